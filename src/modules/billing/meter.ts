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

  private async lockVm(tx: Queryable, id: string): Promise<MeteredVm | undefined> {
    return (await tx.query<MeteredVm>('SELECT * FROM vms WHERE id = $1 FOR UPDATE', [id])).rows[0];
  }

  /**
   * Charges (billed_until, end] as one period in which the VM's GPUs ran or
   * not. Idempotent: a period already charged (same vm and end) is skipped.
   */
  private async closePeriod(tx: Queryable, vm: MeteredVm, endMs: number, gpuRunning: boolean): Promise<MeteredVm> {
    if (!vm.billed_until) return vm;
    const startMs = vm.billed_until.getTime();
    if (endMs <= startMs) return vm;
    const networkBytes = Math.max(0, vm.network_bytes_total - vm.network_bytes_billed);
    const c = priceOfPeriod(vm, endMs - startMs, gpuRunning, networkBytes, this.opts.networkPricePerGbMicros);
    const logId = newId();
    const inserted = await tx.query(
      `INSERT INTO usage_logs (id, vm_id, user_id, period_start, period_end, gpu_ms, gpu_count, storage_ms, storage_gb, network_bytes,
                               gpu_cost_micros, storage_cost_micros, network_cost_micros, total_cost_micros, reservation_id)
       VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)
       ON CONFLICT (vm_id, period_end) DO NOTHING`,
      [logId, vm.id, vm.user_id, new Date(startMs), new Date(endMs), c.gpuMs, vm.gpu_count, c.storageMs, vm.storage_gb, c.networkBytes,
        c.gpuCost, c.storageCost, c.networkCost, c.total, vm.reservation_id],
    );
    const next = { ...vm, billed_until: new Date(endMs), network_bytes_billed: vm.network_bytes_billed + networkBytes };
    await tx.query('UPDATE vms SET billed_until = $2, network_bytes_billed = $3 WHERE id = $1', [vm.id, next.billed_until, next.network_bytes_billed]);
    if (inserted.rowCount !== 1) return next; // this period was charged already
    // Reserved VMs draw on their prepaid reservation first (D32, D37).
    let fromReservation = 0;
    if (vm.reservation_id && c.total > 0) {
      // Only periods inside the term draw on it (closeUpTo splits a period at end_at).
      const r = await tx.query<{ remaining_micros: number }>(
        `SELECT remaining_micros FROM reservations WHERE id = $1 AND status = 'active' AND end_at >= $2 FOR UPDATE`,
        [vm.reservation_id, new Date(endMs)],
      );
      const remaining = r.rows[0]?.remaining_micros ?? 0;
      fromReservation = Math.min(remaining, c.total);
      if (fromReservation > 0) {
        await tx.query('UPDATE reservations SET remaining_micros = remaining_micros - $2 WHERE id = $1', [vm.reservation_id, fromReservation]);
      }
    }
    const charge = c.total - fromReservation;
    let transactionId: string | null = null;
    if (charge > 0) {
      const t = await ledger.post(tx, {
        userId: vm.user_id,
        type: 'charge',
        amountMicros: -charge,
        description: `Usage of VM ${vm.vmid} from ${new Date(startMs).toISOString()} to ${new Date(endMs).toISOString()}`,
        breakdown: {
          vm_id: vm.id,
          vmid: vm.vmid,
          period_start: new Date(startMs).toISOString(),
          period_end: new Date(endMs).toISOString(),
          gpu_seconds: c.gpuMs / 1000,
          storage_gb: vm.storage_gb,
          network_bytes: c.networkBytes,
          gpu_cost: toAmount(c.gpuCost),
          storage_cost: toAmount(c.storageCost),
          network_cost: toAmount(c.networkCost),
          from_reservation: toAmount(fromReservation),
          total_cost: toAmount(c.total),
        },
        vmId: vm.id,
        now: new Date(endMs),
      });
      transactionId = t.id;
      if (t.balance_after_micros <= 0) {
        // D33: the running VMs of this user are stopped by the metering job ...
        await tx.query('UPDATE users SET low_balance_pending = true WHERE id = $1', [vm.user_id]);
      }
      if (t.balance_after_micros <= 0 && t.balance_after_micros + charge > 0) {
        // ... and the moment the balance crosses zero is recorded once, for admins (and later webhooks).
        await tx.query(
          `INSERT INTO events (id, type, user_id, vm_id, data, created_at) VALUES ($1, 'billing.low_balance', $2, $3, $4, $5)`,
          [newId(), vm.user_id, vm.id, JSON.stringify({ balance: toAmount(t.balance_after_micros), charge: toAmount(charge), transaction_id: t.id }), new Date(endMs)],
        );
      }
    }
    await tx.query('UPDATE usage_logs SET from_reservation_micros = $2, transaction_id = $3 WHERE id = $1', [logId, fromReservation, transactionId]);
    return next;
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

  /** The interval job: closes every boundary that has passed for every VM that accrues. Returns periods written. */
  async closeDueIntervals(now: Date): Promise<number> {
    const nowMs = now.getTime();
    const due = await this.db.query<{ id: string }>(
      `SELECT id FROM vms WHERE billed_until IS NOT NULL AND status <> 'destroyed'
          AND billed_until < to_timestamp(floor(extract(epoch FROM $1::timestamptz) / $2) * $2)
        ORDER BY seq`,
      [now, this.opts.intervalS],
    );
    let written = 0;
    for (const { id } of due.rows) {
      written += await this.db.transaction(async (tx) => {
        const vm = await this.lockVm(tx, id);
        if (!vm || !vm.billed_until || vm.status === 'destroyed') return 0;
        const before = vm.billed_until.getTime();
        const after = await this.closeUpTo(tx, vm, nowMs, vm.status === 'running', false);
        return after.billed_until!.getTime() > before ? 1 : 0;
      });
    }
    return written;
  }

  /** D33: users a charge left at or below zero; the caller stops their running VMs and clears the flag. */
  async lowBalanceUsers(): Promise<number[]> {
    const r = await this.db.query<{ id: number }>('SELECT id FROM users WHERE low_balance_pending ORDER BY id');
    return r.rows.map((x) => x.id);
  }

  /** Samples the driver's traffic counters of VMs that accrue (outside any transaction; D32 network). */
  async sampleTraffic(read: (vm: { id: string; vmid: number; node: string; hvRef: string | null }) => Promise<number>): Promise<void> {
    const vms = await this.db.query<{ id: string; vmid: number; node: string; hv_ref: string | null; network_bytes_total: number }>(
      `SELECT id, vmid, node, hv_ref, network_bytes_total FROM vms WHERE billed_until IS NOT NULL AND status <> 'destroyed' AND provisioned`,
    );
    for (const v of vms.rows) {
      const bytes = await read({ id: v.id, vmid: v.vmid, node: v.node, hvRef: v.hv_ref });
      if (bytes > v.network_bytes_total) {
        await this.db.query('UPDATE vms SET network_bytes_total = GREATEST(network_bytes_total, $2) WHERE id = $1', [v.id, bytes]);
      }
    }
  }

  /** Clears a user's low-balance flag (after their VMs were stopped). */
  async clearLowBalance(tx: Queryable, userId: number): Promise<void> {
    await tx.query('UPDATE users SET low_balance_pending = false WHERE id = $1', [userId]);
  }
}
