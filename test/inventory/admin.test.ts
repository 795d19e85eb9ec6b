/**
 * The admin inventory API: nodes and prices (new prices apply to new VMs only).
 */
import { afterEach, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { describeEachDb, type ReqOpts, type Res } from '../helpers/app.js';
import {
  advance,
  createApiKey,
  createNode,
  createUser,
  credit,
  uploadSshKey,
  type TestUser,
} from '../helpers/factories.js';
import { SHIPPED_PRICES as DEFAULTS } from '../helpers/expected.js';

const NODE_KEYS = [
  'accel',
  'agent_seen_at',
  'agent_status',
  'agent_token_set',
  'agent_url',
  'agent_version',
  'cluster_name',
  'cpu_cores',
  'cpu_model',
  'created_at',
  'gpu_count',
  'gpu_ram_mb',
  'gpu_type',
  'gpus_allocated',
  'gpus_free',
  'host_cpu_model',
  'host_gpus',
  'location',
  'max_storage_gb',
  'node',
  'pcie_gen',
  'ram_gb',
  'status',
  'updated_at',
];

const PRICE_KEYS = [
  'gpu_price_hourly',
  'gpu_ram_mb',
  'gpu_type',
  'interruptible_rate',
  'reserved_discount_1mo',
  'reserved_discount_3mo',
  'reserved_discount_6mo',
  'storage_price_gb_hourly',
  'updated_at',
];

type GpuType = keyof typeof DEFAULTS;

const nodeBody = (over: Record<string, unknown> = {}) => ({
  node: `vm-${randomBytes(4).toString('hex')}`,
  gpu_type: '4090',
  gpu_count: 8,
  ram_gb: 512,
  cpu_cores: 64,
  cpu_model: 'AMD EPYC 7543',
  pcie_gen: '4.0',
  max_storage_gb: 2000,
  location: 'eu-central',
  cluster_name: 'fra-1',
  ...over,
});

describeEachDb('admin inventory', (t) => {
  let admin: TestUser;
  let user: TestUser;
  let renter: TestUser;

  const req = (method: string, url: string, opts?: ReqOpts): Promise<Res> => t().req(method, url, opts);
  const asAdmin = (method: string, url: string, body?: unknown) =>
    req(method, url, { token: admin.token, ...(body === undefined ? {} : { body }) });
  const nowIso = () => t().clock.now().toISOString();

  /** A VM of the renter on the node, holding GPUs from its creation on. */
  const vm = async (
    node: { node: string; gpu_type?: unknown },
    gpuCount: number,
    extra: Record<string, unknown> = {},
  ) => {
    const r = await req('POST', '/vms', {
      token: renter.token,
      body: {
        node: node.node,
        gpu_type: node.gpu_type ?? '4090',
        gpu_count: gpuCount,
        storage_gb: 50,
        template_vmid: 100,
        ...extra,
      },
    });
    assert.equal(r.status, 201, r.text);
    return r.body as {
      id: string;
      vmid: number;
      hourly_rate: number;
      gpu_hourly_rate: number;
      storage_hourly_rate: number;
      status: string;
    };
  };
  const destroy = async (id: string) => {
    const r = await req('DELETE', `/vms/${id}`, { token: renter.token });
    assert.equal(r.status, 200, r.text);
  };

  // VMs are created (and may be metered) here too: the ledger stays balanced (every balance is the sum of its
  // transactions).
  afterEach(async () => {
    const { rows } = await t().db.query(
      `SELECT u.id FROM users u LEFT JOIN transactions t ON t.user_id = u.id
        GROUP BY u.id HAVING u.balance_micros <> COALESCE(SUM(t.amount_micros), 0)`,
    );
    assert.deepEqual(rows, [], 'balance == sum(transactions)');
  });

  before(async () => {
    admin = await createUser(t(), { admin: true });
    user = await createUser(t());
    renter = await createUser(t());
    await credit(t(), admin.token, renter.id, 100_000);
    await uploadSshKey(t(), renter.token);
    const p = await asAdmin('PATCH', `/admin/users/${renter.id}`, { max_vms: 1000, max_gpus: 10_000 });
    assert.equal(p.status, 200, p.text);
  });

  describe('nodes: registration, changes and removal', () => {
    test("POST /admin/nodes: 201 with the whole record; gpu_ram_mb defaults to the type's, status to active", async () => {
      for (const gpuType of ['5090', '4090', 'pro6000'] as const) {
        const body = nodeBody({ gpu_type: gpuType, gpu_count: 4 });
        const r = await asAdmin('POST', '/admin/nodes', body);
        assert.equal(r.status, 201, r.text);
        assert.deepEqual(Object.keys(r.body).sort(), NODE_KEYS);
        assert.deepEqual(r.body, {
          ...body,
          gpu_ram_mb: DEFAULTS[gpuType].gpu_ram_mb,
          status: 'active',
          gpus_allocated: 0,
          gpus_free: 4,
          created_at: nowIso(),
          updated_at: nowIso(),
          // a node without an agent runs on the simulator
          agent_url: null,
          agent_token_set: false,
          agent_status: null,
          agent_seen_at: null,
          agent_version: null,
          accel: null,
          host_cpu_model: null,
          host_gpus: null,
        });
        // GET returns the same record
        const g = await asAdmin('GET', `/admin/nodes/${body.node}`);
        assert.equal(g.status, 200, g.text);
        assert.deepEqual(g.body, r.body);
      }
    });

    test('POST keeps an explicit gpu_ram_mb and status; limits 1 and 64 GPUs, 50 GB disk are accepted', async () => {
      const body = nodeBody({ gpu_ram_mb: 49_152, status: 'draining', gpu_count: 64, max_storage_gb: 50 });
      const r = await asAdmin('POST', '/admin/nodes', body);
      assert.equal(r.status, 201, r.text);
      assert.equal(r.body.gpu_ram_mb, 49_152);
      assert.equal(r.body.status, 'draining');
      assert.equal(r.body.gpu_count, 64);
      assert.equal(r.body.max_storage_gb, 50);
      for (const status of ['active', 'offline']) {
        const o = await asAdmin('POST', '/admin/nodes', nodeBody({ status, gpu_count: 1 }));
        assert.equal(o.status, 201, o.text);
        assert.equal(o.body.status, status);
        assert.equal(o.body.gpu_count, 1);
      }
    });

    test('every validation rule is 422 naming the field, and nothing is created', async () => {
      const cases: Array<[string, Record<string, unknown>, string]> = [
        ['uppercase id', { node: 'VM07' }, 'body.node'],
        ['id with underscore', { node: 'vm_07' }, 'body.node'],
        ['id starting with a dash', { node: '-vm07' }, 'body.node'],
        ['id with a space', { node: 'vm 07' }, 'body.node'],
        ['id with a slash', { node: 'vm/07' }, 'body.node'],
        ['empty id', { node: '' }, 'body.node'],
        ['id of 64 characters', { node: 'v'.repeat(64) }, 'body.node'],
        ['id not a string', { node: 7 }, 'body.node'],
        ['gpu_count 0', { gpu_count: 0 }, 'body.gpu_count'],
        ['gpu_count 65', { gpu_count: 65 }, 'body.gpu_count'],
        ['gpu_count negative', { gpu_count: -8 }, 'body.gpu_count'],
        ['gpu_count fractional', { gpu_count: 1.5 }, 'body.gpu_count'],
        ['gpu_count as a string', { gpu_count: '8' }, 'body.gpu_count'],
        ['max_storage_gb 49', { max_storage_gb: 49 }, 'body.max_storage_gb'],
        ['max_storage_gb 0', { max_storage_gb: 0 }, 'body.max_storage_gb'],
        ['unknown field', { colour: 'blue' }, 'body.colour'],
        ['bad gpu_type', { gpu_type: 'a100' }, 'body.gpu_type'],
        ['gpu_type as a number', { gpu_type: 4090 }, 'body.gpu_type'],
        ['bad status', { status: 'broken' }, 'body.status'],
        ['ram_gb 0', { ram_gb: 0 }, 'body.ram_gb'],
        ['cpu_cores 0', { cpu_cores: 0 }, 'body.cpu_cores'],
        ['gpu_ram_mb 0', { gpu_ram_mb: 0 }, 'body.gpu_ram_mb'],
        ['empty cpu_model', { cpu_model: '' }, 'body.cpu_model'],
        ['empty location', { location: '' }, 'body.location'],
        ['null cluster_name', { cluster_name: null }, 'body.cluster_name'],
      ];
      for (const [name, over, field] of cases) {
        const body = nodeBody(over);
        const r = await asAdmin('POST', '/admin/nodes', body);
        assert.equal(r.status, 422, `${name}: ${r.text}`);
        assert.equal(r.body.code, 'validation_error', name);
        assert.ok(
          r.body.errors.some((e: { field: string }) => e.field === field),
          `${name}: ${r.text}`,
        );
        if (typeof body.node === 'string' && /^[a-z0-9][a-z0-9-]{0,62}$/.test(body.node)) {
          assert.equal((await asAdmin('GET', `/admin/nodes/${body.node}`)).status, 404, `${name}: not created`);
        }
      }
      for (const required of [
        'node',
        'gpu_type',
        'gpu_count',
        'ram_gb',
        'cpu_cores',
        'cpu_model',
        'pcie_gen',
        'max_storage_gb',
        'location',
        'cluster_name',
      ]) {
        const body: Record<string, unknown> = nodeBody();
        delete body[required];
        const r = await asAdmin('POST', '/admin/nodes', body);
        assert.equal(r.status, 422, `without ${required}: ${r.text}`);
        assert.deepEqual(r.body.errors, [{ field: `body.${required}`, message: 'is required' }]);
      }
      const none = await req('POST', '/admin/nodes', { token: admin.token });
      assert.equal(none.status, 422, none.text);
    });

    test('a taken node id is 400 conflict and the first node is unchanged', async () => {
      const first = await createNode(t(), admin.token, { gpu_count: 4 });
      const r = await asAdmin(
        'POST',
        '/admin/nodes',
        nodeBody({ node: first.node, gpu_type: 'pro6000', gpu_count: 8 }),
      );
      assert.equal(r.status, 400, r.text);
      assert.equal(r.body.code, 'conflict');
      assert.match(r.body.detail, new RegExp(first.node));
      const g = await asAdmin('GET', `/admin/nodes/${first.node}`);
      assert.deepEqual(g.body, first);
    });

    test('GET /admin/nodes: newest first, limit/offset, X-Total-Count; unknown node 404', async () => {
      const made = [];
      for (let i = 0; i < 3; i++) made.push(await createNode(t(), admin.token, { gpu_count: i + 1 }));
      const all = await asAdmin('GET', '/admin/nodes');
      assert.equal(all.status, 200, all.text);
      const total = Number(all.headers['x-total-count']);
      assert.ok(total >= 3);
      assert.equal(all.body.length, Math.min(total, 50));
      assert.deepEqual(all.body.slice(0, 3), [...made].reverse(), 'newest first, full records');
      for (const n of all.body) assert.deepEqual(Object.keys(n).sort(), NODE_KEYS);
      const p1 = await req('GET', '/admin/nodes', { token: admin.token, query: { limit: 2 } });
      assert.deepEqual(
        p1.body.map((n: { node: string }) => n.node),
        [made[2]!.node, made[1]!.node],
      );
      assert.equal(p1.headers['x-total-count'], String(total));
      const p2 = await req('GET', '/admin/nodes', { token: admin.token, query: { limit: 2, offset: 1 } });
      assert.deepEqual(
        p2.body.map((n: { node: string }) => n.node),
        [made[1]!.node, made[0]!.node],
      );
      const past = await req('GET', '/admin/nodes', { token: admin.token, query: { offset: total } });
      assert.deepEqual(past.body, []);
      assert.equal(past.headers['x-total-count'], String(total));
      for (const query of [{ limit: 0 }, { limit: 101 }, { offset: -1 }, { limit: 'x' }, { status: 'active' }] as Array<
        Record<string, string | number>
      >) {
        const r = await req('GET', '/admin/nodes', { token: admin.token, query });
        assert.equal(r.status, 422, `${JSON.stringify(query)}: ${r.text}`);
      }
      const missing = await asAdmin('GET', '/admin/nodes/no-such-node');
      assert.equal(missing.status, 404);
      assert.equal(missing.body.code, 'not_found');
    });

    test('PATCH changes the fields given and keeps the others; updated_at moves, created_at does not', async () => {
      const n = await createNode(t(), admin.token, { gpu_count: 4 });
      await advance(t(), admin.token, 5);
      const r = await asAdmin('PATCH', `/admin/nodes/${n.node}`, {
        gpu_count: 6,
        location: 'us-west',
        cpu_model: 'AMD EPYC 9554',
        max_storage_gb: 8000,
      });
      assert.equal(r.status, 200, r.text);
      assert.deepEqual(r.body, {
        ...n,
        gpu_count: 6,
        gpus_free: 6,
        location: 'us-west',
        cpu_model: 'AMD EPYC 9554',
        max_storage_gb: 8000,
        updated_at: nowIso(),
      });
      assert.notEqual(r.body.updated_at, n.created_at);
      assert.deepEqual((await asAdmin('GET', `/admin/nodes/${n.node}`)).body, r.body);
      const s = await asAdmin('PATCH', `/admin/nodes/${n.node}`, { status: 'draining' });
      assert.equal(s.status, 200, s.text);
      assert.equal(s.body.status, 'draining');
      assert.equal(s.body.location, 'us-west');
    });

    test('PATCH validation: empty body, unknown field, the node id, bad values are 422; unknown node 404', async () => {
      const n = await createNode(t(), admin.token);
      const cases: Array<[unknown, string]> = [
        [{}, 'body'],
        [{ node: 'other' }, 'body.node'],
        [{ colour: 'red' }, 'body.colour'],
        [{ gpu_count: 0 }, 'body.gpu_count'],
        [{ gpu_count: 65 }, 'body.gpu_count'],
        [{ max_storage_gb: 49 }, 'body.max_storage_gb'],
        [{ gpu_type: 'h100' }, 'body.gpu_type'],
        [{ status: 'retired' }, 'body.status'],
        [{ status: null }, 'body.status'],
        [{ location: '' }, 'body.location'],
      ];
      for (const [body, field] of cases) {
        const r = await asAdmin('PATCH', `/admin/nodes/${n.node}`, body);
        assert.equal(r.status, 422, `${JSON.stringify(body)}: ${r.text}`);
        assert.equal(r.body.code, 'validation_error');
        assert.ok(
          r.body.errors.some((e: { field: string }) => e.field === field),
          `${JSON.stringify(body)}: ${r.text}`,
        );
      }
      assert.deepEqual((await asAdmin('GET', `/admin/nodes/${n.node}`)).body, n, 'unchanged');
      const missing = await asAdmin('PATCH', '/admin/nodes/no-such-node', { gpu_count: 2 });
      assert.equal(missing.status, 404, missing.text);
      assert.equal(missing.body.code, 'not_found');
    });

    test('gpus_allocated / gpus_free follow the VMs; gpu_count cannot go below the GPUs in use (400 invalid_state)', async () => {
      const n = await createNode(t(), admin.token, { gpu_count: 8 });
      const a = await vm(n, 4);
      const b = await vm(n, 2, { rental_type: 'interruptible' });
      const g = await asAdmin('GET', `/admin/nodes/${n.node}`);
      assert.equal(g.body.gpus_allocated, 6);
      assert.equal(g.body.gpus_free, 2);
      const listed = (await req('GET', '/admin/nodes', { token: admin.token, query: { limit: 100 } })).body.find(
        (x: { node: string }) => x.node === n.node,
      );
      assert.equal(listed.gpus_allocated, 6);
      assert.equal(listed.gpus_free, 2);

      const r = await asAdmin('PATCH', `/admin/nodes/${n.node}`, { gpu_count: 4 });
      assert.equal(r.status, 400, r.text);
      assert.equal(r.body.code, 'invalid_state');
      assert.match(r.body.detail, /6/);
      assert.equal((await asAdmin('GET', `/admin/nodes/${n.node}`)).body.gpu_count, 8, 'unchanged');
      // Down to exactly the GPUs in use is fine
      const exact = await asAdmin('PATCH', `/admin/nodes/${n.node}`, { gpu_count: 6 });
      assert.equal(exact.status, 200, exact.text);
      assert.equal(exact.body.gpus_free, 0);
      await destroy(b.id);
      const lower = await asAdmin('PATCH', `/admin/nodes/${n.node}`, { gpu_count: 4 });
      assert.equal(lower.status, 200, lower.text);
      assert.deepEqual([lower.body.gpu_count, lower.body.gpus_allocated, lower.body.gpus_free], [4, 4, 0]);
      await destroy(a.id);
      const after = await asAdmin('GET', `/admin/nodes/${n.node}`);
      assert.deepEqual([after.body.gpus_allocated, after.body.gpus_free], [0, 4]);
    });

    test('gpu_type cannot change while the node has VMs (400 invalid_state); without VMs it can, and gpu_ram_mb follows the new type', async () => {
      const n = await createNode(t(), admin.token, { gpu_type: '4090', gpu_count: 8 });
      const v = await vm(n, 1);
      const r = await asAdmin('PATCH', `/admin/nodes/${n.node}`, { gpu_type: '5090' });
      assert.equal(r.status, 400, r.text);
      assert.equal(r.body.code, 'invalid_state');
      // Naming the type it already has is not a change
      const same = await asAdmin('PATCH', `/admin/nodes/${n.node}`, { gpu_type: '4090', ram_gb: 1024 });
      assert.equal(same.status, 200, same.text);
      assert.equal(same.body.gpu_ram_mb, DEFAULTS['4090'].gpu_ram_mb);
      await destroy(v.id);
      const ok = await asAdmin('PATCH', `/admin/nodes/${n.node}`, { gpu_type: 'pro6000' });
      assert.equal(ok.status, 200, ok.text);
      assert.equal(ok.body.gpu_type, 'pro6000');
      assert.equal(ok.body.gpu_ram_mb, DEFAULTS.pro6000.gpu_ram_mb);
      const explicit = await asAdmin('PATCH', `/admin/nodes/${n.node}`, { gpu_type: '5090', gpu_ram_mb: 30_000 });
      assert.equal(explicit.status, 200, explicit.text);
      assert.deepEqual([explicit.body.gpu_type, explicit.body.gpu_ram_mb], ['5090', 30_000]);
      // A VM of the new type can be placed on it
      const nv = await vm({ node: n.node, gpu_type: '5090' }, 1);
      assert.equal(nv.gpu_hourly_rate, 0.69);
    });

    test('DELETE: 204; refused while VMs live (400 invalid_state), including stopped and interrupted ones; allowed once they are destroyed', async () => {
      const n = await createNode(t(), admin.token, { gpu_count: 8 });
      const a = await vm(n, 8, { rental_type: 'interruptible' });
      const b = await vm(n, 2); // preempts a: a is interrupted, holds no GPUs, still lives
      assert.equal((await req('GET', `/vms/${a.id}`, { token: renter.token })).body.status, 'interrupted');
      const r = await asAdmin('DELETE', `/admin/nodes/${n.node}`);
      assert.equal(r.status, 400, r.text);
      assert.equal(r.body.code, 'invalid_state');
      assert.match(r.body.detail, /2 VM/);
      await destroy(b.id);
      const r2 = await asAdmin('DELETE', `/admin/nodes/${n.node}`);
      assert.equal(r2.status, 400, 'the interrupted VM still lives');
      assert.match(r2.body.detail, /1 VM/);
      await destroy(a.id);
      const ok = await asAdmin('DELETE', `/admin/nodes/${n.node}`);
      assert.equal(ok.status, 204, ok.text);
      assert.equal(ok.text, '');
      assert.equal((await asAdmin('GET', `/admin/nodes/${n.node}`)).status, 404);
      const again = await asAdmin('DELETE', `/admin/nodes/${n.node}`);
      assert.equal(again.status, 404);
      assert.equal(again.body.code, 'not_found');
      // The id is free again
      assert.equal((await asAdmin('POST', '/admin/nodes', nodeBody({ node: n.node }))).status, 201);
    });

    test('a failed VM does not keep a node from being deleted', async () => {
      const n = await createNode(t(), admin.token, { gpu_count: 2 });
      const f = await asAdmin('POST', '/admin/simulator/faults', { node: n.node, action: 'provision', count: 1 });
      assert.equal(f.status, 200, f.text);
      const v = await vm(n, 1);
      await advance(t(), admin.token, 1);
      assert.equal((await req('GET', `/vms/${v.id}`, { token: renter.token })).body.status, 'failed');
      const del = await asAdmin('DELETE', `/admin/nodes/${n.node}`);
      assert.equal(del.status, 204, del.text);
    });

    test('concurrent registrations of one id: exactly one 201, the others 400 conflict', async () => {
      const body = nodeBody();
      const rs = await Promise.all(
        Array.from({ length: 5 }, (_, i) => asAdmin('POST', '/admin/nodes', { ...body, gpu_count: i + 1 })),
      );
      const created = rs.filter((r) => r.status === 201);
      assert.equal(created.length, 1, rs.map((r) => r.text).join('\n'));
      for (const r of rs.filter((x) => x.status !== 201)) assert.deepEqual([r.status, r.body.code], [400, 'conflict']);
      assert.deepEqual((await asAdmin('GET', `/admin/nodes/${body.node}`)).body, created[0]!.body);
    });

    test('node changes racing VM creates never leave a node with more GPUs handed out than it has, nor VMs on a deleted node', async () => {
      const n = await createNode(t(), admin.token, { gpu_count: 8 });
      const creates = Array.from({ length: 4 }, () =>
        req('POST', '/vms', {
          token: renter.token,
          body: { node: n.node, gpu_type: '4090', gpu_count: 2, storage_gb: 50, template_vmid: 100 },
        }),
      );
      const [patch, ...made] = await Promise.all([
        asAdmin('PATCH', `/admin/nodes/${n.node}`, { gpu_count: 4 }),
        ...creates,
      ]);
      const ok = made.filter((r) => r.status === 201);
      for (const r of made.filter((x) => x.status !== 201))
        assert.deepEqual([r.status, r.body.code], [400, 'gpu_unavailable'], r.text);
      const g = (await asAdmin('GET', `/admin/nodes/${n.node}`)).body;
      assert.equal(g.gpus_allocated, ok.length * 2);
      assert.ok(g.gpus_allocated <= g.gpu_count, JSON.stringify(g));
      assert.equal(g.gpu_count, patch.status === 200 ? 4 : 8, patch.text);
      if (patch.status !== 200) assert.equal(patch.body.code, 'invalid_state');
      for (const r of ok) await destroy(r.body.id);

      const m = await createNode(t(), admin.token, { gpu_count: 8 });
      const creates2 = Array.from({ length: 3 }, () =>
        req('POST', '/vms', {
          token: renter.token,
          body: { node: m.node, gpu_type: '4090', gpu_count: 1, storage_gb: 50, template_vmid: 100 },
        }),
      );
      const [del, ...made2] = await Promise.all([asAdmin('DELETE', `/admin/nodes/${m.node}`), ...creates2]);
      const live = made2.filter((r) => r.status === 201);
      if (del.status === 204) {
        assert.equal(live.length, 0, 'no VM on a deleted node');
        for (const r of made2) assert.deepEqual([r.status, r.body.code], [400, 'gpu_unavailable'], r.text);
      } else {
        assert.deepEqual([del.status, del.body.code], [400, 'invalid_state'], del.text);
        assert.ok(live.length > 0);
        for (const r of live) await destroy(r.body.id);
        assert.equal((await asAdmin('DELETE', `/admin/nodes/${m.node}`)).status, 204);
      }
    });

    test("admin only: 401 without a token, 403 for a user and for a user's read_write API key", async () => {
      const n = await createNode(t(), admin.token);
      const key = await createApiKey(t(), user.token, 'read_write');
      const calls: Array<[string, string, unknown?]> = [
        ['GET', '/admin/nodes'],
        ['POST', '/admin/nodes', nodeBody()],
        ['GET', `/admin/nodes/${n.node}`],
        ['PATCH', `/admin/nodes/${n.node}`, { status: 'offline' }],
        ['DELETE', `/admin/nodes/${n.node}`],
      ];
      for (const [method, url, body] of calls) {
        const anon = await req(method, url, body === undefined ? {} : { body });
        assert.equal(anon.status, 401, `${method} ${url}`);
        assert.equal(anon.body.code, 'unauthorized');
        for (const token of [user.token, key]) {
          const r = await req(method, url, { token, ...(body === undefined ? {} : { body }) });
          assert.equal(r.status, 403, `${method} ${url}: ${r.text}`);
          assert.equal(r.body.code, 'forbidden');
        }
      }
      assert.deepEqual((await asAdmin('GET', `/admin/nodes/${n.node}`)).body, n, 'nothing changed');
    });
  });

  describe('pricing: per GPU type, fixed on a VM at its creation', () => {
    const restore = async () => {
      for (const [gpuType, p] of Object.entries(DEFAULTS)) {
        const r = await asAdmin('PUT', `/admin/pricing/${gpuType}`, p);
        assert.equal(r.status, 200, r.text);
      }
    };
    afterEach(restore);

    test('GET /admin/pricing lists the three GPU types with the shipped defaults', async () => {
      const r = await asAdmin('GET', '/admin/pricing');
      assert.equal(r.status, 200, r.text);
      assert.equal(r.headers['cache-control'], 'no-store');
      assert.deepEqual(
        r.body.map((p: { gpu_type: string }) => p.gpu_type),
        ['5090', '4090', 'pro6000'],
      );
      for (const p of r.body) {
        assert.deepEqual(Object.keys(p).sort(), PRICE_KEYS);
        const { gpu_type, updated_at, ...rest } = p;
        assert.deepEqual(rest, DEFAULTS[gpu_type as GpuType], gpu_type);
        assert.ok(!Number.isNaN(Date.parse(updated_at)));
      }
    });

    test('PUT is a partial update: fields not sent keep their value; updated_at is now', async () => {
      await advance(t(), admin.token, 2);
      const r = await asAdmin('PUT', '/admin/pricing/4090', { gpu_price_hourly: 0.5, reserved_discount_3mo: 12.5 });
      assert.equal(r.status, 200, r.text);
      assert.deepEqual(r.body, {
        gpu_type: '4090',
        ...DEFAULTS['4090'],
        gpu_price_hourly: 0.5,
        reserved_discount_3mo: 12.5,
        updated_at: nowIso(),
      });
      const r2 = await asAdmin('PUT', '/admin/pricing/4090', { storage_price_gb_hourly: 0.000123, gpu_ram_mb: 24_000 });
      assert.equal(r2.status, 200, r2.text);
      assert.deepEqual(r2.body, {
        gpu_type: '4090',
        ...DEFAULTS['4090'],
        gpu_price_hourly: 0.5,
        reserved_discount_3mo: 12.5,
        storage_price_gb_hourly: 0.000123,
        gpu_ram_mb: 24_000,
        updated_at: nowIso(),
      });
      const list = await asAdmin('GET', '/admin/pricing');
      assert.deepEqual(
        list.body.find((p: { gpu_type: string }) => p.gpu_type === '4090'),
        r2.body,
      );
      // The other types are untouched
      for (const p of list.body.filter((x: { gpu_type: string }) => x.gpu_type !== '4090')) {
        const { gpu_type, updated_at: _u, ...rest } = p;
        assert.deepEqual(rest, DEFAULTS[gpu_type as GpuType]);
      }
      // Every field at once, with 6 decimals and the extremes of a percentage
      const all = {
        gpu_ram_mb: 1,
        gpu_price_hourly: 1234.567891,
        interruptible_rate: 0,
        storage_price_gb_hourly: 0.000001,
        reserved_discount_1mo: 0,
        reserved_discount_3mo: 99.99,
        reserved_discount_6mo: 100,
      };
      const r3 = await asAdmin('PUT', '/admin/pricing/pro6000', all);
      assert.equal(r3.status, 200, r3.text);
      assert.deepEqual(r3.body, { gpu_type: 'pro6000', ...all, updated_at: nowIso() });
    });

    test('PUT validation: 7 decimals, over 100 %, more than 2 decimals of a percent, negative, wrong types, unknown or no field are 422; nothing changes', async () => {
      const before = await asAdmin('GET', '/admin/pricing');
      const cases: Array<[Record<string, unknown>, string]> = [
        [{ gpu_price_hourly: 0.4400001 }, 'body.gpu_price_hourly'],
        [{ interruptible_rate: 0.0000001 }, 'body.interruptible_rate'],
        [{ storage_price_gb_hourly: 0.0002001 }, 'body.storage_price_gb_hourly'],
        [{ gpu_price_hourly: -0.01 }, 'body.gpu_price_hourly'],
        [{ gpu_price_hourly: '0.44' }, 'body.gpu_price_hourly'],
        [{ gpu_price_hourly: null }, 'body.gpu_price_hourly'],
        [{ gpu_price_hourly: 10_000.01 }, 'body.gpu_price_hourly'],
        [{ reserved_discount_1mo: 100.001 }, 'body.reserved_discount_1mo'],
        [{ reserved_discount_3mo: 101 }, 'body.reserved_discount_3mo'],
        [{ reserved_discount_6mo: -1 }, 'body.reserved_discount_6mo'],
        [{ reserved_discount_6mo: 12.345 }, 'body.reserved_discount_6mo'],
        [{ reserved_discount_1mo: 0.001 }, 'body.reserved_discount_1mo'],
        [{ reserved_discount_1mo: 12.340000001 }, 'body.reserved_discount_1mo'],
        [{ reserved_discount_3mo: 1e-9 }, 'body.reserved_discount_3mo'],
        [{ gpu_ram_mb: 0 }, 'body.gpu_ram_mb'],
        [{ gpu_ram_mb: 1.5 }, 'body.gpu_ram_mb'],
        [{ gpu_type: '5090' }, 'body.gpu_type'],
        [{ discount: 5 }, 'body.discount'],
        [{}, 'body'],
      ];
      for (const [body, field] of cases) {
        const r = await asAdmin('PUT', '/admin/pricing/4090', body);
        assert.equal(r.status, 422, `${JSON.stringify(body)}: ${r.text}`);
        assert.equal(r.body.code, 'validation_error');
        assert.ok(
          r.body.errors.some((e: { field: string }) => e.field === field),
          `${JSON.stringify(body)}: ${r.text}`,
        );
      }
      // A valid field next to an invalid one changes nothing either
      const mixed = await asAdmin('PUT', '/admin/pricing/4090', {
        gpu_price_hourly: 0.99,
        reserved_discount_1mo: 12.345,
      });
      assert.equal(mixed.status, 422, mixed.text);
      assert.deepEqual((await asAdmin('GET', '/admin/pricing')).body, before.body, 'nothing changed');
    });

    test('PUT for an unknown GPU type is 404 not_found', async () => {
      for (const gpuType of ['a100', 'H100', '40900', '4090x']) {
        const r = await asAdmin('PUT', `/admin/pricing/${gpuType}`, { gpu_price_hourly: 1 });
        assert.equal(r.status, 404, `${gpuType}: ${r.text}`);
        assert.equal(r.body.code, 'not_found');
      }
      assert.equal((await asAdmin('GET', '/admin/pricing')).body.length, 3);
    });

    test('concurrent partial updates of one type all land', async () => {
      const updates = [
        { gpu_price_hourly: 0.51 },
        { interruptible_rate: 0.27 },
        { storage_price_gb_hourly: 0.0003 },
        { reserved_discount_1mo: 11 },
        { reserved_discount_3mo: 22 },
        { reserved_discount_6mo: 33 },
        { gpu_ram_mb: 24_000 },
      ];
      const rs = await Promise.all(updates.map((u) => asAdmin('PUT', '/admin/pricing/4090', u)));
      for (const r of rs) assert.equal(r.status, 200, r.text);
      const got = (await asAdmin('GET', '/admin/pricing')).body.find(
        (p: { gpu_type: string }) => p.gpu_type === '4090',
      );
      const { updated_at: _u, ...rest } = got;
      assert.deepEqual(rest, { gpu_type: '4090', ...Object.assign({}, ...updates) });
    });

    test('new prices apply to new VMs only: rates are fixed on the VM at creation', async () => {
      const n = await createNode(t(), admin.token, { gpu_type: '4090', gpu_count: 8 });
      const old = await vm(n, 2, { storage_gb: 100 });
      // 2 x 0.44 + 100 x 0.0002
      assert.deepEqual([old.gpu_hourly_rate, old.storage_hourly_rate, old.hourly_rate], [0.88, 0.02, 0.9]);
      const oldSpot = await vm(n, 1, { rental_type: 'interruptible' });
      assert.deepEqual([oldSpot.gpu_hourly_rate, oldSpot.storage_hourly_rate, oldSpot.hourly_rate], [0.22, 0.01, 0.23]);

      const p = await asAdmin('PUT', '/admin/pricing/4090', {
        gpu_price_hourly: 0.611111,
        interruptible_rate: 0.333333,
        storage_price_gb_hourly: 0.000015,
      });
      assert.equal(p.status, 200, p.text);

      const again = await req('GET', `/vms/${old.id}`, { token: renter.token });
      assert.deepEqual(
        [again.body.gpu_hourly_rate, again.body.storage_hourly_rate, again.body.hourly_rate],
        [0.88, 0.02, 0.9],
      );
      const againSpot = await req('GET', `/vms/${oldSpot.id}`, { token: renter.token });
      assert.equal(againSpot.body.hourly_rate, 0.23);

      const fresh = await vm(n, 2, { storage_gb: 100 });
      // 2 x 0.611111 = 1.222222; 100 x 0.000015 = 0.0015; exact decimal sums
      assert.deepEqual(
        [fresh.gpu_hourly_rate, fresh.storage_hourly_rate, fresh.hourly_rate],
        [1.222222, 0.0015, 1.223722],
      );
      const freshSpot = await vm(n, 1, { rental_type: 'interruptible', storage_gb: 60 });
      assert.deepEqual(
        [freshSpot.gpu_hourly_rate, freshSpot.storage_hourly_rate, freshSpot.hourly_rate],
        [0.333333, 0.0009, 0.334233],
      );
      // Other types keep theirs
      const n5 = await createNode(t(), admin.token, { gpu_type: '5090', gpu_count: 2 });
      const v5 = await vm(n5, 1);
      assert.equal(v5.gpu_hourly_rate, 0.69);
      for (const v of [old, oldSpot, fresh, freshSpot, v5]) await destroy(v.id);
    });

    test('admin only: 401 without a token, 403 for a user', async () => {
      assert.equal((await req('GET', '/admin/pricing')).status, 401);
      assert.equal((await req('PUT', '/admin/pricing/4090', { body: { gpu_price_hourly: 0.01 } })).status, 401);
      const g = await req('GET', '/admin/pricing', { token: user.token });
      assert.equal(g.status, 403);
      assert.equal(g.body.code, 'forbidden');
      const p = await req('PUT', '/admin/pricing/4090', { token: user.token, body: { gpu_price_hourly: 0.01 } });
      assert.equal(p.status, 403);
      const got = (await asAdmin('GET', '/admin/pricing')).body.find(
        (x: { gpu_type: string }) => x.gpu_type === '4090',
      );
      assert.equal(got.gpu_price_hourly, 0.44, 'unchanged');
    });
  });
});
