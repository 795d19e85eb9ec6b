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
import { describeEachDb } from '../helpers/app.js';
import { createApiKey, createNode, createUser, credit } from '../helpers/factories.js';
import { ledgerCheck } from '../../src/modules/billing/ledger-check.js';

const H = 3600;

describeEachDb('the manual clock across instances', (t) => {
  const inject = async (app: FastifyInstance, method: string, url: string, token: string, body?: unknown) => {
    const r = await app.inject({
      method: method as 'POST',
      url,
      headers: { authorization: `Bearer ${token}` },
      payload: body as object,
    });
    return { status: r.statusCode, body: r.body ? JSON.parse(r.body) : undefined, text: r.body };
  };

  test('an instance that did not advance stamps the advanced time', async () => {
    const admin = await createUser(t(), { admin: true });
    const adminKey = await createApiKey(t(), admin.token, 'read_write');
    const b = await t().another();
    const moved = await t().req('POST', '/admin/clock/advance', { token: adminKey, body: { seconds: 5 * H } });
    assert.equal(moved.status, 200, moved.text);
    // An access token from before the advance has expired for B as well: one clock judges it.
    assert.equal((await inject(b, 'GET', '/account', admin.token)).status, 401);
    const key = await inject(b, 'POST', '/api-keys', adminKey, { name: 'through b', scope: 'read_only' });
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
    // Start at a boundary so the periods are whole hours.
    const now = Date.parse((await t().req('GET', '/admin/clock', { token: adminKey })).body.now);
    const toHour = Math.ceil(now / (H * 1000)) * H - now / 1000;
    if (toHour > 0) await t().req('POST', '/admin/clock/advance', { token: adminKey, body: { seconds: toHour } });
    const c = await t().req('POST', '/vms', {
      token: key,
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
    const start = Date.parse((await t().req('GET', `/vms/${c.body.id}`, { token: key })).body.started_at);

    const results = await Promise.all([
      t().req('POST', '/admin/clock/advance', { token: adminKey, body: { seconds: 2 * H } }),
      inject(b, 'POST', '/admin/clock/advance', adminKey, { seconds: 2 * H }),
      inject(b, 'POST', '/admin/clock/advance', adminKey, { seconds: H }),
    ]);
    for (const r of results) assert.equal(r.status, 200, r.text);
    const ends = results.map((r) => Date.parse(r.body.now)).sort((x, y) => x - y);
    assert.equal(ends[2]! - start, 5 * H * 1000, 'the clock moved by the sum of the three advances');
    assert.equal(new Set(ends).size, 3, 'each advance ended at its own moment: they took turns');

    const gone = await inject(b, 'DELETE', `/vms/${c.body.id}`, key);
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
