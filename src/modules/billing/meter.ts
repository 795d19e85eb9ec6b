/**
 * Metering (CONTRACT D31-D33). GPU time is counted while a VM is running,
 * storage from its first start until it is destroyed. A period closes at
 * every multiple of the billing interval (from the Unix epoch) and at every
 * transition into or out of `running` and at destroy; each close writes one
 * usage log and one `charge` transaction. The unique key (vm_id, period_end)
 * makes a period chargeable exactly once, whatever the number of instances
 * or crashes. Amounts: integer micro-units, each part rounded half-up.
 */
import type { Db, Queryable } from '../../db/db.js';
import type { Clock } from '../../clock.js';
import { newId } from '../../ids.js';
import { mulDiv, toAmount } from '../../money.js';
import * as ledger from './ledger.js';

const MS_PER_HOUR = 3_600_000;
const BYTES_PER_GB = 1_000_000_000;

/** The VM columns metering reads. */
export interface MeteredVm {
  id: string;
  vmid: number;
  user_id: number;
  status: string;
  gpu_count: number;
  storage_gb: number;
  gpu_hourly_rate_micros: number;
  storage_hourly_rate_micros: number;
  reservation_id: string | null;
  billed_until: Date | null;
  network_bytes_total: number;
  network_bytes_billed: number;
}

export interface PeriodCharge {
  gpuMs: number;
  storageMs: number;
  networkBytes: number;
  gpuCost: number;
  storageCost: number;
  networkCost: number;
  total: number;
}

/** The pure arithmetic of one period (D32): each part rounded half-up, the total the sum of the parts. */
export function priceOfPeriod(
  vm: Pick<MeteredVm, 'gpu_hourly_rate_micros' | 'storage_hourly_rate_micros'>,
  ms: number,
  gpuRunning: boolean,
  networkBytes: number,
  networkPricePerGbMicros: number,
): PeriodCharge {
  const gpuMs = gpuRunning ? ms : 0;
  const gpuCost = mulDiv(vm.gpu_hourly_rate_micros, gpuMs, MS_PER_HOUR);
  const storageCost = mulDiv(vm.storage_hourly_rate_micros, ms, MS_PER_HOUR);
  const networkCost = mulDiv(networkBytes, networkPricePerGbMicros, BYTES_PER_GB);
  return { gpuMs, storageMs: ms, networkBytes, gpuCost, storageCost, networkCost, total: gpuCost + storageCost + networkCost };
}

/** Interval boundaries strictly after `from` and at or before `to`. */
export function boundariesBetween(fromMs: number, toMs: number, intervalMs: number): number[] {
  const out: number[] = [];
  for (let b = Math.floor(fromMs / intervalMs) * intervalMs + intervalMs; b <= toMs; b += intervalMs) out.push(b);
  return out;
}

/** Reads the cumulative traffic counters of some VMs of one node (the hypervisor driver's trafficBytes). */
export type TrafficReader = (node: string, vms: { id: string; vmid: number; node: string; hvRef: string | null }[]) => Promise<Map<string, number>>;

/** Nodes whose traffic counters are read at once. */
const TRAFFIC_READS_AT_ONCE = 8;

/** One period to charge: (vm.billed_until, endMs], GPUs running or not. */
interface Period {
  vm: MeteredVm;
  endMs: number;
  gpuRunning: boolean;
}

/** An active reservation a VM draws on: what is left of it and when its term ends. */
interface Term {
  remainingMicros: number;
  endMs: number;
}

/** The most VMs one close transaction handles (one period each). */
export const CLOSE_BATCH = 2000;
/** Batches one process closes at once on PostgreSQL. */
const CLOSE_LANES = 2;

export interface MeterOptions {
  intervalS: number;
  networkPricePerGbMicros: number;
}

export class Meter {
  constructor(
    private readonly db: Db,
    private readonly clock: Clock,
    private readonly opts: MeterOptions,
  ) {}

  get intervalMs(): number {
    return this.opts.intervalS * 1000;
  }

  /** The last interval boundary at or before `ms`: the periods ending there or earlier are due. */
  private lastBoundary(ms: number): Date {
    return new Date(Math.floor(ms / this.intervalMs) * this.intervalMs);
  }

  private async lockVm(tx: Queryable, id: string): Promise<MeteredVm | undefined> {
    return (await tx.query<MeteredVm>('SELECT * FROM vms WHERE id = $1 FOR UPDATE', [id])).rows[0];
  }

  /** Charges (billed_until, end] as one period in which the VM's GPUs ran or not (see chargePeriods). */
  private async closePeriod(tx: Queryable, vm: MeteredVm, endMs: number, gpuRunning: boolean): Promise<MeteredVm> {
    await this.chargePeriods(tx, [{ vm, endMs, gpuRunning }]);
    if (!vm.billed_until || endMs <= vm.billed_until.getTime()) return vm;
    const networkBytes = Math.max(0, vm.network_bytes_total - vm.network_bytes_billed);
    return { ...vm, billed_until: new Date(endMs), network_bytes_billed: vm.network_bytes_billed + networkBytes };
  }

  /**
   * Charges one period (billed_until, endMs] for each VM, in a fixed number
   * of statements however many VMs there are: the interval job closes
   * thousands at once this way, a transition one. The VMs' rows must be
   * locked by the caller and each VM appear once; `terms` are their active
   * reservations if the caller locked them already. Idempotent: a period
   * already charged (same VM and end) is skipped, and only the periods
   * written here draw on reservations and balances. Returns periods written.
   */
  private async chargePeriods(tx: Queryable, periods: readonly Period[], terms?: Map<string, Term>): Promise<number> {
    const open = periods.filter((p) => p.vm.billed_until && p.endMs > p.vm.billed_until.getTime());
    if (open.length === 0) return 0;
    // Reserved VMs draw on their prepaid reservation first, for periods inside its term only
    // (closeUpTo splits a period at end_at).
    const active = terms ?? (await this.lockReservations(tx, open.map((p) => p.vm)));
    const rows = open.map(({ vm, endMs, gpuRunning }) => {
      const startMs = vm.billed_until!.getTime();
      const networkBytes = Math.max(0, vm.network_bytes_total - vm.network_bytes_billed);
      const c = priceOfPeriod(vm, endMs - startMs, gpuRunning, networkBytes, this.opts.networkPricePerGbMicros);
      const term = vm.reservation_id ? active.get(vm.reservation_id) : undefined;
      const fromReservation = term && term.endMs >= endMs ? Math.min(term.remainingMicros, c.total) : 0;
      if (term) term.remainingMicros -= fromReservation;
      const charge = c.total - fromReservation;
      return { vm, startMs, endMs, c, fromReservation, charge, logId: newId(), transactionId: charge > 0 ? newId() : null };
    });
    const inserted = await tx.query<{ vm_id: string }>(
      `INSERT INTO usage_logs (id, vm_id, user_id, period_start, period_end, gpu_ms, gpu_count, storage_ms, storage_gb, network_bytes,
                               gpu_cost_micros, storage_cost_micros, network_cost_micros, total_cost_micros, reservation_id,
                               from_reservation_micros, transaction_id)
       SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::int8[], $4::timestamptz[], $5::timestamptz[], $6::int8[], $7::int4[], $8::int8[],
                            $9::int4[], $10::int8[], $11::int8[], $12::int8[], $13::int8[], $14::int8[], $15::uuid[], $16::int8[], $17::uuid[])
       ON CONFLICT (vm_id, period_end) DO NOTHING
       RETURNING vm_id`,
      [
        rows.map((r) => r.logId),
        rows.map((r) => r.vm.id),
        rows.map((r) => r.vm.user_id),
        rows.map((r) => new Date(r.startMs).toISOString()),
        rows.map((r) => new Date(r.endMs).toISOString()),
        rows.map((r) => r.c.gpuMs),
        rows.map((r) => r.vm.gpu_count),
        rows.map((r) => r.c.storageMs),
        rows.map((r) => r.vm.storage_gb),
        rows.map((r) => r.c.networkBytes),
        rows.map((r) => r.c.gpuCost),
        rows.map((r) => r.c.storageCost),
        rows.map((r) => r.c.networkCost),
        rows.map((r) => r.c.total),
        rows.map((r) => r.vm.reservation_id),
        rows.map((r) => r.fromReservation),
        rows.map((r) => r.transactionId),
      ],
    );
    // `vms.id = ANY(...)` finds the rows by primary key, never a scan of the fleet.
    await tx.query(
      `UPDATE vms SET billed_until = u.billed_until, network_bytes_billed = u.network_bytes_billed
         FROM unnest($1::uuid[], $2::timestamptz[], $3::int8[]) AS u(id, billed_until, network_bytes_billed)
        WHERE vms.id = u.id AND vms.id = ANY($1::uuid[])`,
      [rows.map((r) => r.vm.id), rows.map((r) => new Date(r.endMs).toISOString()), rows.map((r) => r.vm.network_bytes_billed + r.c.networkBytes)],
    );
    // A period charged already (the unique key) moves billed_until on but costs nothing again.
    const written = new Set(inserted.rows.map((r) => r.vm_id));
    const charged = rows.filter((r) => written.has(r.vm.id));
    const draws = charged.filter((r) => r.fromReservation > 0);
    if (draws.length) {
      await tx.query(
        `UPDATE reservations SET remaining_micros = remaining_micros - d.amount
           FROM (SELECT id, sum(amount) AS amount FROM unnest($1::uuid[], $2::int8[]) AS u(id, amount) GROUP BY id) AS d
          WHERE reservations.id = d.id`,
        [draws.map((r) => r.vm.reservation_id), draws.map((r) => r.fromReservation)],
      );
    }
    const charges = charged.filter((r) => r.charge > 0);
    const posted = await ledger.postMany(
      tx,
      charges.map((r) => {
        const start = new Date(r.startMs).toISOString();
        const end = new Date(r.endMs).toISOString();
        return {
          userId: r.vm.user_id,
          type: 'charge' as const,
          amountMicros: -r.charge,
          description: `Usage of VM ${r.vm.vmid} from ${start} to ${end}`,
          breakdown: {
            vm_id: r.vm.id,
            vmid: r.vm.vmid,
            period_start: start,
            period_end: end,
            gpu_seconds: r.c.gpuMs / 1000,
            storage_gb: r.vm.storage_gb,
            network_bytes: r.c.networkBytes,
            gpu_cost: toAmount(r.c.gpuCost),
            storage_cost: toAmount(r.c.storageCost),
            network_cost: toAmount(r.c.networkCost),
            from_reservation: toAmount(r.fromReservation),
            total_cost: toAmount(r.c.total),
          },
          vmId: r.vm.id,
          now: new Date(r.endMs),
          id: r.transactionId!,
        };
      }),
    );
    // A charge that leaves the balance at or below zero flags the user: the
    // low-balance job stops their running VMs. The charge that crosses zero
    // is recorded once as an event, for admins (and later webhooks).
    const low = new Set<number>();
    const crossings: { userId: number; vmId: string; data: string; at: string }[] = [];
    charges.forEach((r, i) => {
      const after = posted[i]!.balanceAfterMicros;
      if (after > 0) return;
      low.add(r.vm.user_id);
      if (after + r.charge > 0) {
        crossings.push({
          userId: r.vm.user_id,
          vmId: r.vm.id,
          data: JSON.stringify({ balance: toAmount(after), charge: toAmount(r.charge), transaction_id: posted[i]!.id }),
          at: new Date(r.endMs).toISOString(),
        });
      }
    });
    if (low.size) await tx.query('UPDATE users SET low_balance_pending = true WHERE id = ANY($1::int8[])', [[...low]]);
    if (crossings.length) {
      await tx.query(
        `INSERT INTO events (id, type, user_id, vm_id, data, created_at)
         SELECT id, 'billing.low_balance', user_id, vm_id, data::jsonb, created_at
           FROM unnest($1::uuid[], $2::int8[], $3::uuid[], $4::text[], $5::timestamptz[]) WITH ORDINALITY AS e(id, user_id, vm_id, data, created_at, n)
          ORDER BY n`,
        [crossings.map(() => newId()), crossings.map((e) => e.userId), crossings.map((e) => e.vmId), crossings.map((e) => e.data), crossings.map((e) => e.at)],
      );
    }
    return written.size;
  }

  /** Closes every interval boundary in (billed_until, endMs], then (optionally) the period ending exactly at endMs. */
  private async closeUpTo(tx: Queryable, vm: MeteredVm, endMs: number, gpuRunning: boolean, closeAtEnd: boolean): Promise<MeteredVm> {
    if (!vm.billed_until) return vm;
    let cur = vm;
    const cuts = boundariesBetween(vm.billed_until.getTime(), endMs, this.intervalMs);
    if (vm.reservation_id) {
      // The end of a reservation's term also closes a period: what follows is not drawn from it (D39).
      const r = await tx.query<{ end_at: Date }>(`SELECT end_at FROM reservations WHERE id = $1 AND status = 'active'`, [vm.reservation_id]);
      const end = r.rows[0]?.end_at.getTime();
      if (end !== undefined && end > vm.billed_until.getTime() && end < endMs && !cuts.includes(end)) {
        cuts.push(end);
        cuts.sort((a, b) => a - b);
      }
    }
    for (const b of cuts) cur = await this.closePeriod(tx, cur, b, gpuRunning);
    if (closeAtEnd) cur = await this.closePeriod(tx, cur, endMs, gpuRunning);
    return cur;
  }

  /**
   * Transition hook (runs in the transaction of every VM status change):
   * the first start opens billing; leaving or entering `running`, and
   * destroy, close the period at this instant.
   */
  async onTransition(tx: Queryable, before: { id: string; status: string }, after: { id: string; status: string }, now: Date): Promise<void> {
    const wasRunning = before.status === 'running';
    const isRunning = after.status === 'running';
    const destroyed = after.status === 'destroyed';
    if (wasRunning === isRunning && !destroyed) return;
    const vm = await this.lockVm(tx, after.id);
    if (!vm) return;
    if (!vm.billed_until) {
      if (isRunning) await tx.query('UPDATE vms SET billed_until = $2 WHERE id = $1', [vm.id, now]);
      return;
    }
    await this.closeUpTo(tx, vm, now.getTime(), wasRunning, true);
  }

  /**
   * A VM that interrupted other customers' VMs pays at least one billing
   * period of itself (GPUs running), however soon it is destroyed: otherwise
   * creating and destroying an on-demand VM would interrupt others for free.
   * Called in the destroy's transaction, after its last period was closed;
   * charges the difference between that minimum and what its usage cost.
   */
  async chargePreemptionMinimum(tx: Queryable, vmId: string, now: Date): Promise<number> {
    const preempted = await tx.query('SELECT 1 FROM interruptions WHERE preempted_by_vm_id = $1 LIMIT 1', [vmId]);
    if (preempted.rows.length === 0) return 0;
    const vm = await this.lockVm(tx, vmId);
    if (!vm) return 0;
    const minimum = priceOfPeriod(vm, this.intervalMs, true, 0, 0).total;
    const billed = await tx.query<{ total: number }>('SELECT COALESCE(SUM(total_cost_micros), 0)::int8 AS total FROM usage_logs WHERE vm_id = $1', [vmId]);
    const owed = minimum - Number(billed.rows[0]!.total);
    if (owed <= 0) return 0;
    const t = await ledger.post(tx, {
      userId: vm.user_id,
      type: 'charge',
      amountMicros: -owed,
      description: `Minimum charge of VM ${vm.vmid}: it interrupted other VMs, so it pays at least one billing period`,
      breakdown: { vm_id: vm.id, vmid: vm.vmid, minimum: toAmount(minimum), usage: toAmount(minimum - owed), minimum_charge: toAmount(owed) },
      vmId: vm.id,
      now,
    });
    if (t.balance_after_micros <= 0) await tx.query('UPDATE users SET low_balance_pending = true WHERE id = $1', [vm.user_id]);
    return owed;
  }

  /** Closes the VM's open period at `now` (before its rates or reservation change). */
  async closeAt(tx: Queryable, vmId: string, now: Date): Promise<void> {
    const vm = await this.lockVm(tx, vmId);
    if (!vm || !vm.billed_until || vm.status === 'destroyed') return;
    await this.closeUpTo(tx, vm, now.getTime(), vm.status === 'running', true);
  }

  /**
   * The interval job: closes every boundary that has passed for every VM
   * that accrues, period by period across the fleet (the oldest open period
   * first), a batch of VMs per transaction. Batches are claimed with
   * FOR UPDATE SKIP LOCKED, so several workers split a close between them
   * instead of queueing on each other's locks. `signal` stops it between
   * batches (a worker shutting down). Returns periods written.
   */
  async closeDueIntervals(now: Date, opts: { batch?: number; signal?: AbortSignal } = {}): Promise<number> {
    const batch = opts.batch ?? CLOSE_BATCH;
    const nowMs = now.getTime();
    const lastBoundary = this.lastBoundary(nowMs);
    let written = 0;
    const lane = async () => {
      // A stopping worker ends after the batch in hand; the rest is closed by the next pass, anywhere.
      while (!opts.signal?.aborted) {
        const r = await this.db.transaction((tx) => this.closeBatch(tx, nowMs, lastBoundary, batch));
        written += r.written;
        if (r.claimed === 0) return;
      }
    };
    // On PostgreSQL two batches are in flight at once (the database works on one while this
    // process prices the next); the embedded database runs one transaction at a time anyway.
    await Promise.all(Array.from({ length: this.db.kind === 'postgres' ? CLOSE_LANES : 1 }, lane));
    return written;
  }

  /**
   * The active reservations the VMs draw on, locked (after the VMs: the
   * lock order is VM, reservation, balance). Reserved VMs draw on their
   * prepaid reservation first, for periods inside its term only.
   */
  private async lockReservations(tx: Queryable, vms: readonly MeteredVm[]): Promise<Map<string, Term>> {
    const ids = [...new Set(vms.flatMap((vm) => (vm.reservation_id ? [vm.reservation_id] : [])))];
    const terms = new Map<string, Term>();
    if (ids.length === 0) return terms;
    const r = await tx.query<{ id: string; remaining_micros: number; end_at: Date }>(
      `SELECT id, remaining_micros, end_at FROM reservations WHERE id = ANY($1::uuid[]) AND status = 'active' ORDER BY id FOR UPDATE`,
      [ids],
    );
    for (const row of r.rows) terms.set(row.id, { remainingMicros: row.remaining_micros, endMs: row.end_at.getTime() });
    return terms;
  }

  /** One period of up to `limit` VMs whose open period began before `lastBoundary`. */
  private async closeBatch(tx: Queryable, nowMs: number, lastBoundary: Date, limit: number): Promise<{ claimed: number; written: number }> {
    const due = await tx.query<MeteredVm>(
      `SELECT id, vmid, user_id, status, gpu_count, storage_gb, gpu_hourly_rate_micros, storage_hourly_rate_micros,
              reservation_id, billed_until, network_bytes_total, network_bytes_billed
         FROM vms
        WHERE billed_until IS NOT NULL AND status <> 'destroyed' AND billed_until < $1
        ORDER BY billed_until
        LIMIT $2
        FOR UPDATE SKIP LOCKED`,
      [lastBoundary, limit],
    );
    const terms = await this.lockReservations(tx, due.rows);
    const periods = due.rows.map((vm) => {
      const startMs = vm.billed_until!.getTime();
      let endMs = this.lastBoundary(startMs).getTime() + this.intervalMs;
      // The end of a reservation's term also closes a period: what follows is not drawn from it.
      const termEnd = vm.reservation_id ? terms.get(vm.reservation_id)?.endMs : undefined;
      if (termEnd !== undefined && termEnd > startMs && termEnd < endMs && termEnd < nowMs) endMs = termEnd;
      return { vm, endMs, gpuRunning: vm.status === 'running' };
    });
    return { claimed: periods.length, written: await this.chargePeriods(tx, periods, terms) };
  }

  /** D33: users a charge left at or below zero; the caller stops their running VMs and clears the flag. */
  async lowBalanceUsers(): Promise<number[]> {
    const r = await this.db.query<{ id: number }>('SELECT id FROM users WHERE low_balance_pending ORDER BY id');
    return r.rows.map((x) => x.id);
  }

  /**
   * Reads the traffic counters of the VMs whose period closes now (before
   * the close that bills them), one driver call per node for all its VMs,
   * a few at a time, outside any transaction. With nothing due it costs one
   * indexed query. Returns the VMs whose counter moved.
   */
  async sampleTraffic(now: Date, read: TrafficReader): Promise<number> {
    const lastBoundary = this.lastBoundary(now.getTime());
    const due = await this.db.query<{ id: string; vmid: number; node: string; hv_ref: string | null; network_bytes_total: number }>(
      `SELECT id, vmid, node, hv_ref, network_bytes_total FROM vms
        WHERE billed_until IS NOT NULL AND status <> 'destroyed' AND billed_until < $1 AND provisioned`,
      [lastBoundary],
    );
    const byNode = new Map<string, typeof due.rows>();
    for (const v of due.rows) {
      const list = byNode.get(v.node);
      if (list) list.push(v);
      else byNode.set(v.node, [v]);
    }
    const moved: { id: string; bytes: number }[] = [];
    const nodes = [...byNode];
    const next = async (): Promise<void> => {
      for (let entry = nodes.pop(); entry; entry = nodes.pop()) {
        const [node, vms] = entry;
        const counters = await read(node, vms.map((v) => ({ id: v.id, vmid: v.vmid, node: v.node, hvRef: v.hv_ref })));
        for (const v of vms) {
          const bytes = counters.get(v.id);
          if (bytes !== undefined && bytes > v.network_bytes_total) moved.push({ id: v.id, bytes });
        }
      }
    };
    await Promise.all(Array.from({ length: TRAFFIC_READS_AT_ONCE }, next));
    for (let i = 0; i < moved.length; i += CLOSE_BATCH) {
      const chunk = moved.slice(i, i + CLOSE_BATCH);
      await this.db.query(
        `UPDATE vms SET network_bytes_total = GREATEST(network_bytes_total, u.bytes)
           FROM unnest($1::uuid[], $2::int8[]) AS u(id, bytes) WHERE vms.id = u.id AND vms.id = ANY($1::uuid[])`,
        [chunk.map((m) => m.id), chunk.map((m) => m.bytes)],
      );
    }
    return moved.length;
  }

  /** Clears a user's low-balance flag (after their VMs were stopped). */
  async clearLowBalance(tx: Queryable, userId: number): Promise<void> {
    await tx.query('UPDATE users SET low_balance_pending = false WHERE id = $1', [userId]);
  }
}
