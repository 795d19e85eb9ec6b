/**
 * What the background reconcilers do with VMs: preemption and interruption
 * records, hypervisor failures through the simulator's faults, nodes going
 * offline and back, and two service instances over one database acting once
 * per VM action.
 */
import { before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import type { FastifyInstance } from 'fastify';
import { describeEachDb } from '../helpers/app.js';
import { api, hasStatus, isErrorBody, type Answer, type BodyFor, type RequestBody } from '../helpers/api.js';
import {
  advance,
  createNode,
  createUser,
  credit,
  tokensOf,
  uploadSshKey,
  type TestUser,
} from '../helpers/factories.js';

/** A VM as POST /vms answered it. */
type Vm = BodyFor<'/vms', 'post', 201>;

describeEachDb('VM reconcilers', (t) => {
  let admin: TestUser;
  let alice: TestUser; // rents interruptible VMs
  let bob: TestUser; // rents on-demand VMs

  /** A client with the user's current token (relogin replaces it). */
  const as = (u: TestUser) => api(t(), u.token);
  const expectError = (r: Answer, status: number, code: string, detail?: RegExp) => {
    assert.equal(r.status, status, r.text);
    assert.ok(isErrorBody(r.body), r.text);
    assert.equal(r.body.code, code, r.text);
    if (detail) assert.match(r.body.detail, detail);
  };
  const ok = async <R extends Answer>(r: Promise<R>): Promise<Extract<R, { status: 200 }>> => {
    const res = await r;
    assert.equal(res.status, 200, res.text);
    assert.ok(hasStatus(res, 200));
    return res;
  };
  const create = async (u: TestUser, node: string, over: Partial<RequestBody<'/vms', 'post'>> = {}): Promise<Vm> => {
    const r = await as(u).post('/vms', {
      body: { node, gpu_type: '4090', gpu_count: 1, storage_gb: 50, template_vmid: 100, ...over },
    });
    assert.equal(r.status, 201, r.text);
    return r.body;
  };
  const get = async (v: Vm) => {
    const r = await as(admin).get('/admin/vms', { query: { include_destroyed: true, limit: 100 } });
    assert.equal(r.status, 200, r.text);
    const found = r.body.find((x) => x.id === v.id);
    assert.ok(found, `${v.id} is not in GET /admin/vms`);
    return found;
  };
  const status = async (v: Vm): Promise<string> => (await get(v)).status;
  const history = async (u: TestUser, v: Vm) =>
    (await ok(as(u).get('/vms/{vm_id}/interruption-history', { params: { vm_id: v.id } }))).body;
  const allocated = async (node: string) =>
    (await ok(as(admin).get('/admin/nodes/{node}', { params: { node } }))).body.gpus_allocated;
  const now = () => t().services.clock.now().toISOString();
  const sim = () => t().services.simulator;
  const calls = (v: Vm, action?: string) =>
    sim().calls.filter((c) => c.vmId === v.id && (!action || c.action === action));
  const fault = (body: RequestBody<'/admin/simulator/faults', 'post'>) =>
    as(admin).post('/admin/simulator/faults', { body });
  /** A fault request the API must refuse (not type-checked). */
  const badFault = (rawBody: Record<string, unknown>) => as(admin).post('/admin/simulator/faults', { rawBody });
  const tick = (s: number) => advance(t(), admin.token, s);
  /**
   * Runs the work due now without moving the clock, so that a retry's backoff
   * is counted from a known moment whether or not an advance steps through
   * due moments on its way.
   */
  const settleNow = () => t().services.clock.advance(0);
  /** Fresh access tokens (they live 3600 s of service time). */
  const relogin = async (...users: TestUser[]) => {
    for (const u of users) {
      const r = await api(t()).post('/auth/login', { body: { email: u.email, password: u.password } });
      assert.equal(r.status, 200, r.text);
      u.token = tokensOf(r.body).access_token;
    }
  };

  before(async () => {
    admin = await createUser(t(), { admin: true });
    alice = await createUser(t());
    bob = await createUser(t());
    for (const u of [alice, bob]) {
      await credit(t(), admin.token, u.id, 1000);
      await uploadSshKey(t(), u.token);
    }
  });

  describe('preemption: on-demand VMs take the GPUs of interruptible ones', () => {
    let node: string;
    let i1: Vm, i2: Vm, i3: Vm, od: Vm, od2: Vm;

    before(async () => {
      node = (await createNode(t(), admin.token, { gpu_count: 8 })).node;
      i1 = await create(alice, node, { gpu_count: 2, rental_type: 'interruptible' });
      await tick(1);
      i2 = await create(alice, node, { gpu_count: 2, rental_type: 'interruptible' });
      await tick(1);
      i3 = await create(alice, node, { gpu_count: 2, rental_type: 'interruptible' });
      await tick(1);
      for (const v of [i1, i2, i3]) assert.equal(await status(v), 'running');
      /** started_at of a VM that is running (so it has one). */
      const startedAt = async (v: Vm): Promise<string> => {
        const s = (await get(v)).started_at;
        assert.ok(s !== null, `${v.id} has no started_at`);
        return s;
      };
      assert.ok((await startedAt(i1)) < (await startedAt(i2)) && (await startedAt(i2)) < (await startedAt(i3)));
    });

    test('an on-demand create on a full node preempts the most recently started interruptible VM, only as many as needed', async () => {
      const at = now();
      od = await create(bob, node, { gpu_count: 4 }); // 2 free + 2 taken from i3
      assert.equal(await status(i3), 'interrupted');
      assert.equal(await status(i1), 'running');
      assert.equal(await status(i2), 'running');
      assert.equal(await allocated(node), 8);
      const g3 = await get(i3);
      assert.equal(g3.stopped_at, at, 'stopped_at: it left running at the preemption');
      assert.equal(g3.cpu_percent, 0);
      const h = await history(alice, i3);
      assert.equal(h.length, 1);
      assert.deepEqual(
        { ...h[0], id: undefined },
        {
          id: undefined,
          interruptible_vm_id: i3.id,
          preempted_by_vm_id: od.id,
          preempted_at: at,
          restored_at: null,
          downtime_seconds: null,
          status: 'interrupted',
        },
      );
      assert.deepEqual(await history(alice, i1), []);
      // Then the next most recent: i2 (2 GPUs for od2)
      od2 = await create(bob, node, { gpu_count: 2 });
      assert.equal(await status(i2), 'interrupted');
      assert.equal(await status(i1), 'running');
      assert.equal((await history(alice, i2))[0]!.preempted_by_vm_id, od2.id);
    });

    test('the hypervisor stops a preempted VM in the background', async () => {
      assert.equal(calls(i3, 'stop').length, 0, 'never inside the request');
      await tick(1);
      assert.equal(calls(i3, 'stop').length, 1);
      assert.equal(calls(i2, 'stop').length, 1);
      assert.equal(calls(i1, 'stop').length, 0);
      assert.equal(await status(i3), 'interrupted', 'no GPUs free: it waits');
    });

    test('an interruptible create never preempts: 400 gpu_unavailable when only interruptible-held GPUs are left', async () => {
      const carol = await createUser(t());
      await credit(t(), admin.token, carol.id, 100);
      await uploadSshKey(t(), carol.token);
      const r = await as(carol).post('/vms', {
        body: {
          node,
          gpu_type: '4090',
          gpu_count: 1,
          storage_gb: 50,
          template_vmid: 100,
          rental_type: 'interruptible',
        },
      });
      expectError(r, 400, 'gpu_unavailable', /0 free GPU/);
      assert.equal(await status(i1), 'running');
      // An on-demand create that even preemption cannot satisfy preempts nobody
      const big = await as(carol).post('/vms', {
        body: { node, gpu_type: '4090', gpu_count: 4, storage_gb: 50, template_vmid: 100 },
      });
      expectError(big, 400, 'gpu_unavailable', /2 available GPU\(s\); 4 requested/);
      assert.equal(await status(i1), 'running');
      assert.deepEqual(await history(alice, i1), []);
    });

    test('GET /search offers on-demand GPUs held by interruptible VMs, interruptible ones only when free', async () => {
      const anon = api(t());
      const offers = await anon.get('/search', { query: { gpu_type: '4090', limit: 100 } });
      assert.equal(offers.status, 200, offers.text);
      const od = offers.body.find((o) => o.node === node);
      assert.ok(od, `${node} is not offered`);
      assert.equal(od.gpu_count, 2, 'i1 holds 2 preemptible GPUs');
      const ir = await anon.get('/search', { query: { gpu_type: '4090', rental_type: 'interruptible', limit: 100 } });
      assert.equal(ir.status, 200, ir.text);
      assert.ok(!ir.body.some((o) => o.node === node));
    });

    test('when GPUs free up, an interrupted VM with auto_restart runs again and its record becomes restored', async () => {
      await ok(
        as(alice).post('/vms/{vm_id}/set-auto-restart', { params: { vm_id: i2.id }, body: { auto_restart: false } }),
      );
      const preemptedAt = Date.parse((await history(alice, i3))[0]!.preempted_at);
      await tick(30);
      assert.equal(await status(i3), 'interrupted');
      const freedAt = now();
      await ok(as(bob).delete('/vms/{vm_id}', { params: { vm_id: od.id } })); // frees 4 GPUs
      assert.equal(await status(i3), 'interrupted', 'restarted by the reconciler, not by the request');
      await settleNow(); // the reconcilers' next pass, at the moment the GPUs came free
      const g3 = await get(i3);
      assert.equal(g3.status, 'running');
      assert.equal(g3.started_at, freedAt, 'started_at: the last moment it became running');
      const h = await history(alice, i3);
      assert.equal(h.length, 1);
      assert.equal(h[0]!.status, 'restored');
      assert.equal(h[0]!.restored_at, freedAt);
      assert.equal(h[0]!.downtime_seconds, (Date.parse(freedAt) - preemptedAt) / 1000);
      assert.ok(h[0]!.downtime_seconds! >= 30);
      // auto_restart false: stays interrupted although 2 GPUs are free
      assert.equal(await status(i2), 'interrupted');
      assert.equal((await history(alice, i2))[0]!.status, 'interrupted');
      await tick(5);
      assert.equal(await status(i2), 'interrupted');
      assert.equal(await allocated(node), 6);
      // ...until its owner starts it
      const startedAt = now();
      await ok(as(alice).post('/vms/{vm_id}/start', { params: { vm_id: i2.id } }));
      await settleNow();
      assert.equal(await status(i2), 'running');
      const h2 = await history(alice, i2);
      assert.equal(h2[0]!.status, 'restored');
      assert.equal(h2[0]!.restored_at, startedAt);
      await tick(1);
    });

    test('destroyed while interrupted: the record becomes abandoned', async () => {
      // i2 started last, then i3: both go for a 4-GPU on-demand VM; i1 keeps running.
      const at = now();
      const od3 = await create(bob, node, { gpu_count: 4 });
      assert.equal(await status(i2), 'interrupted');
      assert.equal(await status(i3), 'interrupted');
      assert.equal(await status(i1), 'running');
      await ok(as(alice).delete('/vms/{vm_id}', { params: { vm_id: i3.id } }));
      const h = await history(alice, i3);
      assert.equal(h.length, 2, 'newest first');
      assert.deepEqual([h[0]!.status, h[1]!.status], ['abandoned', 'restored']);
      assert.equal(h[0]!.preempted_at, at);
      assert.equal(h[0]!.preempted_by_vm_id, od3.id);
      assert.equal(h[0]!.restored_at, null);
      assert.equal(h[0]!.downtime_seconds, null);
      const h2 = await history(alice, i2);
      assert.deepEqual(
        h2.map((x) => x.status),
        ['interrupted', 'restored'],
      );
      const page = await ok(
        as(alice).get('/vms/{vm_id}/interruption-history', {
          params: { vm_id: i2.id },
          query: { limit: 1, offset: 1 },
        }),
      );
      assert.equal(page.body.length, 1);
      assert.equal(page.body[0]?.status, 'restored');
      assert.equal(page.headers['x-total-count'], '2');
      for (const v of [i1, i2]) await ok(as(alice).delete('/vms/{vm_id}', { params: { vm_id: v.id } }));
      for (const v of [od2, od3]) await ok(as(bob).delete('/vms/{vm_id}', { params: { vm_id: v.id } }));
      assert.equal(await allocated(node), 0);
      assert.equal((await history(alice, i2))[0]!.status, 'abandoned');
    });

    test('an interruptible VM its owner is stopping is not preempted (it would restart by itself)', async () => {
      const n = (await createNode(t(), admin.token, { gpu_count: 1 })).node;
      const i = await create(alice, n, { rental_type: 'interruptible' });
      await tick(1);
      await ok(fault({ node: n, action: 'stop' }));
      await ok(as(alice).post('/vms/{vm_id}/stop', { params: { vm_id: i.id } }));
      await settleNow(); // the stop fails: it stays stopping, GPUs held, retried in 5 s
      assert.equal(await status(i), 'stopping');
      const r = await as(bob).post('/vms', {
        body: { node: n, gpu_type: '4090', gpu_count: 1, storage_gb: 50, template_vmid: 100 },
      });
      expectError(r, 400, 'gpu_unavailable', /0 available GPU/);
      assert.equal(await status(i), 'stopping');
      assert.deepEqual(await history(alice, i), []);
      await tick(5);
      assert.equal(await status(i), 'stopped');
      const od = await create(bob, n); // free now
      await tick(1);
      assert.equal(await status(i), 'stopped', 'never restarted by itself');
      await ok(as(bob).delete('/vms/{vm_id}', { params: { vm_id: od.id } }));
      await ok(as(alice).delete('/vms/{vm_id}', { params: { vm_id: i.id } }));
    });

    test('a VM preempted before it was ever built is built when it restarts', async () => {
      const n = (await createNode(t(), admin.token, { gpu_count: 2 })).node;
      const iq = await create(alice, n, { gpu_count: 2, rental_type: 'interruptible' });
      const o = await create(bob, n, { gpu_count: 2 });
      const g = await get(iq);
      assert.equal(g.status, 'interrupted');
      assert.equal(g.stopped_at, null, 'it never ran');
      await tick(1);
      assert.equal(calls(iq).length, 0, 'nothing to stop or build yet');
      assert.equal(await status(o), 'running');
      await ok(as(bob).delete('/vms/{vm_id}', { params: { vm_id: o.id } }));
      await tick(1);
      assert.equal(await status(iq), 'running');
      assert.deepEqual(
        calls(iq).map((c) => c.action),
        ['provision', 'start'],
      );
      assert.equal((await history(alice, iq))[0]!.status, 'restored');
      await ok(as(alice).delete('/vms/{vm_id}', { params: { vm_id: iq.id } }));
    });
  });

  describe('hypervisor failures (simulator faults)', () => {
    test('POST /admin/simulator/faults: admin only, 404 for an unknown node, 422 for a bad action', async () => {
      const n = (await createNode(t(), admin.token, { gpu_count: 1 })).node;
      const r = await as(alice).post('/admin/simulator/faults', { body: { node: n, action: 'provision' } });
      expectError(r, 403, 'forbidden');
      expectError(await fault({ node: 'no-such-node', action: 'provision' }), 404, 'not_found', /no-such-node/);
      expectError(await badFault({ node: n, action: 'explode' }), 422, 'validation_error');
      expectError(await badFault({ node: n }), 422, 'validation_error');
      expectError(await fault({ node: n, action: 'stop', count: -1 }), 422, 'validation_error');
      const good = await ok(fault({ node: n, action: 'start', count: 2 }));
      assert.deepEqual(Object.keys(good.body), ['message']);
      await ok(fault({ node: n, action: 'start', count: 0 })); // disarms
    });

    test('a failed provision ends the VM failed: no GPUs held, not counted toward the VM limit, nothing billed', async () => {
      const n = (await createNode(t(), admin.token, { gpu_count: 2 })).node;
      const u = await createUser(t());
      await credit(t(), admin.token, u.id, 50);
      await uploadSshKey(t(), u.token);
      await ok(as(admin).patch('/admin/users/{user_id}', { params: { user_id: u.id }, body: { max_vms: 1 } }));
      await ok(fault({ node: n, action: 'provision' }));
      const v = await create(u, n, { gpu_count: 2 });
      assert.equal(await allocated(n), 2);
      await tick(1);
      const g = await get(v);
      assert.equal(g.status, 'failed');
      assert.equal(g.started_at, null);
      assert.equal(g.ip_address, null);
      assert.equal(await allocated(n), 0, 'a failed VM holds no GPUs');
      assert.deepEqual(
        calls(v).map((c) => [c.action, c.ok]),
        [['provision', false]],
      );
      await tick(3600); // well past an hourly billing boundary
      await relogin(admin, alice, bob, u); // an hour of service time has expired the access tokens
      assert.equal(await status(v), 'failed');
      const tx = await ok(as(u).get('/billing/transactions'));
      assert.deepEqual(
        tx.body.map((x) => x.type),
        ['credit'],
        'nothing billed for a VM that never ran',
      );
      assert.equal((await ok(as(u).get('/billing/balance'))).body.balance, 50);
      const again = await create(u, n, { gpu_count: 2 }); // max_vms 1: the failed one does not count
      await tick(1);
      assert.equal(await status(again), 'running');
      // the failed VM shows in the list and can be destroyed
      const l = await ok(as(u).get('/vms', { query: { status: 'failed' } }));
      assert.deepEqual(
        l.body.map((x) => x.id),
        [v.id],
      );
      await ok(as(u).delete('/vms/{vm_id}', { params: { vm_id: v.id } }));
      await ok(as(u).delete('/vms/{vm_id}', { params: { vm_id: again.id } }));
    });

    test('a failed start returns the VM to stopped and releases its GPUs; the next start works', async () => {
      const n = (await createNode(t(), admin.token, { gpu_count: 1 })).node;
      const v = await create(bob, n);
      await tick(1);
      await ok(as(bob).post('/vms/{vm_id}/stop', { params: { vm_id: v.id } }));
      await tick(1);
      await ok(fault({ node: n, action: 'start' }));
      await ok(as(bob).post('/vms/{vm_id}/start', { params: { vm_id: v.id } }));
      assert.equal(await status(v), 'starting');
      assert.equal(await allocated(n), 1);
      await tick(1);
      assert.equal(await status(v), 'stopped');
      assert.equal(await allocated(n), 0);
      assert.deepEqual(
        calls(v, 'start').map((c) => c.ok),
        [true, false],
      );
      await ok(as(bob).post('/vms/{vm_id}/start', { params: { vm_id: v.id } }));
      await tick(1);
      assert.equal(await status(v), 'running');
      assert.deepEqual(calls(v, 'provision').length, 1, 'built once');
      await ok(as(bob).delete('/vms/{vm_id}', { params: { vm_id: v.id } }));
    });

    test('a failed stop keeps the VM stopping and is retried after 5 s, 10 s, 20 s... until it succeeds', async () => {
      const n = (await createNode(t(), admin.token, { gpu_count: 1 })).node;
      const v = await create(bob, n);
      await tick(1);
      await ok(fault({ node: n, action: 'stop', count: 3 }));
      await ok(as(bob).post('/vms/{vm_id}/stop', { params: { vm_id: v.id } }));
      await settleNow();
      assert.deepEqual(
        calls(v, 'stop').map((c) => c.ok),
        [false],
      );
      for (const [delay, n2] of [
        [5, 2],
        [10, 3],
        [20, 4],
      ] as const) {
        await tick(delay - 1);
        assert.equal(calls(v, 'stop').length, n2 - 1, `not before ${delay} s`);
        assert.equal(await status(v), 'stopping');
        await tick(1);
        assert.equal(calls(v, 'stop').length, n2, `retried after ${delay} s`);
      }
      assert.deepEqual(
        calls(v, 'stop').map((c) => c.ok),
        [false, false, false, true],
      );
      assert.equal(await status(v), 'stopped');
      assert.equal(await allocated(n), 0);
      await ok(as(bob).delete('/vms/{vm_id}', { params: { vm_id: v.id } }));
    });

    test('a failed destroy: the VM is destroyed at once, the cleanup is retried with backoff capped at 5 min until the driver confirms', async () => {
      const n = (await createNode(t(), admin.token, { gpu_count: 1 })).node;
      const v = await create(bob, n);
      await tick(1);
      await ok(fault({ node: n, action: 'destroy', count: 8 }));
      await ok(as(bob).delete('/vms/{vm_id}', { params: { vm_id: v.id } }));
      assert.equal(await status(v), 'destroyed');
      assert.equal(await allocated(n), 0, 'GPUs freed at once');
      const other = await create(alice, n); // the GPU is rentable again right away
      await settleNow();
      assert.equal(calls(v, 'destroy').length, 1);
      for (const [i, delay] of [5, 10, 20, 40, 80, 160, 300, 300].entries()) {
        await tick(delay - 1);
        assert.equal(calls(v, 'destroy').length, i + 1, `attempt ${i + 2} not before ${delay} s`);
        await tick(1);
        assert.equal(calls(v, 'destroy').length, i + 2, `attempt ${i + 2} after ${delay} s`);
      }
      assert.deepEqual(
        calls(v, 'destroy').map((c) => c.ok),
        [...Array(8).fill(false), true],
      );
      await tick(600);
      assert.equal(calls(v, 'destroy').length, 9, 'no more calls once confirmed');
      assert.equal(await status(v), 'destroyed');
      assert.equal(await status(other), 'running');
      await ok(as(alice).delete('/vms/{vm_id}', { params: { vm_id: other.id } }));
    });

    test('a fault can target one VM (vm_id): its neighbours are unaffected', async () => {
      const u = await createUser(t());
      await credit(t(), admin.token, u.id, 100);
      await uploadSshKey(t(), u.token);
      const n = (await createNode(t(), admin.token, { gpu_count: 2 })).node;
      const a = await create(u, n);
      const b = await create(u, n);
      await ok(fault({ node: n, action: 'provision', vm_id: b.id }));
      expectError(await fault({ node: n, action: 'provision', vm_id: 'nope' }), 404, 'not_found');
      await tick(1);
      assert.equal(await status(a), 'running');
      assert.equal(await status(b), 'failed');
      for (const v of [a, b]) await ok(as(u).delete('/vms/{vm_id}', { params: { vm_id: v.id } }));
    });
  });

  describe('nodes going offline and back', () => {
    test("offline turns the node's VMs offline; active again brings each back to what it was", async () => {
      const u = await createUser(t());
      await credit(t(), admin.token, u.id, 100);
      await uploadSshKey(t(), u.token);
      const n = (await createNode(t(), admin.token, { gpu_count: 4 })).node;
      const running = await create(u, n);
      const stopped = await create(u, n);
      const interrupted = await create(u, n, { rental_type: 'interruptible', gpu_count: 2 });
      await tick(1);
      await ok(as(u).post('/vms/{vm_id}/stop', { params: { vm_id: stopped.id } }));
      await tick(1);
      const od = await create(u, n, { gpu_count: 2 }); // 1 free + preempts the interruptible one
      assert.equal(await status(interrupted), 'interrupted');
      await tick(1);
      await ok(as(u).delete('/vms/{vm_id}', { params: { vm_id: od.id } }));
      const before = { running: await get(running), stopped: await get(stopped) };
      await ok(
        as(u).post('/vms/{vm_id}/set-auto-restart', {
          params: { vm_id: interrupted.id },
          body: { auto_restart: false },
        }),
      );
      const creating = await create(u, n);
      // on another node: untouched
      const stopping = await create(u, (await createNode(t(), admin.token, { gpu_count: 1 })).node);
      const at = now();
      const off = await ok(
        as(admin).patch('/admin/nodes/{node}', { params: { node: n }, body: { status: 'offline' } }),
      );
      assert.equal(off.body.status, 'offline');
      for (const v of [running, stopped, interrupted, creating]) assert.equal(await status(v), 'offline');
      assert.equal(await status(stopping), 'creating');
      assert.equal((await get(running)).stopped_at, at, 'leaving running for the node going offline sets stopped_at');
      assert.equal((await get(stopped)).stopped_at, before.stopped.stopped_at, 'a stopped VM keeps its stopped_at');
      const callsBefore = sim().calls.length;
      await tick(5);
      assert.equal(await status(creating), 'offline', 'no hypervisor work on an offline node');
      assert.equal(calls(creating).length, 0);
      assert.equal(await status(stopping), 'running');
      assert.ok(sim().calls.length > callsBefore);
      expectError(
        await as(u).post('/vms/{vm_id}/stop', { params: { vm_id: running.id } }),
        400,
        'invalid_state',
        /offline/,
      );
      const back = now();
      await ok(as(admin).patch('/admin/nodes/{node}', { params: { node: n }, body: { status: 'active' } }));
      assert.equal(await status(running), 'running');
      assert.equal(await status(stopped), 'stopped');
      assert.equal(await status(interrupted), 'interrupted');
      assert.equal(await status(creating), 'creating');
      const r = await get(running);
      assert.equal(r.started_at, back, 'up again from the moment its node returned');
      assert.equal(r.ip_address, before.running.ip_address);
      await tick(1);
      assert.equal(await status(creating), 'running', 'provisioning resumes');
      assert.equal(await status(interrupted), 'interrupted', 'auto_restart off');
      // draining changes nothing for the VMs already there, and offline -> draining also brings them back
      await ok(as(admin).patch('/admin/nodes/{node}', { params: { node: n }, body: { status: 'draining' } }));
      assert.equal(await status(running), 'running');
      await ok(as(admin).patch('/admin/nodes/{node}', { params: { node: n }, body: { status: 'offline' } }));
      assert.equal(await status(running), 'offline');
      await ok(as(admin).patch('/admin/nodes/{node}', { params: { node: n }, body: { status: 'draining' } }));
      assert.equal(await status(running), 'running');
      assert.equal(await status(stopped), 'stopped');
      // an offline VM can be destroyed, and stays destroyed when the node returns
      await ok(as(admin).patch('/admin/nodes/{node}', { params: { node: n }, body: { status: 'offline' } }));
      await ok(as(u).delete('/vms/{vm_id}', { params: { vm_id: stopped.id } }));
      await ok(as(admin).patch('/admin/nodes/{node}', { params: { node: n }, body: { status: 'active' } }));
      assert.equal(await status(stopped), 'destroyed');
      assert.equal(await status(running), 'running');
      for (const v of [running, interrupted, creating, stopping])
        await ok(as(u).delete('/vms/{vm_id}', { params: { vm_id: v.id } }));
    });
  });

  describe('hypervisor work that finishes while its node goes offline', () => {
    test('the VM comes back to where it was and the work resumes, without building it twice', async () => {
      const u = await createUser(t());
      await credit(t(), admin.token, u.id, 100);
      await uploadSshKey(t(), u.token);
      const n = (await createNode(t(), admin.token, { gpu_count: 4 })).node;
      const stopper = await create(u, n);
      await tick(1);
      await ok(as(u).post('/vms/{vm_id}/stop', { params: { vm_id: stopper.id } }));
      const building = await create(u, n);
      // A reconciler claims both actions (lease 0: nothing else stays blocked) and works on them...
      const vms = t().services.vms;
      const token = randomUUID();
      const claimed = await vms.claimDue(t().services.clock.now(), 0, token, 100);
      assert.deepEqual(
        claimed
          .filter((v) => v.node === n)
          .map((v) => [v.id, v.hv_action])
          .sort(),
        [
          [building.id, 'provision'],
          [stopper.id, 'stop'],
        ].sort(),
      );
      // ...the node goes offline meanwhile...
      await ok(as(admin).patch('/admin/nodes/{node}', { params: { node: n }, body: { status: 'offline' } }));
      // ...and the hypervisor's answers arrive.
      await vms.completeAction(building.id, token, 'provision', {
        ok: true,
        hvRef: `sim-${building.vmid}`,
        ipAddress: '10.1.2.3',
      });
      await vms.completeAction(stopper.id, token, 'stop', { ok: true });
      assert.equal(await status(building), 'offline');
      assert.equal(await status(stopper), 'offline');
      await ok(as(admin).patch('/admin/nodes/{node}', { params: { node: n }, body: { status: 'active' } }));
      assert.equal(await status(building), 'creating');
      assert.equal(await status(stopper), 'stopping');
      await tick(1);
      assert.equal(await status(building), 'running', 'not stuck in creating');
      assert.equal(await status(stopper), 'stopped', 'not stuck in stopping');
      assert.equal(calls(building, 'provision').length, 0, 'built once (by the claim above), not twice');
      assert.equal(calls(building, 'start').length, 1);
      assert.ok((await get(building)).ip_address);
      for (const v of [building, stopper]) await ok(as(u).delete('/vms/{vm_id}', { params: { vm_id: v.id } }));
    });
  });

  describe('two service instances on one database', () => {
    test('running both reconcilers at once calls the driver exactly once per VM action', async () => {
      const users = [await createUser(t()), await createUser(t())];
      for (const u of users) {
        await credit(t(), admin.token, u.id, 1000);
        await uploadSshKey(t(), u.token);
      }
      const owner = new Map<string, TestUser>();
      const n = (await createNode(t(), admin.token, { gpu_count: 16 })).node;
      const b: FastifyInstance = await t().another();
      await b.services.clock.sync();
      assert.equal(b.services.clock.now().getTime(), t().services.clock.now().getTime());
      const simA = sim();
      const simB = b.services.simulator;
      const vms: Vm[] = [];
      for (let i = 0; i < 12; i++) {
        const u = users[i % 2]!;
        const v = await create(u, n);
        owner.set(v.id, u);
        vms.push(v);
      }
      const both = async () => {
        for (let i = 0; i < 6; i++)
          await Promise.all([
            t().services.scheduler.runOnce(),
            b.services.scheduler.runOnce(),
            t().services.scheduler.runOnce(),
            b.services.scheduler.runOnce(),
          ]);
      };
      const count = (action: string) => {
        const per = new Map<string, number>();
        for (const c of [...simA.calls, ...simB.calls])
          if (c.action === action && vms.some((v) => v.id === c.vmId)) per.set(c.vmId, (per.get(c.vmId) ?? 0) + 1);
        return vms.map((v) => per.get(v.id) ?? 0);
      };
      await both();
      for (const v of vms) assert.equal(await status(v), 'running');
      assert.deepEqual(count('provision'), Array(12).fill(1));
      assert.deepEqual(count('start'), Array(12).fill(1));
      for (const v of vms) await ok(as(owner.get(v.id)!).post('/vms/{vm_id}/stop', { params: { vm_id: v.id } }));
      await both();
      for (const v of vms) assert.equal(await status(v), 'stopped');
      assert.deepEqual(count('stop'), Array(12).fill(1));
      for (const v of vms) await ok(as(owner.get(v.id)!).delete('/vms/{vm_id}', { params: { vm_id: v.id } }));
      await both();
      assert.deepEqual(count('destroy'), Array(12).fill(1));
      assert.deepEqual(count('start'), Array(12).fill(1));
      // Every action ran on one instance or the other (which one is a matter of timing).
      assert.equal(
        simA.calls.filter((c) => owner.has(c.vmId)).length + simB.calls.filter((c) => owner.has(c.vmId)).length,
        12 * 4,
      );
    });
  });

  test('unknown ids on the interruption history are 404', async () => {
    expectError(
      await as(alice).get('/vms/{vm_id}/interruption-history', { params: { vm_id: randomUUID() } }),
      404,
      'not_found',
    );
  });
});
