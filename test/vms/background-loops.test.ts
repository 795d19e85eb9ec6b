/**
 * Background work under a running clock: hypervisor actions and each job
 * run in loops of their own, so a long job (a billing close of a large
 * fleet) delays neither a VM's start nor the other jobs; a tick that finds
 * its loop's last pass still running is skipped, not queued; and stopping
 * the worker ends a long pass at its next safe point instead of waiting it out.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { describeEachDb } from '../helpers/app.js';
import { createApiKey, createNode, createUser, credit } from '../helpers/factories.js';
import { within } from '../helpers/wait.js';
import { Meter } from '../../src/modules/billing/meter.js';

describeEachDb('background loops', (t) => {
  test('a long job delays neither hypervisor actions nor the other jobs, and overrun ticks are skipped', async () => {
    const admin = await createUser(t(), { admin: true });
    const user = await createUser(t());
    await credit(t(), admin.token, user.id, 100);
    const key = await createApiKey(t(), user.token, 'read_write');
    const { node } = await createNode(t(), admin.token);

    let release!: () => void;
    const released = new Promise<void>((r) => (release = r));
    let slowRuns = 0;
    let fastRuns = 0;
    t().services.reconciler.addJob({
      name: 'test-slow',
      run: async () => {
        slowRuns++;
        await released;
        return 1;
      },
    });
    t().services.reconciler.addJob({ name: 'test-fast', run: async () => ++fastRuns && 0 });
    t().services.reconciler.start(20);
    try {
      const c = await t().req('POST', '/vms', { token: key, body: { node, gpu_type: '4090', gpu_count: 1, storage_gb: 50, template_vmid: 100, auth_method: 'password', password: 'a-vm-password-1234' } });
      assert.equal(c.status, 201, c.text);
      await within(10_000, async () => (await t().req('GET', `/vms/${c.body.id}`, { token: key })).body.status === 'running', 'the VM runs while the slow job is still in its first pass');
      assert.equal(slowRuns, 1, 'ticks during the slow pass were skipped, not queued');
      await within(5_000, async () => fastRuns >= 5, 'the fast job keeps its own schedule');
      release();
      await within(5_000, async () => slowRuns >= 2, 'the slow job runs again once its pass has ended');
    } finally {
      release();
      await t().services.reconciler.stop();
    }
  });

  test('stopping ends a long pass at its next safe point', async () => {
    let started = false;
    let sawAbort = false;
    t().services.reconciler.addJob({
      name: 'test-long',
      run: async (_now, signal) => {
        started = true;
        // Work in small steps until told to stop (as a billing close does between batches).
        while (!signal?.aborted) await new Promise((r) => setTimeout(r, 10));
        sawAbort = true;
        return 0;
      },
    });
    t().services.reconciler.start(20);
    await within(5_000, async () => started, 'the long job starts');
    await t().services.reconciler.stop();
    assert.equal(sawAbort, true, 'stop() told the pass to end and waited for it');
  });

  test('a billing close told to stop writes no further batch', async () => {
    const meter = new Meter(t().db, t().clock, { intervalS: 3600, networkPricePerGbMicros: 0 });
    const stopped = new AbortController();
    stopped.abort();
    const before = await t().db.query<{ n: number }>('SELECT count(*)::int8 AS n FROM usage_logs');
    assert.equal(await meter.closeDueIntervals(new Date(t().clock.nowMs() + 86_400_000), { signal: stopped.signal }), 0);
    const after = await t().db.query<{ n: number }>('SELECT count(*)::int8 AS n FROM usage_logs');
    assert.equal(after.rows[0]!.n, before.rows[0]!.n);
  });
});
