/**
 * Money (docs/billing.md#money): integer micro-units inside, numbers in the major unit
 * (6 decimals) at the API edge. No binary floating point arithmetic on amounts:
 * products and quotients go through BigInt with explicit half-up rounding.
 */
export const MICROS = 1_000_000;

/**
 * micro-units -> API number: the double nearest the decimal. Every value
 * below 10^15 micro-units (1 billion in the major unit: 15 significant
 * digits) reads back exactly through toMicros; larger ones may not.
 */
export function toAmount(micros: number | bigint): number {
  const m = typeof micros === 'bigint' ? micros : BigInt(micros);
  const neg = m < 0n;
  const abs = neg ? -m : m;
  const s = `${abs / 1_000_000n}.${(abs % 1_000_000n).toString().padStart(6, '0')}`;
  return Number(neg ? `-${s}` : s);
}

/**
 * API number -> micro-units. Parsed from the number's decimal text, so 0.1 is
 * exactly 100000; more than 6 decimals is refused (returns null).
 */
export function toMicros(amount: number): number | null {
  if (!Number.isFinite(amount)) return null;
  const text = String(Math.abs(amount)); // shortest round-trip decimal text
  if (/e/i.test(text)) return null; // < 1e-6 (too many decimals) or >= 1e21 (too large)
  const [int, frac = ''] = text.split('.');
  if (frac.length > 6) return null;
  const micros = BigInt(int!) * 1_000_000n + BigInt((frac + '000000').slice(0, 6));
  if (micros > BigInt(Number.MAX_SAFE_INTEGER)) return null;
  return Number(amount < 0 ? -micros : micros);
}

/**
 * round_half_up(a * b / c) exactly (halves round away from zero), for
 * integers a, b and a positive integer c. The result must be a safe integer:
 * anything larger could not be represented exactly and is refused.
 */
export function mulDiv(a: number | bigint, b: number | bigint, c: number | bigint): number {
  const A = BigInt(a);
  const B = BigInt(b);
  const C = BigInt(c);
  if (C <= 0n) throw new RangeError('mulDiv: divisor must be positive');
  const p = A * B;
  const neg = p < 0n;
  const abs = neg ? -p : p;
  const q = (abs * 2n + C) / (2n * C);
  if (q > BigInt(Number.MAX_SAFE_INTEGER)) throw new RangeError('mulDiv: result is not a safe integer');
  return Number(neg ? -q : q);
}

const BYTES_PER_GB = 1_000_000_000;
const MS_PER_HOUR = 3_600_000;

/**
 * What keeping `bytes` for `ms` costs at `priceGbHourMicros` per GB (10^9 bytes) per hour, rounded half-up:
 * customer images' storage (docs/images.md#billing). `ms` defaults to an hour: the hourly cost.
 */
export function storageCost(bytes: number, priceGbHourMicros: number, ms: number = MS_PER_HOUR): number {
  return mulDiv(BigInt(bytes) * BigInt(priceGbHourMicros), ms, BYTES_PER_GB * MS_PER_HOUR);
}

/** Applies a discount in basis points (1000 = 10 %) to a price, rounded half-up to the micro-unit. */
export function discounted(priceMicros: number, discountBp: number): number {
  return mulDiv(priceMicros, 10_000 - discountBp, 10_000);
}

/** Basis points -> percent number for the API (1250 -> 12.5). */
export const bpToPercent = (bp: number) => bp / 100;

/**
 * Percent from the API -> basis points; null when it has more than 2 decimals
 * or is out of 0..100. Read from the number's decimal text (like toMicros), so
 * 12.34 is 1234 and 12.340000001 or 1e-9 are refused, never rounded.
 */
export function percentToBp(p: number): number | null {
  if (!Number.isFinite(p) || p < 0 || p > 100) return null;
  const text = String(p);
  if (/e/i.test(text)) return p === 0 ? 0 : null; // only tiny values print with an exponent here
  const [int, frac = ''] = text.split('.');
  if (frac.length > 2) return null;
  return Number(int) * 100 + Number((frac + '00').slice(0, 2));
}

/** Text for messages: the amount with at least two decimals, then the currency ("12.345678 USD", "0.45 USD"). */
export function formatAmount(micros: number, currency = 'USD'): string {
  const v = toAmount(micros);
  return `${v.toFixed(Math.max(2, (String(v).split('.')[1] ?? '').length))} ${currency}`;
}
