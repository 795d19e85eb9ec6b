/**
 * The SQL of VMs and interruption records: the rows, their writes and the queries of the rules and the
 * hypervisor-actions job. What a VM's API record reads (one VM's, a list's) is listed-repository.ts.
 */
import type { Queryable } from '../../db/db.js';
import type { Row } from '../../db/rows.js';
import type { InterruptionStatus, RentalType, VmStatus } from './lifecycle.js';

export type VmRow = Omit<Row<'vms'>, 'network_bytes_total' | 'offline_from' | 'gpu_devices'> & {
  offline_from: VmStatus | null;
  gpu_devices: string[] | null;
};

export type InterruptionRow = Omit<Row<'interruptions'>, 'seq'>;

/**
 * The lists of lifecycle.ts are the values the tables' CHECK constraints allow, as db/rows.ts reads them from
 * the migrations (this fails to compile when they differ).
 */
type Same<A, B> = [A] extends [B] ? ([B] extends [A] ? true : false) : false;
const listsMatchTables: [
  Same<VmStatus, VmRow['status']>,
  Same<RentalType, VmRow['rental_type']>,
  Same<InterruptionStatus, InterruptionRow['status']>,
] = [true, true, true];
void listsMatchTables;

export type NewVm = Pick<
  VmRow,
  | 'id'
  | 'user_id'
  | 'node'
  | 'instance_label'
  | 'http_ports'
  | 'gpu_type'
  | 'gpu_count'
  | 'storage_gb'
  | 'ram_gb'
  | 'cpu_cores'
  | 'cpu_model'
  | 'pcie_gen'
  | 'template_vmid'
  | 'status'
  | 'holds_gpus'
  | 'rental_type'
  | 'reservation_id'
  | 'auto_restart'
  | 'gpu_hourly_rate_micros'
  | 'storage_hourly_rate_micros'
  | 'auth_method'
  | 'ssh_key_id'
  | 'ssh_public_key'
  | 'provision_secret'
  | 'created_at'
  | 'next_action_at'
  | 'hv_action'
  | 'image_id'
>;

export async function insertVm(q: Queryable, v: NewVm): Promise<VmRow> {
  const cols = Object.keys(v) as (keyof NewVm)[];
  const r = await q.query<VmRow>(
    `INSERT INTO vms (${cols.join(', ')}) VALUES (${cols.map((_, i) => `$${i + 1}`).join(', ')}) RETURNING *`,
    cols.map((c) => v[c]),
  );
  return r.rows[0]!;
}

/** The WHERE of a VM named by uuid or by vmid, of `userId` (null: anyone's), and its parameters. */
export function byRef(
  ref: { id?: string; vmid?: number },
  userId: number | null,
): { where: string; params: unknown[] } {
  const params: unknown[] = [ref.id ?? ref.vmid];
  const where = ref.id !== undefined ? 'id = $1' : 'vmid = $1';
  if (userId === null) return { where, params };
  params.push(userId);
  return { where: `${where} AND user_id = $2`, params };
}

/** By uuid or by vmid; `userId` null for admins and jobs. */
export async function findVm(
  q: Queryable,
  ref: { id?: string; vmid?: number },
  userId: number | null,
  forUpdate = false,
): Promise<VmRow | undefined> {
  const { where, params } = byRef(ref, userId);
  return (await q.query<VmRow>(`SELECT * FROM vms WHERE ${where}${forUpdate ? ' FOR NO KEY UPDATE' : ''}`, params))
    .rows[0];
}

/** Writes the columns a transition or an action result changed. */
export async function updateVm(
  q: Queryable,
  id: string,
  patch: Partial<Omit<VmRow, 'id' | 'vmid' | 'seq'>>,
): Promise<VmRow> {
  const cols = Object.keys(patch).filter((k) => (patch as Record<string, unknown>)[k] !== undefined);
  const r = await q.query<VmRow>(
    `UPDATE vms SET ${cols.map((c, i) => `${c} = $${i + 2}`).join(', ')} WHERE id = $1 RETURNING *`,
    [
      id,
      ...cols.map((c) =>
        c === 'gpu_devices'
          ? JSON.stringify((patch as Record<string, unknown>)[c])
          : (patch as Record<string, unknown>)[c],
      ),
    ],
  );
  return r.rows[0]!;
}

/** Running VMs of a node that no action is working on (what the node's agent reports is compared with these). */
export async function idleRunningOnNode(q: Queryable, node: string): Promise<VmRow[]> {
  return (
    await q.query<VmRow>(
      `SELECT * FROM vms WHERE node = $1 AND status = 'running' AND hv_action IS NULL AND claim_token IS NULL`,
      [node],
    )
  ).rows;
}

/** Traffic counters only grow: a lower reading (a restarted counter) never lowers what was seen. */
export async function raiseTraffic(q: Queryable, id: string, bytes: number): Promise<void> {
  await q.query('UPDATE vms SET network_bytes_total = GREATEST(network_bytes_total, $2) WHERE id = $1', [id, bytes]);
}

/** A user's own VM and GPU limits (null: the default). */
export async function userLimits(
  q: Queryable,
  userId: number,
): Promise<Pick<Row<'users'>, 'max_vms' | 'max_gpus'> | undefined> {
  return (
    await q.query<Pick<Row<'users'>, 'max_vms' | 'max_gpus'>>('SELECT max_vms, max_gpus FROM users WHERE id = $1', [
      userId,
    ])
  ).rows[0];
}

/** What the account limits and the hourly commitment read of each of a user's VMs. */
const COUNTED_COLUMNS = [
  'id',
  'status',
  'rental_type',
  'holds_gpus',
  'gpu_count',
  'gpu_hourly_rate_micros',
  'storage_hourly_rate_micros',
] as const satisfies readonly (keyof VmRow)[];
export type CountedVm = Pick<VmRow, (typeof COUNTED_COLUMNS)[number]>;

/** The user's VMs that count toward the limits: only the columns that count (a user may have many VMs). */
export async function userVmsForLimits(q: Queryable, userId: number): Promise<CountedVm[]> {
  return (
    await q.query<CountedVm>(
      `SELECT ${COUNTED_COLUMNS.join(', ')} FROM vms WHERE user_id = $1 AND status NOT IN ('destroyed', 'failed')`,
      [userId],
    )
  ).rows;
}

/** Interruptible VMs on a node that hold GPUs an on-demand VM may take: the most recently started first. */
export async function preemptionCandidates(q: Queryable, node: string, statuses: readonly string[]): Promise<VmRow[]> {
  return (
    await q.query<VmRow>(
      `SELECT * FROM vms WHERE node = $1 AND rental_type = 'interruptible' AND holds_gpus AND status = ANY($2::text[])
        ORDER BY COALESCE(started_at, created_at) DESC, seq DESC FOR NO KEY UPDATE`,
      [node, statuses],
    )
  ).rows;
}

export async function vmsOnNode(q: Queryable, node: string, statuses: readonly string[]): Promise<VmRow[]> {
  return (
    await q.query<VmRow>(
      'SELECT * FROM vms WHERE node = $1 AND status = ANY($2::text[]) ORDER BY seq FOR NO KEY UPDATE',
      [node, statuses],
    )
  ).rows;
}

/**
 * Of the VMs a node's agent holds, those that live on another node now, run by another agent, and are
 * not moving away from this one: copies left behind by a move (docs/vms.md#start-on-another-host).
 * Two nodes one agent serves share its VMs: none of them is a leftover of the other.
 */
export async function leftCopies(q: Queryable, node: string, ids: readonly string[]): Promise<string[]> {
  if (ids.length === 0) return [];
  const r = await q.query<{ id: string }>(
    `SELECT v.id FROM vms v JOIN nodes here ON here.node = $2 JOIN nodes there ON there.node = v.node
      WHERE v.id = ANY($1::uuid[]) AND v.node <> $2 AND there.agent_url IS DISTINCT FROM here.agent_url
        AND NOT (v.status = 'moving' AND v.move_from IS NOT DISTINCT FROM $2)`,
    [ids, node],
  );
  return r.rows.map((row) => row.id);
}

/** Whether a snapshot of the VM is being taken (docs/images.md): it must not start meanwhile. */
export async function snapshotInProgress(q: Queryable, vmId: string): Promise<boolean> {
  const r = await q.query(`SELECT 1 FROM user_images WHERE source_vm_id = $1 AND state = 'creating' LIMIT 1`, [vmId]);
  return r.rows.length > 0;
}

/** Whether the VM's owner is suspended (their VMs must not come up). */
export async function ownerSuspended(q: Queryable, userId: number): Promise<boolean> {
  return (
    (await q.query<Pick<Row<'users'>, 'suspended'>>('SELECT suspended FROM users WHERE id = $1', [userId])).rows[0]
      ?.suspended ?? false
  );
}

export async function runningVmsOfUser(q: Queryable, userId: number): Promise<VmRow[]> {
  return (
    await q.query<VmRow>(`SELECT * FROM vms WHERE user_id = $1 AND status = 'running' ORDER BY seq FOR NO KEY UPDATE`, [
      userId,
    ])
  ).rows;
}

// ---- the hypervisor-actions job's claims ----

/**
 * Claims due hypervisor work; FOR NO KEY UPDATE SKIP LOCKED so several instances
 * never take the same VM. `now` (service time) decides what is due; the
 * lease runs on real time (`realNow`, `leaseUntil`), so a claim of a dead
 * instance expires however the service clock moves.
 */
export async function claimDue(
  q: Queryable,
  now: Date,
  realNow: Date,
  leaseUntil: Date,
  token: string,
  limit: number,
): Promise<VmRow[]> {
  return (
    await q.query<VmRow>(
      `UPDATE vms SET claim_token = $3, claimed_until = $2
        WHERE id IN (
          SELECT id FROM vms
           WHERE hv_action IS NOT NULL AND next_action_at <= $1 AND status <> 'offline'
             AND (claimed_until IS NULL OR claimed_until <= $5)
           ORDER BY next_action_at, seq
           LIMIT $4
           FOR NO KEY UPDATE SKIP LOCKED)
        RETURNING *`,
      [now, leaseUntil, token, limit, realNow],
    )
  ).rows;
}

/** The VM again, locked, if this claim still holds it. */
export async function reclaim(q: Queryable, id: string, token: string): Promise<VmRow | undefined> {
  return (await q.query<VmRow>('SELECT * FROM vms WHERE id = $1 AND claim_token = $2 FOR NO KEY UPDATE', [id, token]))
    .rows[0];
}

/** Interrupted VMs waiting to restart by themselves, oldest interruption first (never a suspended user's). */
export async function autoRestartCandidates(q: Queryable, limit: number): Promise<VmRow[]> {
  return (
    await q.query<VmRow>(
      `SELECT v.* FROM vms v
         JOIN nodes n ON n.node = v.node AND n.status = 'active'
         JOIN users u ON u.id = v.user_id AND NOT u.suspended
        WHERE v.status = 'interrupted' AND v.auto_restart
          AND NOT EXISTS (SELECT 1 FROM user_images i WHERE i.source_vm_id = v.id AND i.state = 'creating')
        ORDER BY v.stopped_at NULLS FIRST, v.seq LIMIT $1`,
      [limit],
    )
  ).rows;
}

// ---- interruptions ----

export async function insertInterruption(
  q: Queryable,
  i: Omit<InterruptionRow, 'restored_at' | 'downtime_seconds' | 'status'>,
): Promise<void> {
  await q.query(
    `INSERT INTO interruptions (id, interruptible_vm_id, preempted_by_vm_id, preempted_at, status) VALUES ($1, $2, $3, $4, 'interrupted')`,
    [i.id, i.interruptible_vm_id, i.preempted_by_vm_id, i.preempted_at],
  );
}

export async function closeInterruptions(
  q: Queryable,
  vmId: string,
  status: 'restored' | 'abandoned',
  now: Date,
): Promise<void> {
  await q.query(
    `UPDATE interruptions
        SET status = $2,
            restored_at = CASE WHEN $2 = 'restored' THEN $3::timestamptz ELSE NULL END,
            downtime_seconds = CASE WHEN $2 = 'restored' THEN floor(extract(epoch FROM ($3::timestamptz - preempted_at)))::int8 ELSE NULL END
      WHERE interruptible_vm_id = $1 AND status = 'interrupted'`,
    [vmId, status, now],
  );
}

export async function listInterruptions(q: Queryable, vmId: string, limit: number, offset: number) {
  const rows = await q.query<InterruptionRow>(
    'SELECT * FROM interruptions WHERE interruptible_vm_id = $1 ORDER BY seq DESC LIMIT $2 OFFSET $3',
    [vmId, limit, offset],
  );
  const total = await q.query<{ n: number }>(
    'SELECT count(*)::int8 AS n FROM interruptions WHERE interruptible_vm_id = $1',
    [vmId],
  );
  return { rows: rows.rows, total: total.rows[0]!.n };
}

/** When the earliest pending hypervisor action is due (VMs of offline nodes wait for their node), or null. */
export async function nextActionAt(q: Queryable): Promise<Date | null> {
  const r = await q.query<{ at: Date | null }>(
    `SELECT min(next_action_at) AS at FROM vms WHERE hv_action IS NOT NULL AND status <> 'offline'`,
  );
  return r.rows[0]!.at;
}
