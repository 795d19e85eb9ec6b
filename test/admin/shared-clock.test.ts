/**
 * The manual clock is one clock for every instance on a database: a request
 * through an instance that did not advance sees the advanced time, and
 * advances through two instances at once take turns (an advisory lock on
 * PostgreSQL, a queue in the one process of the embedded database), so every
 * hour of every VM is charged once and the clock adds both moves up.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { FastifyInstance } from 'fastify';
import { describeEachDb, request, type TestApp } from '../helpers/app.js';
import { api } from '../helpers/api.js';
import { createApiKey, createNode, createUser, credit } from '../helpers/factories.js';
import { ledgerCheck } from '../../src/modules/billing/ledger-check.js';

const H = 3600;

describeEachDb('the manual clock across instances', (t) => {
  /**
   * The test app with its requests sent to `app`, another instance on the same database, so that the typed client
   * (helpers/api.ts) can address it: `api(via(b), token)`. The requests are what app.inject was given before (the
   * bearer token, a JSON body); the answers get the checks of every t().req answer.
   */
  const via = (app: FastifyInstance): TestApp => ({
    ...t(),
    app,
    req: (method, url, opts) => request(app, new Set(), method, url, opts),
  });

  test('an instance that did not advance stamps the advanced time', async () => {
    const admin = await createUser(t(), { admin: true });
    const adminKey = await createApiKey(t(), admin.token, 'read_write');
    const b = await t().another();
    const moved = await api(t(), adminKey).post('/admin/clock/advance', { body: { seconds: 5 * H } });
    assert.equal(moved.status, 200, moved.text);
    // An access token from before the advance has expired for B as well: one clock judges it.
    assert.equal((await api(via(b), admin.token).get('/account')).status, 401);
    const key = await api(via(b), adminKey).post('/api-keys', { body: { name: 'through b', scope: 'read_only' } });
    assert.equal(key.status, 201, key.text);
    t().forbidSecret(key.body.key);
    assert.equal(key.body.created_at, moved.body.now, 'B stamps the time A advanced to');
  });

  test('advances through two instances at once add up and charge every hour of a VM once', async () => {
    const admin = await createUser(t(), { admin: true });
    const adminKey = await createApiKey(t(), admin.token, 'read_write');
    const user = await createUser(t());
    await credit(t(), admin.token, user.id, 500);
    const key = await createApiKey(t(), user.token, 'read_write');
    const { node } = await createNode(t(), admin.token);
    const b = await t().another();
    const asAdmin = api(t(), adminKey);
    const asAdminOnB = api(via(b), adminKey);
    // Start at a boundary so the periods are whole hours.
    const clock = await asAdmin.get('/admin/clock');
    assert.equal(clock.status, 200, clock.text);
    const now = Date.parse(clock.body.now);
    const toHour = Math.ceil(now / (H * 1000)) * H - now / 1000;
    if (toHour > 0) await asAdmin.post('/admin/clock/advance', { body: { seconds: toHour } });
    const c = await api(t(), key).post('/vms', {
      body: {
        node,
        gpu_type: '4090',
        gpu_count: 1,
        storage_gb: 50,
        template_vmid: 100,
        auth_method: 'password',
        password: 'a-vm-password-1234',
      },
    });
    assert.equal(c.status, 201, c.text);
    await t().services.clock.advance(0); // provisioned and running (0 s in tests)
    const vm = await api(t(), key).get('/vms/{vm_id}', { params: { vm_id: c.body.id } });
    assert.equal(vm.status, 200, vm.text);
    assert.ok(vm.body.started_at, 'running');
    const start = Date.parse(vm.body.started_at);

    const results = await Promise.all([
      asAdmin.post('/admin/clock/advance', { body: { seconds: 2 * H } }),
      asAdminOnB.post('/admin/clock/advance', { body: { seconds: 2 * H } }),
      asAdminOnB.post('/admin/clock/advance', { body: { seconds: H } }),
    ]);
    for (const r of results) assert.equal(r.status, 200, r.text);
    // (every answer is a 200, checked just above: NaN is never taken)
    const ends = results.map((r) => (r.status === 200 ? Date.parse(r.body.now) : NaN)).sort((x, y) => x - y);
    assert.equal(ends[2]! - start, 5 * H * 1000, 'the clock moved by the sum of the three advances');
    assert.equal(new Set(ends).size, 3, 'each advance ended at its own moment: they took turns');

    const gone = await api(via(b), key).delete('/vms/{vm_id}', { params: { vm_id: c.body.id } });
    assert.equal(gone.status, 200, gone.text);
    const logs = await t().db.query<{ period_start: Date; period_end: Date; gpu_ms: number }>(
      'SELECT period_start, period_end, gpu_ms FROM usage_logs WHERE vm_id = $1 ORDER BY period_start',
      [c.body.id],
    );
    assert.equal(logs.rows.length, 5, 'five hourly periods');
    assert.equal(logs.rows[0]!.period_start.getTime(), start);
    assert.equal(logs.rows.at(-1)!.period_end.getTime(), start + 5 * H * 1000, 'billed up to the destroy, through B');
    assert.ok(
      logs.rows.every((l) => l.gpu_ms === H * 1000),
      'every hour charged as running',
    );
    assert.deepEqual(await ledgerCheck(t().db), []);
  });
});
