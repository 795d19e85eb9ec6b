/**
 * What a presented credential stands for, remembered for at most one second
 * so that a busy client does not cost a database round trip per request.
 *
 * - A session's access token: the user (role, suspension) and whether the
 *   session was revoked. An API key: its row and its owner.
 * - An entry lives at most `ttlMs` (one second) of real time: a change made
 *   through another instance (a revoked key, a suspension, a logout) is
 *   honoured everywhere within that second.
 * - A change made through this instance is honoured at once: the services
 *   that revoke sessions and keys, or change a user's role or suspension,
 *   call `forgetUser` after their transaction commits. A read that started
 *   before such a change is not cached (the cache's epoch moved meanwhile),
 *   so an answer from before a revocation cannot outlive it.
 *
 * The cache measures its second with the process's monotonic clock, not the
 * service clock: it bounds how stale an answer may be in real time, and the
 * manual clock used in tests must not keep a revoked credential alive.
 */
import { performance } from 'node:perf_hooks';

interface Entry<V> {
  value: V;
  userId: number | undefined;
  expires: number;
}

export class CredentialCache<V> {
  private readonly entries = new Map<string, Entry<V>>();
  private epoch = 0;

  constructor(
    private readonly ttlMs = 1000,
    private readonly maxEntries = 10_000,
    private readonly now: () => number = () => performance.now(),
  ) {}

  /** The remembered value, or undefined when absent or older than the TTL. */
  get(key: string): V | undefined {
    const e = this.entries.get(key);
    if (!e) return undefined;
    if (e.expires <= this.now()) {
      this.entries.delete(key);
      return undefined;
    }
    return e.value;
  }

  /**
   * Looks `key` up, or loads it and remembers the answer. `userOf` names the
   * user the answer belongs to (for forgetUser); a load that overlapped a
   * forget is returned but not remembered.
   */
  async through(key: string, load: () => Promise<V>, userOf: (v: V) => number | undefined): Promise<V> {
    const hit = this.get(key);
    if (hit !== undefined) return hit;
    const epoch = this.epoch;
    const value = await load();
    if (epoch === this.epoch) {
      if (this.entries.size >= this.maxEntries) this.entries.delete(this.entries.keys().next().value!);
      this.entries.set(key, { value, userId: userOf(value), expires: this.now() + this.ttlMs });
    }
    return value;
  }

  /** Drops every answer about this user (call after the change has committed). */
  forgetUser(userId: number): void {
    this.epoch++;
    for (const [k, e] of this.entries) if (e.userId === userId) this.entries.delete(k);
  }
}
