/**
 * Background work under a running clock: hypervisor actions and each job
 * run in loops of their own, so a long job (a billing close of a large
 * fleet) delays neither a VM's start nor the other jobs; a tick that finds
 * its loop's last pass still running is skipped, not queued; and stopping
 * the worker ends a long pass at its next safe point instead of waiting it out.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { describeEachDb } from '../helpers/app.js';
import { api, type RequestBody } from '../helpers/api.js';
import { createApiKey, createNode, createUser, credit } from '../helpers/factories.js';
import { within } from '../helpers/wait.js';
import type { FastifyBaseLogger } from 'fastify';
import { Meter } from '../../src/modules/billing/meter.js';
import { Scheduler } from '../../src/background/scheduler.js';

describeEachDb('background loops', (t) => {
  /** A customer with credit and an API key, and a VM of theirs just created (its provisioning due). */
  const customerWithVm = async (): Promise<{ key: string; id: string }> => {
    const admin = await createUser(t(), { admin: true });
    const user = await createUser(t());
    await credit(t(), admin.token, user.id, 100);
    const key = await createApiKey(t(), user.token, 'read_write');
    const { node } = await createNode(t(), admin.token);
    const body: RequestBody<'/vms', 'post'> = {
      node,
      gpu_type: '4090',
      gpu_count: 1,
      storage_gb: 50,
      template_vmid: 100,
      auth_method: 'password',
      password: 'a-vm-password-1234',
    };
    const c = await api(t(), key).post('/vms', { body });
    assert.equal(c.status, 201, c.text);
    return { key, id: c.body.id };
  };

  test('a long job delays neither hypervisor actions nor the other jobs, and overrun ticks are skipped', async () => {
    let release!: () => void;
    const released = new Promise<void>((r) => (release = r));
    let slowRuns = 0;
    let fastRuns = 0;
    t().services.scheduler.add({
      name: 'test-slow',
      run: async () => {
        slowRuns++;
        await released;
        return 1;
      },
    });
    t().services.scheduler.add({ name: 'test-fast', run: async () => ++fastRuns && 0 });
    t().services.scheduler.start(20);
    try {
      const { key, id } = await customerWithVm();
      await within(
        10_000,
        async () => {
          const r = await api(t(), key).get('/vms/{vm_id}', { params: { vm_id: id } });
          return r.status === 200 && r.body.status === 'running';
        },
        'the VM runs while the slow job is still in its first pass',
      );
      assert.equal(slowRuns, 1, 'ticks during the slow pass were skipped, not queued');
      await within(5_000, async () => fastRuns >= 5, 'the fast job keeps its own schedule');
      release();
      await within(5_000, async () => slowRuns >= 2, 'the slow job runs again once its pass has ended');
    } finally {
      release();
      await t().services.scheduler.stop();
    }
  });

  test('stopping ends a long pass at its next safe point', async () => {
    let started = false;
    let sawAbort = false;
    t().services.scheduler.add({
      name: 'test-long',
      run: async (_now, signal) => {
        started = true;
        // Work in small steps until told to stop (as a billing close does between batches).
        while (!signal?.aborted) await new Promise((r) => setTimeout(r, 10));
        sawAbort = true;
        return 0;
      },
    });
    t().services.scheduler.start(20);
    await within(5_000, async () => started, 'the long job starts');
    await t().services.scheduler.stop();
    assert.equal(sawAbort, true, 'stop() told the pass to end and waited for it');
  });

  test('once stop() is called nothing more is claimed, and the actions in flight are recorded before it returns', async () => {
    const { key, id } = await customerWithVm();
    const vms = t().services.vms;
    const scheduler = t().services.scheduler;
    const claimDue = vms.claimDue.bind(vms);
    let stopping: Promise<void> | undefined;
    let claimsAfterStop = 0;
    // A shutdown arriving while the background loop is busy: the first claim that finds work calls stop(). The
    // loop would go on to its next pass (it found work), and that pass must claim nothing.
    vms.claimDue = async (...args: Parameters<typeof vms.claimDue>) => {
      if (stopping) claimsAfterStop++;
      const claimed = await claimDue(...args);
      if (claimed.length > 0 && !stopping) stopping = scheduler.stop();
      return claimed;
    };
    try {
      scheduler.start(20);
      await within(5_000, async () => stopping !== undefined, 'a pass claims the provisioning');
      await stopping;
      const recorded = await api(t(), key).get('/vms/{vm_id}', { params: { vm_id: id } });
      assert.equal(recorded.status, 200);
      assert.equal(recorded.body.status, 'starting', 'the provisioning in flight was recorded before stop() returned');
      const [row] = (
        await t().db.query<{ claim_token: string | null }>('SELECT claim_token FROM vms WHERE id = $1', [id])
      ).rows;
      assert.equal(row!.claim_token, null, 'no claim is left held');
      await new Promise((r) => setTimeout(r, 100));
      assert.equal(claimsAfterStop, 0, 'no pass claimed anything after stop() was called');
    } finally {
      vms.claimDue = claimDue;
      await scheduler.stop();
    }
  });

  test("a claim's lease runs on real time: moving the service clock hands no claimed action to another worker", async () => {
    const { id } = await customerWithVm();
    const vms = t().services.vms;
    const mine = (rows: { id: string }[]) => rows.filter((v) => v.id === id).length;
    const now = t().clock.now();
    assert.equal(
      mine(await vms.claimDue(now, 60_000, randomUUID(), 100)),
      1,
      'worker A claims the provision for a minute',
    );
    const dayLater = new Date(now.getTime() + 86_400_000);
    assert.equal(
      mine(await vms.claimDue(dayLater, 60_000, randomUUID(), 100)),
      0,
      'a day of service time later, the minute of real time has not passed',
    );
    await t().db.query('UPDATE vms SET claimed_until = $2 WHERE id = $1', [id, new Date(Date.now() - 1)]);
    assert.equal(
      mine(await vms.claimDue(now, 60_000, randomUUID(), 100)),
      1,
      'once the real-time lease has run out, another worker takes it',
    );
  });

  test('a failing job is logged with its name, and runs again on its next tick', async () => {
    const errors: { job?: string; err?: unknown }[] = [];
    const log = {
      error: (o: { job?: string; err?: unknown }) => errors.push(o),
      warn() {},
      info() {},
      debug() {},
      trace() {},
      fatal() {},
      child() {
        return log;
      },
      level: 'info',
      silent() {},
    };
    const r = new Scheduler(t().clock, log as unknown as FastifyBaseLogger);
    let runs = 0;
    r.add({
      name: 'test-broken',
      run: async () => {
        runs++;
        throw new Error('the database went away');
      },
    });
    r.start(20);
    try {
      await within(5_000, async () => runs >= 3, 'the failing job keeps its schedule');
    } finally {
      await r.stop();
    }
    assert.ok(errors.length >= 2);
    assert.equal(errors[0]!.job, 'test-broken');
    assert.match(String((errors[0]!.err as Error).message), /went away/);
  });

  test('a billing close told to stop writes no further batch', async () => {
    const meter = new Meter(t().db, t().clock, { intervalS: 3600, networkPricePerGbMicros: 0 });
    const stopped = new AbortController();
    stopped.abort();
    const before = await t().db.query<{ n: number }>('SELECT count(*)::int8 AS n FROM usage_logs');
    assert.equal(
      await meter.closeDueIntervals(new Date(t().clock.nowMs() + 86_400_000), { signal: stopped.signal }),
      0,
    );
    const after = await t().db.query<{ n: number }>('SELECT count(*)::int8 AS n FROM usage_logs');
    assert.equal(after.rows[0]!.n, before.rows[0]!.n);
  });
});
