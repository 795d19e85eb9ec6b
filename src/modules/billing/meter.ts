/**
 * Metering (docs/metering.md). GPU time is counted while a VM is running,
 * storage from its first start until it is destroyed. A period closes at
 * every multiple of the billing interval (from the Unix epoch) and at every
 * transition into or out of `running` and at destroy; each close writes one
 * usage log and one `charge` transaction. The unique key (vm_id, period_end)
 * makes a period chargeable exactly once, whatever the number of instances
 * or crashes. Amounts: integer micro-units, each part rounded half-up.
 * Here: transitions and interval closes. The arithmetic is in meter-periods.ts,
 * the traffic counters' sampling in meter-traffic.ts, what the manual clock's
 * advance asks (its budget, the low-balance boundary) in meter-advance.ts.
 */
import type { Db, Queryable } from '../../db/db.js';
import { yieldToIo, type Clock } from '../../clock.js';
import { newOrderedId } from '../../ids.js';
import { toAmount } from '../../money.js';
import * as ledger from './ledger.js';
import * as repo from './meter-repository.js';
import type { MeteredVm } from './meter-repository.js';
import { recordEvent } from '../events/service.js';
import { boundariesBetween, lastBoundary, priceOfPeriod } from './meter-periods.js';
import { sampleTraffic, type TrafficReader } from './meter-traffic.js';
import { nextLowBalanceBoundary, periodsUpTo, refuseLargeAdvance } from './meter-advance.js';

export type { MeteredVm } from './meter-repository.js';
export { ADVANCE_PERIOD_BUDGET } from './meter-advance.js';

/** One period of a VM to charge: (startMs, endMs], GPUs running or not, with the traffic billed in it. */
interface Period {
  vm: MeteredVm;
  startMs: number;
  endMs: number;
  gpuRunning: boolean;
  networkBytes: number;
}

/** The most periods one close transaction charges. */
export const CLOSE_BATCH = 2000;
/** Batches one process closes at once on PostgreSQL. */
const CLOSE_LANES = 2;

export interface MeterOptions {
  intervalS: number;
  networkPricePerGbMicros: number;
  /** Customer images' storage per GB-hour: it counts toward a balance reaching zero too. */
  imagePriceGbHourMicros?: number;
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
    return lastBoundary(ms, this.intervalMs);
  }

  /**
   * The VM, locked, then its meter, locked (the lock order is VM, meter,
   * reservation, balance): a close holding the meter finishes first, and
   * billed_until is read after it.
   */
  private async lockVm(tx: Queryable, id: string): Promise<MeteredVm | undefined> {
    const vm = await repo.lockMeteredVm(tx, id);
    if (!vm) return undefined;
    const meter = await repo.lockMeter(tx, id);
    return { ...vm, billed_until: meter?.billed_until ?? null, network_bytes_billed: meter?.network_bytes_billed ?? 0 };
  }

  /**
   * Locks the meters of VMs whose status a transaction is about to change, before it takes any
   * balance (the lock order is VM, meter, reservation, balance): their closes then run on meters
   * already held. The caller holds the VMs' rows.
   */
  async lockMeters(tx: Queryable, vmIds: readonly string[]): Promise<void> {
    if (vmIds.length > 0) await repo.lockMeters(tx, vmIds);
  }

  /**
   * The periods of `vm` from its billed_until up to `untilMs`: one ending at
   * every interval boundary in between, and at `termEndMs` (the end of the
   * reservation it draws on: what follows is not drawn from it), its GPUs
   * running throughout or not. With `closeAtEnd` the last one ends at
   * `untilMs` itself (a transition), otherwise at the last boundary. At
   * most `max` periods, oldest first; the VM's unbilled traffic goes to the
   * first.
   */
  private periodsOf(
    vm: MeteredVm,
    untilMs: number,
    gpuRunning: boolean,
    closeAtEnd: boolean,
    termEndMs: number | undefined,
    max = Infinity,
  ): Period[] {
    if (!vm.billed_until) return [];
    const fromMs = vm.billed_until.getTime();
    const ends = boundariesBetween(fromMs, untilMs, this.intervalMs);
    if (termEndMs !== undefined && termEndMs > fromMs && termEndMs < untilMs && !ends.includes(termEndMs)) {
      ends.push(termEndMs);
      ends.sort((x, y) => x - y);
    }
    if (closeAtEnd && untilMs > fromMs && ends[ends.length - 1] !== untilMs) ends.push(untilMs);
    let networkBytes = Math.max(0, vm.network_bytes_total - vm.network_bytes_billed);
    const periods: Period[] = [];
    let startMs = fromMs;
    for (const endMs of ends.slice(0, max)) {
      periods.push({ vm, startMs, endMs, gpuRunning, networkBytes });
      networkBytes = 0;
      startMs = endMs;
    }
    return periods;
  }

  /**
   * Charges the given periods, in one statement however many there are: the
   * interval job closes thousands at once this way, a transition one VM's
   * few. The VMs' meter rows (vm_meters) and their active reservations must
   * be locked by the caller (a transition holds the VM's row too, the
   * interval job only the meters it claimed), and each VM's periods follow
   * on from its billed_until in order.
   * Prices are computed here (priceOfPeriod); the statement
   * (chargePeriods in meter-repository.ts) draws on reservations, posts the
   * charges and moves billed_until. Idempotent: a period already charged
   * (same VM and end) is skipped, and only the periods written here draw on
   * reservations and balances. Returns periods written.
   */
  private async chargePeriods(tx: Queryable, periods: readonly Period[]): Promise<number> {
    if (periods.length === 0) return 0;
    // Oldest first across VMs: each user's charges (and the balances they leave) follow time.
    const ordered = [...periods].sort((x, y) => x.endMs - y.endMs);
    const priced = ordered.map((p) =>
      priceOfPeriod(p.vm, p.endMs - p.startMs, p.gpuRunning, p.networkBytes, this.opts.networkPricePerGbMicros),
    );
    const { written, crossings, exhausted } = await repo.chargePeriods(tx, {
      vmIds: ordered.map((p) => p.vm.id),
      userIds: ordered.map((p) => p.vm.user_id),
      vmids: ordered.map((p) => p.vm.vmid),
      gpuCounts: ordered.map((p) => p.vm.gpu_count),
      storageGbs: ordered.map((p) => p.vm.storage_gb),
      reservationIds: ordered.map((p) => p.vm.reservation_id),
      periodStarts: ordered.map((p) => new Date(p.startMs).toISOString()),
      periodEnds: ordered.map((p) => new Date(p.endMs).toISOString()),
      gpuMs: priced.map((c) => c.gpuMs),
      storageMs: priced.map((c) => c.storageMs),
      networkBytes: priced.map((c) => c.networkBytes),
      gpuCosts: priced.map((c) => c.gpuCost),
      storageCosts: priced.map((c) => c.storageCost),
      networkCosts: priced.map((c) => c.networkCost),
      logIds: ordered.map(() => newOrderedId()),
      transactionIds: ordered.map(() => newOrderedId()),
    });
    // A reservation whose prepaid balance these draws used up: what follows is charged to the balance.
    for (const e of exhausted ?? []) {
      await recordEvent(tx, {
        type: 'reservation.exhausted',
        userId: e.user_id,
        vmId: e.vm_id,
        data: { reservation_id: e.reservation_id },
        at: new Date(e.at),
      });
    }
    // The charge that crosses zero is recorded once as an event, for admins (and later webhooks).
    for (const e of crossings ?? []) {
      const data = { balance: toAmount(e.balance_after), charge: toAmount(e.charge), transaction_id: e.transaction_id };
      await recordEvent(tx, {
        type: 'billing.low_balance',
        userId: e.user_id,
        vmId: e.vm_id,
        data,
        at: new Date(e.at),
      });
    }
    return Number(written);
  }

  /** Closes every interval boundary in (billed_until, endMs], then (optionally) the period ending exactly at endMs. */
  private async closeUpTo(
    tx: Queryable,
    vm: MeteredVm,
    endMs: number,
    gpuRunning: boolean,
    closeAtEnd: boolean,
  ): Promise<void> {
    if (!vm.billed_until) return;
    const termEnds = await this.lockReservations(tx, [vm]);
    const termEnd = vm.reservation_id ? termEnds.get(vm.reservation_id) : undefined;
    await this.chargePeriods(tx, this.periodsOf(vm, endMs, gpuRunning, closeAtEnd, termEnd));
  }

  /**
   * Transition hook (runs in the transaction of every VM status change):
   * the first start opens billing; leaving or entering `running`, and
   * destroy, close the period at this instant.
   */
  async onTransition(
    tx: Queryable,
    before: { id: string; status: string },
    after: { id: string; status: string },
    now: Date,
  ): Promise<void> {
    const wasRunning = before.status === 'running';
    const isRunning = after.status === 'running';
    const destroyed = after.status === 'destroyed';
    if (wasRunning === isRunning && !destroyed) return;
    const vm = await this.lockVm(tx, after.id);
    if (!vm) return;
    if (!vm.billed_until) {
      if (isRunning) await repo.insertMeter(tx, vm.id, now);
      return;
    }
    await this.closeUpTo(tx, vm, now.getTime(), wasRunning, true);
    // A destroyed VM's billing is over: its last period is closed.
    if (destroyed) await repo.deleteMeter(tx, vm.id);
  }

  /**
   * A VM that interrupted other customers' VMs pays at least one billing
   * period of itself (GPUs running), however soon it is destroyed: otherwise
   * creating and destroying an on-demand VM would interrupt others for free.
   * Called in the destroy's transaction, after its last period was closed;
   * charges the difference between that minimum and what its usage cost.
   */
  async chargePreemptionMinimum(tx: Queryable, vmId: string, now: Date): Promise<number> {
    if (!(await repo.preemptedOthers(tx, vmId))) return 0;
    const vm = await this.lockVm(tx, vmId);
    if (!vm) return 0;
    const minimum = priceOfPeriod(vm, this.intervalMs, true, 0, 0).total;
    const billed = await repo.usageTotalOfVm(tx, vmId);
    const owed = minimum - Number(billed.total);
    if (owed <= 0) return 0;
    const t = await ledger.post(tx, {
      userId: vm.user_id,
      type: 'charge',
      amountMicros: -owed,
      description: `Minimum charge of VM ${vm.vmid}: it interrupted other VMs, so it pays at least one billing period`,
      breakdown: {
        vm_id: vm.id,
        vmid: vm.vmid,
        minimum: toAmount(minimum),
        usage: toAmount(minimum - owed),
        minimum_charge: toAmount(owed),
      },
      vmId: vm.id,
      now,
    });
    if (t.balance_after_micros <= 0) await repo.markLowBalance(tx, vm.user_id);
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
    const lastBoundary = this.lastBoundary(now.getTime());
    let written = 0;
    let failed = false;
    const lane = async () => {
      // A stopping worker ends after the batch in hand; the rest is closed by the next pass, anywhere.
      while (!opts.signal?.aborted && !failed) {
        try {
          const r = await this.db.transaction((tx) => this.closeBatch(tx, lastBoundary, batch));
          written += r.written;
          if (r.claimed === 0) return;
          await yieldToIo(); // requests waiting meanwhile go first: a catch-up of a day holds none of them
        } catch (err) {
          failed = true; // the other lane stops after its batch: nothing goes on once this call has failed
          throw err;
        }
      }
    };
    // On PostgreSQL two batches are in flight at once (the database works on one while this
    // process prices the next); the embedded database runs one transaction at a time anyway.
    const lanes = await Promise.allSettled(Array.from({ length: this.db.kind === 'postgres' ? CLOSE_LANES : 1 }, lane));
    const failure = lanes.find((l): l is PromiseRejectedResult => l.status === 'rejected');
    if (failure) throw failure.reason;
    return written;
  }

  /**
   * The active reservations the VMs draw on, locked (after the VMs' meters:
   * the lock order is VM, meter, reservation, balance), and when their terms end.
   * Reserved VMs draw on their prepaid reservation first, for periods
   * inside its term only.
   */
  private async lockReservations(tx: Queryable, vms: readonly MeteredVm[]): Promise<Map<string, number>> {
    const ids = [...new Set(vms.flatMap((vm) => (vm.reservation_id ? [vm.reservation_id] : [])))];
    const termEnds = new Map<string, number>();
    if (ids.length === 0) return termEnds;
    for (const row of await repo.lockActiveReservations(tx, ids)) termEnds.set(row.id, row.end_at.getTime());
    return termEnds;
  }

  /**
   * Up to `budget` due periods (those ending at or before `lastBoundary`),
   * oldest first: a VM one period behind gives one, a VM a day behind (its
   * worker was down) all of its day's, so a catch-up claims each VM once.
   * The oldest open period decides how many VMs a batch claims.
   */
  private async closeBatch(
    tx: Queryable,
    lastBoundary: Date,
    budget: number,
  ): Promise<{ claimed: number; written: number }> {
    const oldest = await repo.oldestDueMeter(tx, lastBoundary);
    if (!oldest) return { claimed: 0, written: 0 };
    await repo.readByKey(tx);
    const behind = Math.ceil((lastBoundary.getTime() - oldest.billed_until.getTime()) / this.intervalMs);
    const due = await repo.claimDueMeters(tx, lastBoundary, Math.max(1, Math.floor(budget / Math.max(1, behind))));
    if (due.length === 0) return { claimed: 0, written: 0 };
    const termEnds = await this.lockReservations(tx, due);
    const perVm = Math.max(1, Math.floor(budget / due.length));
    const periods = due.flatMap((vm) =>
      this.periodsOf(
        vm,
        lastBoundary.getTime(),
        vm.status === 'running',
        false,
        vm.reservation_id ? termEnds.get(vm.reservation_id) : undefined,
        perVm,
      ),
    );
    return { claimed: due.length, written: await this.chargePeriods(tx, periods) };
  }

  // ---- the manual clock's advance (meter-advance.ts) ----

  /** How many periods closing every boundary up to `toMs` writes (about), and over how many VMs. */
  async periodsUpTo(toMs: number): Promise<{ periods: number; vms: number }> {
    return periodsUpTo(this.db, this.intervalMs, toMs);
  }

  /** Refuses (400 limit_exceeded) an advance to `toMs` that would close more than ADVANCE_PERIOD_BUDGET periods. */
  async refuseLargeAdvance(toMs: number): Promise<void> {
    return refuseLargeAdvance(this.db, this.opts.intervalS, toMs);
  }

  /** The first boundary after `nowMs` at which a charge could leave a user with a running VM at or below zero. */
  async nextLowBalanceBoundary(nowMs: number): Promise<number | null> {
    return nextLowBalanceBoundary(
      this.db,
      {
        intervalS: this.opts.intervalS,
        networkPricePerGbMicros: this.opts.networkPricePerGbMicros,
        imagePriceGbHourMicros: this.opts.imagePriceGbHourMicros ?? 0,
      },
      nowMs,
    );
  }

  // ---- low balance and traffic ----

  /** Users a charge left at or below zero; the caller stops their running VMs and clears the flag. */
  async lowBalanceUsers(): Promise<number[]> {
    return (await repo.lowBalanceUsers(this.db)).map((x) => x.id);
  }

  /**
   * Reads the traffic counters of the VMs whose period closes now (before
   * the close that bills them), or with `all` of every VM that accrues (the
   * manual clock's advance, before it judges how far it may go): see
   * meter-traffic.ts. With nothing due it costs one indexed query. Returns
   * the VMs whose counter moved.
   */
  async sampleTraffic(now: Date, read: TrafficReader, opts: { all?: boolean } = {}): Promise<number> {
    return sampleTraffic(this.db, opts.all ? 'infinity' : this.lastBoundary(now.getTime()), read, CLOSE_BATCH);
  }

  /** Clears a user's low-balance flag (after their VMs were stopped). */
  async clearLowBalance(tx: Queryable, userId: number): Promise<void> {
    await repo.clearLowBalance(tx, userId);
  }
}
