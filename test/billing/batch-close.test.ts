/**
 * The interval job closes the fleet's periods in batches (a few statements
 * per batch, whatever its size): every due period of every VM once, oldest
 * first, priced by the billing rules, drawn from reservations first, and
 * posted to the ledger with a balance chain that adds up. VMs are seeded
 * straight into the tables so that lags, states, reservations and traffic
 * vary on purpose; expected amounts are computed here with BigInt, apart
 * from the service's arithmetic.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { ManualClock } from '../../src/clock.js';
import type { Db } from '../../src/db/db.js';
import { ledgerCheck } from '../../src/modules/billing/ledger-check.js';
import { Meter } from '../../src/modules/billing/meter.js';
import { createTestDb, DB_KINDS } from '../helpers/db.js';
import { usageGapsSql } from '../helpers/billing-checks.js';

const HOUR_MS = 3_600_000;
/** A billing boundary; the tests close at T0 + 30 min. */
const T0 = Date.UTC(2026, 0, 10);
const NOW = new Date(T0 + HOUR_MS / 2);
const NETWORK_PRICE = 20_000; // micro-units per GB
const M = 1_000_000;

/** Half-up rounding of a * b / c in integers, as the billing rules say. */
const mulDivHalfUp = (a: number, b: number, c: number) =>
  Number((2n * BigInt(a) * BigInt(b) + BigInt(c)) / (2n * BigInt(c)));

interface SeedVm {
  user: number;
  status: 'running' | 'stopped' | 'offline' | 'interrupted';
  lagPeriods: number;
  gpuRate: number;
  storageRate: number;
  networkUnbilled?: number;
  reservation?: { remaining: number; endAt?: number };
}

interface Seeded {
  users: number[];
  vms: { id: string; vmid: number; seed: SeedVm; reservationId: string | null; billedFrom: number }[];
}

async function seed(db: Db, balances: number[], vms: SeedVm[]): Promise<Seeded> {
  const users: number[] = [];
  for (const [i, balance] of balances.entries()) {
    const email = `batch-${randomUUID()}-${i}@example.com`;
    const u = await db.query<{ id: number }>(
      `INSERT INTO users (email, email_normalized, password_hash, created_at, updated_at)
       VALUES ($1, $1, 'x', $2, $2) RETURNING id`,
      [email, new Date(T0 - 10 * HOUR_MS)],
    );
    const id = Number(u.rows[0]!.id);
    // The balance row was opened with the account; the seed's credit fills it.
    await db.query('UPDATE balances SET balance_micros = $2 WHERE user_id = $1', [id, balance]);
    await db.query(
      `INSERT INTO transactions (id, user_id, type, amount_micros, balance_after_micros, description, created_at) VALUES ($1, $2, 'credit', $3, $3, 'seed', $4)`,
      [randomUUID(), id, balance, new Date(T0 - 10 * HOUR_MS)],
    );
    users.push(id);
  }
  const out: Seeded['vms'] = [];
  for (const v of vms) {
    const id = randomUUID();
    const billedFrom = T0 - v.lagPeriods * HOUR_MS;
    const r = await db.query<{ vmid: number }>(
      `INSERT INTO vms (id, user_id, node, gpu_type, gpu_count, storage_gb, ram_gb, cpu_cores, template_vmid, status, holds_gpus, rental_type,
                        gpu_hourly_rate_micros, storage_hourly_rate_micros, auth_method, provisioned, created_at, started_at, first_started_at,
                        network_bytes_total)
       VALUES ($1, $2, 'n1', '4090', 1, 50, 16, 4, 100, $3, $4, $5, $6, $7, 'password', true, $8, $8, $8, $9)
       RETURNING vmid`,
      [
        id,
        users[v.user],
        v.status,
        v.status === 'running',
        v.reservation ? 'reserved' : 'on_demand',
        v.gpuRate,
        v.storageRate,
        new Date(billedFrom),
        1000 + (v.networkUnbilled ?? 0),
      ],
    );
    await db.query('INSERT INTO vm_meters (vm_id, billed_until, network_bytes_billed) VALUES ($1, $2, 1000)', [
      id,
      new Date(billedFrom),
    ]);
    let reservationId: string | null = null;
    if (v.reservation) {
      reservationId = randomUUID();
      await db.query(
        `INSERT INTO reservations (id, user_id, vm_id, gpu_type, gpu_count, storage_gb, reservation_months, discount_bp, deposit_micros,
                                   remaining_micros, status, created_at, end_at)
         VALUES ($1, $2, $3, '4090', 1, 50, 1, 1000, $4, $4, 'active', $5, $6)`,
        [
          reservationId,
          users[v.user],
          id,
          v.reservation.remaining,
          new Date(billedFrom),
          new Date(v.reservation.endAt ?? T0 + 30 * 24 * HOUR_MS),
        ],
      );
      await db.query('UPDATE vms SET reservation_id = $2 WHERE id = $1', [id, reservationId]);
      // The deposit is paid from the balance, as a reservation's creation does.
      const b = await db.query<{ balance_micros: number }>(
        'UPDATE balances SET balance_micros = balance_micros - $2 WHERE user_id = $1 RETURNING balance_micros',
        [users[v.user], v.reservation.remaining],
      );
      await db.query(
        `INSERT INTO transactions (id, user_id, type, amount_micros, balance_after_micros, description, breakdown, created_at)
         VALUES ($1, $2, 'deposit', $3, $4, 'seed deposit', $5, $6)`,
        [
          randomUUID(),
          users[v.user],
          -v.reservation.remaining,
          b.rows[0]!.balance_micros,
          JSON.stringify({ reservation_id: reservationId }),
          new Date(billedFrom),
        ],
      );
    }
    out.push({ id, vmid: Number(r.rows[0]!.vmid), seed: v, reservationId, billedFrom });
  }
  return { users, vms: out };
}

const meterOn = (db: Db) =>
  new Meter(db, new ManualClock(NOW.getTime()), { intervalS: 3600, networkPricePerGbMicros: NETWORK_PRICE });

interface Log {
  vm_id: string;
  period_start: Date;
  period_end: Date;
  gpu_ms: number;
  storage_ms: number;
  network_bytes: number;
  gpu_cost_micros: number;
  storage_cost_micros: number;
  network_cost_micros: number;
  total_cost_micros: number;
  from_reservation_micros: number;
  transaction_id: string | null;
}

interface Txn {
  id: string;
  seq: number;
  user_id: number;
  amount_micros: number;
  balance_after_micros: number;
  vm_id: string | null;
  type: string;
  breakdown: Record<string, unknown>;
}

async function logsOf(db: Db, vmId: string): Promise<Log[]> {
  return (await db.query<Log>('SELECT * FROM usage_logs WHERE vm_id = $1 ORDER BY period_end', [vmId])).rows;
}

/**
 * Each user's transactions chain: every balance_after is the one before plus the amount, and the last is the balance.
 */
async function assertChains(db: Db, users: number[]): Promise<void> {
  for (const u of users) {
    const t = (await db.query<Txn>('SELECT * FROM transactions WHERE user_id = $1 ORDER BY seq', [u])).rows;
    let balance = 0;
    for (const row of t) {
      balance += row.amount_micros;
      assert.equal(row.balance_after_micros, balance, `user ${u}: transaction ${row.seq} continues the chain`);
    }
    const b = await db.query<{ balance_micros: number }>('SELECT balance_micros FROM balances WHERE user_id = $1', [u]);
    assert.equal(b.rows[0]!.balance_micros, balance, `user ${u}: balance is the sum of the transactions`);
  }
}

for (const kind of DB_KINDS) {
  test(`batched interval close [${kind}]`, async (t) => {
    const tdb = await createTestDb(kind);
    t.after(() => tdb.cleanup());
    const db = tdb.db;

    await t.test('every due period of every VM once, priced, drawn and posted as the rules say', async () => {
      const vms: SeedVm[] = [];
      // 23 VMs over three users, in batches of 5: lags of 1-3 periods, every state that accrues,
      // traffic on some, a reservation that covers everything and one that runs out.
      for (let i = 0; i < 23; i++) {
        vms.push({
          user: i % 3,
          status: (['running', 'running', 'stopped', 'offline', 'interrupted'] as const)[i % 5]!,
          lagPeriods: 1 + (i % 3),
          gpuRate: 400_001 + i * 7_919,
          storageRate: 6_945 + i,
          networkUnbilled: i % 4 === 0 ? 3_500_000_001 + i : 0,
        });
      }
      vms.push({
        user: 0,
        status: 'running',
        lagPeriods: 3,
        gpuRate: 900_000,
        storageRate: 7_000,
        reservation: { remaining: 100 * M },
      });
      vms.push({
        user: 1,
        status: 'running',
        lagPeriods: 3,
        gpuRate: 900_000,
        storageRate: 7_000,
        reservation: { remaining: 1_000_000 },
      });
      const seeded = await seed(db, [5_000 * M, 3_000 * M, 7_000 * M], vms);
      const before = new Map<string, number>();
      for (const r of seeded.vms.filter((v) => v.reservationId)) before.set(r.id, r.seed.reservation!.remaining);

      const written = await meterOn(db).closeDueIntervals(NOW, { batch: 5 });
      const due = vms.reduce((n, v) => n + v.lagPeriods, 0);
      assert.equal(written, due, 'one period written for each VM and missed boundary');

      for (const v of seeded.vms) {
        const logs = await logsOf(db, v.id);
        assert.equal(logs.length, v.seed.lagPeriods, `VM ${v.vmid}: one log per missed period`);
        let drawn = 0;
        let remaining = v.seed.reservation?.remaining ?? 0;
        for (const [k, log] of logs.entries()) {
          assert.equal(log.period_start.getTime(), v.billedFrom + k * HOUR_MS);
          assert.equal(log.period_end.getTime(), v.billedFrom + (k + 1) * HOUR_MS);
          const gpuMs = v.seed.status === 'running' ? HOUR_MS : 0;
          const net = k === 0 ? (v.seed.networkUnbilled ?? 0) : 0;
          assert.equal(log.gpu_ms, gpuMs);
          assert.equal(log.storage_ms, HOUR_MS);
          assert.equal(log.network_bytes, net, 'unbilled traffic goes to the first period closed');
          assert.equal(log.gpu_cost_micros, mulDivHalfUp(v.seed.gpuRate, gpuMs, HOUR_MS));
          assert.equal(log.storage_cost_micros, mulDivHalfUp(v.seed.storageRate, HOUR_MS, HOUR_MS));
          assert.equal(log.network_cost_micros, mulDivHalfUp(net, NETWORK_PRICE, 1_000_000_000));
          assert.equal(log.total_cost_micros, log.gpu_cost_micros + log.storage_cost_micros + log.network_cost_micros);
          const draw = v.reservationId ? Math.min(remaining, log.total_cost_micros) : 0;
          remaining -= draw;
          drawn += draw;
          assert.equal(log.from_reservation_micros, draw, `VM ${v.vmid} period ${k}: drawn from the reservation first`);
          if (log.total_cost_micros - draw > 0) {
            const txn = await db.query<Txn>('SELECT * FROM transactions WHERE id = $1', [log.transaction_id]);
            assert.equal(txn.rows[0]?.amount_micros, -(log.total_cost_micros - draw), 'the rest is one charge');
            assert.equal(txn.rows[0]!.type, 'charge');
            assert.equal(txn.rows[0]!.vm_id, v.id);
            assert.equal(txn.rows[0]!.breakdown.period_end, log.period_end.toISOString());
          } else {
            assert.equal(log.transaction_id, null, 'nothing to charge, no transaction');
          }
        }
        const row = await db.query<{ billed_until: Date; network_bytes_billed: number; network_bytes_total: number }>(
          'SELECT m.billed_until, m.network_bytes_billed, v.network_bytes_total FROM vms v JOIN vm_meters m ON m.vm_id = v.id WHERE v.id = $1',
          [v.id],
        );
        assert.equal(row.rows[0]!.billed_until.getTime(), T0, 'billed up to the last boundary');
        assert.equal(row.rows[0]!.network_bytes_billed, row.rows[0]!.network_bytes_total);
        if (v.reservationId) {
          const r = await db.query<{ remaining_micros: number }>(
            'SELECT remaining_micros FROM reservations WHERE id = $1',
            [v.reservationId],
          );
          assert.equal(r.rows[0]!.remaining_micros, before.get(v.id)! - drawn);
        }
      }
      // Period by period: a VM's charges are posted in the order of its periods.
      for (const v of seeded.vms) {
        const ends = (
          await db.query<{ end: string }>(
            `SELECT breakdown->>'period_end' AS end FROM transactions WHERE vm_id = $1 AND type = 'charge' ORDER BY seq`,
            [v.id],
          )
        ).rows.map((r) => Date.parse(r.end));
        assert.deepEqual(
          ends,
          [...ends].sort((a, b) => a - b),
          `VM ${v.vmid}: its oldest period is charged first`,
        );
      }
      await assertChains(db, seeded.users);
      assert.deepEqual((await db.query(usageGapsSql(true), [seeded.users])).rows, [], "periods tile each VM's time");
      assert.deepEqual(await ledgerCheck(db), []);

      const logCount = await db.query<{ n: number }>('SELECT count(*)::int8 AS n FROM usage_logs');
      assert.equal(await meterOn(db).closeDueIntervals(NOW, { batch: 5 }), 0, 'a second close finds nothing due');
      assert.equal(
        (await db.query<{ n: number }>('SELECT count(*)::int8 AS n FROM usage_logs')).rows[0]!.n,
        logCount.rows[0]!.n,
      );
    });

    await t.test('a period is cut at the end of a reservation term: after it, nothing is drawn', async () => {
      const end = T0 - 1.5 * HOUR_MS;
      const seeded = await seed(
        db,
        [100 * M],
        [
          {
            user: 0,
            status: 'running',
            lagPeriods: 3,
            gpuRate: 800_000,
            storageRate: 8_000,
            reservation: { remaining: 50 * M, endAt: end },
          },
        ],
      );
      const v = seeded.vms[0]!;
      assert.equal(await meterOn(db).closeDueIntervals(NOW, { batch: 5 }), 4);
      const logs = await logsOf(db, v.id);
      assert.deepEqual(
        logs.map((l) => [l.period_start.getTime() - T0, l.period_end.getTime() - T0]),
        [
          [-3 * HOUR_MS, -2 * HOUR_MS],
          [-2 * HOUR_MS, -1.5 * HOUR_MS],
          [-1.5 * HOUR_MS, -HOUR_MS],
          [-HOUR_MS, 0],
        ],
      );
      assert.deepEqual(
        logs.map((l) => l.from_reservation_micros > 0),
        [true, true, false, false],
      );
      assert.equal(logs[1]!.gpu_cost_micros, mulDivHalfUp(800_000, HOUR_MS / 2, HOUR_MS));
      assert.deepEqual(
        logs.map((l) => l.transaction_id !== null),
        [false, false, true, true],
        'charged only after the term',
      );
      const r = await db.query<{ remaining_micros: number }>(
        'SELECT remaining_micros FROM reservations WHERE id = $1',
        [v.reservationId],
      );
      assert.equal(r.rows[0]!.remaining_micros, 50 * M - logs[0]!.total_cost_micros - logs[1]!.total_cost_micros);
      await assertChains(db, seeded.users);
    });

    await t.test('a period charged already moves billing on and is not charged again', async () => {
      const seeded = await seed(
        db,
        [1_000 * M],
        [
          { user: 0, status: 'running', lagPeriods: 2, gpuRate: 500_000, storageRate: 7_000 },
          { user: 0, status: 'running', lagPeriods: 2, gpuRate: 500_000, storageRate: 7_000 },
        ],
      );
      const [a, b] = seeded.vms;
      // As if an earlier close had written a's first period and died before moving billed_until.
      await db.query(
        `INSERT INTO usage_logs (id, vm_id, user_id, period_start, period_end, gpu_ms, gpu_count, storage_ms, storage_gb, network_bytes,
                                 gpu_cost_micros, storage_cost_micros, network_cost_micros, total_cost_micros)
         VALUES ($1, $2, $3, $4, $5, 0, 1, 0, 50, 0, 0, 0, 0, 0)`,
        [randomUUID(), a!.id, seeded.users[0], new Date(a!.billedFrom), new Date(a!.billedFrom + HOUR_MS)],
      );
      assert.equal(
        await meterOn(db).closeDueIntervals(NOW, { batch: 1 }),
        3,
        "three new periods: a's second, both of b's",
      );
      const charges = await db.query<Txn>(`SELECT * FROM transactions WHERE user_id = $1 AND type = 'charge'`, [
        seeded.users[0],
      ]);
      assert.equal(charges.rows.length, 3);
      assert.equal(charges.rows.filter((c) => c.vm_id === a!.id).length, 1, 'a is charged for its second period only');
      const billed = await db.query<{ billed_until: Date }>('SELECT billed_until FROM vm_meters WHERE vm_id = $1', [
        a!.id,
      ]);
      assert.equal(billed.rows[0]!.billed_until.getTime(), T0);
      assert.equal((await logsOf(db, b!.id)).length, 2);
      await assertChains(db, seeded.users);
    });

    await t.test('the charge that crosses zero flags the user and is recorded once', async () => {
      const rate = 1_000_000;
      const storage = 10_000;
      // Enough for one period of one VM and a bit: the second of three charges crosses zero.
      const seeded = await seed(
        db,
        [rate + storage + 5],
        [0, 1, 2].map(() => ({
          user: 0,
          status: 'running' as const,
          lagPeriods: 1,
          gpuRate: rate,
          storageRate: storage,
        })),
      );
      const u = seeded.users[0]!;
      await meterOn(db).closeDueIntervals(NOW, { batch: 2 });
      const flag = await db.query<{ low_balance_pending: boolean; balance_micros: number }>(
        'SELECT low_balance_pending, balance_micros FROM balances WHERE user_id = $1',
        [u],
      );
      assert.equal(flag.rows[0]!.low_balance_pending, true);
      assert.equal(flag.rows[0]!.balance_micros, 5 - 2 * (rate + storage), 'every period is charged, even past zero');
      const events = await db.query<{ data: { transaction_id: string; balance: number } }>(
        `SELECT data FROM events WHERE type = 'billing.low_balance' AND user_id = $1`,
        [u],
      );
      assert.equal(events.rows.length, 1, 'one event for the crossing');
      const crossing = await db.query<Txn>('SELECT * FROM transactions WHERE id = $1', [
        events.rows[0]!.data.transaction_id,
      ]);
      assert.equal(crossing.rows[0]!.balance_after_micros, 5 - (rate + storage));
      assert.equal(events.rows[0]!.data.balance, crossing.rows[0]!.balance_after_micros / M);
      await assertChains(db, seeded.users);
    });

    await t.test('nothing accrues for destroyed VMs or VMs billed up to date', async () => {
      const seeded = await seed(
        db,
        [100 * M],
        [
          { user: 0, status: 'running', lagPeriods: 0, gpuRate: 500_000, storageRate: 7_000 },
          { user: 0, status: 'running', lagPeriods: 2, gpuRate: 500_000, storageRate: 7_000 },
        ],
      );
      // Destroyed where billing had reached (its destroy closed the last period).
      await db.query(
        `UPDATE vms SET status = 'destroyed', holds_gpus = false, destroyed_at = m.billed_until FROM vm_meters m WHERE m.vm_id = vms.id AND vms.id = $1`,
        [seeded.vms[1]!.id],
      );
      await db.query('DELETE FROM vm_meters WHERE vm_id = $1', [seeded.vms[1]!.id]);
      assert.equal(await meterOn(db).closeDueIntervals(NOW, { batch: 10 }), 0);
      for (const v of seeded.vms) assert.equal((await logsOf(db, v.id)).length, 0);
    });

    if (kind === 'postgres') {
      await t.test('two meters on two connections split one close: every period once', async () => {
        const vms: SeedVm[] = Array.from({ length: 60 }, (_, i) => ({
          user: i % 4,
          status: 'running' as const,
          lagPeriods: 3,
          gpuRate: 300_000 + i,
          storageRate: 5_000,
        }));
        const seeded = await seed(db, [900 * M, 900 * M, 900 * M, 900 * M], vms);
        const other = await tdb.openAnother();
        const [w1, w2] = await Promise.all([
          meterOn(db).closeDueIntervals(NOW, { batch: 7 }),
          meterOn(other).closeDueIntervals(NOW, { batch: 7 }),
        ]);
        assert.equal(w1 + w2, 180, 'the two closes together wrote each period once');
        for (const v of seeded.vms) assert.equal((await logsOf(db, v.id)).length, 3);
        const dupes = await db.query(
          `SELECT vm_id, breakdown->>'period_end' FROM transactions WHERE user_id = ANY($1) AND type = 'charge' GROUP BY 1, 2 HAVING count(*) > 1`,
          [seeded.users],
        );
        assert.deepEqual(dupes.rows, [], 'no period charged twice');
        await assertChains(db, seeded.users);
        assert.deepEqual(await ledgerCheck(db), []);
      });
    }
  });
}
