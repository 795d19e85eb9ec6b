/**
 * The service clock (docs/configuration.md#the-manual-clock). Nothing else in the code calls Date.now()
 * for service time; rate-limit windows and claim leases stay on real time.
 */
export interface Clock {
  readonly mode: 'system' | 'manual';
  now(): Date;
  nowMs(): number;
}

export class SystemClock implements Clock {
  readonly mode = 'system' as const;
  now(): Date {
    return new Date();
  }
  nowMs(): number {
    return Date.now();
  }
}

/**
 * Stands still except through advance(). Persistence of its value (kept in the
 * database across restarts) is done by the clock service, which owns the row.
 */
export class ManualClock implements Clock {
  readonly mode = 'manual' as const;
  constructor(private ms: number) {}
  now(): Date {
    return new Date(this.ms);
  }
  nowMs(): number {
    return this.ms;
  }
  set(ms: number): void {
    this.ms = ms;
  }
  advance(seconds: number): void {
    this.ms += seconds * 1000;
  }
}

/**
 * Real time, for what must not follow a manual clock: rate-limit windows and the leases that tell a dead instance's
 * claim from a live one.
 */
export const realTimeMs = (): number => Date.now();

/**
 * Lets waiting I/O run (requests, timers) before long work goes on: the embedded database answers
 * through promises alone, so a loop of queries would otherwise never give the event loop back and
 * hold every request, /healthz included, until it ended (docs/architecture.md#background-loops).
 */
export function yieldToIo(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}
