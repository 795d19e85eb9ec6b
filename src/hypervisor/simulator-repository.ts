/** The only SQL of the simulated hypervisor: its armed faults and its VMs' traffic counters. */
import type { Queryable } from '../db/db.js';
import type { Row } from '../db/rows.js';

/** What the simulator can be made to fail: a hypervisor action, or the export a snapshot copies. */
export type SimAction = Row<'sim_faults'>['action'];

/** Arms `count` failures of `action` on a target (a node name, or `vm:<id>`), replacing any armed before. */
export async function armFault(q: Queryable, target: string, action: SimAction, count: number): Promise<void> {
  await q.query(
    `INSERT INTO sim_faults (target, action, remaining) VALUES ($1, $2, $3)
     ON CONFLICT (target, action) DO UPDATE SET remaining = EXCLUDED.remaining`,
    [target, action, count],
  );
}

/** Consumes one armed failure of `action` for the VM or else its node; true when there was one. */
export async function takeFault(q: Queryable, action: SimAction, vmId: string, node: string): Promise<boolean> {
  const r = await q.query(
    `UPDATE sim_faults SET remaining = remaining - 1
      WHERE (target, action) = (
        SELECT target, action FROM sim_faults
         WHERE action = $1 AND remaining > 0 AND target IN ($2, $3)
         ORDER BY target LIKE 'vm:%' DESC LIMIT 1 FOR UPDATE)
      RETURNING target`,
    [action, `vm:${vmId}`, node],
  );
  return r.rowCount === 1;
}

export async function addTraffic(q: Queryable, vmId: string, bytes: number): Promise<void> {
  await q.query(
    'INSERT INTO sim_traffic (vm_id, bytes) VALUES ($1, $2) ON CONFLICT (vm_id) DO UPDATE SET bytes = sim_traffic.bytes + EXCLUDED.bytes',
    [vmId, bytes],
  );
}

export async function forgetTraffic(q: Queryable, vmId: string): Promise<void> {
  await q.query('DELETE FROM sim_traffic WHERE vm_id = $1', [vmId]);
}

/** The traffic counters of these VMs (a VM that made none is absent). */
export async function trafficOf(q: Queryable, vmIds: readonly string[]): Promise<Map<string, number>> {
  const r = await q.query<Pick<Row<'sim_traffic'>, 'vm_id' | 'bytes'>>(
    'SELECT vm_id, bytes FROM sim_traffic WHERE vm_id = ANY($1::uuid[])',
    [vmIds],
  );
  return new Map(r.rows.map((row) => [row.vm_id, row.bytes]));
}
