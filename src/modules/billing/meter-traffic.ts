/**
 * Network traffic (docs/metering.md): the VMs' cumulative traffic counters, read from their hosts
 * before the close that bills them.
 */
import type { Db } from '../../db/db.js';
import * as repo from './meter-repository.js';
import type { TrafficVmRow } from './meter-repository.js';

/** Reads the cumulative traffic counters of some VMs of one node (the hypervisor driver's trafficBytes). */
export type TrafficReader = (
  node: string,
  vms: { id: string; vmid: number; node: string; hvRef: string | null }[],
) => Promise<Map<string, number>>;

/** Nodes whose traffic counters are read at once. */
const TRAFFIC_READS_AT_ONCE = 8;

/**
 * Reads the traffic counters of the VMs whose period ends at or before `lastBoundary` ('infinity':
 * every VM that accrues): one driver call per node for all its VMs, a few at a time, outside any
 * transaction, and raises the stored counters that moved, `batch` VMs per statement. Returns the VMs
 * whose counter moved.
 */
export async function sampleTraffic(
  db: Db,
  lastBoundary: Date | 'infinity',
  read: TrafficReader,
  batch: number,
): Promise<number> {
  const due = await repo.trafficDueVms(db, lastBoundary);
  const byNode = new Map<string, TrafficVmRow[]>();
  for (const v of due) {
    const list = byNode.get(v.node);
    if (list) list.push(v);
    else byNode.set(v.node, [v]);
  }
  const moved: { id: string; bytes: number }[] = [];
  const nodes = [...byNode];
  const next = async (): Promise<void> => {
    for (let entry = nodes.pop(); entry; entry = nodes.pop()) {
      const [node, vms] = entry;
      const counters = await read(
        node,
        vms.map((v) => ({ id: v.id, vmid: v.vmid, node: v.node, hvRef: v.hv_ref })),
      );
      for (const v of vms) {
        const bytes = counters.get(v.id);
        if (bytes !== undefined && bytes > v.network_bytes_total) moved.push({ id: v.id, bytes });
      }
    }
  };
  await Promise.all(Array.from({ length: TRAFFIC_READS_AT_ONCE }, next));
  for (let i = 0; i < moved.length; i += batch) {
    const chunk = moved.slice(i, i + batch);
    await repo.raiseTrafficCounters(
      db,
      chunk.map((m) => m.id),
      chunk.map((m) => m.bytes),
    );
  }
  return moved.length;
}
