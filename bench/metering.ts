/**
 * Metering at fleet scale: a fleet of VMs seeded straight into the tables
 * (1 in 10 stopped, 1 in 20 drawing on a reservation, ten VMs a customer),
 * then the seconds the interval job takes to close
 *   - one billing period of every VM (`close N`), and
 *   - a day of missed periods, as after a worker was down (`catch-up N`),
 * each checked afterwards: one usage log per VM and period, every balance
 * equal to the sum of its transactions; and the seconds an operator's
 * `status: offline` takes for a node with 1,000 VMs (every VM offline
 * afterwards, its open period closed, every balance still the sum of its
 * transactions). Runs the meter in this process on a
 * scratch database (PostgreSQL: a schema on DATABASE_URL; embedded: an
 * in-memory PGlite). On PostgreSQL it also starts a real worker
 * (`serve --role worker`, system clock) on a fleet of 50,000 accruing VMs with
 * nothing due and counts the database transactions it makes per second, then
 * makes a close due and times SIGTERM to exit while it runs. Used by
 * bench/run.ts (`metering`), not run alone.
 */
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { createScratchDatabase } from '../scripts/scratch-db.js';
import { ManualClock } from '../src/clock.js';
import { PgliteDb, PostgresDb, type Db } from '../src/db/db.js';
import { migrate } from '../src/db/migrate.js';
import { Meter } from '../src/modules/billing/meter.js';
import { createServices } from '../src/app.js';
import { loadConfig } from '../src/config.js';
import { ClockService } from '../src/modules/clock/service.js';
import { MemoryRateLimitStore } from '../src/http/rate-limit-store.js';
import type { BenchResult } from './types.js';
import type { Scope } from './cleanup.js';
import { withScope } from './cleanup.js';
import type { DbKind } from './service.js';
import { seedFleet } from '../scripts/seed-fleet.js';

const INTERVAL_S = 3600;
/** A billing boundary: the fleet has been billed up to here. */
const T0 = Date.UTC(2026, 0, 1);
const DEFAULT_URL = 'postgres://postgres@127.0.0.1:5432/test';

/** A migrated scratch database: an in-memory PGlite, or a schema of its own on DATABASE_URL. */
export async function scratchDb(scope: Scope, kind: DbKind): Promise<Db> {
  if (kind === 'embedded') {
    const db = await PgliteDb.open();
    scope.defer(() => db.close());
    await migrate(db);
    return db;
  }
  const url = process.env.DATABASE_URL ?? DEFAULT_URL;
  const schema = `gpc_bench_${randomBytes(6).toString('hex')}`;
  const admin = new PostgresDb(url, { max: 1 });
  await admin.query(`CREATE SCHEMA ${schema}`);
  scope.defer(async () => {
    await admin.query(`DROP SCHEMA ${schema} CASCADE`);
    await admin.close();
  });
  const db = new PostgresDb(url, { searchPath: schema, max: 10 });
  scope.defer(() => db.close());
  await migrate(db);
  return db;
}

/** Fails unless every balance is the sum of its transactions. */
async function checkBalances(db: Db): Promise<void> {
  const off = await db.query(
    `SELECT b.user_id FROM balances b LEFT JOIN transactions t ON t.user_id = b.user_id GROUP BY b.user_id HAVING b.balance_micros <> COALESCE(sum(t.amount_micros), 0) LIMIT 1`,
  );
  if (off.rows.length) throw new Error('metering bench: a balance differs from the sum of its transactions');
}

/** Fails unless every VM has exactly `periods` usage logs and every balance is the sum of its transactions. */
async function check(db: Db, vms: number, periods: number): Promise<void> {
  const logs = await db.query<{ n: number; vms: number; max: number; min: number }>(
    'SELECT COALESCE(sum(c), 0)::int8 AS n, count(*)::int8 AS vms, max(c)::int8 AS max, min(c)::int8 AS min FROM (SELECT vm_id, count(*) AS c FROM usage_logs GROUP BY vm_id) x',
  );
  const l = logs.rows[0]!;
  if (Number(l.vms) !== vms || Number(l.max) !== periods || Number(l.min) !== periods) {
    throw new Error(
      `metering bench: expected ${periods} period(s) for each of ${vms} VMs, found ${l.n} logs over ${l.vms} VMs`,
    );
  }
  await checkBalances(db);
}

const OFFLINE_NODE = 'bench-offline';

/**
 * An operator takes a node with `vms` VMs offline (PATCH /admin/nodes/{node}'s service call), half-way through a
 * billing period: each VM goes offline in the one transaction, its open period closed and charged.
 */
export async function timeNodeOffline(kind: DbKind, vms = 1000): Promise<BenchResult> {
  return withScope(async (scope) => {
    const db = await scratchDb(scope, kind);
    await seedFleet(db, vms, T0);
    const jwtSecret = randomBytes(24).toString('hex');
    const config = loadConfig({
      GPUCLOUD_CLOCK: 'manual',
      GPUCLOUD_JWT_SECRET: jwtSecret,
      GPUCLOUD_BILLING_INTERVAL_S: String(INTERVAL_S),
      LOG_LEVEL: 'silent',
    });
    const clock = await ClockService.create(db, 'manual', T0 + (INTERVAL_S * 1000) / 2);
    const services = createServices({ config, db, clock, rateLimitStore: new MemoryRateLimitStore(), jwtSecret });
    await services.inventory.ensureDefaultPricing();
    // More VMs than a node of 64 GPUs could hold: the seeded fleet moved onto one node.
    await services.inventory.createNode({
      node: OFFLINE_NODE,
      gpu_type: '4090',
      gpu_count: 64,
      ram_gb: 2048,
      cpu_cores: 256,
      cpu_model: 'Bench EPYC',
      pcie_gen: '4.0',
      max_storage_gb: 100_000,
      location: 'bench',
      cluster_name: 'bench',
    });
    await db.query('UPDATE vms SET node = $1', [OFFLINE_NODE]);
    const running = Number(
      (await db.query<{ n: number }>(`SELECT count(*)::int8 AS n FROM vms WHERE status = 'running'`)).rows[0]!.n,
    );
    const started = performance.now();
    await services.inventory.patchNode(OFFLINE_NODE, { status: 'offline' });
    const seconds = (performance.now() - started) / 1000;
    const after = (
      await db.query<{ offline: number; logs: number }>(
        `SELECT (SELECT count(*) FROM vms WHERE status = 'offline')::int8 AS offline,
                (SELECT count(DISTINCT vm_id) FROM usage_logs)::int8 AS logs`,
      )
    ).rows[0]!;
    if (Number(after.offline) !== vms || Number(after.logs) !== running) {
      throw new Error(
        `node-offline bench: expected ${vms} VMs offline and ${running} periods closed, found ${after.offline} and ${after.logs}`,
      );
    }
    await checkBalances(db);
    const name = `a node with ${vms} VMs goes offline`;
    console.log(`${name} (${kind}): ${seconds.toFixed(2)} s`);
    return { kind: 'metering', name, db: kind, seconds };
  });
}

/** `workers` meters, each on a connection pool of its own (PostgreSQL), close at once. */
async function timeClose(kind: DbKind, vms: number, periods: number, workers = 1): Promise<BenchResult> {
  return withScope(async (scope) => {
    const db = await scratchDb(scope, kind);
    await seedFleet(db, vms, T0);
    const pools = [db];
    for (let i = 1; i < workers; i++) {
      const other = new PostgresDb(process.env.DATABASE_URL ?? DEFAULT_URL, {
        searchPath: (await db.query<{ s: string }>('SELECT current_schema() AS s')).rows[0]!.s,
        max: 10,
      });
      scope.defer(() => other.close());
      pools.push(other);
    }
    const now = new Date(T0 + periods * INTERVAL_S * 1000 + 1000);
    const meters = pools.map(
      (p) => new Meter(p, new ManualClock(now.getTime()), { intervalS: INTERVAL_S, networkPricePerGbMicros: 10_000 }),
    );
    const started = performance.now();
    await Promise.all(meters.map((m) => m.closeDueIntervals(now)));
    const seconds = (performance.now() - started) / 1000;
    await check(db, vms, periods);
    const what = periods === 1 ? `close one period, ${vms} VMs` : `catch up ${periods} periods, ${vms} VMs`;
    const name = workers === 1 ? what : `${what}, ${workers} workers`;
    console.log(`${name} (${kind}): ${seconds.toFixed(2)} s`);
    return { kind: 'metering', name, db: kind, seconds };
  });
}

export interface MeteringCase {
  vms: number;
  periods: number;
  workers?: number;
}

/** The default fleet sizes: PostgreSQL up to 100,000 VMs, the embedded database 10,000. */
export function meteringCases(kind: DbKind): MeteringCase[] {
  return kind === 'postgres'
    ? [
        { vms: 10_000, periods: 1 },
        { vms: 10_000, periods: 1, workers: 2 },
        { vms: 100_000, periods: 1 },
        { vms: 100_000, periods: 24 },
      ]
    : [{ vms: 10_000, periods: 1 }];
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));
const WORKER_FLEET = 50_000;
/** The worker's billing interval: a day, so that no boundary passes while it idles. */
const WORKER_INTERVAL_S = 86_400;

/** The worker's idle cost (database transactions per second) and SIGTERM-to-exit time during a close. */
export async function workerBench(repo: string): Promise<BenchResult[]> {
  return withScope(async (scope) => {
    const main = join(repo, 'dist', 'main.js');
    if (!existsSync(main)) throw new Error(`${main} does not exist: run npm run build in ${repo} first`);
    const scratch = await createScratchDatabase(process.env.DATABASE_URL ?? DEFAULT_URL, 'gpucloud_bench');
    scope.defer(() => scratch.drop());
    const db = new PostgresDb(scratch.url, { max: 2 });
    scope.defer(() => db.close());
    await migrate(db);
    const intervalMs = WORKER_INTERVAL_S * 1000;
    const boundary = Math.floor(Date.now() / intervalMs) * intervalMs;
    await seedFleet(db, WORKER_FLEET, boundary);

    const env: NodeJS.ProcessEnv = { PATH: process.env.PATH, HOME: process.env.HOME };
    Object.assign(env, {
      DATABASE_URL: scratch.url,
      GPUCLOUD_JWT_SECRET: randomBytes(24).toString('hex'),
      GPUCLOUD_CLOCK: 'system',
      GPUCLOUD_DEMO: '0',
      GPUCLOUD_BILLING_INTERVAL_S: String(WORKER_INTERVAL_S),
      LOG_LEVEL: 'warn',
    });
    const child = spawn(process.execPath, [main, 'serve', '--role', 'worker'], {
      cwd: repo,
      env,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const exited = new Promise<number>((resolve) => child.once('exit', () => resolve(performance.now())));
    scope.defer(async () => {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
      await exited;
    });
    child.stderr.on('data', (b: Buffer) => process.stderr.write(`  [worker] ${b.toString()}`));
    await new Promise<void>((resolve, reject) => {
      const t = setTimeout(() => reject(new Error('the worker did not start within 60 s')), 60_000);
      child.stdout.on('data', (b: Buffer) => {
        if (b.toString().includes('gpucloud is running')) {
          clearTimeout(t);
          resolve();
        }
      });
      child.once('exit', () => reject(new Error('the worker exited while starting')));
    });

    const xacts = async () =>
      Number(
        (
          await db.query<{ n: number }>(
            'SELECT (xact_commit + xact_rollback)::int8 AS n FROM pg_stat_database WHERE datname = current_database()',
          )
        ).rows[0]!.n,
      );
    await sleep(3000); // past start-up
    const idleS = 10;
    const before = await xacts();
    await sleep(idleS * 1000);
    // The two statistics reads are transactions of their own (and this bench's pool is otherwise idle).
    const tps = Math.max(0, (await xacts()) - before - 1) / idleS;
    console.log(`idle worker, ${WORKER_FLEET} accruing VMs (postgres): ${tps.toFixed(1)} transactions/s`);

    // A close of every VM comes due; SIGTERM once the worker is into it.
    await db.query('UPDATE vm_meters SET billed_until = $1', [new Date(boundary - intervalMs)]);
    for (let i = 0; i < 600; i++) {
      const n = await db.query<{ n: number }>('SELECT count(*)::int8 AS n FROM usage_logs');
      if (Number(n.rows[0]!.n) > 0) break;
      await sleep(50);
    }
    const signalled = performance.now();
    child.kill('SIGTERM');
    const exitS = ((await exited) - signalled) / 1000;
    const logs = Number((await db.query<{ n: number }>('SELECT count(*)::int8 AS n FROM usage_logs')).rows[0]!.n);
    console.log(
      `SIGTERM to exit during a close of ${WORKER_FLEET} VMs (postgres): ${exitS.toFixed(2)} s (${logs} periods closed by then)`,
    );
    return [
      { kind: 'metering', name: `idle worker, ${WORKER_FLEET} VMs (transactions/s)`, db: 'postgres', seconds: tps },
      {
        kind: 'metering',
        name: `SIGTERM to exit during a close of ${WORKER_FLEET} VMs`,
        db: 'postgres',
        seconds: exitS,
      },
    ];
  });
}

export async function meteringBench(kind: DbKind, repo: string, cases = meteringCases(kind)): Promise<BenchResult[]> {
  const out: BenchResult[] = [];
  for (const c of cases) out.push(await timeClose(kind, c.vms, c.periods, c.workers));
  if (kind === 'postgres') out.push(...(await workerBench(repo)));
  return out;
}
