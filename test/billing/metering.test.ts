/**
 * Metering (rates, periods, usage reports, current spend) with the manual
 * clock and hand-computed amounts, exact to the micro-unit; exactly-once
 * periods across instances and crashes; low balance.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { describeEachDb, type TestApp } from '../helpers/app.js';
import { api, type RequestBody } from '../helpers/api.js';
import { alignToHour, createApiKey, createNode, createUser, credit, uploadSshKey } from '../helpers/factories.js';
import { ledgerCheck } from '../../src/modules/billing/ledger-check.js';

const H = 3600;

/** Users with API keys (access tokens expire after an hour of service time). */
async function setup(t: TestApp, creditAmount = 100) {
  const admin = await createUser(t, { admin: true });
  const adminKey = await createApiKey(t, admin.token, 'read_write', 'admin');
  const u = await createUser(t);
  const key = await createApiKey(t, u.token, 'read_write', 'u');
  await credit(t, adminKey, u.id, creditAmount);
  await uploadSshKey(t, key);
  const node = await createNode(t, adminKey, { gpu_type: '4090', gpu_count: 8 });
  return { adminKey, u, key, node: node.node };
}

/** Moves the manual clock (settling due work) by `s` seconds; 0 just settles. */
const advance = (t: TestApp, s: number) => t.services.clock.advance(s);

async function vmStatus(t: TestApp, key: string, id: string): Promise<string> {
  const r = await api(t, key).get('/vms/{vm_id}', { params: { vm_id: id } });
  assert.equal(r.status, 200, r.text);
  return r.body.status;
}

async function balanceOf(t: TestApp, key: string): Promise<number> {
  const r = await api(t, key).get('/billing/balance');
  assert.equal(r.status, 200, r.text);
  return r.body.balance;
}

const createVm = (t: TestApp, key: string, body: RequestBody<'/vms', 'post'>) => api(t, key).post('/vms', { body });

async function sumSql(t: TestApp, sql: string, params: unknown[]): Promise<number> {
  return Number((await t.db.query<{ s: number | null }>(sql, params)).rows[0]!.s ?? 0);
}

describeEachDb('metering', (t) => {
  test('37 min running, 2 h stopped, 5 h running: billed to the micro-unit, per period', async () => {
    const { key, u, node } = await setup(t());
    await alignToHour(t());
    const c = await createVm(t(), key, { node, gpu_type: '4090', gpu_count: 1, storage_gb: 100, template_vmid: 101 });
    assert.equal(c.status, 201, c.text);
    // 1 x 4090 at 0.44/h + 100 GB at 0.0002/GB-h = 0.44 + 0.02: GPU rate + storage rate
    assert.equal(c.body.gpu_hourly_rate, 0.44);
    assert.equal(c.body.storage_hourly_rate, 0.02);
    assert.equal(c.body.hourly_rate, 0.46);
    await advance(t(), 0); // provisioning delay is 0 in tests: running from the top of the hour H0
    assert.equal(await vmStatus(t(), key, c.body.id), 'running');

    await advance(t(), 37 * 60);
    assert.equal((await api(t(), key).post('/vms/{vm_id}/stop', { params: { vm_id: c.body.id } })).status, 200);
    await advance(t(), 0);
    assert.equal(await vmStatus(t(), key, c.body.id), 'stopped');
    await advance(t(), 2 * H);
    assert.equal((await api(t(), key).post('/vms/{vm_id}/start', { params: { vm_id: c.body.id } })).status, 200);
    await advance(t(), 0);
    assert.equal(await vmStatus(t(), key, c.body.id), 'running');
    await advance(t(), 5 * H);
    assert.equal((await api(t(), key).post('/vms/{vm_id}/stop', { params: { vm_id: c.body.id } })).status, 200);
    await advance(t(), 0);

    // Periods (micro-units), each part rounded half-up, the total their sum:
    //  [H0, H0+37m]     running 37 min: gpu 440000*37/60 = 271333.3 -> 271333, storage 20000*37/60 = 12333.3 -> 12333
    //  [H0+37m, H1]     stopped 23 min: storage 7666.7 -> 7667
    //  [H1, H2]         stopped: storage 20000
    //  [H2, H2+37m]     stopped 37 min (start closes it): storage 12333
    //  [H2+37m, H3]     running 23 min: gpu 168666.7 -> 168667, storage 7667
    //  [H3..H7]         running 4 full hours: 4 x 460000
    //  [H7, H7+37m]     running 37 min (stop closes it): 271333 + 12333
    const expected = [283_666, 7_667, 20_000, 12_333, 176_334, 460_000, 460_000, 460_000, 460_000, 283_666];
    const logs = await t().db.query<{ total_cost_micros: number }>(
      'SELECT total_cost_micros FROM usage_logs WHERE vm_id = $1 ORDER BY period_end',
      [c.body.id],
    );
    assert.deepEqual(
      logs.rows.map((r) => r.total_cost_micros),
      expected,
    );
    const total = expected.reduce((a, b) => a + b, 0);
    assert.equal(total, 2_623_666);
    const charged = await sumSql(
      t(),
      `SELECT -SUM(amount_micros) AS s FROM transactions WHERE user_id = $1 AND type = 'charge'`,
      [u.id],
    );
    assert.equal(charged, total);
    assert.equal(await balanceOf(t(), key), 100 - 2.623666);

    const day = new Date(t().clock.nowMs()).toISOString().slice(0, 10);
    const first = new Date(t().clock.nowMs() - 8 * H * 1000).toISOString().slice(0, 10);
    const report = await api(t(), key).get('/billing/usage', { query: { start_date: first, end_date: day } });
    assert.equal(report.status, 200, report.text);
    assert.equal(report.body.total_cost, 2.623666);
    assert.equal(report.body.logs.length, 10);
    // GPU time: 37 min + 5 h = 5.616667 h
    assert.equal(report.body.vm_breakdown.length, 1);
    assert.equal(report.body.vm_breakdown[0]!.vmid, c.body.vmid);
    assert.equal(report.body.vm_breakdown[0]!.cost, 2.623666);
    assert.equal(report.body.vm_breakdown[0]!.hours, 5.616667);
    assert.equal(report.body.total_hours, 5.616667);
    const log = report.body.logs.find((l) => l.total_cost === 0.46);
    assert.ok(log, 'a full hour running');
    assert.deepEqual(
      {
        gpu_seconds: log.gpu_seconds,
        storage_gb: log.storage_gb,
        gpu_cost: log.gpu_cost,
        storage_cost: log.storage_cost,
        network_cost: log.network_cost,
      },
      { gpu_seconds: 3600, storage_gb: 100, gpu_cost: 0.44, storage_cost: 0.02, network_cost: 0 },
    );
    assert.deepEqual(await ledgerCheck(t().db), []);
  });

  test('a day and a month of an interruptible 2-GPU VM: the exact sum of hourly periods', async () => {
    const { key, u, node } = await setup(t(), 1000);
    await alignToHour(t());
    const c = await createVm(t(), key, {
      node,
      gpu_type: '4090',
      gpu_count: 2,
      storage_gb: 50,
      template_vmid: 100,
      rental_type: 'interruptible',
    });
    assert.equal(c.status, 201, c.text);
    // 2 x 0.22 + 50 x 0.0002 = 0.45 per hour
    assert.equal(c.body.hourly_rate, 0.45);
    await advance(t(), 0);
    await advance(t(), 24 * H);
    assert.equal(
      await sumSql(t(), `SELECT -SUM(amount_micros) AS s FROM transactions WHERE user_id = $1 AND type = 'charge'`, [
        u.id,
      ]),
      24 * 450_000,
    );
    await advance(t(), 29 * 24 * H);
    assert.equal(await sumSql(t(), 'SELECT count(*) AS s FROM usage_logs WHERE vm_id = $1', [c.body.id]), 30 * 24);
    assert.equal(
      await sumSql(t(), `SELECT -SUM(amount_micros) AS s FROM transactions WHERE user_id = $1 AND type = 'charge'`, [
        u.id,
      ]),
      30 * 24 * 450_000,
    );
    assert.equal(await balanceOf(t(), key), 1000 - 324);
    assert.deepEqual(await ledgerCheck(t().db), []);
  });

  test('a VM that never ran costs nothing; destroy ends billing at that instant', async () => {
    const { key, u, node, adminKey } = await setup(t());
    const f = await api(t(), adminKey).post('/admin/simulator/faults', { body: { node, action: 'provision' } });
    assert.equal(f.status, 200, f.text);
    const c = await createVm(t(), key, { node, gpu_type: '4090', gpu_count: 1, storage_gb: 50, template_vmid: 100 });
    assert.equal(c.status, 201, c.text);
    await advance(t(), 0);
    assert.equal(await vmStatus(t(), key, c.body.id), 'failed');
    await advance(t(), 3 * H);
    assert.equal(await sumSql(t(), 'SELECT count(*) AS s FROM usage_logs WHERE vm_id = $1', [c.body.id]), 0);

    await alignToHour(t());
    const d = await createVm(t(), key, { node, gpu_type: '4090', gpu_count: 1, storage_gb: 50, template_vmid: 100 });
    assert.equal(d.status, 201, d.text);
    await advance(t(), 0);
    await advance(t(), 90 * 60);
    assert.equal((await api(t(), key).delete('/vms/{vm_id}', { params: { vm_id: d.body.id } })).status, 200);
    await advance(t(), 5 * H);
    // [H0,H1] full hour 0.45 ... (0.44 + 50 x 0.0002 = 0.45), [H1, H1+30m] 0.225; nothing after destroy
    const logs = await t().db.query<{ total_cost_micros: number }>(
      'SELECT total_cost_micros FROM usage_logs WHERE vm_id = $1 ORDER BY period_end',
      [d.body.id],
    );
    assert.deepEqual(
      logs.rows.map((r) => r.total_cost_micros),
      [450_000, 225_000],
    );
    assert.equal(
      await sumSql(t(), `SELECT -SUM(amount_micros) AS s FROM transactions WHERE user_id = $1 AND type = 'charge'`, [
        u.id,
      ]),
      675_000,
    );
  });

  test('current spend: running at the full rate, stopped at the storage rate', async () => {
    const { key, node } = await setup(t());
    const a = await createVm(t(), key, { node, gpu_type: '4090', gpu_count: 1, storage_gb: 100, template_vmid: 100 });
    const b = await createVm(t(), key, { node, gpu_type: '4090', gpu_count: 2, storage_gb: 200, template_vmid: 100 });
    assert.equal(a.status, 201, a.text);
    assert.equal(b.status, 201, b.text);
    await advance(t(), 1);
    await api(t(), key).post('/vms/{vm_id}/stop', { params: { vm_id: b.body.id } });
    await advance(t(), 1);
    const s = await api(t(), key).get('/billing/current-spend');
    assert.equal(s.status, 200, s.text);
    // a: 0.44 + 0.02 running; b stopped: storage 200 x 0.0002 = 0.04
    assert.equal(s.body.total_per_hour, 0.5);
    assert.equal(s.body.hourly_rate, 0.5);
    assert.equal(s.body.total_per_day, 12);
    assert.equal(s.body.total_per_month, 365);
    assert.equal(s.body.running_vms, 1);
    const byId = Object.fromEntries(s.body.vms.map((v) => [v.vm_id, v]));
    assert.equal(byId[a.body.id]?.total_cost_per_hour, 0.46);
    assert.equal(byId[b.body.id]?.gpu_cost_per_hour, 0);
    assert.equal(byId[b.body.id]?.storage_cost_per_hour, 0.04);
    assert.equal(s.headers['cache-control'], 'no-store');
  });

  test('usage report validation and defaults: inclusive UTC dates, the last 30 days, start after end is 422', async () => {
    const { key } = await setup(t());
    const bad: Record<string, string>[] = [
      { start_date: '2026-13-01' },
      { end_date: '2026-02-30' },
      { start_date: 'yesterday' },
      { start_date: '2026-11-10', end_date: '2026-11-01' },
      { foo: 'x' },
    ];
    for (const q of bad) {
      const r = await api(t(), key).get('/billing/usage', { rawQuery: q });
      assert.equal(r.status, 422, JSON.stringify(q) + r.text);
    }
    const r = await api(t(), key).get('/billing/usage');
    assert.equal(r.status, 200);
    const end = new Date(t().clock.nowMs()).toISOString().slice(0, 10);
    assert.equal(r.body.period_end, end);
    assert.equal((Date.parse(r.body.period_end) - Date.parse(r.body.period_start)) / 86_400_000, 29);
    assert.deepEqual(r.body.logs, []);
    assert.equal(r.body.total_cost, 0);
  });

  test('network traffic is billed at the configured price per GB', async () => {
    // This app runs with the default price 0: traffic is recorded but costs nothing.
    const { key, node } = await setup(t());
    await alignToHour(t());
    const c = await createVm(t(), key, { node, gpu_type: '4090', gpu_count: 1, storage_gb: 50, template_vmid: 100 });
    assert.equal(c.status, 201, c.text);
    await advance(t(), 0);
    await t().services.simulator.addTraffic(c.body.id, 3_000_000_000);
    await advance(t(), H);
    const log = (
      await t().db.query<{ network_bytes: number; network_cost_micros: number }>(
        'SELECT network_bytes, network_cost_micros FROM usage_logs WHERE vm_id = $1',
        [c.body.id],
      )
    ).rows;
    assert.equal(log.length, 1);
    assert.equal(log[0]!.network_bytes, 3_000_000_000);
    assert.equal(log[0]!.network_cost_micros, 0);
  });

  test('low balance: a charge that leaves the balance at or below zero stops every running VM', async () => {
    const { key, u, node } = await setup(t(), 1);
    await alignToHour(t());
    // 1 x 4090 + 50 GB = 0.45/h; with 1.00 of credit the check passes (needs 0.45); a second VM needs 0.90 total
    const a = await createVm(t(), key, { node, gpu_type: '4090', gpu_count: 1, storage_gb: 50, template_vmid: 100 });
    const b = await createVm(t(), key, {
      node,
      gpu_type: '4090',
      gpu_count: 1,
      storage_gb: 50,
      template_vmid: 100,
      rental_type: 'interruptible',
    });
    assert.equal(a.status, 201, a.text);
    assert.equal(b.status, 201, b.text);
    await advance(t(), 0);
    await advance(t(), H); // charges 0.45 + 0.23 = 0.68: balance 0.32
    assert.equal(await vmStatus(t(), key, a.body.id), 'running');
    await advance(t(), H); // charges 0.68 more: balance -0.36 -> both stopped
    assert.equal(await vmStatus(t(), key, a.body.id), 'stopped');
    assert.equal(await vmStatus(t(), key, b.body.id), 'stopped');
    const ev = await t().db.query<{ type: string }>(
      `SELECT type FROM events WHERE user_id = $1 AND type = 'billing.low_balance'`,
      [u.id],
    );
    assert.equal(ev.rows.length, 1);
    const bal = await balanceOf(t(), key);
    assert.equal(bal, -0.36); // 1 - 0.68 - 0.68
    // Storage keeps accruing, VMs are not destroyed.
    await advance(t(), H);
    assert.equal(await balanceOf(t(), key), -0.38); // 2 x 50 GB of storage
    assert.equal(await vmStatus(t(), key, a.body.id), 'stopped');
    assert.deepEqual(await ledgerCheck(t().db), []);
  });

  test('a crash between the usage log and its transaction leaves no half-charge', async () => {
    const { key, u, node } = await setup(t());
    await alignToHour(t());
    const c = await createVm(t(), key, { node, gpu_type: '4090', gpu_count: 1, storage_gb: 50, template_vmid: 100 });
    assert.equal(c.status, 201, c.text);
    await advance(t(), 0);
    // The ledger write fails once, after the usage log row was written in the same transaction.
    await t().db.exec(`
      CREATE TABLE crash_once (armed BOOLEAN NOT NULL);
      INSERT INTO crash_once VALUES (true);
      CREATE FUNCTION crash_charge() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN
        IF NEW.type = 'charge' AND (SELECT armed FROM crash_once) THEN
          RAISE EXCEPTION 'simulated crash';
        END IF;
        RETURN NEW;
      END $$;
      CREATE TRIGGER crash_charge BEFORE INSERT ON transactions FOR EACH ROW EXECUTE FUNCTION crash_charge();`);
    await t().clock.set(t().clock.nowMs() + H * 1000);
    await assert.rejects(t().services.meter.closeDueIntervals(t().clock.now()), /simulated crash/);
    assert.equal(await sumSql(t(), 'SELECT count(*) AS s FROM usage_logs WHERE vm_id = $1', [c.body.id]), 0);
    assert.equal(
      await sumSql(t(), `SELECT count(*) AS s FROM transactions WHERE user_id = $1 AND type = 'charge'`, [u.id]),
      0,
    );
    await t().db.exec('UPDATE crash_once SET armed = false');
    assert.ok((await t().services.meter.closeDueIntervals(t().clock.now())) >= 1);
    await t().services.meter.closeDueIntervals(t().clock.now()); // nothing left to charge: a no-op
    assert.equal(await sumSql(t(), 'SELECT count(*) AS s FROM usage_logs WHERE vm_id = $1', [c.body.id]), 1);
    assert.equal(
      await sumSql(t(), `SELECT -SUM(amount_micros) AS s FROM transactions WHERE user_id = $1 AND type = 'charge'`, [
        u.id,
      ]),
      450_000,
    );
    await t().db.exec(
      'DROP TRIGGER crash_charge ON transactions; DROP FUNCTION crash_charge(); DROP TABLE crash_once;',
    );
    await advance(t(), 0);
    assert.deepEqual(await ledgerCheck(t().db), []);
  });

  test('two metering instances closing the same interval at once charge it once', async () => {
    const { key, u, node } = await setup(t());
    await alignToHour(t());
    const vms = [];
    for (let i = 0; i < 3; i++) {
      const c = await createVm(t(), key, { node, gpu_type: '4090', gpu_count: 1, storage_gb: 50, template_vmid: 100 });
      assert.equal(c.status, 201, c.text);
      vms.push(c.body.id);
    }
    await advance(t(), 0);
    const other = await t().another();
    t().clock.set(t().clock.nowMs() + H * 1000);
    const now = t().clock.now();
    await Promise.all([
      t().services.meter.closeDueIntervals(now),
      other.services.meter.closeDueIntervals(now),
      t().services.meter.closeDueIntervals(now),
      other.services.meter.closeDueIntervals(now),
    ]);
    for (const id of vms)
      assert.equal(await sumSql(t(), 'SELECT count(*) AS s FROM usage_logs WHERE vm_id = $1', [id]), 1);
    assert.equal(
      await sumSql(t(), `SELECT count(*) AS s FROM transactions WHERE user_id = $1 AND type = 'charge'`, [u.id]),
      3,
    );
    await advance(t(), 0);
    assert.deepEqual(await ledgerCheck(t().db), []);
  });
});
