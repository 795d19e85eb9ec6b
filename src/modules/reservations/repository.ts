/** The only SQL of reservations. */
import type { Queryable } from '../../db/db.js';
import type { Row } from '../../db/rows.js';

export const RESERVATION_STATUSES = ['active', 'completed', 'cancelled', 'converted_to_on_demand'] as const;
export type ReservationStatus = (typeof RESERVATION_STATUSES)[number];

export type ReservationRow = Row<'reservations'>;

export async function insertReservation(
  q: Queryable,
  r: Pick<
    ReservationRow,
    | 'id'
    | 'user_id'
    | 'vm_id'
    | 'gpu_type'
    | 'gpu_count'
    | 'storage_gb'
    | 'reservation_months'
    | 'discount_bp'
    | 'deposit_micros'
    | 'created_at'
    | 'end_at'
  >,
): Promise<ReservationRow> {
  const res = await q.query<ReservationRow>(
    `INSERT INTO reservations (id, user_id, vm_id, gpu_type, gpu_count, storage_gb, reservation_months, discount_bp,
                               deposit_micros, remaining_micros, status, created_at, end_at)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9, 'active', $10, $11) RETURNING *`,
    [
      r.id,
      r.user_id,
      r.vm_id,
      r.gpu_type,
      r.gpu_count,
      r.storage_gb,
      r.reservation_months,
      r.discount_bp,
      r.deposit_micros,
      r.created_at,
      r.end_at,
    ],
  );
  return res.rows[0]!;
}

export async function findReservation(
  q: Queryable,
  id: string,
  userId: number | null,
  forUpdate = false,
): Promise<ReservationRow | undefined> {
  const params: unknown[] = [id];
  let owner = '';
  if (userId !== null) {
    params.push(userId);
    owner = ' AND user_id = $2';
  }
  return (
    await q.query<ReservationRow>(
      `SELECT * FROM reservations WHERE id = $1${owner}${forUpdate ? ' FOR UPDATE' : ''}`,
      params,
    )
  ).rows[0];
}

/** Locks the reservation's VM row: reservations take the VM's lock before their own, as the meter does. */
export async function lockVm(q: Queryable, vmId: string): Promise<void> {
  await q.query('SELECT 1 FROM vms WHERE id = $1 FOR NO KEY UPDATE', [vmId]);
}

export async function listReservations(q: Queryable, userId: number, limit: number, offset: number) {
  const rows = await q.query<ReservationRow>(
    'SELECT * FROM reservations WHERE user_id = $1 ORDER BY seq DESC LIMIT $2 OFFSET $3',
    [userId, limit, offset],
  );
  const total = await q.query<{ n: number }>('SELECT count(*)::int8 AS n FROM reservations WHERE user_id = $1', [
    userId,
  ]);
  return { rows: rows.rows, total: total.rows[0]!.n };
}

export async function updateReservation(
  q: Queryable,
  id: string,
  patch: Partial<Omit<ReservationRow, 'id' | 'seq'>>,
): Promise<ReservationRow> {
  const cols = Object.keys(patch).filter((k) => (patch as Record<string, unknown>)[k] !== undefined);
  const r = await q.query<ReservationRow>(
    `UPDATE reservations SET ${cols.map((c, i) => `${c} = $${i + 2}`).join(', ')} WHERE id = $1 RETURNING *`,
    [id, ...cols.map((c) => (patch as Record<string, unknown>)[c])],
  );
  return r.rows[0]!;
}

export async function dueEnds(q: Queryable, now: Date, limit: number): Promise<{ id: string; vm_id: string }[]> {
  return (
    await q.query<{ id: string; vm_id: string }>(
      `SELECT id, vm_id FROM reservations WHERE status = 'active' AND end_at <= $1 ORDER BY end_at, seq LIMIT $2`,
      [now, limit],
    )
  ).rows;
}

/** Reservations whose remaining balance is not deposit - draws - refund - fee (ledger check). */
export async function unbalancedReservations(q: Queryable) {
  return (
    await q.query<{ id: string; user_id: number; email: string; remaining_micros: number; expected_micros: number }>(
      `SELECT r.id, r.user_id, u.email, r.remaining_micros,
              (r.deposit_micros - COALESCE(d.drawn, 0) - r.refund_micros - r.cancellation_fee_micros)::int8 AS expected_micros
         FROM reservations r
         JOIN users u ON u.id = r.user_id
         LEFT JOIN (SELECT reservation_id, SUM(from_reservation_micros) AS drawn FROM usage_logs
                     WHERE reservation_id IS NOT NULL GROUP BY reservation_id) d ON d.reservation_id = r.id
        WHERE r.remaining_micros <> r.deposit_micros - COALESCE(d.drawn, 0) - r.refund_micros - r.cancellation_fee_micros
        ORDER BY r.id`,
    )
  ).rows;
}

/** When the earliest active reservation ends, or null. */
export async function nextEndAt(q: Queryable): Promise<Date | null> {
  const r = await q.query<{ at: Date | null }>(`SELECT min(end_at) AS at FROM reservations WHERE status = 'active'`);
  return r.rows[0]!.at;
}
