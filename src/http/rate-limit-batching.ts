/**
 * Shared rate-limit counters without a round trip per request
 * (docs/security.md#rate-limits).
 *
 * Wraps a store that instances share (Redis or the PostgreSQL table). A key's
 * first hit in a window, and every hit once its count has passed the caller's
 * `localBelow` (half the limit), goes to the shared store and returns the
 * total every instance has sent. Below that, while the key was last read from
 * the shared store less than `freshForMs` ago, a hit is counted in memory and
 * sent with the key's other local hits at the next flush (every `flushEveryMs`).
 *
 * So on one instance every count is exact. With several, a count leaves out
 * only the other instances' hits of the last flush interval, and only far from
 * the limit: near it every hit is counted in the shared store. Callers that
 * must be exact at every count (logins) leave `localBelow` out.
 */
import { realTimeMs } from '../clock.js';
import { windowOf, type HitOptions, type RateLimitHit, type RateLimitStore } from './rate-limit-store.js';

/** A store whose counters instances share, and that can add several hits at once. */
export interface SharedRateLimitStore extends RateLimitStore {
  /** Adds `n` (>= 1) hits to `key` in the window containing `nowMs`; the count includes them. */
  add(key: string, windowMs: number, nowMs: number, n: number): Promise<RateLimitHit>;
}

interface Entry {
  windowMs: number;
  windowStart: number;
  windowEnd: number;
  /** The shared count at the last answer from the shared store (it includes every hit sent before). */
  base: number;
  /** Hits counted here and not yet sent. */
  pending: number;
  /** Hits sent and not yet answered. */
  inflight: number;
  /** Real time of the last answer from the shared store (as the caller or the flush timer gave it). */
  syncedAt: number;
}

export interface BatchingOptions {
  /** How often local hits are sent (default 100 ms). */
  flushEveryMs?: number;
  /** A key read longer ago than this is counted in the shared store again (default 1000 ms). */
  freshForMs?: number;
  /** How often a flush also drops the counters of ended windows (default 1000 ms). */
  sweepEveryMs?: number;
}

export class BatchingRateLimitStore implements RateLimitStore {
  /** Key -> its counter in the latest window this instance has seen. */
  private readonly entries = new Map<string, Entry>();
  /** Keys with local hits not yet sent: a flush visits these, not every key. */
  private readonly dirty = new Set<string>();
  /** Real time at which the next flush also drops the counters of ended windows. */
  private nextSweepMs = 0;
  private readonly flushEveryMs: number;
  private readonly freshForMs: number;
  private readonly sweepEveryMs: number;
  private timer: NodeJS.Timeout | undefined;
  private flushing: Promise<void> | undefined;
  private closed = false;

  constructor(
    readonly shared: SharedRateLimitStore,
    opts: BatchingOptions = {},
  ) {
    this.flushEveryMs = opts.flushEveryMs ?? 100;
    this.freshForMs = opts.freshForMs ?? 1000;
    this.sweepEveryMs = opts.sweepEveryMs ?? 1000;
  }

  /** A hit on a key read from the shared store lately and still far below the caller's `localBelow`. */
  hitLocal(key: string, windowMs: number, nowMs: number, opts: HitOptions = {}): RateLimitHit | undefined {
    if (this.closed) throw new Error('rate-limit store is closed');
    const entry = this.entries.get(key);
    if (entry === undefined || opts.localBelow === undefined) return undefined;
    const { windowStart, resetMs } = windowOf(windowMs, nowMs);
    if (
      entry.windowStart !== windowStart ||
      nowMs - entry.syncedAt > this.freshForMs ||
      entry.base + entry.inflight + entry.pending + 1 >= opts.localBelow
    ) {
      return undefined;
    }
    entry.pending += 1;
    this.dirty.add(key);
    return { count: entry.base + entry.inflight + entry.pending, resetMs };
  }

  async hit(key: string, windowMs: number, nowMs: number, opts: HitOptions = {}): Promise<RateLimitHit> {
    const local = this.hitLocal(key, windowMs, nowMs, opts);
    if (local !== undefined) return local;
    const { windowStart, windowEnd } = windowOf(windowMs, nowMs);
    let entry = this.entries.get(key);
    if (entry !== undefined && entry.windowStart !== windowStart) {
      // A hit for an earlier window than the one held (a clock step back) is counted where it belongs.
      if (windowStart < entry.windowStart) return this.shared.add(key, windowMs, nowMs, 1);
      entry = undefined;
    }
    if (entry === undefined) {
      entry = { windowMs, windowStart, windowEnd, base: 0, pending: 0, inflight: 0, syncedAt: -Infinity };
      this.entries.set(key, entry);
      this.startTimer(); // which also drops the entry once its window has ended
    }
    // Counted in the shared store, together with this key's local hits not yet sent. If that fails, this
    // hit is let through uncounted (the caller fails open) and the earlier local ones are sent again.
    entry.pending += 1;
    return this.send(key, entry, nowMs, 1);
  }

  /**
   * Takes back a local hit not yet sent if the key has one in that window; otherwise one in the shared store.
   * The count held here then follows, one lower.
   */
  async unhit(key: string, windowMs: number, nowMs: number): Promise<number> {
    if (this.closed) throw new Error('rate-limit store is closed');
    const entry = this.entries.get(key);
    const held = entry !== undefined && entry.windowStart === windowOf(windowMs, nowMs).windowStart;
    if (held && entry.pending > 0) {
      entry.pending -= 1;
      return entry.base + entry.inflight + entry.pending;
    }
    const count = await this.shared.unhit(key, windowMs, nowMs);
    if (held) entry.base = Math.max(0, entry.base - 1);
    return count;
  }

  /**
   * Sends the entry's local hits to the shared store at `nowMs`; its count and read time follow the
   * answer. On failure, all but `dropOnFailure` of them wait for the next flush.
   */
  private async send(key: string, entry: Entry, nowMs: number, dropOnFailure: number): Promise<RateLimitHit> {
    const n = entry.pending;
    entry.pending = 0;
    entry.inflight += n;
    try {
      const hit = await this.shared.add(key, entry.windowMs, nowMs, n);
      entry.base = Math.max(entry.base, hit.count);
      entry.syncedAt = nowMs;
      return hit;
    } catch (err) {
      entry.pending += n - dropOnFailure;
      if (entry.pending > 0) this.dirty.add(key);
      throw err;
    } finally {
      entry.inflight -= n;
    }
  }

  /** Sends every key's local hits; drops the counters of windows that have ended. */
  flush(): Promise<void> {
    this.flushing ??= this.sendPending().finally(() => {
      this.flushing = undefined;
    });
    return this.flushing;
  }

  /** Number of keys held (for tests). */
  size(): number {
    return this.entries.size;
  }

  private async sendPending(): Promise<void> {
    const now = realTimeMs();
    const sends: Promise<void>[] = [];
    const keys = [...this.dirty];
    this.dirty.clear();
    for (const key of keys) {
      const entry = this.entries.get(key);
      if (entry === undefined || entry.pending === 0 || entry.windowEnd <= now) continue;
      // A failure keeps the hits for the next flush; the shared store's error is logged by the requests that reach it.
      sends.push(
        this.send(key, entry, Math.max(now, entry.windowStart), 0).then(
          () => undefined,
          () => undefined,
        ),
      );
    }
    if (now >= this.nextSweepMs) {
      // Hits of an ended window no longer limit anything: their counters go, about once a second.
      this.nextSweepMs = now + this.sweepEveryMs;
      for (const [key, entry] of this.entries) {
        if (entry.windowEnd <= now && entry.inflight === 0) this.entries.delete(key);
      }
      if (this.entries.size === 0) this.stopTimer();
    }
    await Promise.all(sends);
  }

  private startTimer(): void {
    if (this.timer !== undefined || this.closed) return;
    this.timer = setInterval(() => void this.flush(), this.flushEveryMs);
    this.timer.unref();
  }

  private stopTimer(): void {
    if (this.timer === undefined) return;
    clearInterval(this.timer);
    this.timer = undefined;
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.stopTimer();
    await this.flush();
    this.closed = true;
    await this.shared.close();
  }
}
