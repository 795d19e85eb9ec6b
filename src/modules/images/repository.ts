/** The only SQL of images and their uploads. */
import type { Queryable } from '../../db/db.js';
import type { Row } from '../../db/rows.js';

export type UploadRow = Row<'image_uploads'>;
export type ImageRow = Row<'images'>;

export async function insertUpload(q: Queryable, u: UploadRow): Promise<UploadRow> {
  return (
    await q.query<UploadRow>(
      `INSERT INTO image_uploads (id, size_bytes, received_bytes, sha256, template_vmid, created_at, expires_at)
       VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING *`,
      [u.id, u.size_bytes, u.received_bytes, u.sha256, u.template_vmid, u.created_at, u.expires_at],
    )
  ).rows[0]!;
}

export async function getUpload(q: Queryable, id: string): Promise<UploadRow | undefined> {
  return (await q.query<UploadRow>('SELECT * FROM image_uploads WHERE id = $1', [id])).rows[0];
}

/** Moves an upload's end from `from` to `to`; false when it no longer ended at `from`. */
export async function advanceUpload(q: Queryable, id: string, from: number, to: number): Promise<boolean> {
  const r = await q.query(
    'UPDATE image_uploads SET received_bytes = $3 WHERE id = $1 AND received_bytes = $2 RETURNING id',
    [id, from, to],
  );
  return r.rows.length === 1;
}

export async function deleteUpload(q: Queryable, id: string): Promise<void> {
  await q.query('DELETE FROM image_uploads WHERE id = $1', [id]);
}

/** Forgets the uploads that expired; returns their ids (their bytes are the store's to remove). */
export async function deleteExpired(q: Queryable, now: Date): Promise<string[]> {
  return (
    await q.query<{ id: string }>('DELETE FROM image_uploads WHERE expires_at <= $1 RETURNING id', [now])
  ).rows.map((r) => r.id);
}

export async function insertImage(q: Queryable, i: ImageRow): Promise<ImageRow> {
  await q.query(
    `INSERT INTO images (sha256, format, size_bytes, virtual_size_bytes, created_at) VALUES ($1, $2, $3, $4, $5)
     ON CONFLICT (sha256) DO NOTHING`,
    [i.sha256, i.format, i.size_bytes, i.virtual_size_bytes, i.created_at],
  );
  return (await getImage(q, i.sha256))!;
}

export async function getImage(q: Queryable, sha256: string, lock = false): Promise<ImageRow | undefined> {
  return (await q.query<ImageRow>(`SELECT * FROM images WHERE sha256 = $1${lock ? ' FOR UPDATE' : ''}`, [sha256]))
    .rows[0];
}

export async function listImages(
  q: Queryable,
  limit: number,
  offset: number,
): Promise<{ rows: (ImageRow & { templates: number[] })[]; total: number }> {
  const rows = await q.query<ImageRow & { templates: number[] }>(
    `SELECT i.*, coalesce(array_agg(t.template_vmid ORDER BY t.template_vmid)
         FILTER (WHERE t.template_vmid IS NOT NULL), '{}') AS templates
       FROM images i LEFT JOIN templates t ON t.image_sha256 = i.sha256
      GROUP BY i.sha256 ORDER BY i.created_at DESC, i.sha256 LIMIT $1 OFFSET $2`,
    [limit, offset],
  );
  const total = (await q.query<{ n: number }>('SELECT count(*)::int8 AS n FROM images')).rows[0]!.n;
  return { rows: rows.rows, total };
}

export async function templatesOfImage(q: Queryable, sha256: string): Promise<number[]> {
  return (
    await q.query<{ template_vmid: number }>(
      'SELECT template_vmid FROM templates WHERE image_sha256 = $1 ORDER BY template_vmid',
      [sha256],
    )
  ).rows.map((r) => r.template_vmid);
}

/** Customer images (not deleted) whose content this is. */
export async function customerImagesOf(q: Queryable, sha256: string): Promise<number> {
  return (
    await q.query<{ n: number }>(
      `SELECT count(*)::int8 AS n FROM user_images WHERE sha256 = $1 AND state <> 'deleted'`,
      [sha256],
    )
  ).rows[0]!.n;
}

export async function deleteImage(q: Queryable, sha256: string): Promise<void> {
  await q.query('DELETE FROM images WHERE sha256 = $1', [sha256]);
}
