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

let lastMs = 0;
let counter = 0;

/**
 * A UUID (version 7, RFC 9562) whose first 48 bits are the milliseconds of
 * the machine's clock, then a 12-bit counter, then random bits: ids made
 * one after another sort one after another, so rows written in bulk (usage
 * logs, ledger entries) append to their primary-key index instead of
 * landing on random pages of it. The time in it is only an ordering hint,
 * never read back (the service clock stamps the rows themselves).
 */
export function newOrderedId(): string {
  const now = Date.now();
  if (now > lastMs) {
    lastMs = now;
    counter = 0;
  } else if (++counter > 0xfff) {
    lastMs += 1; // more than 4,096 ids in one millisecond: borrow the next one
    counter = 0;
  }
  let buf: Buffer;
  let at = 0;
  if (source === nodeRandomBytes) {
    if (pool.at + 8 > pool.buf.length) pool = { buf: nodeRandomBytes(4096), at: 0 };
    buf = pool.buf;
    at = pool.at;
    pool.at += 8;
  } else {
    buf = source(8);
  }
  const t = lastMs.toString(16).padStart(12, '0');
  return (
    `${t.slice(0, 8)}-${t.slice(8)}-${(0x7000 | counter).toString(16)}-${HEX[(buf[at]! & 0x3f) | 0x80]}${HEX[buf[at + 1]!]}-` +
    `${HEX[buf[at + 2]!]}${HEX[buf[at + 3]!]}${HEX[buf[at + 4]!]}${HEX[buf[at + 5]!]}${HEX[buf[at + 6]!]}${HEX[buf[at + 7]!]}`
  );
}

const HEX = Array.from({ length: 256 }, (_, i) => i.toString(16).padStart(2, '0'));
/** Random bytes for ordered ids, drawn from the RNG 4 KB at a time (one call per 512 ids). */
let pool = { buf: Buffer.alloc(0), at: 0 };

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
