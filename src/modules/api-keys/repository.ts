/** The only SQL of API keys. */
import type { Queryable } from '../../db/db.js';
import type { Row } from '../../db/rows.js';
import type { Scope } from '../../http/scopes.js';
import type { Role } from '../auth/repository.js';

export type ApiKeyRow = Pick<
  Row<'api_keys'>,
  'id' | 'user_id' | 'name' | 'scope' | 'prefix' | 'created_at' | 'expires_at' | 'last_used_at'
>;

const COLS = 'id, user_id, name, scope, prefix, created_at, expires_at, last_used_at';

export async function insertKey(
  q: Queryable,
  k: {
    id: string;
    userId: number;
    name: string;
    scope: Scope;
    prefix: string;
    keyHash: string;
    now: Date;
    expiresAt: Date | null;
    createdByKeyId: string | null;
  },
): Promise<ApiKeyRow> {
  const r = await q.query<ApiKeyRow>(
    `INSERT INTO api_keys (id, user_id, name, scope, prefix, key_hash, created_at, expires_at, created_by_key_id)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING ${COLS}`,
    [k.id, k.userId, k.name, k.scope, k.prefix, k.keyHash, k.now, k.expiresAt, k.createdByKeyId],
  );
  return r.rows[0]!;
}

export async function listKeys(q: Queryable, userId: number, limit: number, offset: number) {
  const rows = await q.query<ApiKeyRow>(
    `SELECT ${COLS} FROM api_keys WHERE user_id = $1 AND revoked_at IS NULL
      ORDER BY seq DESC LIMIT $2 OFFSET $3`,
    [userId, limit, offset],
  );
  const total = await q.query<{ n: number }>(
    'SELECT count(*)::int8 AS n FROM api_keys WHERE user_id = $1 AND revoked_at IS NULL',
    [userId],
  );
  return { rows: rows.rows, total: total.rows[0]!.n };
}

/**
 * Revokes the key and every key made with it, at any depth; returns the ids revoked now (none when `id` is not an
 * active key of the user).
 */
export async function revokeKey(q: Queryable, userId: number, id: string, now: Date): Promise<string[]> {
  const r = await q.query<Pick<Row<'api_keys'>, 'id'>>(
    `WITH RECURSIVE lineage AS (
       SELECT id FROM api_keys WHERE id = $1 AND user_id = $2 AND revoked_at IS NULL
       UNION
       SELECT k.id FROM api_keys k JOIN lineage l ON k.created_by_key_id = l.id WHERE k.user_id = $2
     )
     UPDATE api_keys SET revoked_at = $3 WHERE id IN (SELECT id FROM lineage) AND revoked_at IS NULL RETURNING id`,
    [id, userId, now],
  );
  return r.rows.map((row) => row.id);
}

export type ActiveKeyRow = ApiKeyRow & { role: Role; suspended: boolean; email: string };

/** A key with its owner's role, suspension and email. */
const ACTIVE_KEY_COLS = `k.id, k.user_id, k.name, k.scope, k.prefix, k.created_at, k.expires_at, k.last_used_at,
                         u.role, u.suspended, u.email`;

export async function findActiveKeyByHash(q: Queryable, keyHash: string): Promise<ActiveKeyRow | undefined> {
  const r = await q.query<ActiveKeyRow>(
    `SELECT ${ACTIVE_KEY_COLS} FROM api_keys k JOIN users u ON u.id = k.user_id
      WHERE k.key_hash = $1 AND k.revoked_at IS NULL`,
    [keyHash],
  );
  return r.rows[0];
}

/** findActiveKeyByHash for many keys in one round trip: the active ones among them, each with its hash. */
export async function findActiveKeysByHash(
  q: Queryable,
  keyHashes: readonly string[],
): Promise<(ActiveKeyRow & { key_hash: string })[]> {
  if (keyHashes.length === 0) return [];
  const r = await q.query<ActiveKeyRow & { key_hash: string }>(
    `SELECT k.key_hash, ${ACTIVE_KEY_COLS} FROM api_keys k JOIN users u ON u.id = k.user_id
      WHERE k.key_hash = ANY($1::text[]) AND k.revoked_at IS NULL`,
    [keyHashes],
  );
  return r.rows;
}

/** Written at most once every `everyMs` per key (instances that remembered an older value do not write again). */
export async function touchKey(q: Queryable, id: string, now: Date, everyMs: number): Promise<void> {
  await q.query(
    `UPDATE api_keys SET last_used_at = $2
      WHERE id = $1 AND (last_used_at IS NULL OR last_used_at < $2::timestamptz - make_interval(secs => $3::float8 / 1000))`,
    [id, now, everyMs],
  );
}
