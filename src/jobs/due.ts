/**
 * When background work next comes due, for the manual clock's stepping
 * advance (D43): hypervisor actions, billing interval boundaries of VMs that
 * accrue, reservation ends.
 */
import type { Db } from '../db/db.js';

export async function nextDue(db: Db, nowMs: number, intervalMs: number): Promise<number | null> {
  const r = await db.query<{ action: Date | null; accruing: boolean; reservation: Date | null }>(
    `SELECT (SELECT min(next_action_at) FROM vms WHERE hv_action IS NOT NULL AND status <> 'offline') AS action,
            EXISTS (SELECT 1 FROM vms WHERE billed_until IS NOT NULL AND status <> 'destroyed') AS accruing,
            (SELECT min(end_at) FROM reservations WHERE status = 'active') AS reservation`,
  );
  const row = r.rows[0]!;
  const candidates: number[] = [];
  if (row.action) candidates.push(row.action.getTime());
  if (row.reservation) candidates.push(row.reservation.getTime());
  if (row.accruing) candidates.push(Math.floor(nowMs / intervalMs) * intervalMs + intervalMs);
  return candidates.length ? Math.min(...candidates) : null;
}
