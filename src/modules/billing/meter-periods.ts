/**
 * The pure arithmetic of metering (docs/metering.md): where periods end and what one costs. Amounts
 * are integer micro-units, each part rounded half-up.
 */
import { mulDiv } from '../../money.js';
import type { MeteredVm } from './meter-repository.js';

export const MS_PER_HOUR = 3_600_000;
export const BYTES_PER_GB = 1_000_000_000;

export interface PeriodCharge {
  gpuMs: number;
  storageMs: number;
  networkBytes: number;
  gpuCost: number;
  storageCost: number;
  networkCost: number;
  total: number;
}

/** The pure arithmetic of one period: each part rounded half-up, the total the sum of the parts. */
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
  return {
    gpuMs,
    storageMs: ms,
    networkBytes,
    gpuCost,
    storageCost,
    networkCost,
    total: gpuCost + storageCost + networkCost,
  };
}

/** Interval boundaries strictly after `from` and at or before `to`. */
export function boundariesBetween(fromMs: number, toMs: number, intervalMs: number): number[] {
  const out: number[] = [];
  for (let b = Math.floor(fromMs / intervalMs) * intervalMs + intervalMs; b <= toMs; b += intervalMs) out.push(b);
  return out;
}

/** The last interval boundary at or before `ms`: the periods ending there or earlier are due. */
export function lastBoundary(ms: number, intervalMs: number): Date {
  return new Date(Math.floor(ms / intervalMs) * intervalMs);
}
