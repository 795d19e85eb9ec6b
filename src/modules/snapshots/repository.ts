/** The only SQL of customer images (docs/images.md) and their storage billing. */
import type { Queryable } from '../../db/db.js';
import type { Row } from '../../db/rows.js';

export type UserImageRow = Row<'user_images'>;

export async function insertImage(
  q: Queryable,
  i: Pick<
    UserImageRow,
    | 'id'
    | 'user_id'
    | 'name'
    | 'source_vm_id'
    | 'source_vmid'
    | 'source_node'
    | 'template_vmid'
    | 'login_user'
    | 'disk_gb'
    | 'created_at'
  >,
): Promise<UserImageRow> {
  return (
    await q.query<UserImageRow>(
      `INSERT INTO user_images (id, user_id, name, state, source_vm_id, source_vmid, source_node, template_vmid, login_user, disk_gb, created_at)
       VALUES ($1, $2, $3, 'creating', $4, $5, $6, $7, $8, $9, $10) RETURNING *`,
      [
        i.id,
        i.user_id,
        i.name,
        i.source_vm_id,
        i.source_vmid,
        i.source_node,
        i.template_vmid,
        i.login_user,
        i.disk_gb,
        i.created_at,
      ],
    )
  ).rows[0]!;
}

/** One of the user's images (null user: anyone's), deleted ones included. */
export async function getImage(
  q: Queryable,
  id: string,
  userId: number | null,
  lock = false,
): Promise<UserImageRow | undefined> {
  return (
    await q.query<UserImageRow>(
      `SELECT * FROM user_images WHERE id = $1 AND ($2::int8 IS NULL OR user_id = $2)${lock ? ' FOR UPDATE' : ''}`,
      [id, userId],
    )
  ).rows[0];
}

/** The user's images that are not deleted, newest first. */
export async function listImages(
  q: Queryable,
  userId: number,
  limit: number,
  offset: number,
): Promise<{ rows: UserImageRow[]; total: number }> {
  const rows = await q.query<UserImageRow>(
    `SELECT * FROM user_images WHERE user_id = $1 AND state <> 'deleted' ORDER BY seq DESC LIMIT $2 OFFSET $3`,
    [userId, limit, offset],
  );
  const total = await q.query<{ n: number }>(
    `SELECT count(*)::int8 AS n FROM user_images WHERE user_id = $1 AND state <> 'deleted'`,
    [userId],
  );
  return { rows: rows.rows, total: total.rows[0]!.n };
}

/**
 * What counts toward the user's image limits: images not failed or deleted, and their size; an image
 * still being made counts at its source disk's size, the most it can be.
 */
export async function usageOf(q: Queryable, userId: number): Promise<{ count: number; bytes: number }> {
  const r = await q.query<{ count: number; bytes: number }>(
    `SELECT count(*)::int8 AS count,
            COALESCE(SUM(CASE WHEN state = 'ready' THEN size_bytes ELSE disk_gb::int8 * 1000000000 END), 0)::int8 AS bytes
       FROM user_images WHERE user_id = $1 AND state IN ('creating', 'ready')`,
    [userId],
  );
  return r.rows[0]!;
}

/**
 * Claims one image being made whose claim is free or expired (real time), under a lease: across
 * instances each snapshot is taken by one of them at a time.
 */
export async function claimCreating(
  q: Queryable,
  realNow: Date,
  until: Date,
  token: string,
): Promise<UserImageRow | undefined> {
  return (
    await q.query<UserImageRow>(
      `UPDATE user_images SET claim_token = $3, claimed_until = $2
        WHERE id = (SELECT id FROM user_images
                     WHERE state = 'creating' AND (claimed_until IS NULL OR claimed_until < $1)
                     ORDER BY created_at LIMIT 1 FOR UPDATE SKIP LOCKED)
        RETURNING *`,
      [realNow, until, token],
    )
  ).rows[0];
}

/** The image, locked, if `token` still holds its claim. */
export async function reclaim(q: Queryable, id: string, token: string): Promise<UserImageRow | undefined> {
  return (
    await q.query<UserImageRow>(
      `SELECT * FROM user_images WHERE id = $1 AND claim_token = $2 AND state = 'creating' FOR UPDATE`,
      [id, token],
    )
  ).rows[0];
}

export async function updateImage(q: Queryable, id: string, patch: Partial<UserImageRow>): Promise<UserImageRow> {
  const cols = Object.keys(patch).filter((k) => (patch as Record<string, unknown>)[k] !== undefined);
  const r = await q.query<UserImageRow>(
    `UPDATE user_images SET ${cols.map((c, i) => `${c} = $${i + 2}`).join(', ')} WHERE id = $1 RETURNING *`,
    [id, ...cols.map((c) => (patch as Record<string, unknown>)[c])],
  );
  return r.rows[0]!;
}

/** Whether any image that is not deleted (or failed) still stands on this content. */
export async function contentInUse(q: Queryable, sha256: string): Promise<boolean> {
  const r = await q.query(
    `SELECT 1 FROM user_images WHERE sha256 = $1 AND state IN ('creating', 'ready')
     UNION ALL SELECT 1 FROM templates WHERE image_sha256 = $1
     UNION ALL SELECT 1 FROM vms v JOIN user_images u ON u.id = v.image_id
                WHERE u.sha256 = $1 AND v.status NOT IN ('destroyed', 'failed') AND NOT v.provisioned
     LIMIT 1`,
    [sha256],
  );
  return r.rows.length > 0;
}

/** The content of the customer images that VMs on `node` are still to be built from. */
export async function imagesForNode(q: Queryable, node: string): Promise<string[]> {
  const r = await q.query<{ sha256: string }>(
    `SELECT DISTINCT u.sha256 FROM vms v JOIN user_images u ON u.id = v.image_id
      WHERE v.node = $1 AND u.sha256 IS NOT NULL AND v.status NOT IN ('destroyed', 'failed')`,
    [node],
  );
  return r.rows.map((x) => x.sha256);
}

// ---- storage billing (billing/image-meter.ts) ----

/** Ready images whose billing is behind `lastBoundary`, oldest first, locked (skipping those another close holds). */
export async function claimDueBilling(q: Queryable, lastBoundary: Date, limit: number): Promise<UserImageRow[]> {
  return (
    await q.query<UserImageRow>(
      `SELECT * FROM user_images WHERE state = 'ready' AND billed_until < $1
        ORDER BY billed_until, id LIMIT $2 FOR UPDATE SKIP LOCKED`,
      [lastBoundary, limit],
    )
  ).rows;
}

export async function insertUsageLog(q: Queryable, l: Omit<Row<'image_usage_logs'>, 'seq'>): Promise<boolean> {
  const r = await q.query(
    `INSERT INTO image_usage_logs (id, image_id, user_id, period_start, period_end, size_bytes, price_gb_hourly_micros, cost_micros, transaction_id)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (image_id, period_end) DO NOTHING RETURNING id`,
    [
      l.id,
      l.image_id,
      l.user_id,
      l.period_start,
      l.period_end,
      l.size_bytes,
      l.price_gb_hourly_micros,
      l.cost_micros,
      l.transaction_id,
    ],
  );
  return r.rows.length === 1;
}
