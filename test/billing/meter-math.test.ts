/** The pure arithmetic of metering (periods, half-up rounding) and reservation quotes, computed by hand. */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { boundariesBetween, priceOfPeriod } from '../../src/modules/billing/meter-periods.js';
import { quote } from '../../src/modules/reservations/service.js';
import type { PricingRow } from '../../src/modules/inventory/repository.js';

const P4090: PricingRow = {
  gpu_type: '4090',
  gpu_ram_mb: 24576,
  gpu_price_hourly_micros: 440_000,
  interruptible_rate_micros: 220_000,
  storage_price_gb_hourly_micros: 200,
  reserved_discount_1mo_bp: 1000,
  reserved_discount_3mo_bp: 2000,
  reserved_discount_6mo_bp: 3000,
  updated_at: new Date(0),
};

describe('priceOfPeriod: each part rounded half-up to the micro-unit, the total their sum', () => {
  const vm = { gpu_hourly_rate_micros: 880_000, storage_hourly_rate_micros: 20_000 };

  test('a whole hour running costs the hourly rate', () => {
    const c = priceOfPeriod(vm, 3_600_000, true, 0, 0);
    assert.deepEqual([c.gpuCost, c.storageCost, c.networkCost, c.total], [880_000, 20_000, 0, 900_000]);
  });

  test('37 minutes running: 880000 x 37/60 = 542666.67 -> 542667, storage 12333.33 -> 12333', () => {
    const c = priceOfPeriod(vm, 37 * 60_000, true, 0, 0);
    assert.equal(c.gpuCost, 542_667);
    assert.equal(c.storageCost, 12_333);
    assert.equal(c.total, 555_000);
  });

  test('stopped: storage only', () => {
    const c = priceOfPeriod(vm, 2 * 3_600_000, false, 0, 0);
    assert.deepEqual([c.gpuMs, c.gpuCost, c.storageCost], [0, 0, 40_000]);
  });

  test('half a micro-unit rounds up, less rounds down', () => {
    // 1 micro/h for 1800 s = 0.5 -> 1; for 1799 s = 0.4997 -> 0
    assert.equal(
      priceOfPeriod({ gpu_hourly_rate_micros: 1, storage_hourly_rate_micros: 0 }, 1_800_000, true, 0, 0).gpuCost,
      1,
    );
    assert.equal(
      priceOfPeriod({ gpu_hourly_rate_micros: 1, storage_hourly_rate_micros: 0 }, 1_799_000, true, 0, 0).gpuCost,
      0,
    );
  });

  test('network: bytes x price per GB (10^9 bytes)', () => {
    const c = priceOfPeriod(vm, 1000, false, 2_500_000_000, 50_000); // 2.5 GB at 0.05
    assert.equal(c.networkCost, 125_000);
  });

  test('the total is the sum of the rounded parts', () => {
    for (const ms of [1, 999, 61_001, 3_599_999, 7_654_321]) {
      const c = priceOfPeriod(
        { gpu_hourly_rate_micros: 333_333, storage_hourly_rate_micros: 7_777 },
        ms,
        true,
        123_456_789,
        10_001,
      );
      assert.equal(c.total, c.gpuCost + c.storageCost + c.networkCost);
    }
  });
});

describe('boundariesBetween', () => {
  test('hour boundaries strictly after the start, up to and including the end', () => {
    const h = 3_600_000;
    assert.deepEqual(boundariesBetween(h + 5, 3 * h, h), [2 * h, 3 * h]);
    assert.deepEqual(boundariesBetween(h, 2 * h - 1, h), []);
    assert.deepEqual(boundariesBetween(h, h, h), []);
  });
});

describe('reservation quote: discounted rate x 730 h x months, 25 % fee', () => {
  test('1 x 4090, 100 GB, 1 month: 10 % off', () => {
    const q = quote(P4090, 1, 100, 1);
    assert.equal(q.gpuHourlyMicros, 396_000); // 0.44 x 0.9
    assert.equal(q.storageHourlyMicros, 20_000); // 100 x 0.0002
    assert.equal(q.hourlyMicros, 416_000);
    assert.equal(q.monthlyMicros, 416_000 * 730); // 303.68
    assert.equal(q.depositMicros, 303_680_000);
    assert.equal(q.feeMicros, 75_920_000); // 25 %
  });

  test('8 x 4090, 500 GB, 6 months: 30 % off, whole commitment prepaid', () => {
    const q = quote(P4090, 8, 500, 6);
    assert.equal(q.gpuHourlyMicros, 8 * 308_000);
    assert.equal(q.hourlyMicros, 2_464_000 + 100_000);
    assert.equal(q.depositMicros, 2_564_000 * 730 * 6);
  });

  test('3 months uses the 3-month discount', () => {
    assert.equal(quote(P4090, 2, 50, 3).discountBp, 2000);
  });
});
