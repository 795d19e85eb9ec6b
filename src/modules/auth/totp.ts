/**
 * TOTP (RFC 6238) for two-factor authentication: HMAC-SHA1, 6 digits, 30
 * second step, on the `otpauth` package; this module only fixes the
 * parameters and adds what the service needs on top (replay protection,
 * strict code syntax, recovery codes).
 *
 * Nothing in this module reads the clock: every time-dependent function takes
 * `nowMs` explicitly so that the service's injectable clock drives it (otpauth
 * would default to Date.now()), and the randomness source is injected as well
 * (otpauth would default to node's RNG).
 */
import { HOTP, Secret, TOTP } from 'otpauth';

export const TOTP_DIGITS = 6;
export const TOTP_PERIOD_SECONDS = 30;
export const TOTP_SECRET_BYTES = 20;
/** Steps of clock drift accepted on either side of the current step. */
export const TOTP_DRIFT_STEPS = 1;
const TOTP_ALGORITHM = 'SHA1';

const BASE32_ALPHABET = 'ABCDEFGHIJKLMNOPQRSTUVWXYZ234567';

/** otpauth's Secret for the given bytes (copied: a Buffer may be a view into a larger pool). */
function secretOfBytes(buf: Uint8Array): Secret {
  return new Secret({ buffer: Uint8Array.from(buf).buffer });
}

/** otpauth's Secret for a base32 string: case-insensitive, whitespace and '=' anywhere ignored. */
function secretOfBase32(s: string): Secret {
  return Secret.fromBase32(s.replace(/[\s=]+/g, '').toUpperCase());
}

/** RFC 4648 base32 encoding, upper case, without '=' padding. */
export function base32Encode(buf: Buffer): string {
  return secretOfBytes(buf).base32;
}

/**
 * RFC 4648 base32 decoding. Case-insensitive; whitespace and '=' padding are
 * ignored; any other character outside the alphabet throws. Trailing bits that
 * do not make up a whole byte are discarded.
 */
export function base32Decode(s: string): Buffer {
  return Buffer.from(secretOfBase32(s).bytes);
}

/** A fresh 20-byte (160-bit) TOTP secret, base32 encoded. */
export function generateTotpSecret(randomBytes: (n: number) => Buffer): string {
  const bytes = randomBytes(TOTP_SECRET_BYTES);
  if (bytes.length < TOTP_SECRET_BYTES) {
    throw new Error('randomBytes returned too few bytes');
  }
  return secretOfBytes(bytes.subarray(0, TOTP_SECRET_BYTES)).base32;
}

function checkStep(step: number): void {
  if (!Number.isSafeInteger(step) || step < 0) {
    throw new RangeError(`invalid TOTP step: ${step}`);
  }
}

/**
 * The zero-padded 6-digit code for a step counter: the TOTP of that step is
 * the HOTP (RFC 4226) of the step number, which otpauth computes exactly for
 * every safe integer (a timestamp of step * 30 s would not be, far enough out).
 */
export function totpAt(secretBase32: string, step: number): string {
  checkStep(step);
  return HOTP.generate({
    secret: secretOfBase32(secretBase32),
    algorithm: TOTP_ALGORITHM,
    digits: TOTP_DIGITS,
    counter: step,
  });
}

/** The TOTP step counter for a time in milliseconds since the Unix epoch. */
export function stepAt(nowMs: number): number {
  return TOTP.counter({ period: TOTP_PERIOD_SECONDS, timestamp: nowMs });
}

const CODE_RE = /^[0-9]{6}$/;

/**
 * Verifies a TOTP code against steps current-1, current and current+1, the
 * current step being that of `nowMs` (the service clock).
 *
 * A step is only eligible if it is strictly greater than `lastUsedStep`, so a
 * code is accepted at most once and an older code cannot be used after a newer
 * one. Every candidate is compared (in constant time, by otpauth), without
 * early exit: otpauth's own window search (TOTP.validate with window 1) stops
 * at the first match, in the order current, -1, +1, whereas this keeps the
 * highest eligible one.
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
  const token = code.trim();
  if (!CODE_RE.test(token)) return null;
  if (!Number.isFinite(nowMs)) return null;

  const secret = secretOfBase32(secretBase32);
  const current = stepAt(nowMs);
  let matched: number | null = null;
  for (let step = current - TOTP_DRIFT_STEPS; step <= current + TOTP_DRIFT_STEPS; step++) {
    if (step < 0) continue;
    checkStep(step);
    const equal =
      HOTP.validate({ token, secret, algorithm: TOTP_ALGORITHM, digits: TOTP_DIGITS, counter: step, window: 0 }) === 0;
    const eligible = lastUsedStep === null || step > lastUsedStep;
    // Keep the highest matching step so that replay protection is as strict as possible.
    if (equal && eligible) matched = step;
  }
  return matched;
}

/**
 * The otpauth:// provisioning URL (for QR codes) of a TOTP secret, as otpauth
 * writes it (label `issuer:account`, every part URI-encoded), with `secret`
 * moved to the front of the query where this URL has always had it.
 */
export function otpauthUrl(secretBase32: string, accountEmail: string, issuer = 'gpucloud'): string {
  const uri = new TOTP({
    issuer,
    label: accountEmail,
    issuerInLabel: true,
    secret: secretOfBase32(secretBase32),
    algorithm: TOTP_ALGORITHM,
    digits: TOTP_DIGITS,
    period: TOTP_PERIOD_SECONDS,
  }).toString();
  const at = uri.indexOf('?');
  const params = uri.slice(at + 1).split('&');
  const first = params.filter((p) => p.startsWith('secret='));
  const rest = params.filter((p) => !p.startsWith('secret='));
  return `${uri.slice(0, at)}?${[...first, ...rest].join('&')}`;
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
