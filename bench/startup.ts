/**
 * The `startup` case of `npm run bench`: seconds from spawning
 * the service as `npm start` runs it to the first 200 from GET /healthz, and its
 * RSS (VmRSS) 5 s later and once idle (60 s later: by then V8 has shrunk the
 * young generation it grew while starting and compacted the heap), for the
 * first start on a fresh database (an empty embedded data dir, or a new scratch
 * PostgreSQL database: migrations and all) and for the second start on the same one.
 * Run: npm run bench -- startup [--db embedded|postgres|both] [--repo DIR]
 */
import { readRssMb } from '../scripts/soak/server.js';
import { freePort } from '../test/helpers/ports.js';
import { withScope, type Scope } from './cleanup.js';
import type { BenchOptions, BenchResult } from './types.js';
import { benchAdmin, freshDatabase, startService, type Credentials, type ServiceDb } from './service.js';

const JUST_STARTED_MS = 5_000;
const IDLE_MS = 60_000;
const START_TIMEOUT_MS = 120_000;
const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

async function healthy(url: string): Promise<boolean> {
  try {
    return (await fetch(url, { signal: AbortSignal.timeout(1000) })).status === 200;
  } catch {
    return false;
  }
}

/** Seconds from t0 to the first 200 from `url`; fails as soon as `started` does (the server exited). */
async function secondsToHealthy(url: string, t0: number, started: Promise<unknown>): Promise<number> {
  let failure: unknown;
  started.catch((err: unknown) => (failure = err));
  while (performance.now() - t0 < START_TIMEOUT_MS) {
    if (failure !== undefined) throw failure;
    if (await healthy(url)) return (performance.now() - t0) / 1000;
    await sleep(10);
  }
  throw new Error(`no 200 from ${url} within ${START_TIMEOUT_MS / 1000} s`);
}

async function timedStart(
  scope: Scope,
  o: BenchOptions,
  db: ServiceDb,
  admin: Credentials,
  name: string,
): Promise<BenchResult> {
  const port = await freePort();
  const t0 = performance.now();
  const started = startService(scope, o.repo, db, admin, port);
  const seconds = await secondsToHealthy(`http://127.0.0.1:${port}/healthz`, t0, started);
  const service = await started;
  await sleep(JUST_STARTED_MS);
  const started5s = readRssMb(service.pid);
  await sleep(IDLE_MS - JUST_STARTED_MS);
  const rss = readRssMb(service.pid);
  await service.stop();
  const mb = (v: number | undefined) => v?.toFixed(0) ?? 'n/a';
  console.log(
    `  ${name}: ${seconds.toFixed(2)} s to GET /healthz 200, RSS ${mb(started5s)} MB 5 s later, ${mb(rss)} MB idle`,
  );
  const na = { rps: null, p50_ms: null, p99_ms: null, baseline: null, baseline_rps: null, ratio: null };
  return {
    kind: 'startup',
    name,
    db: o.db,
    ...na,
    seconds: Math.round(seconds * 1000) / 1000,
    rss_5s_mb: started5s === undefined ? null : Math.round(started5s * 10) / 10,
    rss_mb: rss === undefined ? null : Math.round(rss * 10) / 10,
  };
}

export function startupBench(o: BenchOptions): Promise<BenchResult[]> {
  return withScope(async (scope) => {
    const db = await freshDatabase(scope, o.db);
    const admin = benchAdmin();
    const what = o.db === 'embedded' ? 'data dir' : 'database';
    const first = await timedStart(scope, o, db, admin, `startup: first start (fresh ${what})`);
    const second = await timedStart(scope, o, db, admin, `startup: second start (existing ${what})`);
    return [first, second];
  });
}
