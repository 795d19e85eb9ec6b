/** The only SQL of idempotency keys (docs/errors.md#idempotency-keys): claims, answers, takeovers and their expiry. */
import type { Queryable } from '../db/db.js';
import type { Row } from '../db/rows.js';

/** A key's row as a retry reads it. */
export type StoredKey = Omit<Row<'idempotency_keys'>, 'user_id' | 'idem_key'>;

/** Which key, of whom, held by which request. */
export interface KeyRef {
  userId: number;
  lookup: string;
  owner: string;
}

/**
 * Claims the key for `ref.owner` until `leaseUntilMs` (real time); false when the key exists and is younger than
 * `forgetBefore`. In the same statement the user's records created at or before `forgetBefore` are forgotten (all of
 * them, so none lingers), and an expired record of this very key is claimed afresh in place.
 */
export async function claim(
  q: Queryable,
  ref: KeyRef,
  requestHash: string,
  now: Date,
  leaseUntilMs: number,
  forgetBefore: Date,
): Promise<boolean> {
  const r = await q.query(
    `WITH forgotten AS (
       DELETE FROM idempotency_keys WHERE user_id = $1 AND created_at <= $7 AND idem_key <> $2
     )
     INSERT INTO idempotency_keys (user_id, idem_key, request_hash, state, created_at, owner, lease_until_ms)
     VALUES ($1, $2, $3, 'pending', $4, $5, $6)
     ON CONFLICT (user_id, idem_key) DO UPDATE
        SET request_hash = EXCLUDED.request_hash, state = 'pending', response_status = NULL, response_body = NULL,
            created_at = EXCLUDED.created_at, owner = EXCLUDED.owner, lease_until_ms = EXCLUDED.lease_until_ms
      WHERE idempotency_keys.created_at <= $7`,
    [ref.userId, ref.lookup, requestHash, now, ref.owner, leaseUntilMs, forgetBefore],
  );
  return r.rowCount === 1;
}

export async function find(q: Queryable, userId: number, lookup: string): Promise<StoredKey | undefined> {
  return (
    await q.query<StoredKey>(
      'SELECT request_hash, state, response_status, response_body, created_at, owner, lease_until_ms FROM idempotency_keys WHERE user_id = $1 AND idem_key = $2',
      [userId, lookup],
    )
  ).rows[0];
}

/** Takes over a pending key still held by `previousOwner` (whose lease ran out); false when someone else did. */
export async function takeOver(
  q: Queryable,
  ref: KeyRef,
  leaseUntilMs: number,
  previousOwner: string | null,
): Promise<boolean> {
  const r = await q.query(
    `UPDATE idempotency_keys SET owner = $3, lease_until_ms = $4
      WHERE user_id = $1 AND idem_key = $2 AND state = 'pending' AND owner IS NOT DISTINCT FROM $5`,
    [ref.userId, ref.lookup, ref.owner, leaseUntilMs, previousOwner],
  );
  return r.rowCount === 1;
}

/** Records the (sealed) answer of the key's owner; false when the key is no longer its own. */
export async function recordAnswer(
  q: Queryable,
  ref: KeyRef,
  status: number,
  sealedBody: string | null,
): Promise<boolean> {
  const r = await q.query(
    `UPDATE idempotency_keys SET state = 'done', response_status = $4, response_body = $5
      WHERE user_id = $1 AND idem_key = $2 AND owner = $3`,
    [ref.userId, ref.lookup, ref.owner, status, sealedBody],
  );
  return r.rowCount === 1;
}

/** Lets a pending key go (no definitive answer), so that the client can retry. */
export async function release(q: Queryable, ref: KeyRef): Promise<void> {
  await q.query(
    `DELETE FROM idempotency_keys WHERE user_id = $1 AND idem_key = $2 AND owner = $3 AND state = 'pending'`,
    [ref.userId, ref.lookup, ref.owner],
  );
}

/** Forgets every record created at or before `before`; returns how many. */
export async function purge(q: Queryable, before: Date): Promise<number> {
  return (await q.query('DELETE FROM idempotency_keys WHERE created_at <= $1', [before])).rowCount;
}
