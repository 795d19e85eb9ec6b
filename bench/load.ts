/**
 * One measurement with autocannon (its programmatic API), from this process
 * against a server in another: 50 connections, a 2 s warm-up that is thrown
 * away, then the measured run. Counts: successful (2xx) answers per second,
 * their latency percentiles (from each response's time, to the hundredth of a
 * millisecond), and errors (non-2xx answers, timeouts, socket errors). Used by
 * bench/http.ts, not run on its own.
 */
import autocannon from 'autocannon';

export const CONNECTIONS = 50;
export const WARMUP_S = 2;

export interface Load {
  url: string;
  method?: string;
  headers?: Record<string, string>;
  body?: string;
  requests?: autocannon.Request[];
  /** Called before the warm-up and before the measured run (a load that changes the server puts it back). */
  prepare?: () => Promise<void>;
  /** Filled by a load that reads its answers: "METHOD status code" -> count of error answers; cleared by prepare. */
  errorCodes?: Map<string, number>;
}

export interface Measurement {
  rps: number;
  p50_ms: number | null;
  p99_ms: number | null;
  requests: number;
  errors: number;
  seconds: number;
  statuses: Record<string, number>;
  error_codes?: Record<string, number>;
}

const round2 = (n: number) => Math.round(n * 100) / 100;

/** Nearest-rank percentile of sorted values. */
function percentile(sorted: number[], p: number): number | null {
  if (sorted.length === 0) return null;
  return round2(sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(p * sorted.length) - 1))]!);
}

async function fire(
  load: Load,
  durationS: number,
  onAnswer: (status: number, ms: number) => void,
): Promise<autocannon.Result> {
  const { prepare: _prepare, errorCodes: _errorCodes, ...opts } = load;
  const instance = autocannon({ ...opts, connections: CONNECTIONS, duration: durationS, timeout: 30 });
  instance.on('response', (_client, status, _bytes, ms) => onAnswer(status, ms));
  return instance;
}

function summarize(
  r: autocannon.Result,
  latencies: number[],
  errorCodes: Map<string, number> | undefined,
): Measurement {
  latencies.sort((a, b) => a - b);
  const statuses = Object.fromEntries(Object.entries(r.statusCodeStats).map(([code, s]) => [code, s.count]));
  const seconds = r.duration;
  return {
    rps: round2(latencies.length / seconds),
    p50_ms: percentile(latencies, 0.5),
    p99_ms: percentile(latencies, 0.99),
    requests: r.requests.total,
    errors: r.non2xx + r.errors,
    seconds: round2(seconds),
    statuses,
    ...(errorCodes?.size ? { error_codes: Object.fromEntries(errorCodes) } : {}),
  };
}

export async function measure(load: Load, durationS: number): Promise<Measurement> {
  await load.prepare?.();
  await fire(load, WARMUP_S, () => {});
  await load.prepare?.();
  const latencies: number[] = [];
  const r = await fire(load, durationS, (status, ms) => {
    if (status >= 200 && status < 300) latencies.push(ms);
  });
  return summarize(r, latencies, load.errorCodes);
}
