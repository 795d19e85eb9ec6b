/**
 * The service clock's persistence and advance (CONTRACT D43). The manual
 * clock starts at the real time of the first start (truncated to the second)
 * and is kept in the database across restarts. advance() returns only after
 * every job that came due has run.
 */
import type { Db } from '../../db/db.js';
import { ManualClock, SystemClock, type Clock } from '../../clock.js';
import { invalidState } from '../../errors.js';

export type DueRunner = (now: Date) => Promise<void>;

export class ClockService {
  private readonly runners: DueRunner[] = [];
  private advancing: Promise<unknown> = Promise.resolve();

  constructor(
    private readonly db: Db,
    readonly clock: Clock,
  ) {}

  static async create(db: Db, mode: 'system' | 'manual'): Promise<ClockService> {
    if (mode === 'system') return new ClockService(db, new SystemClock());
    const start = Math.floor(Date.now() / 1000) * 1000;
    await db.query('INSERT INTO service_clock (id, now_ms) VALUES (1, $1) ON CONFLICT (id) DO NOTHING', [start]);
    const r = await db.query<{ now_ms: number }>('SELECT now_ms FROM service_clock WHERE id = 1');
    return new ClockService(db, new ManualClock(r.rows[0]!.now_ms));
  }

  /** Background jobs register here so that an advance settles them before it returns. */
  onAdvance(runner: DueRunner): void {
    this.runners.push(runner);
  }

  now(): Date {
    return this.clock.now();
  }

  async advance(seconds: number): Promise<Date> {
    const clock = this.clock;
    if (!(clock instanceof ManualClock)) {
      throw invalidState('The service clock is the system clock; start with GPUCLOUD_CLOCK=manual to advance it');
    }
    // Advances are serialized: each one settles its due work before the next moves time again.
    const run = this.advancing.then(async () => {
      const target = clock.nowMs() + seconds * 1000;
      await this.db.query('UPDATE service_clock SET now_ms = $1 WHERE id = 1', [target]);
      clock.set(target);
      for (const r of this.runners) await r(clock.now());
      return clock.now();
    });
    this.advancing = run.catch(() => undefined);
    return run;
  }
}
