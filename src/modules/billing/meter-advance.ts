/**
 * What the manual clock's advance asks of the meter (docs/metering.md): how many periods an advance
 * would close, and the first boundary at which a charge could leave a user with a running VM at or
 * below zero (the low-balance rule stops their VMs there).
 */
import type { Db } from '../../db/db.js';
import { AppError } from '../../errors.js';
import * as repo from './meter-repository.js';
import { BYTES_PER_GB, lastBoundary } from './meter-periods.js';

/**
 * The most billing periods one advance of the manual clock may close: about
 * half a minute of work on the embedded database (a test-only clock; a
 * larger advance is refused, not left half done).
 */
export const ADVANCE_PERIOD_BUDGET = 300_000;

/** The billing interval and the prices the low-balance boundary is judged with. */
export interface AdvanceRates {
  intervalS: number;
  networkPricePerGbMicros: number;
  imagePriceGbHourMicros: number;
}

/**
 * How many periods closing every boundary up to `toMs` writes (about: the VMs that accrue times the boundaries),
 * and over how many VMs.
 */
export async function periodsUpTo(db: Db, intervalMs: number, toMs: number): Promise<{ periods: number; vms: number }> {
  const { vms, oldest } = await repo.meterSummary(db);
  if (!oldest) return { periods: 0, vms: 0 };
  const boundaries = Math.max(0, Math.floor(toMs / intervalMs) - Math.floor(oldest.getTime() / intervalMs));
  return { periods: Number(vms) * boundaries, vms: Number(vms) };
}

/**
 * Refuses (400 limit_exceeded) an advance of the manual clock to `toMs`
 * that would close more than ADVANCE_PERIOD_BUDGET periods, naming the
 * largest advance that is accepted.
 */
export async function refuseLargeAdvance(db: Db, intervalS: number, toMs: number): Promise<void> {
  const { periods, vms } = await periodsUpTo(db, intervalS * 1000, toMs);
  if (periods <= ADVANCE_PERIOD_BUDGET) return;
  const maxS = Math.floor(ADVANCE_PERIOD_BUDGET / vms) * intervalS;
  throw new AppError(
    'limit_exceeded',
    `This advance would close about ${periods} billing periods of ${vms} VMs, more than ${ADVANCE_PERIOD_BUDGET} at once; ` +
      `advance by at most ${maxS} seconds at a time`,
  );
}

/**
 * The first interval boundary after `nowMs` at which a charge could leave
 * a user who has a running VM at or below zero (the low-balance rule stops
 * their VMs then), or null when no user has a running VM. The boundaries
 * before it change balances and nothing else, so the manual clock's
 * advance goes straight there and the close takes them in bulk. Errs
 * early: every accruing VM of the user is charged its full hourly rates
 * (a reservation's draws ignored) plus rounding, its unbilled traffic at
 * once, from where its billing stands.
 */
export async function nextLowBalanceBoundary(db: Db, rates: AdvanceRates, nowMs: number): Promise<number | null> {
  const intervalMs = rates.intervalS * 1000;
  const rows = await repo.accrualOfUsersWithRunningVms(db, rates.imagePriceGbHourMicros);
  const first = lastBoundary(nowMs, intervalMs).getTime() + intervalMs;
  let earliest: number | null = null;
  for (const u of rows) {
    // Each part of each period is rounded half-up: at most one micro-unit more per part.
    const perInterval = Math.ceil((Number(u.hourly) * rates.intervalS) / 3600) + 3 * Number(u.vms);
    const traffic = Math.ceil((Number(u.unbilled) * rates.networkPricePerGbMicros) / BYTES_PER_GB) + Number(u.vms);
    // The first boundary also closes whatever billing is behind by.
    const behind = Math.max(1, Math.ceil((first - u.oldest.getTime()) / intervalMs));
    const k = Math.max(1, Math.ceil((u.balance - traffic) / perInterval) - behind + 1);
    const at = first + (k - 1) * intervalMs;
    if (earliest === null || at < earliest) earliest = at;
  }
  return earliest;
}
