/** Authenticated encryption (AES-256-GCM) for the few secrets the service must keep readable for a while. */
import { createCipheriv, createDecipheriv, createHash, timingSafeEqual } from 'node:crypto';
import { randomBytes } from './ids.js';

const PREFIX = 'v1:';

/** A 32-byte key derived from a secret and a purpose label. */
export function deriveKey(secret: string | Buffer, label: string): Buffer {
  return createHash('sha256').update(`gpucloud:${label}:`).update(secret).digest();
}

/** The SHA-256 of a secret: what is kept of a token, and what two tokens are compared by. */
export function secretDigest(secret: string): Buffer {
  return createHash('sha256').update(secret).digest();
}

/**
 * Whether `given` is the secret `expected` (or the secret whose secretDigest it is), in constant time: the
 * digests compared have one length whatever was sent.
 */
export function sameSecret(given: string, expected: string | Buffer): boolean {
  return timingSafeEqual(secretDigest(given), typeof expected === 'string' ? secretDigest(expected) : expected);
}

export function seal(key: Buffer, plaintext: string): string {
  const iv = randomBytes(12);
  const c = createCipheriv('aes-256-gcm', key, iv);
  const body = Buffer.concat([c.update(plaintext, 'utf8'), c.final()]);
  return PREFIX + Buffer.concat([iv, c.getAuthTag(), body]).toString('base64');
}

export function open(key: Buffer, sealed: string): string {
  if (!sealed.startsWith(PREFIX)) throw new Error('unknown sealed format');
  const raw = Buffer.from(sealed.slice(PREFIX.length), 'base64');
  const d = createDecipheriv('aes-256-gcm', key, raw.subarray(0, 12));
  d.setAuthTag(raw.subarray(12, 28));
  return Buffer.concat([d.update(raw.subarray(28)), d.final()]).toString('utf8');
}
