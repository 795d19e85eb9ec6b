/** The only SQL of nodes and prices, and the one place a node's GPUs are counted. */
import type { Queryable } from '../../db/db.js';
import type { Row } from '../../db/rows.js';
import { PREEMPTIBLE } from '../vms/lifecycle.js';

export const GPU_TYPES = ['5090', '4090', 'pro6000'] as const;
export type GpuType = (typeof GPU_TYPES)[number];
export const NODE_STATUSES = ['active', 'draining', 'offline'] as const;
export type NodeStatus = (typeof NODE_STATUSES)[number];

export type PricingRow = Row<'gpu_pricing'>;

export type NodeRow = Pick<
  Row<'nodes'>,
  | 'node'
  | 'gpu_count'
  | 'gpu_ram_mb'
  | 'ram_gb'
  | 'cpu_cores'
  | 'cpu_model'
  | 'pcie_gen'
  | 'max_storage_gb'
  | 'location'
  | 'cluster_name'
  | 'status'
  | 'created_at'
  | 'updated_at'
> & {
  gpu_type: GpuType;
};

/** The host-agent columns of a node (null for a simulated node). */
export type NodeAgentRow = Pick<
  Row<'nodes'>,
  | 'agent_url'
  | 'agent_token_sealed'
  | 'agent_status'
  | 'agent_seen_at'
  | 'agent_checked_at'
  | 'agent_misses'
  | 'agent_offline_from'
> & {
  agent_info: AgentInfo | null;
};

/** What an agent reports about its host. */
export interface AgentInfo {
  agent_version: string;
  accel: string;
  host_cpu_model: string;
  host_gpus: { pci_address: string; model: string; vfio: boolean; iommu_group: number | null }[];
}

export type FullNodeRow = NodeRow & NodeAgentRow;

export interface GpuUsage {
  /** GPUs held by any VM on the node. */
  held: number;
  /** Of those, GPUs held by interruptible VMs that an on-demand or reserved VM may preempt. */
  preemptible: number;
}

export const NODE_FIELDS = [
  'gpu_type',
  'gpu_count',
  'gpu_ram_mb',
  'ram_gb',
  'cpu_cores',
  'cpu_model',
  'pcie_gen',
  'max_storage_gb',
  'location',
  'cluster_name',
  'status',
] as const;

export async function listPricing(q: Queryable): Promise<PricingRow[]> {
  return (
    await q.query<PricingRow>(
      `SELECT * FROM gpu_pricing ORDER BY array_position(ARRAY['5090','4090','pro6000'], gpu_type)`,
    )
  ).rows;
}

export async function getPricing(q: Queryable, gpuType: string, forUpdate = false): Promise<PricingRow | undefined> {
  return (
    await q.query<PricingRow>(`SELECT * FROM gpu_pricing WHERE gpu_type = $1${forUpdate ? ' FOR UPDATE' : ''}`, [
      gpuType,
    ])
  ).rows[0];
}

/** A GPU type's price row, unless it has one (the shipped defaults never overwrite an operator's prices). */
export async function insertPricingIfMissing(
  q: Queryable,
  p: Omit<PricingRow, 'updated_at'>,
  now: Date,
): Promise<void> {
  await q.query(
    `INSERT INTO gpu_pricing (gpu_type, gpu_ram_mb, gpu_price_hourly_micros, interruptible_rate_micros, storage_price_gb_hourly_micros,
                              reserved_discount_1mo_bp, reserved_discount_3mo_bp, reserved_discount_6mo_bp, updated_at)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (gpu_type) DO NOTHING`,
    [
      p.gpu_type,
      p.gpu_ram_mb,
      p.gpu_price_hourly_micros,
      p.interruptible_rate_micros,
      p.storage_price_gb_hourly_micros,
      p.reserved_discount_1mo_bp,
      p.reserved_discount_3mo_bp,
      p.reserved_discount_6mo_bp,
      now,
    ],
  );
}

export async function upsertPricing(q: Queryable, p: Omit<PricingRow, 'updated_at'>, now: Date): Promise<PricingRow> {
  const r = await q.query<PricingRow>(
    `INSERT INTO gpu_pricing (gpu_type, gpu_ram_mb, gpu_price_hourly_micros, interruptible_rate_micros, storage_price_gb_hourly_micros,
                              reserved_discount_1mo_bp, reserved_discount_3mo_bp, reserved_discount_6mo_bp, updated_at)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
     ON CONFLICT (gpu_type) DO UPDATE SET
       gpu_ram_mb = EXCLUDED.gpu_ram_mb,
       gpu_price_hourly_micros = EXCLUDED.gpu_price_hourly_micros,
       interruptible_rate_micros = EXCLUDED.interruptible_rate_micros,
       storage_price_gb_hourly_micros = EXCLUDED.storage_price_gb_hourly_micros,
       reserved_discount_1mo_bp = EXCLUDED.reserved_discount_1mo_bp,
       reserved_discount_3mo_bp = EXCLUDED.reserved_discount_3mo_bp,
       reserved_discount_6mo_bp = EXCLUDED.reserved_discount_6mo_bp,
       updated_at = EXCLUDED.updated_at
     RETURNING *`,
    [
      p.gpu_type,
      p.gpu_ram_mb,
      p.gpu_price_hourly_micros,
      p.interruptible_rate_micros,
      p.storage_price_gb_hourly_micros,
      p.reserved_discount_1mo_bp,
      p.reserved_discount_3mo_bp,
      p.reserved_discount_6mo_bp,
      now,
    ],
  );
  return r.rows[0]!;
}

export async function listNodes(q: Queryable): Promise<FullNodeRow[]> {
  return (await q.query<FullNodeRow>('SELECT * FROM nodes ORDER BY node')).rows;
}

/** A page of nodes, newest first (by insertion order, as many share a timestamp under the manual clock). */
export async function pageNodes(
  q: Queryable,
  limit: number,
  offset: number,
): Promise<{ rows: FullNodeRow[]; total: number }> {
  const rows = await q.query<FullNodeRow>('SELECT * FROM nodes ORDER BY seq DESC LIMIT $1 OFFSET $2', [limit, offset]);
  const total = await q.query<{ n: number }>('SELECT count(*)::int8 AS n FROM nodes');
  return { rows: rows.rows, total: total.rows[0]!.n };
}

export async function getNode(q: Queryable, node: string, forUpdate = false): Promise<FullNodeRow | undefined> {
  return (await q.query<FullNodeRow>(`SELECT * FROM nodes WHERE node = $1${forUpdate ? ' FOR UPDATE' : ''}`, [node]))
    .rows[0];
}

/** undefined when the node id is taken. */
export async function insertNode(
  q: Queryable,
  n: Omit<NodeRow, 'created_at' | 'updated_at'> & Partial<Pick<NodeAgentRow, 'agent_url' | 'agent_token_sealed'>>,
  now: Date,
): Promise<FullNodeRow | undefined> {
  const r = await q.query<FullNodeRow>(
    `INSERT INTO nodes (node, gpu_type, gpu_count, gpu_ram_mb, ram_gb, cpu_cores, cpu_model, pcie_gen, max_storage_gb,
                        location, cluster_name, status, created_at, updated_at, agent_url, agent_token_sealed)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $13, $14, $15)
     ON CONFLICT (node) DO NOTHING RETURNING *`,
    [
      n.node,
      n.gpu_type,
      n.gpu_count,
      n.gpu_ram_mb,
      n.ram_gb,
      n.cpu_cores,
      n.cpu_model,
      n.pcie_gen,
      n.max_storage_gb,
      n.location,
      n.cluster_name,
      n.status,
      now,
      n.agent_url ?? null,
      n.agent_token_sealed ?? null,
    ],
  );
  return r.rows[0];
}

/** Columns an update may set: the operator's fields and the agent's. */
const UPDATABLE = [
  ...NODE_FIELDS,
  'agent_url',
  'agent_token_sealed',
  'agent_status',
  'agent_seen_at',
  'agent_misses',
  'agent_info',
  'agent_offline_from',
] as const;
type NodePatch = Partial<Omit<FullNodeRow, 'node' | 'created_at' | 'updated_at' | 'agent_checked_at'>>;

/**
 * `touch`: the change is the node's own (an operator's or a status change), so updated_at moves; a heartbeat's is
 * not.
 */
export async function updateNode(
  q: Queryable,
  node: string,
  patch: NodePatch,
  now: Date,
  touch = true,
): Promise<FullNodeRow | undefined> {
  const sets: string[] = [];
  const params: unknown[] = [node];
  for (const k of UPDATABLE) {
    const v = patch[k];
    if (v === undefined) continue;
    params.push(k === 'agent_info' && v !== null ? JSON.stringify(v) : v);
    sets.push(`${k} = $${params.length}${k === 'agent_info' ? '::jsonb' : ''}`);
  }
  if (touch || sets.length === 0) {
    params.push(now);
    sets.push(`updated_at = $${params.length}`);
  }
  const r = await q.query<FullNodeRow>(`UPDATE nodes SET ${sets.join(', ')} WHERE node = $1 RETURNING *`, params);
  return r.rows[0];
}

/**
 * Claims the agents due for a heartbeat: one whose last check is at least
 * `intervalMs` old (real time). The claim is the update itself, so of several
 * service instances exactly one checks each agent per interval.
 */
export async function claimAgentChecks(q: Queryable, realNow: Date, intervalMs: number): Promise<FullNodeRow[]> {
  const r = await q.query<FullNodeRow>(
    `UPDATE nodes SET agent_checked_at = $1
      WHERE agent_url IS NOT NULL AND (agent_checked_at IS NULL OR agent_checked_at <= $2 OR agent_checked_at > $1)
      RETURNING *`,
    [realNow, new Date(realNow.getTime() - intervalMs)],
  );
  return r.rows;
}

/** A node's host agent: its URL and sealed token (both null for a simulated node). */
export async function agentOf(
  q: Queryable,
  node: string,
): Promise<{ agent_url: string | null; agent_token_sealed: string | null } | undefined> {
  return (
    await q.query<Pick<Row<'nodes'>, 'agent_url' | 'agent_token_sealed'>>(
      'SELECT agent_url, agent_token_sealed FROM nodes WHERE node = $1',
      [node],
    )
  ).rows[0];
}

export async function deleteNode(q: Queryable, node: string): Promise<boolean> {
  return (await q.query('DELETE FROM nodes WHERE node = $1', [node])).rowCount === 1;
}

/** Non-destroyed, non-failed VMs on a node (a node with any cannot be deleted). */
export async function liveVmCount(q: Queryable, node: string): Promise<number> {
  return (
    await q.query<{ n: number }>(
      `SELECT count(*)::int8 AS n FROM vms WHERE node = $1 AND status NOT IN ('destroyed', 'failed')`,
      [node],
    )
  ).rows[0]!.n;
}

/**
 * GPU accounting: the one place the GPUs a node has handed out are counted
 * (ARCHITECTURE invariant). `holds_gpus` is maintained by the VM lifecycle.
 */
export async function gpuUsage(q: Queryable, nodes?: string[]): Promise<Map<string, GpuUsage>> {
  const r = await q.query<{ node: string; held: number; preemptible: number }>(
    `SELECT node,
            COALESCE(SUM(gpu_count), 0)::int8 AS held,
            COALESCE(SUM(gpu_count) FILTER (WHERE rental_type = 'interruptible' AND status = ANY($2::text[])), 0)::int8 AS preemptible
       FROM vms
      WHERE holds_gpus ${nodes ? 'AND node = ANY($1::text[])' : 'AND $1::text[] IS NULL'}
      GROUP BY node`,
    [nodes ?? null, PREEMPTIBLE],
  );
  return new Map(r.rows.map((row) => [row.node, { held: row.held, preemptible: row.preemptible }]));
}

/**
 * Nodes a stopped VM could move to (docs/vms.md#start-on-another-host), locked, best first: active,
 * not `from`, the same GPU type and driver as `from` (docs/architecture.md#hypervisor-drivers), room
 * for the disk, and by the count before the lock enough free GPUs; the same cluster first, then the
 * most free GPUs. A node another transaction holds is skipped, not waited for: two moves in
 * opposite directions never wait on each other. The caller counts the GPUs again behind the lock.
 */
export async function lockMoveTargets(
  q: Queryable,
  want: { from: string; gpuType: string; gpuCount: number; storageGb: number; cluster: string },
): Promise<FullNodeRow[]> {
  const r = await q.query<FullNodeRow>(
    `SELECT n.* FROM nodes n
      WHERE n.status = 'active' AND n.node <> $1 AND n.gpu_type = $2 AND n.max_storage_gb >= $4
        AND node_driver(n) = (SELECT node_driver(f) FROM nodes f WHERE f.node = $1)
        AND n.gpu_count - COALESCE((SELECT SUM(v.gpu_count) FROM vms v WHERE v.node = n.node AND v.holds_gpus), 0) >= $3
      ORDER BY (n.cluster_name = $5) DESC,
               n.gpu_count - COALESCE((SELECT SUM(v.gpu_count) FROM vms v WHERE v.node = n.node AND v.holds_gpus), 0) DESC,
               n.node
      LIMIT 8
      FOR UPDATE OF n SKIP LOCKED`,
    [want.from, want.gpuType, want.gpuCount, want.storageGb, want.cluster],
  );
  return r.rows;
}
