/**
 * When background work next comes due, for the manual clock's stepping
 * advance: hypervisor actions, reservation ends, and the billing boundary at
 * which a balance could reach zero (`billingBoundary`: the boundaries before it
 * are closed in bulk wherever the advance stops next).
 */
import type { Db } from '../db/db.js';

export async function nextDue(db: Db, billingBoundary: number | null): Promise<number | null> {
  const r = await db.query<{ action: Date | null; reservation: Date | null }>(
    `SELECT (SELECT min(next_action_at) FROM vms WHERE hv_action IS NOT NULL AND status <> 'offline') AS action,
            (SELECT min(end_at) FROM reservations WHERE status = 'active') AS reservation`,
  );
  const row = r.rows[0]!;
  const candidates: number[] = [];
  if (row.action) candidates.push(row.action.getTime());
  if (row.reservation) candidates.push(row.reservation.getTime());
  if (billingBoundary !== null) candidates.push(billingBoundary);
  return candidates.length ? Math.min(...candidates) : null;
}
