/** Latency histograms and outcome counters of the soak. */

/**
 * Latencies in fixed buckets, small enough to keep one per endpoint for any
 * length of run: 0.1 ms wide below 100 ms, 1 ms below 10 s, 10 ms below
 * 120 s, and one bucket above. A percentile is its bucket's upper bound.
 */
export class Histogram {
  private static readonly SIZE = 1000 + 9900 + 11000 + 1;
  private readonly buckets = new Uint32Array(Histogram.SIZE);
  count = 0;
  max = 0;

  private static index(ms: number): number {
    if (ms < 100) return Math.max(0, Math.floor(ms * 10));
    if (ms < 10_000) return 1000 + Math.floor(ms) - 100;
    if (ms < 120_000) return 10_900 + Math.floor((ms - 10_000) / 10);
    return Histogram.SIZE - 1;
  }

  private upper(i: number): number {
    if (i < 1000) return (i + 1) / 10;
    if (i < 10_900) return i - 1000 + 100 + 1;
    if (i < Histogram.SIZE - 1) return 10_000 + (i - 10_900 + 1) * 10;
    return this.max;
  }

  record(ms: number): void {
    this.buckets[Histogram.index(ms)]!++;
    this.count++;
    if (ms > this.max) this.max = ms;
  }

  /** The p-th percentile (0 < p <= 100) in ms, 0 when empty. */
  percentile(p: number): number {
    if (this.count === 0) return 0;
    const rank = Math.max(1, Math.ceil((p / 100) * this.count));
    let seen = 0;
    for (let i = 0; i < this.buckets.length; i++) {
      seen += this.buckets[i]!;
      if (seen >= rank) return Math.min(this.upper(i), this.max);
    }
    return this.max;
  }
}

export type Outcome = 'ok' | 'expected' | 'error';

export interface ErrorSample {
  atS: number;
  requestId: string;
  detail: string;
}

export interface EndpointStats {
  hist: Histogram;
  ok: number;
  expected: number;
  errors: number;
  /** Expected business 4xx by code, e.g. gpu_unavailable -> 12. */
  expectedByCode: Map<string, number>;
}

export interface ErrorGroup {
  count: number;
  samples: ErrorSample[];
}

export class SoakStats {
  readonly all = new Histogram();
  /** Latencies since the last takeWindow() (the progress lines' recent p99). */
  private window = new Histogram();
  readonly endpoints = new Map<string, EndpointStats>();
  /** Errors grouped by "endpoint status code" (or a description for non-HTTP errors). */
  readonly errorGroups = new Map<string, ErrorGroup>();
  requests = 0;
  errors = 0;
  expected = 0;

  constructor(private readonly t0: () => number) {}

  private endpoint(name: string): EndpointStats {
    let e = this.endpoints.get(name);
    if (!e) {
      e = { hist: new Histogram(), ok: 0, expected: 0, errors: 0, expectedByCode: new Map() };
      this.endpoints.set(name, e);
    }
    return e;
  }

  /** A request that got an answer, or failed on the network (then ms is the time until the failure). */
  record(endpoint: string, ms: number, outcome: Outcome, code?: string): void {
    const e = this.endpoint(endpoint);
    this.requests++;
    this.all.record(ms);
    this.window.record(ms);
    e.hist.record(ms);
    if (outcome === 'ok') e.ok++;
    else if (outcome === 'expected') {
      e.expected++;
      this.expected++;
      const k = code ?? 'unknown';
      e.expectedByCode.set(k, (e.expectedByCode.get(k) ?? 0) + 1);
    } else e.errors++;
  }

  takeWindow(): Histogram {
    const w = this.window;
    this.window = new Histogram();
    return w;
  }

  /** An error: a failed request (recorded with record() too) or a problem seen otherwise (a stuck VM). */
  error(group: string, requestId: string, detail: string): void {
    this.errors++;
    let g = this.errorGroups.get(group);
    if (!g) {
      g = { count: 0, samples: [] };
      this.errorGroups.set(group, g);
    }
    g.count++;
    if (g.samples.length < 3)
      g.samples.push({ atS: Math.round(this.t0() / 100) / 10, requestId, detail: detail.slice(0, 600) });
  }
}
