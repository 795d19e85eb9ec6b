/**
 * A worker SIGKILLed in the middle of a billing close (processes, PostgreSQL,
 * the system clock): 20,000 VMs seeded straight into a fresh database with
 * two periods due; worker 1 starts closing them and is killed once some
 * batches have committed and others not; worker 2, started afterwards,
 * finishes the close. Every VM must end billed up to the last boundary with
 * its periods tiling its time, every period charged exactly once (one charge
 * transaction per usage log that cost anything, none without one), and
 * `gpucloud admin ledger-check` must exit 0.
 *
 * Skipped unless DATABASE_URL is set.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { PostgresDb } from '../../src/db/db.js';
import { migrate } from '../../src/db/migrate.js';
import { seedFleet } from '../../scripts/seed-fleet.js';
import {
  cleanEnv,
  createDatabase,
  ledgerCheck,
  sleep,
  startInstance,
  type FreshDatabase,
  type Instance,
} from './instances-cluster.js';

const skip = process.env.DATABASE_URL ? false : 'needs DATABASE_URL';
const VMS = 20_000;
/** A day: the boundary is midnight UTC, so a run never sees one pass between two of its own reads. */
const INTERVAL_S = 86_400;

let fresh: FreshDatabase;
/** Where the seeded fleet was billed up to. */
let seededUntil = 0;
let env: NodeJS.ProcessEnv;
const running: Instance[] = [];

const count = async (sql: string, params: unknown[] = []) =>
  Number((await fresh.pool.query<{ n: string }>(sql, params)).rows[0]!.n);

before(async () => {
  if (skip) return;
  fresh = await createDatabase(process.env.DATABASE_URL!);
  const db = new PostgresDb(fresh.url, { max: 2 });
  try {
    await migrate(db);
    const intervalMs = INTERVAL_S * 1000;
    seededUntil = Math.floor(Date.now() / intervalMs) * intervalMs - 2 * intervalMs;
    await seedFleet(db, VMS, seededUntil);
  } finally {
    await db.close();
  }
  env = cleanEnv({
    DATABASE_URL: fresh.url,
    GPUCLOUD_JWT_SECRET: randomBytes(24).toString('hex'),
    GPUCLOUD_CLOCK: 'system',
    GPUCLOUD_DEMO: '0',
    GPUCLOUD_BILLING_INTERVAL_S: String(INTERVAL_S),
    LOG_LEVEL: 'warn',
  });
});

after(async () => {
  if (skip) return;
  await Promise.all(running.map((i) => i.stop(5_000)));
  await fresh.drop();
});

/** The last boundary, if every VM is billed up to it; undefined while some are not. */
async function allClosedUpTo(): Promise<number | undefined> {
  const boundary = Math.floor(Date.now() / (INTERVAL_S * 1000)) * INTERVAL_S * 1000;
  return (await count('SELECT count(*) AS n FROM vm_meters WHERE billed_until <> $1', [new Date(boundary)])) === 0
    ? boundary
    : undefined;
}

async function assertBooksExact(): Promise<void> {
  assert.equal(
    await count(
      `SELECT count(*) AS n FROM usage_logs WHERE total_cost_micros > from_reservation_micros AND transaction_id IS NULL`,
    ),
    0,
    'every period that cost more than its reservation paid has its charge',
  );
  assert.equal(
    await count(
      `SELECT count(*) AS n FROM transactions t WHERE t.type = 'charge' AND NOT EXISTS (SELECT 1 FROM usage_logs l WHERE l.transaction_id = t.id)`,
    ),
    0,
    'no charge without its period: nothing charged twice',
  );
  const check = ledgerCheck(env);
  assert.equal(check.status, 0, `ledger-check: ${check.stdout}${check.stderr}`);
}

test(
  'a worker killed mid-close: the next one finishes it, every period charged exactly once',
  { skip, timeout: 300_000 },
  async () => {
    const w1 = await startInstance('worker-1', 'worker', env);
    running.push(w1);
    let seen = 0;
    for (let i = 0; i < 6000 && seen === 0; i++) {
      seen = await count('SELECT count(*) AS n FROM usage_logs');
      if (seen === 0) await sleep(10);
    }
    w1.child.kill('SIGKILL');
    await new Promise<void>((r) => (w1.exited ? r() : w1.child.once('exit', () => r())));
    const atKill = await count('SELECT count(*) AS n FROM usage_logs');
    assert.ok(atKill > 0 && atKill < VMS * 2, `killed in the middle: ${atKill} of ${VMS * 2} periods closed`);
    assert.equal(await allClosedUpTo(), undefined);

    const w2 = await startInstance('worker-2', 'worker', env);
    running.push(w2);
    let upTo: number | undefined;
    for (let i = 0; i < 1200 && (upTo = await allClosedUpTo()) === undefined; i++) await sleep(100);
    assert.ok(upTo, 'worker 2 closed what worker 1 left');
    // Two periods, or three if a boundary (midnight UTC) passed during the test.
    const periods = (upTo - seededUntil) / (INTERVAL_S * 1000);
    assert.equal(
      await count('SELECT count(*) AS n FROM usage_logs'),
      VMS * periods,
      `${periods} periods for each VM, none twice`,
    );
    await assertBooksExact();
  },
);
