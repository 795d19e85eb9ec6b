/**
 * The schedule of background work (docs/architecture.md#background-loops): each job is declared
 * once, with what it runs and when it next has work, and both clocks use that one declaration.
 *
 * - Under the system clock every job runs in a loop of its own, a pass every `everyMs` of real
 *   time, so a long billing close never delays a VM's start or another job.
 * - Under the manual clock nothing of service time runs on its own: an advance steps through the
 *   moments the jobs' `nextDue` give and, at each, runs every job in declaration order until none
 *   finds work (`settle`).
 * - Jobs of real time (`clock: 'real'`: heartbeats to host agents, webhook deliveries, which deal with
 *   processes outside) run in their loops under either clock, and never in an advance.
 */
import type { FastifyBaseLogger } from 'fastify';
import { yieldToIo, type Clock } from '../clock.js';
import { Loop } from './loop.js';
import { JobMetrics } from './metrics.js';

export interface Job {
  /** Names the job in logs and metrics. */
  name: string;
  /** The interval of its loop (default: the scheduler's). */
  everyMs?: number;
  /** 'real': its loop runs under either clock and an advance never runs it (default 'service'). */
  clock?: 'service' | 'real';
  /**
   * Does what is due at `now`; returns how much work it did (0: nothing was due). `signal` is
   * aborted when the worker stops: long work ends at its next safe point. `settle` is set when a
   * manual-clock advance runs it: work it starts in the background must be done when it returns.
   */
  run: (now: Date, signal?: AbortSignal, settle?: boolean) => Promise<number>;
  /**
   * The earliest moment (ms) after which it has work, for a manual-clock advance to stop at; null
   * when none is known. A job without it runs at whatever moments the others give.
   */
  nextDue?: (nowMs: number) => Promise<number | null>;
  /** Waits for work it started in the background (driver actions in flight) once its loop stopped. */
  finish?: () => Promise<void>;
}

export class Scheduler {
  private readonly jobs: Job[] = [];
  private loops = new Map<string, Loop>();
  private stopping: AbortController | undefined;
  /** The settle pass running now: passes never overlap, whoever starts them. */
  private running: Promise<number> | undefined;

  constructor(
    private readonly clock: Clock,
    private readonly log?: FastifyBaseLogger,
    private readonly metrics: JobMetrics = new JobMetrics(),
  ) {}

  /** Adds a job after the others: passes run the jobs in the order they were added. */
  add(job: Job): void {
    if (this.jobs.some((j) => j.name === job.name)) throw new Error(`a job named ${job.name} is already scheduled`);
    this.jobs.push(job);
  }

  /** The jobs' names, in the order their passes run them. */
  names(): string[] {
    return this.jobs.map((j) => j.name);
  }

  /** The jobs of service time, which an advance runs, in order. */
  private serviceJobs(): Job[] {
    return this.jobs.filter((j) => j.clock !== 'real');
  }

  /** One pass of every job of service time, in order; returns how much work they did. */
  async runOnce(settle = true): Promise<number> {
    let work = 0;
    for (const job of this.serviceJobs()) {
      work += await this.metrics.pass(job.name, () => job.run(this.clock.now(), this.stopping?.signal, settle));
    }
    return work;
  }

  /** Passes until nothing is due (bounded), so a manual-clock advance leaves a settled state. */
  async settle(maxPasses = 50): Promise<void> {
    for (let i = 0; i < maxPasses; i++) {
      const prev = this.running ?? Promise.resolve(0);
      const next = prev.catch(() => 0).then(() => this.runOnce(true));
      this.running = next;
      if ((await next) === 0) return;
      await yieldToIo();
    }
  }

  /** The earliest moment any job has work after `nowMs`, asking them in declaration order. */
  async nextDue(nowMs: number): Promise<number | null> {
    const due: number[] = [];
    for (const job of this.serviceJobs()) {
      const at = job.nextDue ? await job.nextDue(nowMs) : null;
      if (at !== null) due.push(at);
    }
    return due.length ? Math.min(...due) : null;
  }

  /**
   * The loops, one per job, each on its own timer: every job under the system clock, the jobs of real
   * time alone under the manual clock (`serviceTime: false`), whose advance runs the others.
   */
  start(intervalMs = 1000, opts: { serviceTime?: boolean } = {}): void {
    if (this.stopping) return;
    this.stopping = new AbortController();
    const signal = this.stopping.signal;
    const serviceTime = opts.serviceTime ?? true;
    for (const job of this.jobs) {
      if (!serviceTime && job.clock !== 'real') continue;
      const loop = new Loop(
        job.name,
        job.everyMs ?? intervalMs,
        () => job.run(this.clock.now(), signal, false),
        this.log,
        this.metrics,
      );
      this.loops.set(job.name, loop);
      loop.start();
    }
  }

  /** A pass of the job's loop now (one more after the running one); nothing when the loops are not running. */
  wake(name: string): void {
    this.loops.get(name)?.now();
  }

  /**
   * Stops every loop: the passes running end at their next safe point, then each job's background work
   * (driver actions in flight) finishes and is recorded.
   */
  async stop(): Promise<void> {
    this.stopping?.abort();
    await Promise.all([...this.loops.values()].map((loop) => loop.stop()));
    await this.running?.catch(() => undefined);
    this.loops.clear();
    for (const job of this.jobs) await job.finish?.();
    this.stopping = undefined;
  }
}
