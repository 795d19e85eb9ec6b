/**
 * The only SQL of the service clock: the persisted time of the manual clock
 * (docs/configuration.md#the-manual-clock).
 */
import type { Queryable } from '../../db/db.js';
import type { Row } from '../../db/rows.js';

/** Writes the manual clock's first time, unless it has run before. */
export async function initClock(q: Queryable, startMs: number): Promise<void> {
  await q.query('INSERT INTO service_clock (id, now_ms) VALUES (1, $1) ON CONFLICT (id) DO NOTHING', [startMs]);
}

/** The persisted time (undefined when the row is missing). */
export async function storedNowMs(q: Queryable): Promise<number | undefined> {
  const r = await q.query<Pick<Row<'service_clock'>, 'now_ms'>>('SELECT now_ms FROM service_clock WHERE id = 1');
  const v = Number(r.rows[0]?.now_ms);
  return Number.isFinite(v) ? v : undefined;
}

/**
 * Moves the persisted time by `deltaMs` from the later of the stored value and `fromMs`, in one statement, so
 * that advances from several instances add up and the clock never goes back. Returns the new time.
 */
export async function moveClock(q: Queryable, fromMs: number, deltaMs: number): Promise<number | undefined> {
  const r = await q.query<Pick<Row<'service_clock'>, 'now_ms'>>(
    'UPDATE service_clock SET now_ms = GREATEST(now_ms, $1) + $2 WHERE id = 1 RETURNING now_ms',
    [fromMs, deltaMs],
  );
  const v = Number(r.rows[0]?.now_ms);
  return Number.isFinite(v) ? v : undefined;
}

/** Holds the lock that serializes advances across instances until `tx` ends (PostgreSQL). */
export async function lockAdvances(tx: Queryable, lockId: number): Promise<void> {
  await tx.query('SELECT pg_advisory_xact_lock($1)', [lockId]);
}
