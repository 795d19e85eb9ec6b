/**
 * Money (CONTRACT D7): integer micro-units inside, numbers in the major unit
 * (6 decimals) at the API edge. No binary floating point arithmetic on amounts:
 * products and quotients go through BigInt with explicit half-up rounding.
 */
export const MICROS = 1_000_000;

/** micro-units -> API number (exact for |amount| < 2^53 micro-units, i.e. ~9 billion). */
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

/** round_half_up(a * b / c) for non-negative integers, exactly. */
export function mulDiv(a: number | bigint, b: number | bigint, c: number | bigint): number {
  const A = BigInt(a);
  const B = BigInt(b);
  const C = BigInt(c);
  if (C <= 0n) throw new RangeError('mulDiv: divisor must be positive');
  const p = A * B;
  const neg = p < 0n;
  const abs = neg ? -p : p;
  const q = (abs * 2n + C) / (2n * C);
  return Number(neg ? -q : q);
}

/** Applies a discount in basis points (1000 = 10 %) to a price, rounded half-up to the micro-unit. */
export function discounted(priceMicros: number, discountBp: number): number {
  return mulDiv(priceMicros, 10_000 - discountBp, 10_000);
}

/** Basis points -> percent number for the API (1250 -> 12.5). */
export const bpToPercent = (bp: number) => bp / 100;

/** Percent from the API -> basis points; null when it has more than 2 decimals or is out of 0..100. */
export function percentToBp(p: number): number | null {
  if (!Number.isFinite(p) || p < 0 || p > 100) return null;
  const bp = Math.round(p * 100);
  return Math.abs(bp - p * 100) < 1e-6 ? bp : null;
}

/** "$12.345678" style text for messages. */
export function formatAmount(micros: number, currency = 'USD'): string {
  const v = toAmount(micros);
  return `${v.toFixed(Math.max(2, (String(v).split('.')[1] ?? '').length))} ${currency}`;
}
