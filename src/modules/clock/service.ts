/**
 * The service clock's persistence and advance (docs/configuration.md#the-manual-clock). The manual
 * clock starts at the real time of the first start (truncated to the second),
 * or at GPUCLOUD_CLOCK_START when that is set, and is kept in the database
 * across restarts: a later start never moves it, whatever the setting says. advance() returns only after
 * every job that came due has run.
 */
import * as repo from './repository.js';
import type { Db } from '../../db/db.js';
import { ManualClock, SystemClock, yieldToIo, type Clock } from '../../clock.js';
import { invalidState } from '../../errors.js';

export type DueRunner = (now: Date) => Promise<void>;
/** The earliest moment after `nowMs` at which something is due, or null. */
export type NextDue = (nowMs: number) => Promise<number | null>;

/** Upper bound on the steps of one advance (one per due moment); past it the rest is settled at the target. */
const MAX_STEPS = 100_000;
/** The advisory lock that serializes advances across instances on PostgreSQL. */
const ADVANCE_LOCK = 0x67_70_63_6c; // "gpcl"
/**
 * Advances in this process, queued per database: every clock object on one
 * database (the embedded one serves a single process) takes its turn.
 */
const queues = new WeakMap<Db, Promise<unknown>>();

export class ClockService {
  private readonly runners: DueRunner[] = [];
  private readonly nextDues: NextDue[] = [];
  private readonly limits: ((toMs: number) => Promise<void>)[] = [];

  constructor(
    private readonly db: Db,
    readonly clock: Clock,
  ) {}

  /** `startMs`: where a manual clock that has never run starts (default: the real time, to the second). */
  static async create(db: Db, mode: 'system' | 'manual', startMs?: number): Promise<ClockService> {
    if (mode === 'system') return new ClockService(db, new SystemClock());
    const start = startMs ?? Math.floor(Date.now() / 1000) * 1000;
    await repo.initClock(db, start);
    return new ClockService(db, new ManualClock((await repo.storedNowMs(db))!));
  }

  /**
   * Background jobs register here so that an advance settles them before it
   * returns. With `nextDue`, the advance stops at every moment something comes
   * due and runs the jobs then, so work happens at its own time (a VM
   * provisioned 3 s after its creation starts then, not at the end of the advance).
   */
  onAdvance(runner: DueRunner, nextDue?: NextDue): void {
    this.runners.push(runner);
    if (nextDue) this.nextDues.push(nextDue);
  }

  /** `check` refuses an advance (by throwing) before it moves the clock, e.g. one that is too much work to settle. */
  limitAdvance(check: (toMs: number) => Promise<void>): void {
    this.limits.push(check);
  }

  private async earliestDue(nowMs: number): Promise<number | null> {
    let best: number | null = null;
    for (const f of this.nextDues) {
      const t = await f(nowMs);
      if (t !== null && (best === null || t < best)) best = t;
    }
    return best;
  }

  now(): Date {
    return this.clock.now();
  }

  /**
   * Catches a manual clock up with the persisted value (another instance may
   * have advanced it); a no-op for the system clock. Returns the clock's time.
   */
  async sync(): Promise<Date> {
    const clock = this.clock;
    if (clock instanceof ManualClock) {
      const stored = await repo.storedNowMs(this.db);
      if (stored !== undefined && stored > clock.nowMs()) clock.set(stored);
    }
    return clock.now();
  }

  async advance(seconds: number): Promise<Date> {
    const clock = this.clock;
    if (!(clock instanceof ManualClock)) {
      throw invalidState('The service clock is the system clock; start with GPUCLOUD_CLOCK=manual to advance it');
    }
    // The HTTP route takes whole seconds >= 1; callers in code may settle due work with 0.
    if (!Number.isFinite(seconds) || seconds < 0) throw new RangeError(`the service clock cannot move by ${seconds} s`);
    const deltaMs = Math.round(seconds * 1000);
    // Advances are serialized: each one settles its due work before the next moves time again,
    // in this process (a queue per database) and across instances (an advisory lock on PostgreSQL).
    const queued = queues.get(this.db) ?? Promise.resolve();
    const run = queued.then(() => this.exclusively(() => this.step(clock, deltaMs)));
    queues.set(
      this.db,
      run.catch(() => undefined),
    );
    return run;
  }

  /**
   * Runs `fn` holding the advance lock. On PostgreSQL the lock belongs to a
   * transaction kept open on a connection of its own while `fn` works on the
   * others; its failure is handed back after the lock is released, so the
   * transaction's retry logic never runs an advance twice.
   */
  private async exclusively<T>(fn: () => Promise<T>): Promise<T> {
    if (this.db.kind !== 'postgres') return fn();
    const outcome = await this.db.transaction(async (tx) => {
      await repo.lockAdvances(tx, ADVANCE_LOCK);
      try {
        return { ok: true as const, value: await fn() };
      } catch (error) {
        return { ok: false as const, error };
      }
    });
    if (!outcome.ok) throw outcome.error;
    return outcome.value;
  }

  /** Moves the persisted clock by `deltaMs`, stepping through every moment work comes due. */
  private async step(clock: ManualClock, deltaMs: number): Promise<Date> {
    // Another instance may have advanced while this one waited for the lock: continue from there.
    await this.sync();
    for (const check of this.limits) await check(clock.nowMs() + deltaMs);
    // One statement moves the persisted clock, so that advances from several
    // instances on one database add up and the clock never goes back: it
    // continues from the later of the stored value and this instance's.
    const target = await repo.moveClock(this.db, clock.nowMs(), deltaMs);
    if (target === undefined) throw new Error('service_clock row is missing');
    // Step through every moment something comes due before the target, in order.
    let lastRun = -Infinity;
    for (let step = 0; step < MAX_STEPS; step++) {
      const next = await this.earliestDue(clock.nowMs());
      // Work still due at a moment the jobs already ran (e.g. waiting for GPUs) waits for the target.
      if (next === null || next >= target || next <= lastRun) break;
      lastRun = Math.max(next, clock.nowMs());
      clock.set(lastRun);
      for (const runner of this.runners) await runner(clock.now());
      await yieldToIo();
    }
    clock.set(target);
    for (const runner of this.runners) await runner(clock.now());
    return clock.now();
  }
}
