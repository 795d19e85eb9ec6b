/** What each bench is given and what it reports (bench/run.ts prints and compares them). */
import type { DbKind } from './service.js';

export interface BenchResult {
  /** Which table prints it: HTTP load, start-up, metering, history reads, or (absent) the real-VM timings. */
  kind?: 'http' | 'startup' | 'metering' | 'history';
  name: string;
  db: string;
  /** HTTP: successful answers per second and their latency; null where not measured. */
  rps?: number | null;
  p50_ms?: number | null;
  p99_ms?: number | null;
  /** The name of what this is compared with, its req/s, and rps / baseline_rps. */
  baseline?: string | null;
  baseline_rps?: number | null;
  ratio?: number | null;
  /** HTTP: non-2xx answers plus socket errors and timeouts, all requests answered, answers per status. */
  errors?: number;
  requests?: number;
  statuses?: Record<string, number>;
  /** HTTP, create/destroy cycle: error answers by "METHOD status code". */
  error_codes?: Record<string, number>;
  /** Start-up: VmRSS after 60 s idle, and 5 s after the first 200. */
  rss_mb?: number | null;
  rss_5s_mb?: number | null;
  /** HTTP: length of the measured run; start-up: time to ready; real-VM: the median. */
  seconds?: number;
  /** History: the median milliseconds of the read. */
  ms?: number;
  min_s?: number;
  max_s?: number;
  runs?: number;
  /** Real-VM: the baseline's median seconds. */
  baseline_s?: number;
  target_s?: number;
  ok?: boolean;
}

export interface BenchOptions {
  db: DbKind;
  durationS: number;
  repo: string;
}
