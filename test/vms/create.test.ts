/**
 * POST /vms: every rule in its order, one failing check each;
 * the balance rule with the user's committed spend; SSH keys; Idempotency-Key
 * replays; and concurrency: racing creates never hand out more GPUs than a node
 * has, nor spend the same money twice.
 */
import { before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { describeEachDb } from '../helpers/app.js';
import { api, expectError, type RequestBody } from '../helpers/api.js';
import { advance, createNode, createUser, credit, uploadSshKey, type TestUser } from '../helpers/factories.js';

/** 4090 at the default prices: 0.44 per GPU-hour on demand, 0.22 interruptible, 0.0002 per GB-hour. */
const GPU = 0.44;
const GPU_INT = 0.22;
const GB = 0.0002;
const round6 = (x: number) => Math.round(x * 1e6) / 1e6;
const rate = (gpus: number, gb: number, perGpu = GPU) => round6(gpus * perGpu + gb * GB);

type VmBody = RequestBody<'/vms', 'post'>;

describeEachDb('POST /vms', (t) => {
  let admin: TestUser;
  let rich: TestUser; // credit and an SSH key
  let node: string; // 4090 x 8, max 2000 GB

  const as = (u: TestUser) => api(t(), u.token);
  const base = (over: Partial<VmBody> = {}): VmBody => ({
    node,
    gpu_type: '4090',
    gpu_count: 1,
    storage_gb: 50,
    template_vmid: 100,
    ...over,
  });
  const create = (u: TestUser, body: VmBody, headers?: Record<string, string>) =>
    as(u).post('/vms', { body, ...(headers ? { headers } : {}) });
  /** A create with a body that is not type-checked (invalid on purpose, or in another key order). */
  const createRaw = (u: TestUser, rawBody: unknown, headers?: Record<string, string>) =>
    as(u).post('/vms', { rawBody, ...(headers ? { headers } : {}) });
  const destroyAll = async (u: TestUser) => {
    const l = await as(u).get('/vms', { query: { limit: 100 } });
    assert.equal(l.status, 200, l.text);
    for (const v of l.body) assert.equal((await as(u).delete('/vms/{vm_id}', { params: { vm_id: v.id } })).status, 200);
  };
  const nodeInfo = async (n: string) => {
    const r = await as(admin).get('/admin/nodes/{node}', { params: { node: n } });
    assert.equal(r.status, 200, r.text);
    return r.body;
  };
  const vmStatus = async (u: TestUser, id: string) => {
    const r = await as(u).get('/vms/{vm_id}', { params: { vm_id: id } });
    assert.equal(r.status, 200, r.text);
    return r.body.status;
  };
  const countVms = async (u: TestUser) => {
    const r = await as(u).get('/vms');
    assert.equal(r.status, 200, r.text);
    return r.body.length;
  };
  const newUser = async (amount = 0, key = true) => {
    const u = await createUser(t());
    if (amount > 0) await credit(t(), admin.token, u.id, amount);
    if (key) await uploadSshKey(t(), u.token);
    return u;
  };
  const patchUser = async (u: TestUser, body: RequestBody<'/admin/users/{user_id}', 'patch'>) => {
    const r = await as(admin).patch('/admin/users/{user_id}', { params: { user_id: u.id }, body });
    assert.equal(r.status, 200, r.text);
  };

  before(async () => {
    admin = await createUser(t(), { admin: true });
    rich = await newUser(1000);
    node = (await createNode(t(), admin.token, { gpu_type: '4090', gpu_count: 8, max_storage_gb: 2000 })).node;
  });

  test('a valid create answers 201 with the VM record, status creating, vmid >= 1000 and the rates fixed at creation', async () => {
    const r = await create(
      rich,
      base({ gpu_count: 2, storage_gb: 100, template_vmid: 101, instance_label: 'train-1' }),
    );
    assert.equal(r.status, 201, r.text);
    const v = r.body;
    assert.match(v.id, /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/);
    assert.ok(Number.isInteger(v.vmid) && v.vmid >= 1000);
    assert.equal(v.status, 'creating');
    assert.equal(v.user_id, rich.id);
    assert.equal(v.node, node);
    assert.equal(v.rental_type, 'on_demand');
    assert.equal(v.auto_restart, null, 'null for non-interruptible VMs');
    assert.equal(v.reservation_id, null);
    assert.equal(v.instance_label, 'train-1');
    assert.equal(v.gpu_hourly_rate, 0.88);
    assert.equal(v.storage_hourly_rate, 0.02);
    assert.equal(v.hourly_rate, 0.9);
    assert.equal(v.started_at, null);
    assert.equal(v.stopped_at, null);
    assert.equal(v.ip_address, null);
    assert.equal(v.ram_gb, 128, 'a quarter of the node for a quarter of its GPUs');
    assert.equal(v.cpu_cores, 16);
    const i = await create(rich, base({ rental_type: 'interruptible' }));
    assert.equal(i.status, 201, i.text);
    assert.equal(i.body.auto_restart, true, 'defaults to true for interruptible VMs');
    assert.equal(i.body.gpu_hourly_rate, GPU_INT);
    assert.ok(i.body.vmid > v.vmid, 'vmids are unique and increasing');
    await destroyAll(rich);
  });

  describe('1. validation (422)', () => {
    let poor: TestUser; // no credit, no key, over its limits: validation still comes first
    before(async () => {
      poor = await newUser(0, false);
      await patchUser(poor, { max_vms: 0, max_gpus: 0 });
    });
    const cases: [string, (b: Record<string, unknown>) => Record<string, unknown>, string, RegExp?][] = [
      ['missing node', ({ node: _n, ...b }) => b, 'body.node'],
      ['bad gpu_type', (b) => ({ ...b, gpu_type: 'a100' }), 'body.gpu_type'],
      ['gpu_count 3', (b) => ({ ...b, gpu_count: 3 }), 'body.gpu_count'],
      ['gpu_count 16', (b) => ({ ...b, gpu_count: 16 }), 'body.gpu_count'],
      ['gpu_count "1" (a string)', (b) => ({ ...b, gpu_count: '1' }), 'body.gpu_count'],
      ['storage_gb 49', (b) => ({ ...b, storage_gb: 49 }), 'body.storage_gb'],
      ['storage_gb 50.5', (b) => ({ ...b, storage_gb: 50.5 }), 'body.storage_gb'],
      ['template_vmid 99', (b) => ({ ...b, template_vmid: 99 }), 'body.template_vmid'],
      ['template_vmid 105', (b) => ({ ...b, template_vmid: 105 }), 'body.template_vmid'],
      ['missing template_vmid', ({ template_vmid: _t, ...b }) => b, 'body.template_vmid'],
      ['bad rental_type', (b) => ({ ...b, rental_type: 'spot' }), 'body.rental_type'],
      [
        'reserved without reservation_months',
        (b) => ({ ...b, rental_type: 'reserved' }),
        'body.reservation_months',
        /reserved/,
      ],
      [
        'reservation_months 2',
        (b) => ({ ...b, rental_type: 'reserved', reservation_months: 2 }),
        'body.reservation_months',
      ],
      ['reservation_months on an on-demand VM', (b) => ({ ...b, reservation_months: 1 }), 'body.reservation_months'],
      ['bad auth_method', (b) => ({ ...b, auth_method: 'kerberos' }), 'body.auth_method'],
      ['password auth without password', (b) => ({ ...b, auth_method: 'password' }), 'body.password', /password/],
      [
        'password of 11 characters',
        (b) => ({ ...b, auth_method: 'password', password: 'x'.repeat(11) }),
        'body.password',
      ],
      ['a password with ssh_key auth', (b) => ({ ...b, password: 'a-good-long-password' }), 'body.password'],
      ['instance_label of 33 characters', (b) => ({ ...b, instance_label: 'x'.repeat(33) }), 'body.instance_label'],
      ['instance_label with a control character', (b) => ({ ...b, instance_label: 'a\tb' }), 'body.instance_label'],
      ['unknown field', (b) => ({ ...b, colour: 'red' }), 'body.colour'],
    ];
    for (const [name, mutate, field, detail] of cases) {
      test(`${name} -> 422 validation_error naming ${field}`, async () => {
        // The node does not exist and the user has no money, key or quota: validation is checked first.
        const r = await createRaw(poor, mutate(base({ node: 'no-such-node' })));
        expectError(r, 422, 'validation_error', detail);
        assert.ok(Array.isArray(r.body.errors) && r.body.errors.length >= 1, r.text);
        assert.ok(
          r.body.errors.some((e) => e.field === field),
          `errors name ${field}: ${JSON.stringify(r.body.errors)}`,
        );
      });
    }
    test('a body that is not an object, or none at all -> 422', async () => {
      expectError(await createRaw(poor, []), 422, 'validation_error');
      expectError(await createRaw(poor, undefined), 422, 'validation_error');
    });
  });

  describe('2. the node exists and is active (400 gpu_unavailable)', () => {
    test('unknown node', async () => {
      expectError(await create(rich, base({ node: 'vm-nope' })), 400, 'gpu_unavailable', /vm-nope/);
    });
    test('draining and offline nodes accept no new VMs', async () => {
      for (const status of ['draining', 'offline'] as const) {
        const n = await createNode(t(), admin.token, { status });
        const r = await create(rich, base({ node: n.node }));
        expectError(r, 400, 'gpu_unavailable', new RegExp(status));
        assert.match(r.body.detail, new RegExp(n.node));
      }
    });
    test('a node of another GPU type', async () => {
      const r = await create(rich, base({ gpu_type: '5090' }));
      expectError(r, 400, 'gpu_unavailable', /4090/);
      assert.match(r.body.detail, /5090/);
    });
  });

  describe('3. GPUs on the node (400 gpu_unavailable)', () => {
    test('more GPUs than the node has free', async () => {
      const small = await createNode(t(), admin.token, { gpu_count: 2 });
      expectError(
        await create(rich, base({ node: small.node, gpu_count: 4 })),
        400,
        'gpu_unavailable',
        /2 available GPU\(s\); 4 requested/,
      );
      const a = await create(rich, base({ node: small.node, gpu_count: 1 }));
      assert.equal(a.status, 201, a.text);
      expectError(
        await create(rich, base({ node: small.node, gpu_count: 2 })),
        400,
        'gpu_unavailable',
        /1 available GPU\(s\); 2 requested/,
      );
      const b = await create(rich, base({ node: small.node, gpu_count: 1 }));
      assert.equal(b.status, 201, b.text);
      expectError(await create(rich, base({ node: small.node, gpu_count: 1 })), 400, 'gpu_unavailable', /0 available/);
      const info = await nodeInfo(small.node);
      assert.equal(info.gpus_allocated, 2);
      assert.equal(info.gpus_free, 0);
      // Destroy frees the GPUs at once
      assert.equal((await as(rich).delete('/vms/{vm_id}', { params: { vm_id: a.body.id } })).status, 200);
      assert.equal((await nodeInfo(small.node)).gpus_free, 1);
      assert.equal((await create(rich, base({ node: small.node, gpu_count: 1 }))).status, 201);
      await destroyAll(rich);
    });
  });

  describe('4. storage within the node maximum (400 limit_exceeded)', () => {
    test('storage_gb over max_storage_gb; exactly the maximum is fine', async () => {
      const r = await create(rich, base({ storage_gb: 2001 }));
      expectError(r, 400, 'limit_exceeded', /2000/);
      assert.match(r.body.detail, /storage/i);
      const ok = await create(rich, base({ storage_gb: 2000 }));
      assert.equal(ok.status, 201, ok.text);
      assert.equal(ok.body.storage_gb, 2000);
      await destroyAll(rich);
    });
  });

  describe('5. per-user limits (400 limit_exceeded)', () => {
    test('the 11th VM is refused; failed and destroyed VMs do not count', async () => {
      const u = await newUser(100);
      const n = await createNode(t(), admin.token, { gpu_count: 16 });
      const ids: string[] = [];
      for (let i = 0; i < 10; i++) {
        const r = await create(u, base({ node: n.node }));
        assert.equal(r.status, 201, r.text);
        ids.push(r.body.id);
      }
      expectError(await create(u, base({ node: n.node })), 400, 'limit_exceeded', /10 VMs/);
      assert.equal((await as(u).delete('/vms/{vm_id}', { params: { vm_id: String(ids[0]) } })).status, 200);
      assert.equal((await create(u, base({ node: n.node }))).status, 201, 'a destroyed VM frees its slot');
      expectError(await create(u, base({ node: n.node })), 400, 'limit_exceeded', /VM limit/);
      await destroyAll(u);
    });

    test('more than 16 GPUs in use is refused', async () => {
      const u = await newUser(100);
      const n1 = await createNode(t(), admin.token, { gpu_count: 8 });
      const n2 = await createNode(t(), admin.token, { gpu_count: 8 });
      const n3 = await createNode(t(), admin.token, { gpu_count: 8 });
      assert.equal((await create(u, base({ node: n1.node, gpu_count: 8 }))).status, 201);
      assert.equal((await create(u, base({ node: n2.node, gpu_count: 8 }))).status, 201);
      const r = await create(u, base({ node: n3.node, gpu_count: 1 }));
      expectError(r, 400, 'limit_exceeded', /16 of 16 GPUs in use, 1 requested/);
      await destroyAll(u);
      assert.equal((await create(u, base({ node: n3.node, gpu_count: 8 }))).status, 201);
      await destroyAll(u);
    });

    test('limits set by an admin (PATCH /admin/users/:id) are honoured; null restores the defaults', async () => {
      const u = await newUser(100);
      const n = await createNode(t(), admin.token, { gpu_count: 16 });
      await patchUser(u, { max_vms: 2 });
      assert.equal((await create(u, base({ node: n.node }))).status, 201);
      assert.equal((await create(u, base({ node: n.node }))).status, 201);
      expectError(await create(u, base({ node: n.node })), 400, 'limit_exceeded', /at most 2 VMs/);
      await patchUser(u, { max_vms: null, max_gpus: 3 });
      expectError(
        await create(u, base({ node: n.node, gpu_count: 2 })),
        400,
        'limit_exceeded',
        /2 of 3 GPUs in use, 2 requested/,
      );
      assert.equal((await create(u, base({ node: n.node, gpu_count: 1 }))).status, 201, '2 + 1 <= 3');
      await patchUser(u, { max_gpus: null });
      assert.equal((await create(u, base({ node: n.node, gpu_count: 8 }))).status, 201, 'back to the default 16');
      await patchUser(u, { max_vms: 0 });
      expectError(await create(u, base({ node: n.node })), 400, 'limit_exceeded', /at most 0 VMs/);
      await destroyAll(u);
    });

    test('concurrent creates of one user never pass the VM limit', async () => {
      const u = await newUser(100);
      const nodes = await Promise.all(Array.from({ length: 5 }, () => createNode(t(), admin.token, { gpu_count: 16 })));
      await patchUser(u, { max_vms: 4 });
      const rs = await Promise.all(Array.from({ length: 10 }, (_, i) => create(u, base({ node: nodes[i % 5]!.node }))));
      assert.equal(rs.filter((r) => r.status === 201).length, 4, rs.map((r) => r.status).join(','));
      for (const r of rs.filter((r) => r.status !== 201)) expectError(r, 400, 'limit_exceeded');
      await destroyAll(u);
    });
  });

  describe('6. balance (400 insufficient_balance)', () => {
    test('one hour of the new VM: the detail names required and available', async () => {
      const u = await newUser(0.5);
      const r = await create(u, base({ gpu_count: 2 })); // 0.88 + 0.01 = 0.89/h
      expectError(r, 400, 'insufficient_balance', /required 0\.89 USD/);
      assert.match(r.body.detail, /available 0\.50 USD/);
      const ok = await create(u, base({ gpu_count: 1 })); // 0.45 <= 0.50
      assert.equal(ok.status, 201, ok.text);
      await destroyAll(u);
    });

    test('a user with no credit cannot create even the smallest VM', async () => {
      const u = await newUser(0);
      expectError(
        await create(u, base({ rental_type: 'interruptible' })),
        400,
        'insufficient_balance',
        /available 0\.00 USD/,
      );
    });

    test('committed spend: running, creating and interrupted VMs count the full rate, stopped the storage rate, failed and destroyed nothing', async () => {
      const u = await newUser(2);
      const probeNode = (await createNode(t(), admin.token, { gpu_count: 8 })).node; // never used but by the probe
      const work = (await createNode(t(), admin.token, { gpu_count: 4 })).node;
      const probeRate = rate(8, 50); // 3.53, always more than the user has
      /** The committed spend the service sees, read from a create that must fail on balance. */
      const committed = async (): Promise<number> => {
        const r = await create(u, base({ node: probeNode, gpu_count: 8 }));
        expectError(r, 400, 'insufficient_balance');
        const m = /required (\d+\.\d+) USD.*available (-?\d+\.\d+) USD/.exec(r.body.detail);
        assert.ok(m, r.body.detail);
        const bal = await as(u).get('/billing/balance');
        assert.equal(bal.status, 200, bal.text);
        assert.equal(Number(m[2]), bal.body.balance, 'available is the balance');
        return round6(Number(m[1]) - probeRate);
      };
      assert.equal(await committed(), 0);
      const a = await create(u, base({ node: work, storage_gb: 100 })); // 0.44 + 0.02
      assert.equal(a.status, 201, a.text);
      assert.equal(await committed(), 0.46, 'creating counts the full rate');
      await advance(t(), admin.token, 1);
      assert.equal(await vmStatus(u, a.body.id), 'running');
      assert.equal(await committed(), 0.46, 'running counts the full rate');
      assert.equal((await as(u).post('/vms/{vm_id}/stop', { params: { vm_id: a.body.id } })).status, 200);
      assert.equal(await committed(), 0.46, 'stopping still counts the full rate');
      await advance(t(), admin.token, 1);
      assert.equal(await vmStatus(u, a.body.id), 'stopped');
      assert.equal(await committed(), 0.02, 'stopped counts the storage rate');

      // An interrupted VM (preempted by another user's on-demand VM) counts its full rate.
      const i = await create(u, base({ node: work, gpu_count: 4, rental_type: 'interruptible' })); // 0.88 + 0.01
      assert.equal(i.status, 201, i.text);
      assert.equal(await committed(), round6(0.02 + 0.89));
      await advance(t(), admin.token, 1);
      const other = await newUser(100);
      const od = await create(other, base({ node: work, gpu_count: 4 }));
      assert.equal(od.status, 201, od.text);
      assert.equal(await vmStatus(u, i.body.id), 'interrupted');
      assert.equal(await committed(), round6(0.02 + 0.89), 'interrupted counts the full rate');
      assert.equal((await as(u).delete('/vms/{vm_id}', { params: { vm_id: i.body.id } })).status, 200);
      assert.equal(await committed(), 0.02, 'destroyed counts nothing');
      await destroyAll(other);

      // A failed VM counts nothing.
      const f = await as(admin).post('/admin/simulator/faults', { body: { node: work, action: 'provision' } });
      assert.equal(f.status, 200, f.text);
      const b = await create(u, base({ node: work }));
      assert.equal(b.status, 201, b.text);
      assert.equal(await committed(), 0.47);
      await advance(t(), admin.token, 1);
      assert.equal(await vmStatus(u, b.body.id), 'failed');
      // A failed VM says why, to its owner; a running one has no failure reason.
      const failed = await as(u).get('/vms/{vm_id}', { params: { vm_id: b.body.id } });
      assert.equal(failed.status, 200, failed.text);
      assert.match(failed.body.failure_reason ?? '', /provision/);
      assert.equal(b.body.failure_reason, null, 'none while it was creating');
      assert.equal(await committed(), 0.02, 'failed counts nothing');
      await destroyAll(u);
      assert.equal(await committed(), 0);
    });

    test('committed spend decides: a VM that fits alone is refused next to a running one', async () => {
      const u = await newUser(0.9);
      const a = await create(u, base()); // 0.45
      assert.equal(a.status, 201);
      const r = await create(u, base({ gpu_count: 1, storage_gb: 60 })); // 0.452 + 0.45 > 0.90
      expectError(r, 400, 'insufficient_balance', /required 0\.902 USD/);
      assert.match(r.body.detail, /available 0\.90 USD/);
      assert.equal((await create(u, base())).status, 201, '0.45 + 0.45 = 0.90 is just enough');
      await destroyAll(u);
    });

    test('concurrent creates of one user never spend the same money twice (credit for exactly 3 VMs, 10 at once)', async () => {
      const u = await newUser(round6(3 * rate(1, 50)));
      // Several roomy nodes, so that no node lock serializes the creates: only the user's own can.
      const nodes = await Promise.all(Array.from({ length: 5 }, () => createNode(t(), admin.token, { gpu_count: 16 })));
      const rs = await Promise.all(Array.from({ length: 10 }, (_, i) => create(u, base({ node: nodes[i % 5]!.node }))));
      const ok = rs.filter((r) => r.status === 201);
      assert.equal(ok.length, 3, rs.map((r) => `${r.status} ${r.status === 201 ? '' : r.body.code}`).join(', '));
      for (const r of rs.filter((r) => r.status !== 201)) expectError(r, 400, 'insufficient_balance');
      assert.equal(await countVms(u), 3);
      await destroyAll(u);
    });
  });

  describe('7. SSH key', () => {
    test("another user's ssh_key_id -> 404, an unknown one -> 404, a non-uuid one -> 404", async () => {
      const owner = await newUser(10);
      const keys = await as(owner).get('/ssh-keys');
      assert.equal(keys.status, 200, keys.text);
      const theirs = keys.body[0]?.id;
      assert.ok(theirs, keys.text);
      expectError(await create(rich, base({ ssh_key_id: theirs })), 404, 'not_found', /SSH key/);
      expectError(await create(rich, base({ ssh_key_id: randomUUID() })), 404, 'not_found', /SSH key/);
      expectError(await create(rich, base({ ssh_key_id: 'not-a-uuid' })), 404, 'not_found', /SSH key/);
      const own = await create(owner, base({ ssh_key_id: theirs }));
      assert.equal(own.status, 201, own.text);
      await destroyAll(owner);
    });

    test('no SSH key with auth_method ssh_key -> 400 invalid_state; password auth works without a key', async () => {
      const u = await newUser(10, false);
      const r = await create(u, base());
      expectError(r, 400, 'invalid_state', /SSH key/);
      expectError(await create(u, base({ auth_method: 'ssh_key' })), 400, 'invalid_state');
      const p = await create(u, base({ auth_method: 'password', password: 'correct-horse-battery' }));
      assert.equal(p.status, 201, p.text);
      assert.ok(!p.text.includes('correct-horse-battery'), 'the password is never echoed');
      await advance(t(), admin.token, 1);
      const g = await as(u).get('/vms/{vm_id}', { params: { vm_id: p.body.id } });
      assert.equal(g.status, 200, g.text);
      assert.equal(g.body.status, 'running', 'provisioned with the password');
      assert.ok(!g.text.includes('correct-horse-battery'));
      await destroyAll(u);
    });
  });

  describe('the order of the checks: a request failing two gets the earlier one', () => {
    let poor: TestUser; // no credit, no key
    before(async () => {
      poor = await newUser(0, false);
    });
    test('validation before the node', async () => {
      expectError(await createRaw(poor, { ...base({ node: 'nope' }), gpu_count: 3 }), 422, 'validation_error');
    });
    test('node before GPUs, storage, limits, balance and key', async () => {
      const drain = await createNode(t(), admin.token, { status: 'draining', gpu_count: 1, max_storage_gb: 100 });
      await patchUser(poor, { max_vms: 0 });
      expectError(
        await create(poor, base({ node: drain.node, gpu_count: 8, storage_gb: 500 })),
        400,
        'gpu_unavailable',
        /draining/,
      );
      expectError(await create(poor, base({ node: 'nope', ssh_key_id: 'not-a-uuid' })), 400, 'gpu_unavailable', /nope/);
      expectError(await create(poor, base({ node: 'nope', ssh_key_id: randomUUID() })), 400, 'gpu_unavailable', /nope/);
      await patchUser(poor, { max_vms: null });
    });
    test('GPUs before storage', async () => {
      const small = await createNode(t(), admin.token, { gpu_count: 1, max_storage_gb: 100 });
      expectError(
        await create(poor, base({ node: small.node, gpu_count: 2, storage_gb: 500 })),
        400,
        'gpu_unavailable',
      );
    });
    test('storage before limits', async () => {
      await patchUser(poor, { max_vms: 0 });
      expectError(await create(poor, base({ storage_gb: 5000 })), 400, 'limit_exceeded', /storage/);
      expectError(await create(poor, base()), 400, 'limit_exceeded', /VM limit/);
      await patchUser(poor, { max_vms: null });
    });
    test('limits before balance', async () => {
      await patchUser(poor, { max_gpus: 0 });
      expectError(await create(poor, base()), 400, 'limit_exceeded', /GPU limit/);
      await patchUser(poor, { max_gpus: null });
    });
    test('balance before the SSH key', async () => {
      expectError(await create(poor, base()), 400, 'insufficient_balance');
      expectError(await create(poor, base({ ssh_key_id: randomUUID() })), 400, 'insufficient_balance');
      await credit(t(), admin.token, poor.id, 1);
      expectError(await create(poor, base()), 400, 'invalid_state', /SSH key/);
    });
  });

  describe('Idempotency-Key', () => {
    test('a replay creates one VM and answers the same body; another body with the key is 422', async () => {
      const u = await newUser(100);
      const key = `vm-${randomUUID()}`;
      const body = base({ gpu_count: 2 });
      const first = await create(u, body, { 'idempotency-key': key });
      assert.equal(first.status, 201, first.text);
      const again = await create(u, { ...body }, { 'idempotency-key': key });
      assert.equal(again.status, 201);
      assert.deepEqual(again.body, first.body);
      const reordered = Object.fromEntries(Object.entries(body).reverse());
      const third = await createRaw(u, reordered, { 'idempotency-key': key });
      assert.equal(third.status, 201);
      assert.equal(third.body.id, first.body.id);
      assert.equal(await countVms(u), 1);
      assert.equal((await nodeInfo(node)).gpus_allocated, 2);
      expectError(await create(u, base({ gpu_count: 1 }), { 'idempotency-key': key }), 422, 'idempotency_mismatch');
      // A new key is a new VM
      assert.equal((await create(u, body, { 'idempotency-key': `vm-${randomUUID()}` })).status, 201);
      assert.equal(await countVms(u), 2);
      await destroyAll(u);
    });

    test('concurrent requests with one key create one VM', async () => {
      const u = await newUser(100);
      const key = `vm-${randomUUID()}`;
      const rs = await Promise.all(Array.from({ length: 5 }, () => create(u, base(), { 'idempotency-key': key })));
      const ids: string[] = [];
      for (const r of rs) {
        assert.equal(r.status, 201, r.text);
        ids.push(r.body.id);
      }
      assert.equal(new Set(ids).size, 1);
      assert.equal(await countVms(u), 1);
      await destroyAll(u);
    });

    test('a refused create is replayed as refused, without checking again', async () => {
      const u = await newUser(0);
      const key = `vm-${randomUUID()}`;
      const r1 = await create(u, base(), { 'idempotency-key': key });
      expectError(r1, 400, 'insufficient_balance');
      await credit(t(), admin.token, u.id, 100);
      const r2 = await create(u, base(), { 'idempotency-key': key });
      assert.equal(r2.status, 400);
      assert.deepEqual(r2.body, r1.body);
      assert.equal(await countVms(u), 0);
    });
  });

  describe('40 concurrent creates racing for 8 GPUs', () => {
    test('exactly 8 GPUs are handed out; the others get 400 gpu_unavailable', async () => {
      const race = (await createNode(t(), admin.token, { gpu_count: 8 })).node;
      const users = await Promise.all(Array.from({ length: 5 }, () => newUser(100)));
      const rs = await Promise.all(
        Array.from({ length: 40 }, (_, i) =>
          create(
            users[i % users.length]!,
            base({ node: race, rental_type: i % 3 === 0 ? 'interruptible' : 'on_demand' }),
          ),
        ),
      );
      const ok = rs.filter((r) => r.status === 201);
      const refused = rs.filter((r) => r.status !== 201);
      // On-demand creates may preempt interruptible ones, so count who still holds GPUs.
      for (const r of refused) expectError(r, 400, 'gpu_unavailable');
      const info = await nodeInfo(race);
      assert.equal(info.gpus_allocated, 8);
      assert.equal(info.gpus_free, 0);
      const vms = await as(admin).get('/admin/vms', { query: { node: race, limit: 100 } });
      assert.equal(vms.status, 200, vms.text);
      assert.equal(vms.body.length, ok.length);
      const holding = vms.body.filter((v) => v.status === 'creating');
      const interrupted = vms.body.filter((v) => v.status === 'interrupted');
      assert.equal(holding.length + interrupted.length, ok.length);
      assert.equal(
        holding.reduce((s, v) => s + v.gpu_count, 0),
        8,
      );
      for (const v of interrupted) assert.equal(v.rental_type, 'interruptible', 'only interruptible VMs are preempted');
      assert.ok(ok.length >= 8);
      for (const u of users) await destroyAll(u);
      assert.equal((await nodeInfo(race)).gpus_allocated, 0);

      // Pure on-demand race: exactly 8 winners.
      const race2 = (await createNode(t(), admin.token, { gpu_count: 8 })).node;
      const rs2 = await Promise.all(
        Array.from({ length: 40 }, (_, i) => create(users[i % users.length]!, base({ node: race2 }))),
      );
      assert.equal(rs2.filter((r) => r.status === 201).length, 8, rs2.map((r) => r.status).join(','));
      for (const r of rs2.filter((r) => r.status !== 201)) expectError(r, 400, 'gpu_unavailable');
      assert.equal((await nodeInfo(race2)).gpus_allocated, 8);
      const vms2 = await as(admin).get('/admin/vms', { query: { node: race2, limit: 100 } });
      assert.equal(vms2.status, 200, vms2.text);
      assert.equal(vms2.body.length, 8);
      assert.equal(new Set(vms2.body.map((v) => v.vmid)).size, 8, 'unique vmids');

      // They all come up, and the node never holds more than it has.
      await advance(t(), admin.token, 1);
      assert.equal((await nodeInfo(race2)).gpus_allocated, 8);
      const running = await as(admin).get('/admin/vms', { query: { node: race2, status: 'running', limit: 100 } });
      assert.equal(running.status, 200, running.text);
      assert.equal(running.body.length, 8);
      for (const u of users) await destroyAll(u);
      assert.equal((await nodeInfo(race2)).gpus_allocated, 0);
    });
  });
});
