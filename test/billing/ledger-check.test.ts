/**
 * The ledger check (`gpucloud admin ledger-check`, docs/billing.md#ledger-check):
 * silent after real money flows (credits, adjustments, deposits, usage
 * drawn from reservations and charged to balances, cancellation refunds, the
 * refund of a failed reserved VM), and naming the account for every kind of
 * corruption made behind its back in SQL. Then the real CLI as a child
 * process against an embedded data dir: exit 0 when sound, 1 naming the
 * account when not.
 */
import { before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { fileURLToPath } from 'node:url';
import { describeEachDb } from '../helpers/app.js';
import { api } from '../helpers/api.js';
import { createApiKey, createNode, createUser, credit, uploadSshKey } from '../helpers/factories.js';
import type { VmSpec } from '../helpers/world.js';
import { ledgerCheck, type LedgerProblem } from '../../src/modules/billing/ledger-check.js';
import { PgliteDb } from '../../src/db/db.js';
import { gpucloudMain } from '../helpers/entry.js';

describeEachDb('ledgerCheck: balances, reservations and usage periods add up', (t) => {
  let adminKey: string;
  let u1: { id: number; email: string; key: string };
  let u2: { id: number; email: string; key: string };
  let reservationId: string;

  const advance = async (seconds: number) => {
    const r = await api(t(), adminKey).post('/admin/clock/advance', { body: { seconds } });
    assert.equal(r.status, 200, r.text);
  };
  const sql = <T = Record<string, unknown>>(text: string, params: unknown[] = []) => t().db.query<T>(text, params);
  /** Corrupts, checks that exactly the expected account is named, and puts things back. */
  const expectNamed = async (
    kind: LedgerProblem['kind'],
    who: { id: number; email: string },
    corrupt: string,
    restore: string,
    params: unknown[],
  ) => {
    await sql(corrupt, params);
    try {
      const problems = await ledgerCheck(t().db);
      const mine = problems.filter((p) => p.kind === kind);
      assert.equal(mine.length, 1, JSON.stringify(problems));
      assert.equal(mine[0]!.user_id, who.id);
      assert.equal(mine[0]!.email, who.email);
      assert.ok(
        problems.every((p) => p.user_id === who.id),
        `only the corrupted account is named: ${JSON.stringify(problems)}`,
      );
      return mine[0]!;
    } finally {
      await sql(restore, params);
      assert.deepEqual(await ledgerCheck(t().db), []);
    }
  };

  before(async () => {
    const admin = await createUser(t(), { admin: true });
    adminKey = await createApiKey(t(), admin.token, 'read_write');
    const node = (await createNode(t(), adminKey, { gpu_type: '4090', gpu_count: 8 })).node;
    const failing = (await createNode(t(), adminKey, { gpu_type: '4090', gpu_count: 8 })).node;
    const mk = async () => {
      const u = await createUser(t());
      await uploadSshKey(t(), u.token);
      return { id: u.id, email: u.email, key: await createApiKey(t(), u.token, 'read_write') };
    };
    u1 = await mk();
    u2 = await mk();
    assert.deepEqual(await ledgerCheck(t().db), [], 'a fresh database is sound');

    // Money flows: credits and an adjustment, a reserved VM (deposit, draws), an on-demand VM
    // (charges), a cancellation (refund), a failed reserved VM (whole deposit back), low balance.
    await credit(t(), adminKey, u1.id, 5000);
    await credit(t(), adminKey, u2.id, 2);
    await credit(t(), adminKey, u1.id, -0.123457);
    /** Creates a VM (201 asserted) and returns its record. */
    const vm = async (body: VmSpec, key = u1.key) => {
      const r = await api(t(), key).post('/vms', {
        body: { node, gpu_type: '4090', gpu_count: 1, storage_gb: 50, template_vmid: 100, ...body },
      });
      assert.equal(r.status, 201, r.text);
      return r.body;
    };
    const r1 = await vm({ rental_type: 'reserved', reservation_months: 1 });
    assert.ok(r1.reservation_id, 'a reserved VM names its reservation');
    reservationId = r1.reservation_id;
    await vm({});
    await vm({}, u2.key);
    const fault = await api(t(), adminKey).post('/admin/simulator/faults', {
      body: { node: failing, action: 'provision' },
    });
    assert.equal(fault.status, 200, fault.text);
    await vm({ node: failing, rental_type: 'reserved', reservation_months: 3, storage_gb: 60 });
    await advance(5 * 3600 + 123);
    const r2 = await vm({ rental_type: 'reserved', reservation_months: 6, gpu_count: 2 });
    assert.ok(r2.reservation_id, 'a reserved VM names its reservation');
    await advance(1800);
    const u1c = api(t(), u1.key);
    const cancelled = await u1c.delete('/reservations/{reservation_id}', {
      params: { reservation_id: r2.reservation_id },
    });
    assert.equal(cancelled.status, 200, cancelled.text);
    const destroyed = await u1c.delete('/vms/{vm_id}', { params: { vm_id: r1.id } });
    assert.equal(destroyed.status, 200, destroyed.text);
    await advance(3 * 3600 + 7);
  });

  test('sound after deposits, draws, charges, refunds and a low-balance stop', async () => {
    const types = (await sql<{ type: string }>('SELECT DISTINCT type FROM transactions')).rows
      .map((r) => r.type)
      .sort();
    assert.deepEqual(types, ['adjustment', 'charge', 'credit', 'deposit', 'refund']);
    const drawn = await sql<{ n: number }>(
      'SELECT count(*)::int AS n FROM usage_logs WHERE from_reservation_micros > 0',
    );
    assert.ok(drawn.rows[0]!.n > 0, 'some usage was drawn from a reservation');
    const low = await sql<{ balance_micros: number }>(`SELECT balance_micros FROM balances WHERE user_id = $1`, [
      u2.id,
    ]);
    assert.ok(low.rows[0]!.balance_micros <= 0, 'u2 ran out of credit');
    assert.deepEqual(await ledgerCheck(t().db), []);
  });

  test('a balance changed without a transaction names the account', async () => {
    const p = await expectNamed(
      'balance',
      u1,
      'UPDATE balances SET balance_micros = balance_micros + 1 WHERE user_id = $1',
      'UPDATE balances SET balance_micros = balance_micros - 1 WHERE user_id = $1',
      [u1.id],
    );
    assert.match(p.detail, /balance/);
  });

  test("a reservation's remaining balance off by one micro-unit names its owner", async () => {
    const p = await expectNamed(
      'reservation',
      u1,
      'UPDATE reservations SET remaining_micros = remaining_micros + 1 WHERE id = $1',
      'UPDATE reservations SET remaining_micros = remaining_micros - 1 WHERE id = $1',
      [reservationId],
    );
    assert.match(p.detail, new RegExp(reservationId));
  });

  test('a transaction whose balance_after is not the running sum names the account', async () => {
    const last = (await sql('SELECT id FROM transactions WHERE user_id = $1 ORDER BY seq LIMIT 1 OFFSET 1', [u2.id]))
      .rows[0] as { id: string };
    await expectNamed(
      'transaction',
      u2,
      'UPDATE transactions SET balance_after_micros = balance_after_micros + 5 WHERE id = $1',
      'UPDATE transactions SET balance_after_micros = balance_after_micros - 5 WHERE id = $1',
      [last.id],
    );
  });

  test('a deposit that names no reservation, and a usage log not paid in full, are found', async () => {
    await expectNamed(
      'reservation',
      u1,
      `UPDATE transactions SET breakdown = breakdown || '{"reservation_id":"00000000-0000-4000-8000-000000000000"}'::jsonb WHERE breakdown->>'reservation_id' = $1 AND type = 'deposit'`,
      `UPDATE transactions SET breakdown = breakdown || jsonb_build_object('reservation_id', $1::text) WHERE breakdown->>'reservation_id' = '00000000-0000-4000-8000-000000000000'`,
      [reservationId],
    );
    const log = (
      await sql('SELECT id FROM usage_logs WHERE user_id = $1 AND transaction_id IS NOT NULL ORDER BY seq LIMIT 1', [
        u2.id,
      ])
    ).rows[0] as { id: string };
    await expectNamed(
      'usage',
      u2,
      'UPDATE usage_logs SET total_cost_micros = total_cost_micros + 1 WHERE id = $1',
      'UPDATE usage_logs SET total_cost_micros = total_cost_micros - 1 WHERE id = $1',
      [log.id],
    );
  });

  test('a usage period deleted, shifted or stretched names the VM and the span its time is not covered for', async () => {
    // A middle period of one of u1's VMs (one with periods before and after it).
    const row = (
      await sql(
        `SELECT to_jsonb(l) AS log, v.vmid FROM usage_logs l JOIN vms v ON v.id = l.vm_id
          WHERE l.user_id = $1 AND EXISTS (SELECT 1 FROM usage_logs a WHERE a.vm_id = l.vm_id AND a.period_end < l.period_start)
            AND EXISTS (SELECT 1 FROM usage_logs b WHERE b.vm_id = l.vm_id AND b.period_start > l.period_end)
          ORDER BY l.seq LIMIT 1`,
        [u1.id],
      )
    ).rows[0] as { log: { id: string; period_start: string; period_end: string }; vmid: number };
    assert.ok(row, 'u1 has a VM with three periods or more');
    const start = new Date(row.log.period_start).toISOString();
    const end = new Date(row.log.period_end).toISOString();
    const deleted = await expectNamed(
      'coverage',
      u1,
      `DELETE FROM usage_logs WHERE id = ($1::jsonb->>'id')::uuid`,
      `INSERT INTO usage_logs OVERRIDING SYSTEM VALUE SELECT * FROM jsonb_populate_record(NULL::usage_logs, $1::jsonb)`,
      [JSON.stringify(row.log)],
    );
    assert.equal(
      deleted.detail,
      `VM ${row.vmid} (${(row.log as { vm_id?: string }).vm_id}): no usage period from ${start} to ${end}`,
    );
    const shifted = await expectNamed(
      'coverage',
      u1,
      `UPDATE usage_logs SET period_start = period_start + interval '1 second' WHERE id = $1`,
      `UPDATE usage_logs SET period_start = period_start - interval '1 second' WHERE id = $1`,
      [row.log.id],
    );
    assert.match(
      shifted.detail,
      new RegExp(`^VM ${row.vmid} .*: no usage period from ${start.replace(/[.]/g, '\\.')} to `),
    );
    const stretched = await expectNamed(
      'coverage',
      u1,
      `UPDATE usage_logs SET period_end = period_end + interval '1 second' WHERE id = $1`,
      `UPDATE usage_logs SET period_end = period_end - interval '1 second' WHERE id = $1`,
      [row.log.id],
    );
    assert.match(stretched.detail, /: overlapping periods from /);
  });
});

describe('gpucloud admin ledger-check (the CLI, embedded database)', () => {
  const root = fileURLToPath(new URL('../../', import.meta.url));
  let dir: string;
  const cli = async (...args: string[]): Promise<{ code: number; stdout: string; stderr: string }> => {
    const env: NodeJS.ProcessEnv = { ...process.env, GPUCLOUD_DATA_DIR: dir, LOG_LEVEL: 'silent', GPUCLOUD_DEMO: '0' };
    for (const k of [
      'DATABASE_URL',
      'GPUCLOUD_REDIS_URL',
      'GPUCLOUD_JWT_SECRET',
      'GPUCLOUD_CLOCK',
      'GPUCLOUD_CLOCK_START',
      'NODE_TEST_CONTEXT',
      'NODE_OPTIONS',
    ])
      delete env[k];
    try {
      const r = await promisify(execFile)(process.execPath, [gpucloudMain(), ...args], {
        cwd: root,
        env,
        timeout: 90_000,
      });
      return { code: 0, stdout: r.stdout, stderr: r.stderr };
    } catch (err) {
      const e = err as { code?: number; stdout?: string; stderr?: string };
      if (typeof e.code !== 'number') throw err;
      return { code: e.code, stdout: e.stdout ?? '', stderr: e.stderr ?? '' };
    }
  };

  before(() => {
    dir = mkdtempSync(join(tmpdir(), 'gpucloud-ledger-cli-'));
  });
  test.after(() => rmSync(dir, { recursive: true, force: true }));

  test('exit 0 on a sound database, 1 naming the account once a balance is corrupted', async () => {
    const email = 'ledger-cli@example.com';
    const made = await cli('admin', 'create-user', '--email', email, '--password', 'a-long-cli-password');
    assert.equal(made.code, 0, made.stderr);
    const clean = await cli('admin', 'ledger-check');
    assert.equal(clean.code, 0, clean.stderr);
    assert.match(clean.stdout, /Ledger OK/);

    // Behind the ledger's back: the balance moves without a transaction.
    const db = await PgliteDb.open(join(dir, 'pg'));
    try {
      await db.query(
        'UPDATE balances SET balance_micros = balance_micros + 1 WHERE user_id = (SELECT id FROM users WHERE email = $1)',
        [email],
      );
    } finally {
      await db.close();
    }
    const bad = await cli('admin', 'ledger-check');
    assert.equal(bad.code, 1, bad.stdout + bad.stderr);
    assert.match(bad.stderr, new RegExp(email.replace('.', '\\.')));
    assert.match(bad.stderr, /1 problem/);
  });
});
