/** The only SQL of SSH keys. */
import type { Queryable } from '../../db/db.js';
import type { Row } from '../../db/rows.js';

export type SshKeyRow = Omit<Row<'ssh_keys'>, 'seq'>;

export async function lockUser(q: Queryable, userId: number): Promise<void> {
  await q.query('SELECT id FROM users WHERE id = $1 FOR NO KEY UPDATE', [userId]);
}

export async function countKeys(q: Queryable, userId: number): Promise<number> {
  return (await q.query<{ n: number }>('SELECT count(*)::int8 AS n FROM ssh_keys WHERE user_id = $1', [userId]))
    .rows[0]!.n;
}

export async function findByFingerprint(
  q: Queryable,
  userId: number,
  fingerprint: string,
): Promise<SshKeyRow | undefined> {
  return (
    await q.query<SshKeyRow>('SELECT * FROM ssh_keys WHERE user_id = $1 AND fingerprint = $2', [userId, fingerprint])
  ).rows[0];
}

export async function listLabels(q: Queryable, userId: number): Promise<string[]> {
  return (
    await q.query<Pick<Row<'ssh_keys'>, 'label'>>('SELECT label FROM ssh_keys WHERE user_id = $1', [userId])
  ).rows.map((r) => r.label);
}

export async function insertKey(
  q: Queryable,
  k: Omit<SshKeyRow, 'created_at'> & { created_at: Date },
): Promise<SshKeyRow> {
  const r = await q.query<SshKeyRow>(
    `INSERT INTO ssh_keys (id, user_id, label, key_type, fingerprint, public_key, created_at)
     VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING *`,
    [k.id, k.user_id, k.label, k.key_type, k.fingerprint, k.public_key, k.created_at],
  );
  return r.rows[0]!;
}

export async function listKeys(q: Queryable, userId: number, limit: number, offset: number) {
  const rows = await q.query<SshKeyRow>(
    'SELECT * FROM ssh_keys WHERE user_id = $1 ORDER BY seq DESC LIMIT $2 OFFSET $3',
    [userId, limit, offset],
  );
  return { rows: rows.rows, total: await countKeys(q, userId) };
}

export async function findKey(q: Queryable, userId: number, id: string): Promise<SshKeyRow | undefined> {
  return (await q.query<SshKeyRow>('SELECT * FROM ssh_keys WHERE id = $1 AND user_id = $2', [id, userId])).rows[0];
}

/** The caller's oldest key: the default for VMs created with auth_method ssh_key. */
export async function findOldestKey(q: Queryable, userId: number): Promise<SshKeyRow | undefined> {
  return (await q.query<SshKeyRow>('SELECT * FROM ssh_keys WHERE user_id = $1 ORDER BY seq ASC LIMIT 1', [userId]))
    .rows[0];
}

/** The deleted key, or undefined when the user has no such key. */
export async function deleteKey(
  q: Queryable,
  userId: number,
  id: string,
): Promise<{ id: string; label: string; fingerprint: string } | undefined> {
  const r = await q.query<Pick<Row<'ssh_keys'>, 'id' | 'label' | 'fingerprint'>>(
    'DELETE FROM ssh_keys WHERE id = $1 AND user_id = $2 RETURNING id, label, fingerprint',
    [id, userId],
  );
  return r.rows[0];
}
