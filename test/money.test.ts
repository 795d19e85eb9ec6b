/**
 * Money arithmetic (docs/billing.md#money): integer micro-units inside, 6-decimal
 * numbers at the edge, never binary floating point for amounts.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import {
  bpToPercent,
  discounted,
  formatAmount,
  MICROS,
  mulDiv,
  percentToBp,
  toAmount,
  toMicros,
} from '../src/money.js';

const MAX = Number.MAX_SAFE_INTEGER;

describe('toMicros / toAmount', () => {
  test('exact decimal conversion, both ways', () => {
    const cases: Array<[number, number]> = [
      [0, 0],
      [1, 1_000_000],
      [0.1, 100_000],
      [0.2, 200_000],
      [0.3, 300_000],
      [0.44, 440_000],
      [0.000001, 1],
      [0.000002, 2],
      [1.999999, 1_999_999],
      [12.345678, 12_345_678],
      [-0.5, -500_000],
      [-12.345678, -12_345_678],
      [10_000_000, 10_000_000_000_000],
      [123456789.123456, 123_456_789_123_456],
      [9007199254.74099, 9_007_199_254_740_990],
    ];
    for (const [amount, micros] of cases) {
      assert.equal(toMicros(amount), micros, `toMicros(${amount})`);
      assert.equal(toAmount(micros), amount, `toAmount(${micros})`);
      assert.equal(toAmount(BigInt(micros)), amount, `toAmount(${micros}n)`);
    }
  });

  test('round trip of every micro-unit step around awkward binary fractions', () => {
    // 0.1 + 0.2 !== 0.3 in binary floating point; through micro-units it is.
    assert.equal(toAmount(toMicros(0.1)! + toMicros(0.2)!), 0.3);
    for (let m = 0; m < 3000; m += 7) {
      const a = toAmount(m);
      assert.equal(toMicros(a), m);
      assert.equal(toMicros(-a), m === 0 ? 0 : -m);
    }
    // Exact up to 15 significant digits: every micro-unit below 1 billion in the major unit.
    for (const m of [1, 999_999, 1_000_001, 4_294_967_297, 999_999_999_999_999, 123_456_789_012_345]) {
      assert.equal(toMicros(toAmount(m)), m, `round trip ${m}`);
      assert.equal(toMicros(toAmount(-m)), -m, `round trip -${m}`);
    }
    let x = 987_654_321;
    for (let i = 0; i < 2000; i++) {
      x = (x * 48271) % 2147483647;
      const m = (x * 465_661) % 1_000_000_000_000_000; // spread over 0 .. 10^15
      assert.equal(toMicros(toAmount(m)), m, `round trip ${m}`);
    }
  });

  test('toAmount output has at most 6 decimals and keeps the sign', () => {
    assert.equal(toAmount(1), 0.000001);
    assert.equal(toAmount(-1), -0.000001);
    assert.equal(toAmount(-1_000_000), -1);
    assert.equal(String(toAmount(1_234_500)), '1.2345');
    assert.equal(toAmount(-0), 0);
  });

  test('refusals: more than 6 decimals, NaN, Infinity, too large for exact micro-units', () => {
    for (const bad of [
      0.0000001,
      1.0000001,
      -0.0000001,
      12.3456789,
      0.1 + 0.2, // 0.30000000000000004
      1e-7,
      5e-7,
      Number.NaN,
      Number.POSITIVE_INFINITY,
      Number.NEGATIVE_INFINITY,
      1e21,
      1e300,
      -1e300,
      9007199254.740992, // 2^53 micro-units: the first not exact
      1e10,
      Number.MAX_VALUE,
    ]) {
      assert.equal(toMicros(bad), null, `toMicros(${bad}) must be refused`);
    }
    assert.equal(toMicros(Number.MIN_VALUE), null);
  });

  test('toAmount takes whole micro-units only', () => {
    assert.throws(() => toAmount(1.5), RangeError);
    assert.throws(() => toAmount(Number.NaN), RangeError);
  });

  test('negative zero is zero', () => {
    assert.equal(toMicros(-0), 0);
    assert.ok(Object.is(toMicros(-0), 0));
  });

  test('MICROS is one million', () => {
    assert.equal(MICROS, 1_000_000);
  });
});

describe('mulDiv', () => {
  test('rounds half up, exactly', () => {
    assert.equal(mulDiv(1, 1, 2), 1); // 0.5 -> 1
    assert.equal(mulDiv(1, 1, 3), 0); // 0.333 -> 0
    assert.equal(mulDiv(2, 1, 3), 1); // 0.667 -> 1
    assert.equal(mulDiv(3, 1, 2), 2); // 1.5 -> 2
    assert.equal(mulDiv(5, 1, 2), 3); // 2.5 -> 3 (half up, not banker's)
    assert.equal(mulDiv(0, 12345, 7), 0);
    assert.equal(mulDiv(10, 10, 1), 100);
    // 0.44 $/h for 1 s = 122.222... micro -> 122; for 45 s = 5500 exactly
    assert.equal(mulDiv(440_000, 1000, 3_600_000), 122);
    assert.equal(mulDiv(440_000, 45_000, 3_600_000), 5500);
    // 0.69 $/h for 1.5 s: 287.5 -> 288
    assert.equal(mulDiv(690_000, 1500, 3_600_000), 288);
  });

  test('halves of negative products round away from zero', () => {
    assert.equal(mulDiv(-1, 1, 2), -1);
    assert.equal(mulDiv(-5, 1, 2), -3);
    assert.equal(mulDiv(-1, 1, 3), 0);
    assert.equal(mulDiv(1, -2, 3), -1);
  });

  test('exact on large values where a*b exceeds 2^53', () => {
    // (2^53 - 1) * 3 / 3 is exact only through BigInt
    assert.equal(mulDiv(MAX, 3, 3), MAX);
    assert.equal(mulDiv(MAX, MAX, MAX), MAX);
    // a month of 8 x pro6000 in ms: 13.52 $/h x 730 h
    assert.equal(mulDiv(13_520_000, 730 * 3_600_000, 3_600_000), 9_869_600_000);
    // 9e15 * 7 / 9 = 7e15 exactly; in doubles 9e15 * 7 already loses digits
    assert.equal(mulDiv(9_000_000_000_000_000, 7, 9), 7_000_000_000_000_000);
    // 123456789012345 * 1000003 / 1000000 = 123457159382712.037035 -> ...712
    assert.equal(mulDiv(123_456_789_012_345, 1_000_003, 1_000_000), 123_457_159_382_712);
    // A half at the end of a long product: (2^52 + 1) * 1 / 2 = 2^51 + 0.5 -> 2^51 + 1
    assert.equal(mulDiv(2 ** 52 + 1, 1, 2), 2 ** 51 + 1);
    assert.equal(mulDiv(BigInt(MAX), 2n, 2n), MAX);
  });

  test('refuses a non-positive divisor, non-integers and results beyond exact integers', () => {
    assert.throws(() => mulDiv(1, 1, 0), RangeError);
    assert.throws(() => mulDiv(1, 1, -3), RangeError);
    assert.throws(() => mulDiv(1.5, 1, 1), RangeError);
    assert.throws(() => mulDiv(MAX, 2, 1), RangeError);
    assert.throws(() => mulDiv(MAX, MAX, 1), RangeError);
  });
});

describe('discounted and percentages', () => {
  test('discounted applies basis points, rounded half up to the micro-unit', () => {
    assert.equal(discounted(440_000, 1000), 396_000); // 0.44 - 10 %
    assert.equal(discounted(690_000, 2000), 552_000);
    assert.equal(discounted(1_690_000, 3000), 1_183_000);
    assert.equal(discounted(440_000, 0), 440_000);
    assert.equal(discounted(440_000, 10_000), 0);
    assert.equal(discounted(1, 5000), 1); // 0.5 -> 1
    assert.equal(discounted(3, 3333), 2); // 2.0001 -> 2
    assert.equal(discounted(333_333, 1250), 291_666); // 291666.375 -> 291666
    assert.equal(discounted(333_335, 1250), 291_668); // 291668.125
    assert.equal(discounted(7, 5000), 4); // 3.5 -> 4
  });

  test('percentToBp reads at most 2 decimals, 0..100', () => {
    const ok: Array<[number, number]> = [
      [0, 0],
      [10, 1000],
      [12.5, 1250],
      [12.34, 1234],
      [0.29, 29], // 0.29 * 100 is 28.999999999999996 in binary
      [0.01, 1],
      [33.33, 3333],
      [99.99, 9999],
      [100, 10_000],
      [-0, 0],
    ];
    for (const [p, bp] of ok) {
      assert.equal(percentToBp(p), bp, `percentToBp(${p})`);
      assert.equal(bpToPercent(bp), Math.abs(p), `bpToPercent(${bp})`);
    }
    for (const bad of [
      -0.01,
      -1,
      100.01,
      100.001,
      101,
      12.345,
      33.333,
      0.001,
      1e-9,
      12.340000001,
      Number.NaN,
      Number.POSITIVE_INFINITY,
      1e21,
    ]) {
      assert.equal(percentToBp(bad), null, `percentToBp(${bad}) must be refused`);
    }
  });

  test('formatAmount', () => {
    assert.equal(formatAmount(1_500_000), '1.50 USD');
    assert.equal(formatAmount(1_234_567), '1.234567 USD');
    assert.equal(formatAmount(0), '0.00 USD');
    assert.equal(formatAmount(-250_000, 'EUR'), '-0.25 EUR');
  });
});
