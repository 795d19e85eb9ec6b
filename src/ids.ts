/**
 * The one place randomness and identifiers come from. Tests may swap the
 * source of random bytes; nothing else in the code calls crypto's RNG.
 */
import { createHash, randomBytes as nodeRandomBytes, randomUUID } from 'node:crypto';

export type RandomBytes = (n: number) => Buffer;

let source: RandomBytes = nodeRandomBytes;

export function randomBytes(n: number): Buffer {
  return source(n);
}

export function newId(): string {
  return source === nodeRandomBytes ? randomUUID() : uuidFromBytes(source(16));
}

function uuidFromBytes(b: Buffer): string {
  b[6] = (b[6]! & 0x0f) | 0x40;
  b[8] = (b[8]! & 0x3f) | 0x80;
  const h = b.toString('hex');
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

/** URL-safe random token with `bytes` of entropy. */
export function randomToken(bytes = 32): string {
  return randomBytes(bytes).toString('base64url');
}

/** SHA-256 hex of a high-entropy secret (refresh tokens, API keys, challenge tokens). */
export function sha256Hex(value: string): string {
  return createHash('sha256').update(value).digest('hex');
}

/** For tests only: replace the randomness source. Returns a restore function. */
export function setRandomSourceForTests(fn: RandomBytes): () => void {
  const prev = source;
  source = fn;
  return () => {
    source = prev;
  };
}

export const UUID_RE = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
