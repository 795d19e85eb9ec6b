/**
 * Fixed-window rate-limit counters (docs/security.md#rate-limits).
 *
 * Windows are fixed, `windowMs` long (60 s in production) and aligned to
 * multiples of `windowMs` since the Unix epoch, so every service instance
 * computes the same window for the same instant. Callers pass REAL time
 * (`Date.now()`), never the service clock.
 *
 * Three implementations share one interface:
 * - {@link MemoryRateLimitStore}: per-process Map, for a single instance
 *   (the embedded database) and tests.
 * - {@link RedisRateLimitStore}: counters shared between instances through
 *   Redis (used when `GPUCLOUD_REDIS_URL` is set), the fastest shared store.
 * - {@link PostgresRateLimitStore}: counters shared between instances in an
 *   unlogged table (PostgreSQL without Redis), so several instances never
 *   each count on their own.
 */
import { Redis } from 'ioredis';
import type { Db } from '../db/db.js';
import type { Row } from '../db/rows.js';

export interface RateLimitHit {
  /** Hits counted on the key in the current window, including this one (>= 1). */
  count: number;
  /** Milliseconds until the current window ends (>= 1). */
  resetMs: number;
}

export interface HitOptions {
  /**
   * While the key's count stays below this, the hit may be counted in this
   * process and sent to a shared store a moment later (see rate-limit-batching.ts).
   * Left out, every hit is counted where every instance sees it at once.
   */
  localBelow?: number;
}

export interface RateLimitStore {
  /**
   * Counts one hit on `key` in the fixed window of `windowMs` that contains
   * `nowMs`; windows are aligned to multiples of windowMs since the Unix epoch
   * so that every instance agrees.
   */
  hit(key: string, windowMs: number, nowMs: number, opts?: HitOptions): Promise<RateLimitHit>;
  /**
   * Counts the hit and answers at once when this process can (no round trip):
   * the same count `hit` would give. Undefined, with nothing counted, when the
   * hit must go to a shared store: then call `hit`. The request path tries
   * this first, so a hit counted in memory costs no promise.
   */
  hitLocal?(key: string, windowMs: number, nowMs: number, opts?: HitOptions): RateLimitHit | undefined;
  /**
   * Takes back one hit counted on `key` in the window that contains `nowMs` (a counted attempt that turned out
   * not to be what the limit counts: a login that succeeded). Never below zero, and never makes a counter where
   * there is none. Resolves to the key's count in that window afterwards. The caller passes the current time and
   * skips the call when the hit's window has ended since: it no longer limits anything.
   */
  unhit(key: string, windowMs: number, nowMs: number): Promise<number>;
  close(): Promise<void>;
}

interface WindowInfo {
  windowStart: number;
  windowEnd: number;
  resetMs: number;
}

export function windowOf(windowMs: number, nowMs: number): WindowInfo {
  if (!Number.isFinite(windowMs) || windowMs < 1) {
    throw new RangeError(`rate-limit windowMs must be a finite number >= 1, got ${windowMs}`);
  }
  if (!Number.isFinite(nowMs)) {
    throw new RangeError(`rate-limit nowMs must be a finite number, got ${nowMs}`);
  }
  const w = Math.floor(windowMs);
  const windowStart = Math.floor(nowMs / w) * w;
  const windowEnd = windowStart + w;
  const resetMs = Math.max(1, Math.ceil(windowEnd - nowMs));
  return { windowStart, windowEnd, resetMs };
}

// ---------------------------------------------------------------------------
// In-memory implementation
// ---------------------------------------------------------------------------

interface MemoryEntry {
  count: number;
  windowEnd: number;
}

export interface MemoryRateLimitStoreOptions {
  /**
   * Minimum number of hits between two full sweeps of expired windows
   * (default 1000). A sweep also waits until at least as many hits as there
   * were live entries after the previous sweep, so sweeping is amortised O(1).
   */
  sweepEvery?: number;
}

export class MemoryRateLimitStore implements RateLimitStore {
  /** `${windowStart}:${key}` -> counter of that window. */
  private readonly entries = new Map<string, MemoryEntry>();
  private readonly sweepEvery: number;
  private hitsSinceSweep = 0;
  private sizeAfterSweep = 0;
  private closed = false;

  constructor(opts: MemoryRateLimitStoreOptions = {}) {
    const every = opts.sweepEvery ?? 1000;
    this.sweepEvery = Number.isFinite(every) && every >= 1 ? Math.floor(every) : 1000;
  }

  async hit(key: string, windowMs: number, nowMs: number): Promise<RateLimitHit> {
    return this.count(key, windowMs, nowMs, 1);
  }

  hitLocal(key: string, windowMs: number, nowMs: number): RateLimitHit {
    return this.count(key, windowMs, nowMs, 1);
  }

  async add(key: string, windowMs: number, nowMs: number, n: number): Promise<RateLimitHit> {
    return this.count(key, windowMs, nowMs, n);
  }

  async unhit(key: string, windowMs: number, nowMs: number): Promise<number> {
    if (this.closed) throw new Error('rate-limit store is closed');
    const entry = this.entries.get(`${windowOf(windowMs, nowMs).windowStart}:${key}`);
    if (entry === undefined) return 0;
    if (entry.count > 0) entry.count -= 1;
    return entry.count;
  }

  private count(key: string, windowMs: number, nowMs: number, n: number): RateLimitHit {
    if (this.closed) throw new Error('rate-limit store is closed');
    const { windowStart, windowEnd, resetMs } = windowOf(windowMs, nowMs);
    const mapKey = `${windowStart}:${key}`;
    let entry = this.entries.get(mapKey);
    if (entry === undefined) {
      entry = { count: 0, windowEnd };
      this.entries.set(mapKey, entry);
      // The key's previous window is over: drop it eagerly.
      this.entries.delete(`${windowStart - Math.floor(windowMs)}:${key}`);
    }
    entry.count += n;
    const count = entry.count;

    this.hitsSinceSweep += 1;
    if (this.hitsSinceSweep >= Math.max(this.sweepEvery, this.sizeAfterSweep)) {
      this.sweep(nowMs);
    }
    return { count, resetMs };
  }

  /** Drops every window that has ended at `nowMs`. Returns the number of entries removed. */
  sweep(nowMs: number): number {
    let removed = 0;
    for (const [k, e] of this.entries) {
      if (e.windowEnd <= nowMs) {
        this.entries.delete(k);
        removed += 1;
      }
    }
    this.hitsSinceSweep = 0;
    this.sizeAfterSweep = this.entries.size;
    return removed;
  }

  /** Number of window counters currently held (for tests / metrics). */
  size(): number {
    return this.entries.size;
  }

  async close(): Promise<void> {
    this.closed = true;
    this.entries.clear();
  }
}

// ---------------------------------------------------------------------------
// Redis implementation
// ---------------------------------------------------------------------------

/**
 * INCRBY + PEXPIRE done atomically: the expiry is set on the first hit of a
 * window (and repaired if a key somehow has none), so no key can be left
 * without a TTL.
 */
const HIT_SCRIPT = `
local c = redis.call('INCRBY', KEYS[1], ARGV[2])
if c == 1 or redis.call('PTTL', KEYS[1]) < 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
return c
`;

/** DECR that never goes below zero nor makes a key (so never one without a TTL); DECR keeps the key's TTL. */
const UNHIT_SCRIPT = `
local c = tonumber(redis.call('GET', KEYS[1]) or '0')
if c <= 0 then
  return 0
end
return redis.call('DECR', KEYS[1])
`;

/** The scripts above as commands of the client (ioredis `defineCommand`). */
interface HitCommand {
  gpucloudHit(key: string, ttlMs: string, n: string): Promise<unknown>;
  gpucloudUnhit(key: string): Promise<unknown>;
}

/** Extra TTL beyond the window end, to tolerate small clock skew between instances. */
const EXPIRY_SLACK_MS = 1000;

export interface RedisRateLimitStoreOptions {
  /** Prefix of every Redis key (default `gpucloud:`). */
  prefix?: string;
}

export class RedisRateLimitStore implements RateLimitStore {
  readonly prefix: string;
  private readonly client: Redis;
  private lastError: Error | undefined;
  private closed = false;

  constructor(url: string, opts: RedisRateLimitStoreOptions = {}) {
    this.prefix = opts.prefix ?? 'gpucloud:';
    this.client = new Redis(url, {
      lazyConnect: false,
      maxRetriesPerRequest: 2,
      enableOfflineQueue: true,
      commandTimeout: 2000,
    });
    // Sent as EVALSHA (ioredis loads the script on first use): the script's text does not travel with every hit.
    this.client.defineCommand('gpucloudHit', { numberOfKeys: 1, lua: HIT_SCRIPT });
    this.client.defineCommand('gpucloudUnhit', { numberOfKeys: 1, lua: UNHIT_SCRIPT });
    // Connection errors surface through rejected commands; keep the last one
    // for diagnostics and avoid ioredis' "Unhandled error event" output.
    this.client.on('error', (err: Error) => {
      this.lastError = err;
    });
  }

  /** Redis key of the counter of `key` for the window starting at `windowStart`. */
  keyFor(key: string, windowStart: number): string {
    return `${this.prefix}rl:${key}:${windowStart}`;
  }

  async hit(key: string, windowMs: number, nowMs: number): Promise<RateLimitHit> {
    return this.add(key, windowMs, nowMs, 1);
  }

  async add(key: string, windowMs: number, nowMs: number, n: number): Promise<RateLimitHit> {
    if (this.closed) throw new Error('rate-limit store is closed');
    const { windowStart, resetMs } = windowOf(windowMs, nowMs);
    const redisKey = this.keyFor(key, windowStart);
    let reply: unknown;
    try {
      reply = await (this.client as unknown as HitCommand).gpucloudHit(
        redisKey,
        String(resetMs + EXPIRY_SLACK_MS),
        String(n),
      );
    } catch (err) {
      const cause = err instanceof Error ? err : new Error(String(err));
      const detail = this.lastError && this.lastError !== cause ? ` (${this.lastError.message})` : '';
      throw new Error(`rate-limit store: Redis command failed: ${cause.message}${detail}`, { cause });
    }
    const count = Number(reply);
    if (!Number.isInteger(count) || count < 1) {
      throw new Error(`rate-limit store: unexpected Redis reply ${String(reply)}`);
    }
    return { count, resetMs };
  }

  async unhit(key: string, windowMs: number, nowMs: number): Promise<number> {
    if (this.closed) throw new Error('rate-limit store is closed');
    const redisKey = this.keyFor(key, windowOf(windowMs, nowMs).windowStart);
    let reply: unknown;
    try {
      reply = await (this.client as unknown as HitCommand).gpucloudUnhit(redisKey);
    } catch (err) {
      const cause = err instanceof Error ? err : new Error(String(err));
      throw new Error(`rate-limit store: Redis command failed: ${cause.message}`, { cause });
    }
    const count = Number(reply);
    if (!Number.isInteger(count) || count < 0) {
      throw new Error(`rate-limit store: unexpected Redis reply ${String(reply)}`);
    }
    return count;
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    if (this.client.status === 'ready') {
      try {
        await this.client.quit();
        return;
      } catch {
        // fall through to a hard disconnect
      }
    }
    this.client.disconnect();
  }
}

// ---------------------------------------------------------------------------
// PostgreSQL implementation
// ---------------------------------------------------------------------------

/** Ended windows are deleted at most this often (real time). */
const PG_SWEEP_EVERY_MS = 60_000;

export class PostgresRateLimitStore implements RateLimitStore {
  private closed = false;
  private nextSweepMs = 0;

  constructor(private readonly db: Db) {}

  async hit(key: string, windowMs: number, nowMs: number): Promise<RateLimitHit> {
    return this.add(key, windowMs, nowMs, 1);
  }

  async add(key: string, windowMs: number, nowMs: number, n: number): Promise<RateLimitHit> {
    if (this.closed) throw new Error('rate-limit store is closed');
    const { windowStart, windowEnd, resetMs } = windowOf(windowMs, nowMs);
    if (nowMs >= this.nextSweepMs) {
      this.nextSweepMs = nowMs + PG_SWEEP_EVERY_MS;
      // Housekeeping: a failed sweep is retried at the next one and never fails a request.
      void this.db
        .query('DELETE FROM rate_limit_hits WHERE window_end < $1', [nowMs - EXPIRY_SLACK_MS])
        .catch(() => undefined);
    }
    const r = await this.db.query<Pick<Row<'rate_limit_hits'>, 'count'>>(
      `INSERT INTO rate_limit_hits (key, window_start, window_end, count) VALUES ($1, $2, $3, $4)
       ON CONFLICT (key, window_start) DO UPDATE SET count = rate_limit_hits.count + EXCLUDED.count
       RETURNING count`,
      [key, windowStart, windowEnd, n],
    );
    return { count: Number(r.rows[0]!.count), resetMs };
  }

  async unhit(key: string, windowMs: number, nowMs: number): Promise<number> {
    if (this.closed) throw new Error('rate-limit store is closed');
    const r = await this.db.query<Pick<Row<'rate_limit_hits'>, 'count'>>(
      `UPDATE rate_limit_hits SET count = count - 1 WHERE key = $1 AND window_start = $2 AND count > 0
       RETURNING count`,
      [key, windowOf(windowMs, nowMs).windowStart],
    );
    return r.rows.length === 0 ? 0 : Number(r.rows[0]!.count);
  }

  async close(): Promise<void> {
    this.closed = true; // the database is the service's, closed with it
  }
}
