/**
 * Long advances of the manual clock: billing boundaries at which no balance
 * can reach zero are closed in bulk wherever the advance stops next, so the
 * outcome is the one stepping hour by hour would give (every period, the
 * low-balance stop at the boundary whose charge crossed zero, unbilled
 * traffic counted), and an advance that would close more periods than the
 * budget is refused before the clock moves.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { describeEachDb, type TestApp } from '../helpers/app.js';
import { api, type RequestBody } from '../helpers/api.js';
import { alignToHour, createApiKey, createNode, createUser, credit } from '../helpers/factories.js';
import { ledgerCheck } from '../../src/modules/billing/ledger-check.js';
import { usageGapsSql } from '../helpers/billing-checks.js';
import { ADVANCE_PERIOD_BUDGET } from '../../src/modules/billing/meter.js';
import { seedFleet } from '../../scripts/seed-fleet.js';

const H = 3600;
const DAY = 24 * H;
const VM_PASSWORD = 'a-vm-password-1234';

async function setup(t: TestApp, creditAmount: number) {
  const admin = await createUser(t, { admin: true });
  const adminKey = await createApiKey(t, admin.token, 'read_write', 'admin');
  const u = await createUser(t);
  const key = await createApiKey(t, u.token, 'read_write', 'u');
  await credit(t, adminKey, u.id, creditAmount);
  const { node } = await createNode(t, adminKey, { gpu_type: '4090', gpu_count: 8 });
  return { adminKey, u, key, node };
}

async function launch(
  t: TestApp,
  key: string,
  node: string,
  over: Partial<RequestBody<'/vms', 'post'>> = {},
): Promise<string> {
  const r = await api(t, key).post('/vms', {
    body: {
      node,
      gpu_type: '4090',
      gpu_count: 1,
      storage_gb: 50,
      template_vmid: 100,
      auth_method: 'password',
      password: VM_PASSWORD,
      ...over,
    },
  });
  assert.equal(r.status, 201, r.text);
  await t.services.clock.advance(0); // provisioning takes no time in tests: running now
  return r.body.id;
}

async function logsOf(t: TestApp, vmId: string) {
  return (
    await t.db.query<{ period_end: Date; gpu_ms: number; total_cost_micros: number }>(
      'SELECT period_end, gpu_ms, total_cost_micros FROM usage_logs WHERE vm_id = $1 ORDER BY period_end',
      [vmId],
    )
  ).rows;
}

async function balanceMicros(t: TestApp, userId: number): Promise<number> {
  return (await t.db.query<{ b: number }>('SELECT balance_micros AS b FROM balances WHERE user_id = $1', [userId]))
    .rows[0]!.b;
}

describeEachDb(
  'long advances of the manual clock',
  (t) => {
    test('a 90-day advance writes every hourly period, and the low-balance stop lands on the boundary that crossed zero', async () => {
      // 1 x 4090 + 50 GB = 0.45/h. 30.00 of credit lasts 66 whole hours (29.70); the 67th crosses zero.
      const { u, key, node } = await setup(t(), 30);
      await alignToHour(t());
      const started = t().clock.nowMs();
      const vm = await launch(t(), key, node);
      await t().services.clock.advance(90 * DAY);

      const logs = await logsOf(t(), vm);
      assert.equal(logs.length, 90 * 24, 'one period per hour, none skipped');
      logs.forEach((l, i) => assert.equal(l.period_end.getTime(), started + (i + 1) * H * 1000));
      // Running (GPU time) for the first 67 hours, stopped by the low-balance rule at the 67th boundary.
      assert.deepEqual(
        logs.map((l) => l.gpu_ms > 0),
        logs.map((_, i) => i < 67),
      );
      const vmRow = await api(t(), key).get('/vms/{vm_id}', { params: { vm_id: vm } });
      assert.equal(vmRow.status, 200, vmRow.text);
      assert.equal(vmRow.body.status, 'stopped');
      const stop = await t().db.query<{ stopped_at: Date }>('SELECT stopped_at FROM vms WHERE id = $1', [vm]);
      assert.equal(
        stop.rows[0]!.stopped_at.getTime(),
        started + 67 * H * 1000,
        'stopped at the boundary whose charge crossed zero',
      );
      const events = await t().db.query(`SELECT 1 FROM events WHERE user_id = $1 AND type = 'billing.low_balance'`, [
        u.id,
      ]);
      assert.equal(events.rows.length, 1);
      // 67 hours at 0.45 and the rest of the 90 days at 0.01 (50 GB of storage).
      assert.equal(await balanceMicros(t(), u.id), 30_000_000 - 67 * 450_000 - (90 * 24 - 67) * 10_000);
      assert.deepEqual((await t().db.query(usageGapsSql(true), [[u.id]])).rows, []);
      assert.deepEqual(await ledgerCheck(t().db), []);
    });

    test('traffic not yet billed when the advance starts counts towards the balance reaching zero', async () => {
      const { u, key, node } = await setup(t(), 5);
      await alignToHour(t());
      const started = t().clock.nowMs();
      const vm = await launch(t(), key, node);
      // 0.05 per GB: 100 GB cost 5.00, so the first hour's charge (5.45) crosses zero.
      await t().services.simulator.addTraffic(vm, 100_000_000_000);
      await t().services.clock.advance(10 * DAY);
      const stop = await t().db.query<{ status: string; stopped_at: Date }>(
        'SELECT status, stopped_at FROM vms WHERE id = $1',
        [vm],
      );
      assert.equal(stop.rows[0]!.status, 'stopped');
      assert.equal(
        stop.rows[0]!.stopped_at.getTime(),
        started + H * 1000,
        'stopped at the first boundary, as stepping hour by hour would',
      );
      const logs = await logsOf(t(), vm);
      assert.equal(logs.length, 10 * 24);
      assert.equal(logs[0]!.total_cost_micros, 450_000 + 5_000_000);
      assert.equal(logs.filter((l) => l.gpu_ms > 0).length, 1);
      assert.equal(await balanceMicros(t(), u.id), 5_000_000 - 5_450_000 - (10 * 24 - 1) * 10_000);
    });

    test('an advance that would close more periods than the budget is refused, and the clock stays', async () => {
      const before = t().clock.nowMs();
      // The fleet is billed up to the last boundary, as the interval job leaves it.
      await seedFleet(t().db, 1_000, Math.floor(before / (H * 1000)) * H * 1000);
      assert.deepEqual(
        await ledgerCheck(t().db),
        [],
        "the fleet is seeded beside the earlier tests' users, their books untouched",
      );
      const admin = await createUser(t(), { admin: true });
      const adminKey = await createApiKey(t(), admin.token, 'read_write', 'admin');
      const { periods } = await t().services.meter.periodsUpTo(before + 400 * H * 1000);
      assert.ok(periods > ADVANCE_PERIOD_BUDGET);

      const asAdmin = api(t(), adminKey);
      const r = await asAdmin.post('/admin/clock/advance', { body: { seconds: 400 * H } });
      assert.equal(r.status, 400, r.text);
      assert.equal(r.body.code, 'limit_exceeded');
      const maxS = Number(/at most (\d+) seconds/.exec(r.body.detail)?.[1]);
      assert.ok(maxS >= H && maxS < 400 * H, r.body.detail);
      assert.equal(t().clock.nowMs(), before);
      const clock = await asAdmin.get('/admin/clock');
      assert.equal(clock.status, 200, clock.text);
      assert.equal(clock.body.now, new Date(before).toISOString());

      // What the answer says is accepted.
      const ok = await asAdmin.post('/admin/clock/advance', {
        body: { seconds: Math.min(maxS, 2 * H) },
      });
      assert.equal(ok.status, 200, ok.text);
    });
  },
  { env: { GPUCLOUD_NETWORK_PRICE_GB: '0.05' } },
);
