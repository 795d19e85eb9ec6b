/** A background loop of the worker (see docs/architecture.md, "Background loops"). */
import type { FastifyBaseLogger } from 'fastify';
import { JobMetrics } from './metrics.js';

/**
 * One background loop: a pass every `everyMs` of real time, one pass at a
 * time. A tick that finds the last pass still running is skipped, never
 * queued, so a slow pass delays only its own loop.
 */
export class Loop {
  private timer: NodeJS.Timeout | undefined;
  private pass: Promise<void> | undefined;
  private again = false;

  constructor(
    readonly name: string,
    private readonly everyMs: number,
    private readonly run: () => Promise<unknown>,
    private readonly log?: FastifyBaseLogger,
    private readonly metrics: JobMetrics = new JobMetrics(),
  ) {}

  start(): void {
    this.timer = setInterval(() => this.tick(), this.everyMs);
    this.timer.unref();
  }

  /**
   * A pass now rather than at the next tick; asked during a pass, one more pass follows it (work that pass
   * finished may have made more due). Nothing while the loop is stopped.
   */
  now(): void {
    if (this.pass) this.again = true;
    this.tick();
  }

  private tick(): void {
    if (this.pass || !this.timer) return;
    this.pass = this.metrics
      .pass(this.name, this.run)
      .then(() => undefined)
      .catch((err: unknown) => this.log?.error({ err, job: this.name }, 'background job failed'))
      .finally(() => {
        this.pass = undefined;
        if (this.again) {
          this.again = false;
          this.tick();
        }
      });
  }

  /** No new pass starts; resolves when the one running (if any) has ended. */
  async stop(): Promise<void> {
    clearInterval(this.timer);
    this.timer = undefined;
    this.again = false;
    await this.pass;
  }
}
