/**
 * Pure TOTP (RFC 6238) helpers: HMAC-SHA1, 6 digits, 30 second step.
 *
 * Nothing in this module reads the clock: every time-dependent function takes
 * `nowMs` explicitly so that the service's injectable clock drives it, and the
 * randomness source is injected as well.
 */
import { createHmac, timingSafeEqual } from 'node:crypto';

export const TOTP_DIGITS = 6;
export const TOTP_PERIOD_SECONDS = 30;
export const TOTP_SECRET_BYTES = 20;
/** Steps of clock drift accepted on either side of the current step. */
export const TOTP_DRIFT_STEPS = 1;

const BASE32_ALPHABET = 'ABCDEFGHIJKLMNOPQRSTUVWXYZ234567';
const BASE32_LOOKUP: ReadonlyMap<string, number> = new Map(
  [...BASE32_ALPHABET].map((ch, i) => [ch, i] as const),
);

/** RFC 4648 base32 encoding, upper case, without '=' padding. */
export function base32Encode(buf: Buffer): string {
  let out = '';
  let bits = 0;
  let value = 0;
  for (const byte of buf) {
    value = ((value << 8) | byte) & 0xffff;
    bits += 8;
    while (bits >= 5) {
      out += BASE32_ALPHABET[(value >>> (bits - 5)) & 31];
      bits -= 5;
    }
  }
  if (bits > 0) {
    out += BASE32_ALPHABET[(value << (5 - bits)) & 31];
  }
  return out;
}

/**
 * RFC 4648 base32 decoding. Case-insensitive; whitespace and '=' padding are
 * ignored; any other character outside the alphabet throws. Trailing bits that
 * do not make up a whole byte are discarded.
 */
export function base32Decode(s: string): Buffer {
  const cleaned = s.replace(/[\s=]+/g, '').toUpperCase();
  const out: number[] = [];
  let bits = 0;
  let value = 0;
  for (const ch of cleaned) {
    const v = BASE32_LOOKUP.get(ch);
    if (v === undefined) {
      throw new Error(`invalid base32 character: ${JSON.stringify(ch)}`);
    }
    value = ((value << 5) | v) & 0xffff;
    bits += 5;
    if (bits >= 8) {
      out.push((value >>> (bits - 8)) & 0xff);
      bits -= 8;
    }
  }
  return Buffer.from(out);
}

/** A fresh 20-byte (160-bit) TOTP secret, base32 encoded. */
export function generateTotpSecret(randomBytes: (n: number) => Buffer): string {
  const bytes = randomBytes(TOTP_SECRET_BYTES);
  if (bytes.length < TOTP_SECRET_BYTES) {
    throw new Error('randomBytes returned too few bytes');
  }
  return base32Encode(bytes.subarray(0, TOTP_SECRET_BYTES));
}

/** The zero-padded 6-digit code for a step counter (RFC 4226 HOTP). */
export function totpAt(secretBase32: string, step: number): string {
  if (!Number.isSafeInteger(step) || step < 0) {
    throw new RangeError(`invalid TOTP step: ${step}`);
  }
  const key = base32Decode(secretBase32);
  const counter = Buffer.alloc(8);
  counter.writeBigUInt64BE(BigInt(step));
  const mac = createHmac('sha1', key).update(counter).digest();
  const offset = (mac[mac.length - 1] ?? 0) & 0x0f;
  const binary = mac.readUInt32BE(offset) & 0x7fffffff;
  return String(binary % 10 ** TOTP_DIGITS).padStart(TOTP_DIGITS, '0');
}

/** The TOTP step counter for a time in milliseconds since the Unix epoch. */
export function stepAt(nowMs: number): number {
  return Math.floor(nowMs / 1000 / TOTP_PERIOD_SECONDS);
}

const CODE_RE = /^[0-9]{6}$/;

/**
 * Verifies a TOTP code against steps current-1, current and current+1.
 *
 * A step is only eligible if it is strictly greater than `lastUsedStep`, so a
 * code is accepted at most once and an older code cannot be used after a newer
 * one. Every candidate is compared in constant time, without early exit.
 *
 * Returns the matched step (to be persisted as the new lastUsedStep) or null.
 */
export function verifyTotp(
  secretBase32: string,
  code: string,
  nowMs: number,
  lastUsedStep: number | null,
): number | null {
  if (typeof code !== 'string') return null;
  const trimmed = code.trim();
  if (!CODE_RE.test(trimmed)) return null;
  if (!Number.isFinite(nowMs)) return null;

  const given = Buffer.from(trimmed, 'ascii');
  const current = stepAt(nowMs);
  let matched: number | null = null;
  for (let step = current - TOTP_DRIFT_STEPS; step <= current + TOTP_DRIFT_STEPS; step++) {
    if (step < 0) continue;
    const expected = Buffer.from(totpAt(secretBase32, step), 'ascii');
    const equal = timingSafeEqual(expected, given);
    const eligible = lastUsedStep === null || step > lastUsedStep;
    // Keep the highest matching step so that replay protection is as strict as possible.
    if (equal && eligible) matched = step;
  }
  return matched;
}

/** The otpauth:// provisioning URL (for QR codes) of a TOTP secret. */
export function otpauthUrl(secretBase32: string, accountEmail: string, issuer = 'gpucloud'): string {
  const label = `${encodeURIComponent(issuer)}:${encodeURIComponent(accountEmail)}`;
  const secret = secretBase32.replace(/[\s=]+/g, '').toUpperCase();
  const query = [
    `secret=${encodeURIComponent(secret)}`,
    `issuer=${encodeURIComponent(issuer)}`,
    'algorithm=SHA1',
    `digits=${TOTP_DIGITS}`,
    `period=${TOTP_PERIOD_SECONDS}`,
  ].join('&');
  return `otpauth://totp/${label}?${query}`;
}

const RECOVERY_ALPHABET = BASE32_ALPHABET.toLowerCase();
/** 12 characters of 5 bits each: 60 bits of entropy per code. */
const RECOVERY_CHARS = 12;
const RECOVERY_GROUP = 4;

function recoveryCode(randomBytes: (n: number) => Buffer): string {
  const bytes = randomBytes(RECOVERY_CHARS);
  if (bytes.length < RECOVERY_CHARS) {
    throw new Error('randomBytes returned too few bytes');
  }
  let chars = '';
  for (let i = 0; i < RECOVERY_CHARS; i++) {
    // 32 divides 256, so taking the low 5 bits of a byte is unbiased.
    chars += RECOVERY_ALPHABET[(bytes[i] ?? 0) & 31];
  }
  const groups: string[] = [];
  for (let i = 0; i < RECOVERY_CHARS; i += RECOVERY_GROUP) {
    groups.push(chars.slice(i, i + RECOVERY_GROUP));
  }
  return groups.join('-');
}

/**
 * `count` distinct, human-friendly recovery codes like `abcd-efgh-ijkl`
 * (lowercase base32 alphabet, 60 bits of entropy each).
 */
export function generateRecoveryCodes(randomBytes: (n: number) => Buffer, count = 10): string[] {
  if (!Number.isSafeInteger(count) || count < 0) {
    throw new RangeError(`invalid recovery code count: ${count}`);
  }
  const codes = new Set<string>();
  let attempts = 0;
  const maxAttempts = count * 10 + 10;
  while (codes.size < count) {
    if (++attempts > maxAttempts) {
      throw new Error('randomness source keeps producing duplicate recovery codes');
    }
    codes.add(recoveryCode(randomBytes));
  }
  return [...codes];
}

/** Canonical form of a recovery code for hashing/comparison: lowercase, no spaces or dashes. */
export function normalizeRecoveryCode(input: string): string {
  return input.toLowerCase().replace(/[\s-]+/g, '');
}
