/**
 * Reservations (docs/reservations.md): a 1, 3 or 6-month prepaid commitment at a
 * discount. The deposit is the whole commitment (monthly cost x months) and is
 * taken with the VM's creation; usage draws it down; cancelling keeps 25 % of
 * what remains as a fee and refunds the rest; at the end of the term the VM
 * (if any) goes on as on-demand and nothing is refunded.
 */
import type { Db, Queryable } from '../../db/db.js';
import type { Clock } from '../../clock.js';
import { AppError, invalidState, notFound } from '../../errors.js';
import { newId, UUID_RE } from '../../ids.js';
import { bpToPercent, discounted, formatAmount, mulDiv, toAmount } from '../../money.js';
import * as ledger from '../billing/ledger.js';
import { recordEvent } from '../events/service.js';
import type { Meter } from '../billing/meter.js';
import type { InventoryService } from '../inventory/service.js';
import type { PricingRow } from '../inventory/repository.js';
import * as repo from './repository.js';
import type { ReservationRow } from './repository.js';
import type { ReservationRecord } from './schemas.js';

export const HOURS_PER_MONTH = 730;
export const CANCELLATION_FEE_PERCENT = 25;
export type Months = 1 | 3 | 6;

export interface Quote {
  months: Months;
  discountBp: number;
  gpuHourlyMicros: number;
  storageHourlyMicros: number;
  hourlyMicros: number;
  monthlyMicros: number;
  depositMicros: number;
  feeMicros: number;
}

export function discountBpFor(p: PricingRow, months: Months): number {
  return months === 6
    ? p.reserved_discount_6mo_bp
    : months === 3
      ? p.reserved_discount_3mo_bp
      : p.reserved_discount_1mo_bp;
}

/** The largest prepaid commitment a reservation may be: the largest balance an account may hold. */
export const MAX_COMMITMENT_MICROS = 1_000_000_000 * 1_000_000;

/**
 * The price of a reservation: the same numbers the reserved VM is created with. Per GPU the
 * on-demand price less the term's discount (rounded half-up to the micro-unit), times the GPUs,
 * plus the storage rate; monthly = hourly x 730; deposit = monthly x months (all prepaid); the
 * quoted fee is 25 % of the deposit. See docs/reservations.md#pricing-a-reservation.
 */
export function quote(p: PricingRow, gpuCount: number, storageGb: number, months: Months): Quote {
  const discountBp = discountBpFor(p, months);
  const gpuHourlyMicros = gpuCount * discounted(p.gpu_price_hourly_micros, discountBp);
  const storageHourlyMicros = storageGb * p.storage_price_gb_hourly_micros;
  const hourlyMicros = gpuHourlyMicros + storageHourlyMicros;
  const monthlyMicros = hourlyMicros * HOURS_PER_MONTH;
  const depositMicros = monthlyMicros * months;
  // Prices and sizes the API allows can multiply past what money can hold exactly: such a commitment
  // is refused, never rounded.
  if (!Number.isSafeInteger(depositMicros) || depositMicros > MAX_COMMITMENT_MICROS) {
    throw new AppError(
      'limit_exceeded',
      `A reservation this large (over ${formatAmount(MAX_COMMITMENT_MICROS)} prepaid) is not accepted; reserve fewer GPUs, less disk or fewer months`,
    );
  }
  return {
    months,
    discountBp,
    gpuHourlyMicros,
    storageHourlyMicros,
    hourlyMicros,
    monthlyMicros,
    depositMicros,
    feeMicros: mulDiv(depositMicros, CANCELLATION_FEE_PERCENT, 100),
  };
}

export const toReservationRecord = (r: ReservationRow): ReservationRecord => ({
  id: r.id,
  user_id: r.user_id,
  vm_id: r.vm_id,
  reservation_months: r.reservation_months,
  discount_percent: bpToPercent(r.discount_bp),
  deposit_amount: toAmount(r.deposit_micros),
  remaining_balance: toAmount(r.remaining_micros),
  status: r.status,
  created_at: r.created_at.toISOString(),
  end_at: r.end_at.toISOString(),
  cancelled_at: r.cancelled_at?.toISOString() ?? null,
  cancellation_fee: toAmount(r.cancellation_fee_micros),
  refund_amount: toAmount(r.refund_micros),
  gpu_type: r.gpu_type,
  gpu_count: r.gpu_count,
  storage_gb: r.storage_gb,
});

/** Turns a reserved VM into an on-demand one at current on-demand prices (provided by the VM module). */
export type ConvertVm = (tx: Queryable, vmId: string, now: Date) => Promise<boolean>;

export class ReservationService {
  constructor(
    private readonly db: Db,
    private readonly clock: Clock,
    private readonly inventory: InventoryService,
    private readonly meter: Meter,
    /** The VM module's conversion (src/app.ts composes the two). */
    private readonly convert: ConvertVm,
  ) {}

  async calculate(input: { gpu_type: string; gpu_count: number; storage_gb: number; reservation_months?: Months }) {
    const months = input.reservation_months ?? 1;
    const p = await this.inventory.pricingFor(this.db, input.gpu_type);
    const q = quote(p, input.gpu_count, input.storage_gb, months);
    return {
      discount_percent: bpToPercent(q.discountBp),
      deposit_required: toAmount(q.depositMicros),
      monthly_cost: toAmount(q.monthlyMicros),
      hourly_rate_after_discount: toAmount(q.hourlyMicros),
      cancellation_fee_25_percent: toAmount(q.feeMicros),
      reservation_months: months,
      gpu_type: input.gpu_type,
      gpu_count: input.gpu_count,
      storage_gb: input.storage_gb,
    };
  }

  /**
   * Inside the VM's creation transaction: the reservation and its `deposit` transaction, committed with the VM or not
   * at all.
   */
  async createForVm(
    tx: Queryable,
    a: {
      id?: string;
      userId: number;
      vmId: string;
      vmid: number;
      gpuType: string;
      gpuCount: number;
      storageGb: number;
      quote: Quote;
      now: Date;
    },
  ): Promise<ReservationRow> {
    const id = a.id ?? newId();
    const r = await repo.insertReservation(tx, {
      id,
      user_id: a.userId,
      vm_id: a.vmId,
      gpu_type: a.gpuType,
      gpu_count: a.gpuCount,
      storage_gb: a.storageGb,
      reservation_months: a.quote.months,
      discount_bp: a.quote.discountBp,
      deposit_micros: a.quote.depositMicros,
      created_at: a.now,
      end_at: new Date(a.now.getTime() + a.quote.months * HOURS_PER_MONTH * 3_600_000),
    });
    await ledger.post(tx, {
      userId: a.userId,
      type: 'deposit',
      amountMicros: -a.quote.depositMicros,
      description: `Deposit for a ${a.quote.months}-month reservation of VM ${a.vmid}`,
      breakdown: {
        reservation_id: id,
        reservation_months: a.quote.months,
        discount_percent: bpToPercent(a.quote.discountBp),
        hourly_rate_after_discount: toAmount(a.quote.hourlyMicros),
        monthly_cost: toAmount(a.quote.monthlyMicros),
      },
      vmId: a.vmId,
      now: a.now,
    });
    await recordEvent(tx, {
      type: 'reservation.created',
      userId: a.userId,
      vmId: a.vmId,
      data: {
        reservation_id: id,
        vmid: a.vmid,
        reservation_months: a.quote.months,
        deposit: toAmount(a.quote.depositMicros),
        end_at: r.end_at.toISOString(),
      },
      at: a.now,
    });
    return r;
  }

  /** When the earliest active reservation ends (ms), or null: the manual clock stops there. */
  async nextEndDue(): Promise<number | null> {
    return (await repo.nextEndAt(this.db))?.getTime() ?? null;
  }

  async list(userId: number, limit: number, offset: number): Promise<{ items: ReservationRecord[]; total: number }> {
    const r = await repo.listReservations(this.db, userId, limit, offset);
    return { items: r.rows.map(toReservationRecord), total: r.total };
  }

  /**
   * Cancels an active reservation: 25 % of the remaining balance is kept, 75 % refunded; the VM goes on as on-demand.
   * Rows are locked in the meter's order (the VM, then the reservation, then the user's
   * balance through the ledger), so a cancel racing a metering close, a stop or a destroy of
   * the same VM waits instead of deadlocking.
   */
  async cancel(userId: number, id: string): Promise<ReservationRecord> {
    if (!UUID_RE.test(id)) throw notFound('Reservation');
    const outcome = await this.db.transaction(async (tx) => {
      const found = await repo.findReservation(tx, id, userId);
      if (!found) throw notFound('Reservation');
      await repo.lockVm(tx, found.vm_id);
      const before = (await repo.findReservation(tx, id, userId, true))!;
      if (before.status !== 'active') throw invalidState(`Cannot cancel a reservation that is ${before.status}`);
      const now = this.clock.now();
      if (before.end_at.getTime() <= now.getTime()) {
        // The term is over but the end job has not run yet: end it now (as at end_at, nothing refunded) and refuse.
        return { ended: await this.endLocked(tx, before) };
      }
      // Usage up to now is still drawn from the reservation at the reserved rate.
      await this.meter.closeAt(tx, before.vm_id, now);
      const r = (await repo.findReservation(tx, id, userId, true))!;
      const fee = mulDiv(r.remaining_micros, CANCELLATION_FEE_PERCENT, 100);
      const refund = r.remaining_micros - fee;
      if (refund > 0) {
        await ledger.post(tx, {
          userId,
          type: 'refund',
          amountMicros: refund,
          description: `Refund of the cancelled reservation ${r.id}`,
          breakdown: {
            reservation_id: r.id,
            remaining_balance: toAmount(r.remaining_micros),
            cancellation_fee: toAmount(fee),
            refund_amount: toAmount(refund),
          },
          vmId: r.vm_id,
          now,
        });
      }
      const after = await repo.updateReservation(tx, r.id, {
        status: 'cancelled',
        cancelled_at: now,
        ended_at: now,
        cancellation_fee_micros: fee,
        refund_micros: refund,
        remaining_micros: 0,
      });
      await this.convert(tx, r.vm_id, now);
      await recordEvent(tx, {
        type: 'reservation.cancelled',
        userId,
        vmId: r.vm_id,
        data: { reservation_id: r.id, reason: 'user', refund: toAmount(refund), cancellation_fee: toAmount(fee) },
        at: now,
      });
      return { record: toReservationRecord(after) };
    });
    if ('ended' in outcome)
      throw invalidState(`Cannot cancel a reservation that is ${outcome.ended}: its term is over`);
    return outcome.record;
  }

  /** A reserved VM that ends `failed` has its reservation cancelled without fee, the whole deposit refunded. */
  async refundFailed(tx: Queryable, reservationId: string, now: Date): Promise<void> {
    const r = await repo.findReservation(tx, reservationId, null, true);
    if (!r || r.status !== 'active') return;
    await ledger.post(tx, {
      userId: r.user_id,
      type: 'refund',
      amountMicros: r.remaining_micros,
      description: `Refund of the reservation of a VM that failed to provision`,
      breakdown: {
        reservation_id: r.id,
        remaining_balance: toAmount(r.remaining_micros),
        cancellation_fee: 0,
        refund_amount: toAmount(r.remaining_micros),
      },
      vmId: r.vm_id,
      now,
    });
    await repo.updateReservation(tx, r.id, {
      status: 'cancelled',
      cancelled_at: now,
      ended_at: now,
      cancellation_fee_micros: 0,
      refund_micros: r.remaining_micros,
      remaining_micros: 0,
    });
    await recordEvent(tx, {
      type: 'reservation.cancelled',
      userId: r.user_id,
      vmId: r.vm_id,
      data: {
        reservation_id: r.id,
        reason: 'provision_failed',
        refund: toAmount(r.remaining_micros),
        cancellation_fee: 0,
      },
      at: now,
    });
  }

  /**
   * Ends active reservations whose term is over: converted_to_on_demand (VM alive) or completed; unused balance is
   * kept. Returns how many ended.
   */
  async endDue(now: Date): Promise<number> {
    let ended = 0;
    for (const { id, vm_id } of await repo.dueEnds(this.db, now, 100)) {
      ended += await this.db.transaction(async (tx) => {
        await repo.lockVm(tx, vm_id); // the meter's lock order: VM, reservation, balance
        const r = await repo.findReservation(tx, id, null, true);
        if (!r || r.status !== 'active' || r.end_at.getTime() > now.getTime()) return 0;
        await this.endLocked(tx, r);
        return 1;
      });
    }
    return ended;
  }

  /** Ends an active reservation whose term is over (its VM and row locked by the caller). */
  private async endLocked(tx: Queryable, r: ReservationRow): Promise<'converted_to_on_demand' | 'completed'> {
    // Usage until the end of the term draws on the reservation; after it, on-demand.
    await this.meter.closeAt(tx, r.vm_id, r.end_at);
    const alive = await this.convert(tx, r.vm_id, r.end_at);
    const status = alive ? 'converted_to_on_demand' : 'completed';
    await repo.updateReservation(tx, r.id, { status, ended_at: r.end_at });
    await recordEvent(tx, {
      type: 'reservation.expired',
      userId: r.user_id,
      vmId: r.vm_id,
      data: { reservation_id: r.id, status },
      at: r.end_at,
    });
    return status;
  }

  async problems() {
    return repo.unbalancedReservations(this.db);
  }
}
