/**
 * A VM's money figures (docs/vms.md#rental-types): the rates fixed on it at
 * creation, and the hourly spend the balance checks of create, start and
 * auto-restart count.
 */
import { discounted } from '../../money.js';
import type { PricingRow } from '../inventory/repository.js';
import type { RentalType } from './lifecycle.js';
import type { CountedVm } from './repository.js';

/** The rates fixed on the VM at creation (later price changes apply to new VMs only). */
export function ratesFor(p: PricingRow, rental: RentalType, gpuCount: number, storageGb: number, months?: number) {
  let perGpu = p.gpu_price_hourly_micros;
  if (rental === 'interruptible') perGpu = p.interruptible_rate_micros;
  if (rental === 'reserved') {
    const bp =
      months === 6
        ? p.reserved_discount_6mo_bp
        : months === 3
          ? p.reserved_discount_3mo_bp
          : p.reserved_discount_1mo_bp;
    perGpu = discounted(p.gpu_price_hourly_micros, bp);
  }
  const gpu = gpuCount * perGpu;
  const storage = storageGb * p.storage_price_gb_hourly_micros;
  return { gpu, storage, total: gpu + storage };
}

/** What a VM commits the user to per hour from the credit balance (reserved VMs draw on their reservation). */
export function committedHourly(vms: readonly CountedVm[], excludeId?: string): number {
  let sum = 0;
  for (const v of vms) {
    if (v.id === excludeId || v.rental_type === 'reserved') continue;
    if (v.status === 'destroyed' || v.status === 'failed') continue;
    sum +=
      v.status === 'stopped' ? v.storage_hourly_rate_micros : v.gpu_hourly_rate_micros + v.storage_hourly_rate_micros;
  }
  return sum;
}
