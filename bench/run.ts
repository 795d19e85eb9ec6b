/**
 * `npm run bench [-- CASE ...] [--db embedded|postgres|both] [--duration S] [--repo DIR] [--runs N] [--image-mb N]`:
 * the benchmarks, printed as tables and written to bench/results.json. Speed
 * targets live here, never in timed tests. Cases (all of them when none is
 * named, real-vm only when --db includes embedded; real-vm skips itself
 * without QEMU):
 *   search pricing vm vms balance login vm-cycle vm-cycle-customers
 *             the service's endpoints under load (autocannon, 50
 *             connections, --duration seconds each, default 10), each
 *             against a bare-Fastify baseline (bench/http.ts)
 *   startup   seconds to the first GET /healthz 200 and idle RSS, first and
 *             second start (bench/startup.ts)
 *   metering  seconds the interval job takes to close one billing period of
 *             10,000 and 100,000 running VMs and to catch up a missed day of
 *             100,000 (PostgreSQL; 10,000 embedded), seeded straight into
 *             the tables; on PostgreSQL also an idle worker's transactions
 *             per second at 50,000 VMs and its SIGTERM-to-exit time during a
 *             close (bench/metering.ts)
 *   node-offline
 *             seconds an operator's `status: offline` takes for a node with
 *             1,000 VMs, seeded the same way, half-way through a billing
 *             period (bench/metering.ts)
 *   history   milliseconds of the reads of request paths and background
 *             loops behind a long history (200,000 destroyed or failed VMs
 *             on PostgreSQL, 20,000 embedded, with their events, webhook
 *             deliveries, refresh tokens...) seeded into the tables
 *             (bench/history.ts)
 *   portal    the access portal next to the same HTTP server reached directly: GET / at
 *             50 connections, a 100 MB download, 1,000 idle WebSockets' RSS
 *             (a stand-in agent and guest app, bench/portal.ts)
 *   images    a raw image (--image-mb N, default 1024) pushed in 32 MiB ranges
 *             (MB/s), then downloaded by two real agents registered at once:
 *             each one's MB/s (target: at least 200) and seconds to ready,
 *             and the service's RSS growth meanwhile (target: under 50 MB)
 *             (bench/images.ts)
 *   move      a stopped VM's disk holding --image-mb N MiB of data (default 1024)
 *             moved between two real agents on loopback: export on one,
 *             import on the other until it is stopped and verified; MB/s end
 *             to end (target: at least 150), split into convert, hash,
 *             transfer, checks (bench/move.ts; needs qemu-utils)
 *   real-vm   POST /vms -> running -> SSH login on the test image, the agent
 *             alone, and bare QEMU as the baseline (needs QEMU; --runs N,
 *             default 3; embedded only)
 * --db: which database the HTTP and startup cases run on (default embedded;
 * postgres makes a scratch database on DATABASE_URL, default
 * postgres://postgres@127.0.0.1:5432/test, with Redis at GPUCLOUD_REDIS_URL,
 * default redis://127.0.0.1:6379). --repo: the checkout whose built
 * service (its npm start) is measured (default this one; run npm run build there first),
 * for before/after figures; the baselines always come from this checkout.
 */
import { writeFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { REPO_ROOT } from '../scripts/soak/server.js';
import { releaseOnSignals } from './cleanup.js';
import { httpBench, SERVICE_CASES } from './http.js';
import { historyBench } from './history.js';
import { imagesBench } from './images.js';
import { meteringBench, timeNodeOffline } from './metering.js';
import { moveBench } from './move.js';
import { realVmBench } from './real-vm.js';
import { portalBench } from './portal.js';
import type { DbKind } from './service.js';
import type { BenchOptions, BenchResult } from './types.js';
import { startupBench } from './startup.js';

const HTTP_CASES = SERVICE_CASES.map((c) => c.name);
const CASES = [...HTTP_CASES, 'startup', 'metering', 'node-offline', 'history', 'portal', 'images', 'move', 'real-vm'];

interface Args {
  cases: string[];
  dbs: DbKind[];
  durationS: number;
  repo: string;
  runs: number;
  imageMb: number;
}

function parse(): Args {
  const { values, positionals } = parseArgs({
    options: {
      runs: { type: 'string', default: '3' },
      db: { type: 'string', default: 'embedded' },
      duration: { type: 'string', default: '10' },
      repo: { type: 'string', default: REPO_ROOT },
      'image-mb': { type: 'string', default: '1024' },
    },
    allowPositionals: true,
    strict: true,
  });
  const runs = Number(values.runs);
  if (!Number.isInteger(runs) || runs < 1 || runs > 50) throw new Error('--runs must be 1 to 50');
  const durationS = Number(values.duration);
  if (!Number.isInteger(durationS) || durationS < 1 || durationS > 3600)
    throw new Error('--duration must be 1 to 3600 (seconds)');
  const imageMb = Number(values['image-mb']);
  if (!Number.isInteger(imageMb) || imageMb < 64 || imageMb > 65536) throw new Error('--image-mb must be 64 to 65536');
  if (!['embedded', 'postgres', 'both'].includes(values.db)) throw new Error('--db must be embedded, postgres or both');
  const dbs: DbKind[] = values.db === 'both' ? ['embedded', 'postgres'] : [values.db as DbKind];
  for (const c of positionals)
    if (!CASES.includes(c)) throw new Error(`unknown case "${c}"; cases: ${CASES.join(', ')}`);
  // real-vm runs on the embedded database alone: not by default on --db postgres.
  const all = dbs.includes('embedded') ? CASES : CASES.filter((c) => c !== 'real-vm');
  return { cases: positionals.length ? positionals : all, dbs, durationS, repo: resolve(values.repo), runs, imageMb };
}

async function runCases(a: Args): Promise<BenchResult[]> {
  const results: BenchResult[] = [];
  const http = HTTP_CASES.filter((c) => a.cases.includes(c));
  for (const db of a.dbs) {
    const o: BenchOptions = { db, durationS: a.durationS, repo: a.repo };
    if (http.length) {
      console.log(`== http (${db}): ${http.join(', ')}`);
      results.push(...(await httpBench(o, http)));
    }
    if (a.cases.includes('startup')) {
      console.log(`== startup (${db})`);
      results.push(...(await startupBench(o)));
    }
    if (a.cases.includes('metering')) {
      console.log(`== metering (${db})`);
      results.push(...(await meteringBench(db, o.repo)));
    }
    if (a.cases.includes('node-offline')) {
      console.log(`== node-offline (${db})`);
      results.push(await timeNodeOffline(db));
    }
    if (a.cases.includes('history')) {
      console.log(`== history (${db})`);
      results.push(...(await historyBench(db)));
    }
    if (a.cases.includes('portal')) {
      console.log(`== portal (${db})`);
      results.push(...(await portalBench(o)));
    }
    if (a.cases.includes('images')) {
      console.log(`== images (${db})`);
      results.push(...(await imagesBench(o, a.imageMb)));
    }
  }
  if (a.cases.includes('move')) {
    console.log('== move');
    results.push(...(await moveBench(a.imageMb)));
  }
  if (a.cases.includes('real-vm')) {
    console.log('== real-vm');
    results.push(...(await realVmBench(a.runs)));
  }
  return results;
}

const num = (n: number | null | undefined, digits = 2) => (n === undefined || n === null ? '-' : n.toFixed(digits));

function printHttp(rows: BenchResult[]): void {
  console.log(
    [
      'endpoint'.padEnd(46),
      'db'.padEnd(9),
      'req/s'.padStart(8),
      'p50 ms'.padStart(7),
      'p99 ms'.padStart(7),
      '  baseline'.padEnd(40),
      'base r/s'.padStart(9),
      'ratio'.padStart(6),
      'errors'.padStart(7),
    ].join(' '),
  );
  for (const r of rows) {
    console.log(
      [
        r.name.padEnd(46),
        r.db.padEnd(9),
        num(r.rps, 0).padStart(8),
        num(r.p50_ms).padStart(7),
        num(r.p99_ms).padStart(7),
        `  ${r.baseline ?? '-'}`.padEnd(40),
        num(r.baseline_rps, 0).padStart(9),
        num(r.ratio).padStart(6),
        String(r.errors ?? '').padStart(7),
      ].join(' '),
    );
  }
}

function printStartup(rows: BenchResult[]): void {
  const head = ['start-up'.padEnd(46), 'db'.padEnd(9), 'seconds'.padStart(8), 'RSS MB at 5 s'.padStart(14)];
  console.log([...head, 'idle RSS MB'.padStart(12)].join(' '));
  for (const r of rows)
    console.log(
      [
        r.name.padEnd(46),
        r.db.padEnd(9),
        num(r.seconds).padStart(8),
        num(r.rss_5s_mb, 0).padStart(14),
        num(r.rss_mb, 0).padStart(12),
      ].join(' '),
    );
}

function printMetering(rows: BenchResult[]): void {
  console.log(['metering'.padEnd(46), 'db'.padEnd(9), 'seconds'.padStart(8)].join(' '));
  for (const r of rows) console.log([r.name.padEnd(46), r.db.padEnd(9), num(r.seconds).padStart(8)].join(' '));
}

function printHistory(rows: BenchResult[]): void {
  console.log(['history'.padEnd(72), 'db'.padEnd(9), 'ms'.padStart(8)].join(' '));
  for (const r of rows) console.log([r.name.padEnd(72), r.db.padEnd(9), num(r.ms).padStart(8)].join(' '));
}

function printRealVm(rows: BenchResult[]): void {
  console.log(
    [
      'case'.padEnd(46),
      'db'.padEnd(9),
      'median s'.padStart(9),
      'min s'.padStart(7),
      'max s'.padStart(7),
      '  target',
    ].join(' '),
  );
  for (const r of rows) {
    const target = r.target_s === undefined ? '' : `  < ${r.target_s} s ${r.ok ? 'ok' : 'MISSED'}`;
    console.log(
      [
        r.name.padEnd(46),
        r.db.padEnd(9),
        num(r.seconds).padStart(9),
        num(r.min_s).padStart(7),
        num(r.max_s).padStart(7),
        target,
      ].join(' '),
    );
  }
}

function print(results: BenchResult[]): void {
  const tables: [BenchResult['kind'], (rows: BenchResult[]) => void][] = [
    ['http', printHttp],
    ['startup', printStartup],
    ['metering', printMetering],
    ['history', printHistory],
    [undefined, printRealVm],
  ];
  for (const [kind, printer] of tables) {
    const rows = results.filter((r) => r.kind === kind);
    if (rows.length) {
      console.log('');
      printer(rows);
    }
  }
}

async function main(): Promise<void> {
  const args = parse();
  releaseOnSignals();
  const results = await runCases(args);
  print(results);
  writeFileSync(new URL('./results.json', import.meta.url), JSON.stringify(results, null, 2) + '\n');
  console.log('written: bench/results.json');
}

main().catch((err: unknown) => {
  console.error(err instanceof Error ? err.message : err);
  process.exit(1);
});
