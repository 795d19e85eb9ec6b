/**
 * History at scale: what the service keeps (destroyed and failed VMs, interruptions, finished webhook
 * deliveries and their attempts, revoked refresh tokens, a day of idempotency keys) seeded straight into the
 * tables next to a live fleet, then the milliseconds (median of RUNS) of the reads that run on request paths
 * and in background loops, through the repositories' own functions. Each must stay as fast as on an empty
 * history (docs/architecture.md#history). Used by bench/run.ts (`history`), not run alone.
 */
import { ManualClock } from '../src/clock.js';
import type { Db, Queryable } from '../src/db/db.js';
import * as authRepo from '../src/modules/auth/repository.js';
import * as meterRepo from '../src/modules/billing/meter-repository.js';
import * as idempotency from '../src/http/idempotency-repository.js';
import * as inventoryRepo from '../src/modules/inventory/repository.js';
import { InventoryService } from '../src/modules/inventory/service.js';
import { listVmVersions } from '../src/modules/vms/listed-repository.js';
import * as vmRepo from '../src/modules/vms/repository.js';
import * as webhookRepo from '../src/modules/webhooks/repository.js';
import { seedFleet } from '../scripts/seed-fleet.js';
import { withScope } from './cleanup.js';
import { scratchDb } from './metering.js';
import type { BenchResult } from './types.js';
import type { DbKind } from './service.js';

const T0 = Date.UTC(2026, 0, 1);
const LIVE_VMS = 10_000;
const RUNS = 15;
/** Rows of VM history on each database (the embedded one is for a small fleet). */
const HISTORY: Record<DbKind, number> = { postgres: 200_000, embedded: 20_000 };

/** Everything the service keeps, `h` destroyed or failed VMs and the rest in proportion. */
async function seedHistory(db: Db, h: number): Promise<{ heavyUser: number; node: string; vmId: string }> {
  // Only the default prices: no agent is asked anything and no offer is listed.
  const inventory = new InventoryService(
    db,
    new ManualClock(T0),
    'bench-secret'.padEnd(32, '-'),
    async () => null,
    async () => new Set(),
  );
  await inventory.ensureDefaultPricing();
  await seedFleet(db, LIVE_VMS, T0);
  const nodes = LIVE_VMS / 8;
  await db.query(
    `INSERT INTO nodes (node, gpu_type, gpu_count, gpu_ram_mb, ram_gb, cpu_cores, cpu_model, pcie_gen, max_storage_gb,
                        location, cluster_name, status, created_at, updated_at)
     SELECT 'node-' || g, '4090', 8, 24576, 256, 64, 'Bench EPYC', '4.0', 2000, 'bench', 'bench', 'active', $1, $1
       FROM generate_series(0, $2 - 1) g`,
    [new Date(T0), nodes],
  );
  const users = (await db.query<{ id: number }>('SELECT id FROM users ORDER BY id')).rows.map((r) => r.id);
  const heavyUser = users[0]!;
  // A quarter of the history is one customer's (short jobs, created and destroyed), the rest everyone's; one VM
  // in fifty failed to build and was left so (failed VMs are listed until destroyed).
  await db.query(
    `INSERT INTO vms (id, user_id, node, gpu_type, gpu_count, storage_gb, ram_gb, cpu_cores, template_vmid, status,
                      holds_gpus, rental_type, gpu_hourly_rate_micros, storage_hourly_rate_micros, auth_method,
                      provisioned, created_at, started_at, stopped_at, destroyed_at, auto_restart)
     SELECT gen_random_uuid(), CASE WHEN g % 4 = 0 THEN $2::int8 ELSE ($3::int8[])[1 + g % $4] END,
            'node-' || (g % $5), '4090', 1, 50, 32, 8, 100, CASE WHEN g % 50 = 8 THEN 'failed' ELSE 'destroyed' END,
            false, CASE WHEN g % 3 = 0 THEN 'interruptible' ELSE 'on_demand' END, 433333, 13889, 'password', true,
            $1::timestamptz - g * interval '1 minute', $1::timestamptz - g * interval '1 minute',
            $1::timestamptz - g * interval '1 minute' + interval '1 hour',
            $1::timestamptz - g * interval '1 minute' + interval '1 hour', CASE WHEN g % 3 = 0 THEN true END
       FROM generate_series(1, $6) g`,
    [new Date(T0), heavyUser, users, users.length, nodes, h],
  );
  // Twenty interrupted VMs wait to restart by themselves.
  await db.query(
    `UPDATE vms SET status = 'interrupted', rental_type = 'interruptible', auto_restart = true, holds_gpus = false,
                    stopped_at = $1
      WHERE id IN (SELECT id FROM vms WHERE status = 'running' ORDER BY seq LIMIT 20)`,
    [new Date(T0)],
  );
  // One in ten destroyed interruptible VMs was preempted by a destroyed on-demand one.
  await db.query(
    `INSERT INTO interruptions (id, interruptible_vm_id, preempted_by_vm_id, preempted_at, status)
     SELECT gen_random_uuid(), a.id, b.id, a.created_at, 'abandoned'
       FROM (SELECT id, created_at, row_number() OVER (ORDER BY seq) r FROM vms
              WHERE status = 'destroyed' AND rental_type = 'interruptible') a
       JOIN (SELECT id, row_number() OVER (ORDER BY seq) r FROM vms
              WHERE status = 'destroyed' AND rental_type = 'on_demand') b USING (r)
      WHERE a.r % 10 = 0`,
  );
  // An endpoint per customer, two events per history VM of the last 29 days delivered, each with its attempt:
  // all finished, one in a hundred past the keeping time (30 days).
  await db.query(
    `INSERT INTO webhooks (id, user_id, url, secret, created_at, updated_at)
     SELECT gen_random_uuid(), id, 'https://example.com/hook', 'sealed', $1, $1 FROM users`,
    [new Date(T0)],
  );
  await db.query(
    `INSERT INTO events (id, type, user_id, created_at)
     SELECT gen_random_uuid(), 'vm.status_changed', ($2::int8[])[1 + g % $3],
            $1::timestamptz - (g % 2500000) * interval '1 second'
       FROM generate_series(1, $4) g`,
    [new Date(T0), users, users.length, 2 * h],
  );
  await db.query(
    `INSERT INTO webhook_deliveries (webhook_id, event_id, event_seq, state, attempts, next_attempt_at, created_at)
     SELECT w.id, e.id, e.seq, 'succeeded', 1, e.created_at,
            CASE WHEN e.seq % 100 = 0 THEN $1::timestamptz - interval '40 days' ELSE e.created_at END
       FROM events e JOIN webhooks w ON w.user_id = e.user_id`,
    [new Date(T0)],
  );
  await db.query(
    `INSERT INTO webhook_attempts (id, webhook_id, event_id, attempt, attempted_at, status_code, duration_ms, outcome)
     SELECT gen_random_uuid(), webhook_id, event_id, 1, created_at, 200, 10, 'succeeded' FROM webhook_deliveries`,
  );
  // Refresh tokens: one live session per customer, the rest rotated and revoked long ago.
  await db.query(
    `INSERT INTO refresh_tokens (id, user_id, family_id, token_hash, created_at, expires_at, rotated_at, revoked_at)
     SELECT gen_random_uuid(), ($2::int8[])[1 + g % $3], gen_random_uuid(), md5('t' || g), $1::timestamptz - interval '1 day',
            $1::timestamptz + interval '29 days', NULL, CASE WHEN g > $3 THEN $1::timestamptz - interval '1 hour' END
       FROM generate_series(1, $4) g`,
    [new Date(T0), users, users.length, 2 * h],
  );
  // A day of idempotency keys, none old enough to go yet.
  await db.query(
    `INSERT INTO idempotency_keys (user_id, idem_key, request_hash, state, created_at)
     SELECT ($2::int8[])[1 + g % $3], md5('k' || g), 'hash', 'done', $1::timestamptz - (g % 86000) * interval '1 second'
       FROM generate_series(1, $4) g`,
    [new Date(T0), users, users.length, h / 2],
  );
  await db.exec('ANALYZE');
  const vmId = (await db.query<{ id: string }>(`SELECT id FROM vms WHERE status = 'destroyed' LIMIT 1`)).rows[0]!.id;
  return { heavyUser, node: 'node-1', vmId };
}

/** The median of RUNS timings of `f`, in milliseconds. */
async function medianMs(f: () => Promise<unknown>): Promise<number> {
  const ms: number[] = [];
  for (let i = 0; i < RUNS; i++) {
    const started = performance.now();
    await f();
    ms.push(performance.now() - started);
  }
  return ms.sort((a, b) => a - b)[Math.floor(RUNS / 2)]!;
}

class RolledBack extends Error {}

/** `f` in a transaction that is rolled back afterwards (a write measured without changing the world). */
async function rolledBack(db: Db, f: (tx: Queryable) => Promise<unknown>): Promise<void> {
  await db
    .transaction(async (tx) => {
      await f(tx);
      throw new RolledBack();
    })
    .catch((err: unknown) => {
      if (!(err instanceof RolledBack)) throw err;
    });
}

export async function historyBench(kind: DbKind): Promise<BenchResult[]> {
  return withScope(async (scope) => {
    const db = await scratchDb(scope, kind);
    const h = HISTORY[kind];
    const started = performance.now();
    const { heavyUser, node, vmId } = await seedHistory(db, h);
    console.log(
      `  seeded ${LIVE_VMS} live VMs and ${h} destroyed or failed ones (a quarter one customer's) with their` +
        ` interruptions, events, webhook deliveries, refresh tokens and idempotency keys in` +
        ` ${((performance.now() - started) / 1000).toFixed(1)} s`,
    );
    const now = new Date(T0);
    const cases: [string, () => Promise<unknown>][] = [
      ["a create's limits read, a customer with a long history", () => vmRepo.userVmsForLimits(db, heavyUser)],
      [
        'GET /vms page of that customer (ids and versions)',
        () => listVmVersions(db, { userId: heavyUser, includeDestroyed: false, limit: 50, offset: 0 }),
      ],
      ["an agent heartbeat's running VMs of a node", () => vmRepo.idleRunningOnNode(db, node)],
      ["a node's live VMs (offline, back online)", () => vmRepo.vmsOnNode(db, node, ['running', 'stopped'])],
      ["a node's live-VM count (delete node)", () => inventoryRepo.liveVmCount(db, node)],
      ['auto-restart candidates (every pass)', () => vmRepo.autoRestartCandidates(db, 50)],
      ['whether a destroyed VM preempted others', () => meterRepo.preemptedOthers(db, vmId)],
      [
        'signing a customer out everywhere (rolled back)',
        () => rolledBack(db, (tx) => authRepo.revokeAllFamilies(tx, heavyUser, now, 'logout_all')),
      ],
      [
        'webhook housekeeping (rolled back)',
        () => rolledBack(db, (tx) => webhookRepo.purgeFinished(tx, new Date(T0 - 30 * 86_400_000))),
      ],
      ['idempotency-key housekeeping', () => idempotency.purge(db, new Date(T0 - 86_400_000))],
    ];
    const out: BenchResult[] = [];
    for (const [what, f] of cases) {
      const ms = await medianMs(f);
      const name = `${what}, ${h} VMs of history`;
      console.log(`${name} (${kind}): ${ms.toFixed(2)} ms`);
      out.push({ kind: 'history', name, db: kind, ms });
    }
    return out;
  });
}
