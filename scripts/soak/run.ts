/**
 * The soak: start the server (unless --url), set up users and nodes, run the
 * mixed traffic at a fixed arrival rate, watch the server's RSS, and judge.
 *
 * Open model: request starts are scheduled by time (start i at t0 + i/rate),
 * never by completions. At most `concurrency` requests are in flight; a start
 * that finds no free slot waits for one, and its latency is counted from its
 * scheduled time (so a stalling server shows in p99 instead of slowing the
 * client down: no coordinated omission). Starts still waiting when the time
 * is up were never sent: each is an error.
 *
 * RSS baseline: the server's VmRSS sampled after setup AND `warmupS` (10) s
 * of traffic, when start-up, JIT, connection pools and caches have settled.
 * The run fails if any later sample exceeds it by more than maxRssGrowthPct
 * (20 %). The RSS right after start-up and after setup are printed for
 * information only.
 *
 * On the embedded database the fresh data dir is first initialised by a
 * start that is stopped at once, and the soak runs against a second start on
 * it. The first start on an empty data dir (PGlite's initdb and the
 * migrations) leaves ~400 MB that is given back only at some later GC, from a
 * few seconds to a minute on: a baseline taken before that GC would allow
 * twice the steady RSS. A restart on existing data is also what production
 * runs. The first start's RSS is printed.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import type { SoakOptions } from './options.js';
import { scrapeMetrics, type ServerMetrics } from './metrics.js';
import {
  createScratchDatabase,
  rateLimitVariables,
  readRssMb,
  startChildServer,
  type ChildServer,
  type ScratchDatabase,
} from './server.js';
import { Histogram, SoakStats } from './stats.js';
import { setup } from './setup.js';
import { Traffic } from './traffic.js';

export interface RssSample {
  atS: number;
  mb: number;
  metrics?: ServerMetrics;
}

export interface SoakResult {
  minutes: number;
  requests: number;
  errors: number;
  expected: number;
  p50Ms: number;
  p99Ms: number;
  rssStartMb: number | undefined;
  rssMaxMb: number | undefined;
  rssGrowthPct: number | undefined;
  rssSamples: RssSample[];
  passed: boolean;
  /**
   * The line CI greps, e.g. `soak: minutes=1 requests=3000 errors=0 p50_ms=3 p99_ms=40 rss_start_mb=120
   * rss_max_mb=131 rss_growth_pct=9.2`.
   */
  summary: string;
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));
const fmtMs = (ms: number) => String(Math.round(ms));
const fmt1 = (n: number | undefined) => (n === undefined ? 'n/a' : n.toFixed(1));

/** Least-squares slope of y over x, per minute of x seconds. */
function slopePerMin(xs: number[], ys: number[]): number | undefined {
  const n = xs.length;
  if (n < 3) return undefined;
  const mx = xs.reduce((a, b) => a + b, 0) / n;
  const my = ys.reduce((a, b) => a + b, 0) / n;
  let num = 0;
  let den = 0;
  for (let i = 0; i < n; i++) {
    num += (xs[i]! - mx) * (ys[i]! - my);
    den += (xs[i]! - mx) ** 2;
  }
  return den === 0 ? undefined : (num / den) * 60;
}

export async function runSoak(
  o: SoakOptions,
  out: (line: string) => void = console.log,
  signal?: AbortSignal,
): Promise<SoakResult> {
  const tmp = mkdtempSync(join(tmpdir(), 'gpucloud-soak-'));
  let server: ChildServer | undefined;
  let scratch: ScratchDatabase | undefined;
  const t0 = performance.now();
  let trafficStart = t0;
  const stats = new SoakStats(() => performance.now() - trafficStart);
  try {
    // ---- the server ----
    let base = o.url;
    let pid = o.pid;
    let adminPassword = o.adminPassword;
    if (!base) {
      adminPassword = `soak-admin-${randomBytes(9).toString('hex')}`;
      const env: Record<string, string> = {
        GPUCLOUD_DATA_DIR: join(tmp, 'data'),
        PORT: '0',
        HOST: '127.0.0.1',
        LOG_LEVEL: o.logLevel,
        GPUCLOUD_DEMO: '0',
        GPUCLOUD_ADMIN_EMAIL: o.adminEmail,
        GPUCLOUD_ADMIN_PASSWORD: adminPassword,
        GPUCLOUD_SIM_PROVISION_MS: '500',
        GPUCLOUD_CLOCK: 'system',
      };
      // Far above any rate this soak can reach (the server accepts up to 1000000 for each).
      for (const v of rateLimitVariables()) env[v] = '1000000';
      if (o.redisUrl) env.GPUCLOUD_REDIS_URL = o.redisUrl;
      if (o.db === 'postgres') {
        scratch = await createScratchDatabase(process.env.DATABASE_URL!);
        env.DATABASE_URL = scratch.url;
        env.GPUCLOUD_JWT_SECRET = randomBytes(32).toString('hex');
        out(`soak: database ${scratch.name} created`);
      }
      const forward = (line: string) => process.stderr.write(`[server] ${line}\n`);
      if (o.db === 'embedded') {
        // Initialise the fresh data dir with a first start (see the top of this file).
        const first = await startChildServer(env, 120_000, forward);
        await sleep(1000);
        out(
          `soak: data dir initialised by a first start (rss ${rssText(first.pid)} MB after ${((performance.now() - t0) / 1000).toFixed(1)} s); restarting on it`,
        );
        await first.stop();
      }
      const t1 = performance.now();
      server = await startChildServer(env, 120_000, forward);
      base = server.url;
      pid = server.pid;
      out(
        `soak: server pid ${pid} at ${base} (${o.db}${o.redisUrl ? ' + redis' : ''}), started in ${((performance.now() - t1) / 1000).toFixed(1)} s, rss ${rssText(pid)} MB`,
      );
    } else {
      if (!adminPassword)
        throw new Error('--url needs the admin password: --admin-password or GPUCLOUD_ADMIN_PASSWORD');
      out(`soak: server at ${base}${pid ? ` (pid ${pid})` : ' (no --pid: RSS is not measured)'}`);
    }
    const serverUrl = base;

    // ---- setup ----
    const world = await setup(
      base,
      {
        adminEmail: o.adminEmail,
        adminPassword,
        users: o.users,
        vmsPerUser: o.vmsPerUser,
        timeoutMs: o.timeoutMs,
        tmpDir: tmp,
      },
      out,
    );
    if (pid) out(`soak: rss after setup ${rssText(pid)} MB`);
    const tr = new Traffic(world, stats, o.timeoutMs);

    // ---- traffic ----
    const durationMs = o.minutes * 60_000;
    const samples: RssSample[] = [];
    let baseline: number | undefined;
    let inflight = 0;
    let issued = 0;
    let maxInflight = 0;
    let lateStarts = 0;
    let loopLagMaxMs = 0;
    // How late starts were sent after their scheduled time (client-side wait for a slot or the event loop).
    const startLag = new Histogram();
    const waiting: number[] = [];
    let stopped = false;
    trafficStart = performance.now();
    const elapsedS = () => (performance.now() - trafficStart) / 1000;

    const launch = (scheduledAt: number) => {
      inflight++;
      if (inflight > maxInflight) maxInflight = inflight;
      const lag = performance.now() - scheduledAt;
      startLag.record(lag);
      if (lag > 1000) lateStarts++;
      tr.run(tr.pickOp(), scheduledAt)
        .catch((err: unknown) => stats.error('soak client bug', '', (err as Error).stack ?? String(err)))
        .finally(() => {
          inflight--;
          drain();
        });
    };
    const drain = () => {
      while (!stopped && inflight < o.concurrency && waiting.length) launch(waiting.shift()!);
    };
    // Start i is due at trafficStart + i / rate s; there are ceil(duration x rate) of them.
    const totalStarts = Math.ceil((durationMs / 1000) * o.rate);
    let tickTimer: NodeJS.Timeout | undefined;
    const tick = () => {
      if (stopped) return;
      const now = performance.now();
      const due = Math.min(Math.floor(((now - trafficStart) / 1000) * o.rate) + 1, totalStarts);
      while (issued < due) waiting.push(trafficStart + (issued++ * 1000) / o.rate);
      drain();
      // Wake up for the next start (timers are ~1 ms precise; never more than 50 ms apart).
      if (issued < totalStarts)
        tickTimer = setTimeout(
          tick,
          Math.min(50, Math.max(0, trafficStart + (issued * 1000) / o.rate - performance.now())),
        );
    };
    let sampling = false;
    const sample = async () => {
      if (sampling) return;
      sampling = true;
      try {
        const metrics = await scrapeMetrics(serverUrl, 5000);
        if (metrics?.loopLagMaxMs !== undefined) loopLagMaxMs = Math.max(loopLagMaxMs, metrics.loopLagMaxMs);
        const mb = pid ? readRssMb(pid) : undefined;
        if (mb === undefined) return;
        const atS = Math.round(elapsedS());
        if (samples.at(-1)?.atS === atS) samples.pop();
        samples.push({ atS, mb, metrics });
        if (baseline === undefined && atS >= o.warmupS) {
          baseline = mb;
          out(`soak: rss baseline ${mb.toFixed(1)} MB (after setup and ${o.warmupS} s of traffic)`);
        }
      } finally {
        sampling = false;
      }
    };
    const afterWarmup = () => samples.filter((s) => s.atS >= o.warmupS);
    const progress = () => {
      const last = samples.at(-1);
      const m = last?.metrics;
      const w = stats.takeWindow();
      out(
        `soak: t=${Math.round(elapsedS())}s requests=${stats.requests} errors=${stats.errors} expected_4xx=${stats.expected} p99_ms=${fmtMs(stats.all.percentile(99))} ` +
          `p99_last10s_ms=${fmtMs(w.percentile(99))} rss_mb=${fmt1(last?.mb)} heap_mb=${fmt1(m?.heapUsedMb)} ext_mb=${fmt1(m?.externalMb)} fds=${m?.openFds ?? 'n/a'} ` +
          `loop_lag_max_ms=${fmtMs(m?.loopLagMaxMs ?? 0)} inflight=${inflight} waiting=${waiting.length} vms=${tr.liveCount()} (${tr.liveSummary()}) cycles=${tr.cycles}`,
      );
    };

    tick();
    await sample();
    const timers = [
      setInterval(() => void sample(), 5000),
      setInterval(() => {
        tr.checkStuck();
        progress();
      }, 10_000),
    ];
    const stopEarly = new Promise<string>((resolve) => {
      signal?.addEventListener('abort', () => resolve('interrupted'), { once: true });
      timers.push(
        setInterval(() => {
          if (server?.exit) resolve(`the server exited (code ${server.exit.code}, signal ${server.exit.signal})`);
        }, 200),
      );
    });
    const why = await Promise.race([sleep(durationMs).then(() => undefined), stopEarly]);
    stopped = true;
    clearTimeout(tickTimer);
    for (const t of timers) clearInterval(t);
    if (why) {
      stats.error(
        why === 'interrupted' ? 'interrupted' : 'server exited',
        '',
        `${why} after ${elapsedS().toFixed(1)} s${server?.tail.length ? `; its last lines:\n${server.tail.join('\n')}` : ''}`,
      );
    }
    // Starts never sent because every slot was busy until the end: errors (the server could not keep up).
    const unsent = waiting.length;
    if (unsent > 0 && !why) {
      for (let i = 0; i < unsent; i++)
        stats.error(
          'not sent (all slots busy until the end)',
          '',
          `${unsent} scheduled starts were never sent: ${o.concurrency} requests in flight`,
        );
    }
    waiting.length = 0;
    const drainUntil = performance.now() + o.timeoutMs + 2000;
    while (inflight > 0 && performance.now() < drainUntil) await sleep(20);
    tr.checkStuck();
    while (sampling) await sleep(20);
    await sample();
    progress();

    // ---- report ----
    out('soak: per endpoint (latency from the scheduled start; expected = business 4xx)');
    out(
      `  ${'endpoint'.padEnd(28)} ${'count'.padStart(7)} ${'errors'.padStart(6)} ${'expected'.padStart(8)} ${'p50_ms'.padStart(7)} ${'p99_ms'.padStart(7)} ${'max_ms'.padStart(7)}  expected by code`,
    );
    for (const [name, e] of [...stats.endpoints].sort((a, b) => a[0].localeCompare(b[0]))) {
      const codes = [...e.expectedByCode].map(([c, n]) => `${c}:${n}`).join(' ');
      out(
        `  ${name.padEnd(28)} ${String(e.hist.count).padStart(7)} ${String(e.errors).padStart(6)} ${String(e.expected).padStart(8)} ${fmtMs(e.hist.percentile(50)).padStart(7)} ${fmtMs(e.hist.percentile(99)).padStart(7)} ${fmtMs(e.hist.max).padStart(7)}  ${codes}`,
      );
    }
    out(
      `soak: VM creates=${tr.creates} full cycles (create, stop, start, destroy)=${tr.cycles} failed=${tr.failedVms} left=${tr.liveCount()} (${tr.liveSummary()})`,
    );
    out(
      `soak: max in flight=${maxInflight} of ${o.concurrency}; start lag (sent after scheduled) p50_ms=${startLag.percentile(50).toFixed(1)} p99_ms=${startLag.percentile(99).toFixed(1)} max_ms=${startLag.max.toFixed(1)}, more than 1 s late=${lateStarts}; server event-loop lag max_ms=${fmtMs(loopLagMaxMs)}`,
    );
    if (samples.length) {
      out(`soak: rss_mb over time (s=MB): ${samples.map((s) => `${s.atS}=${Math.round(s.mb)}`).join(' ')}`);
      if (samples.some((s) => s.metrics?.heapUsedMb !== undefined)) {
        out(
          `soak: heap_used_mb over time: ${samples.map((s) => `${s.atS}=${s.metrics?.heapUsedMb === undefined ? '?' : Math.round(s.metrics.heapUsedMb)}`).join(' ')}`,
        );
        const first = afterWarmup()[0]?.metrics ?? samples[0]!.metrics;
        const last = samples.at(-1)!.metrics;
        out(
          `soak: from the baseline to the end: heap_used_mb ${fmt1(first?.heapUsedMb)} -> ${fmt1(last?.heapUsedMb)}, external_mb ${fmt1(first?.externalMb)} -> ${fmt1(last?.externalMb)}, ` +
            `open fds ${first?.openFds ?? '?'} -> ${last?.openFds ?? '?'}, active handles ${first?.activeHandles ?? '?'} -> ${last?.activeHandles ?? '?'}`,
        );
      }
      const aw = afterWarmup();
      if (aw.length) {
        const slope = slopePerMin(
          aw.map((s) => s.atS),
          aw.map((s) => s.mb),
        );
        out(
          `soak: rss after warm-up: baseline=${fmt1(baseline)} min=${fmt1(Math.min(...aw.map((s) => s.mb)))} max=${fmt1(Math.max(...aw.map((s) => s.mb)))} end=${fmt1(aw.at(-1)!.mb)} MB, trend ${slope === undefined ? 'n/a' : `${slope >= 0 ? '+' : ''}${slope.toFixed(2)} MB/min`}`,
        );
      }
    }
    for (const [group, g] of stats.errorGroups) {
      out(`soak: ERROR x${g.count} ${group}`);
      for (const s of g.samples)
        out(`    at ${s.atS}s${s.requestId ? ` x-request-id ${s.requestId}` : ''}: ${s.detail}`);
    }
    const aw = afterWarmup();
    const max = aw.length ? Math.max(...aw.map((s) => s.mb)) : undefined;
    const growth = baseline !== undefined && max !== undefined ? ((max - baseline) / baseline) * 100 : undefined;
    const rssOk = growth === undefined || growth <= o.maxRssGrowthPct;
    if (!rssOk) out(`soak: RSS grew ${growth!.toFixed(1)} % over the baseline (limit ${o.maxRssGrowthPct} %)`);
    if (pid && baseline === undefined)
      out('soak: RSS baseline never taken (the run ended during warm-up or /proc is unreadable)');
    const p50 = stats.all.percentile(50);
    const p99 = stats.all.percentile(99);
    const summary =
      `soak: minutes=${o.minutes} requests=${stats.requests} errors=${stats.errors} p50_ms=${fmtMs(p50)} p99_ms=${fmtMs(p99)} ` +
      `rss_start_mb=${baseline === undefined ? 0 : Math.round(baseline)} rss_max_mb=${max === undefined ? 0 : Math.round(max)} rss_growth_pct=${growth === undefined ? '0.0' : growth.toFixed(1)}`;
    if (o.url) await tr.destroyAll();
    return {
      minutes: o.minutes,
      requests: stats.requests,
      errors: stats.errors,
      expected: stats.expected,
      p50Ms: p50,
      p99Ms: p99,
      rssStartMb: baseline,
      rssMaxMb: max,
      rssGrowthPct: growth,
      rssSamples: samples,
      passed: stats.errors === 0 && rssOk,
      summary,
    };
  } finally {
    if (server) {
      const died = server.exit;
      await server.stop();
      if (died) out(`soak: the server had exited by itself (code ${died.code}, signal ${died.signal})`);
    }
    if (scratch) {
      await scratch
        .drop()
        .catch((err: unknown) => out(`soak: could not drop database ${scratch!.name}: ${(err as Error).message}`));
    }
    rmSync(tmp, { recursive: true, force: true });
  }
}

function rssText(pid: number): string {
  const mb = readRssMb(pid);
  return mb === undefined ? 'n/a' : mb.toFixed(1);
}
