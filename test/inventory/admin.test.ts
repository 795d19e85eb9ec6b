/**
 * The admin inventory API: nodes and prices (new prices apply to new VMs only).
 */
import { afterEach, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { describeEachDb } from '../helpers/app.js';
import { api, type Api, type RequestBody } from '../helpers/api.js';
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
import type { NodeRecord, NodeSpec, VmSpec } from '../helpers/world.js';

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

type NodeBody = RequestBody<'/admin/nodes', 'post'>;
type VmBody = RequestBody<'/vms', 'post'>;

const nodeBody = (over: NodeSpec = {}): NodeBody => ({
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
/** A node body with fields the API must refuse (sent as rawBody). */
const badNodeBody = (over: Record<string, unknown>): Record<string, unknown> => ({ ...nodeBody(), ...over });

describeEachDb('admin inventory', (t) => {
  let admin: TestUser;
  let user: TestUser;
  let renter: TestUser;
  /** Typed clients for the administrator and the renter (made in before()). */
  let asAdmin: Api;
  let asRenter: Api;

  const nowIso = () => t().clock.now().toISOString();

  /** A VM of the renter on the node, holding GPUs from its creation on. */
  const vm = async (
    node: { node: string; gpu_type?: VmBody['gpu_type'] },
    gpuCount: VmBody['gpu_count'],
    extra: VmSpec = {},
  ) => {
    const r = await asRenter.post('/vms', {
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
    return r.body;
  };
  const destroy = async (id: string) => {
    const r = await asRenter.delete('/vms/{vm_id}', { params: { vm_id: id } });
    assert.equal(r.status, 200, r.text);
  };
  /** GET /vms/{vm_id} as the renter; asserts the 200. */
  const vmOf = async (id: string) => {
    const r = await asRenter.get('/vms/{vm_id}', { params: { vm_id: id } });
    assert.equal(r.status, 200, r.text);
    return r.body;
  };
  const at = (node: string) => ({ params: { node } });
  /** GET /admin/nodes/{node}; asserts the 200. */
  const nodeOf = async (node: string) => {
    const r = await asAdmin.get('/admin/nodes/{node}', at(node));
    assert.equal(r.status, 200, r.text);
    return r.body;
  };
  /** GET /admin/pricing; asserts the 200. */
  const prices = async () => {
    const r = await asAdmin.get('/admin/pricing');
    assert.equal(r.status, 200, r.text);
    return r.body;
  };
  const pricing = (gpuType: string) => ({ params: { gpu_type: gpuType } });

  // VMs are created (and may be metered) here too: the ledger stays balanced (every balance is the sum of its
  // transactions).
  afterEach(async () => {
    const { rows } = await t().db.query(
      `SELECT b.user_id FROM balances b LEFT JOIN transactions t ON t.user_id = b.user_id
        GROUP BY b.user_id HAVING b.balance_micros <> COALESCE(SUM(t.amount_micros), 0)`,
    );
    assert.deepEqual(rows, [], 'balance == sum(transactions)');
  });

  before(async () => {
    admin = await createUser(t(), { admin: true });
    user = await createUser(t());
    renter = await createUser(t());
    asAdmin = api(t(), admin.token);
    asRenter = api(t(), renter.token);
    await credit(t(), admin.token, renter.id, 100_000);
    await uploadSshKey(t(), renter.token);
    const p = await asAdmin.patch('/admin/users/{user_id}', {
      params: { user_id: renter.id },
      body: { max_vms: 1000, max_gpus: 10_000 },
    });
    assert.equal(p.status, 200, p.text);
  });

  describe('nodes: registration, changes and removal', () => {
    test("POST /admin/nodes: 201 with the whole record; gpu_ram_mb defaults to the type's, status to active", async () => {
      for (const gpuType of ['5090', '4090', 'pro6000'] as const) {
        const body = nodeBody({ gpu_type: gpuType, gpu_count: 4 });
        const r = await asAdmin.post('/admin/nodes', { body });
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
        const g = await asAdmin.get('/admin/nodes/{node}', at(body.node));
        assert.equal(g.status, 200, g.text);
        assert.deepEqual(g.body, r.body);
      }
    });

    test('POST keeps an explicit gpu_ram_mb and status; limits 1 and 64 GPUs, 50 GB disk are accepted', async () => {
      const body = nodeBody({ gpu_ram_mb: 49_152, status: 'draining', gpu_count: 64, max_storage_gb: 50 });
      const r = await asAdmin.post('/admin/nodes', { body });
      assert.equal(r.status, 201, r.text);
      assert.equal(r.body.gpu_ram_mb, 49_152);
      assert.equal(r.body.status, 'draining');
      assert.equal(r.body.gpu_count, 64);
      assert.equal(r.body.max_storage_gb, 50);
      for (const status of ['active', 'offline'] as const) {
        const o = await asAdmin.post('/admin/nodes', { body: nodeBody({ status, gpu_count: 1 }) });
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
        const body = badNodeBody(over);
        const r = await asAdmin.post('/admin/nodes', { rawBody: body });
        assert.equal(r.status, 422, `${name}: ${r.text}`);
        assert.equal(r.body.code, 'validation_error', name);
        assert.ok(
          r.body.errors?.some((e) => e.field === field),
          `${name}: ${r.text}`,
        );
        const id = body.node;
        if (typeof id === 'string' && /^[a-z0-9][a-z0-9-]{0,62}$/.test(id)) {
          assert.equal((await asAdmin.get('/admin/nodes/{node}', at(id))).status, 404, `${name}: not created`);
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
        const r = await asAdmin.post('/admin/nodes', { rawBody: body });
        assert.equal(r.status, 422, `without ${required}: ${r.text}`);
        assert.deepEqual(r.body.errors, [{ field: `body.${required}`, message: 'is required' }]);
      }
      const none = await asAdmin.post('/admin/nodes', { rawBody: undefined });
      assert.equal(none.status, 422, none.text);
    });

    test('a taken node id is 400 conflict and the first node is unchanged', async () => {
      const first = await createNode(t(), admin.token, { gpu_count: 4 });
      const r = await asAdmin.post('/admin/nodes', {
        body: nodeBody({ node: first.node, gpu_type: 'pro6000', gpu_count: 8 }),
      });
      assert.equal(r.status, 400, r.text);
      assert.equal(r.body.code, 'conflict');
      assert.match(r.body.detail, new RegExp(first.node));
      const g = await asAdmin.get('/admin/nodes/{node}', at(first.node));
      assert.deepEqual(g.body, first);
    });

    test('GET /admin/nodes: newest first, limit/offset, X-Total-Count; unknown node 404', async () => {
      const made: NodeRecord[] = [];
      for (let i = 0; i < 3; i++) made.push(await createNode(t(), admin.token, { gpu_count: i + 1 }));
      const all = await asAdmin.get('/admin/nodes');
      assert.equal(all.status, 200, all.text);
      const total = Number(all.headers['x-total-count']);
      assert.ok(total >= 3);
      assert.equal(all.body.length, Math.min(total, 50));
      assert.deepEqual(all.body.slice(0, 3), [...made].reverse(), 'newest first, full records');
      for (const n of all.body) assert.deepEqual(Object.keys(n).sort(), NODE_KEYS);
      const p1 = await asAdmin.get('/admin/nodes', { query: { limit: 2 } });
      assert.equal(p1.status, 200, p1.text);
      assert.deepEqual(
        p1.body.map((n) => n.node),
        [made[2]!.node, made[1]!.node],
      );
      assert.equal(p1.headers['x-total-count'], String(total));
      const p2 = await asAdmin.get('/admin/nodes', { query: { limit: 2, offset: 1 } });
      assert.equal(p2.status, 200, p2.text);
      assert.deepEqual(
        p2.body.map((n) => n.node),
        [made[1]!.node, made[0]!.node],
      );
      const past = await asAdmin.get('/admin/nodes', { query: { offset: total } });
      assert.deepEqual(past.body, []);
      assert.equal(past.headers['x-total-count'], String(total));
      for (const query of [{ limit: 0 }, { limit: 101 }, { offset: -1 }, { limit: 'x' }, { status: 'active' }] as Array<
        Record<string, string | number>
      >) {
        const r = await asAdmin.get('/admin/nodes', { rawQuery: query });
        assert.equal(r.status, 422, `${JSON.stringify(query)}: ${r.text}`);
      }
      const missing = await asAdmin.get('/admin/nodes/{node}', at('no-such-node'));
      assert.equal(missing.status, 404);
      assert.equal(missing.body.code, 'not_found');
    });

    test('PATCH changes the fields given and keeps the others; updated_at moves, created_at does not', async () => {
      const n = await createNode(t(), admin.token, { gpu_count: 4 });
      await advance(t(), admin.token, 5);
      const r = await asAdmin.patch('/admin/nodes/{node}', {
        ...at(n.node),
        body: {
          gpu_count: 6,
          location: 'us-west',
          cpu_model: 'AMD EPYC 9554',
          max_storage_gb: 8000,
        },
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
      assert.deepEqual((await asAdmin.get('/admin/nodes/{node}', at(n.node))).body, r.body);
      const s = await asAdmin.patch('/admin/nodes/{node}', { ...at(n.node), body: { status: 'draining' } });
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
        const r = await asAdmin.patch('/admin/nodes/{node}', { ...at(n.node), rawBody: body });
        assert.equal(r.status, 422, `${JSON.stringify(body)}: ${r.text}`);
        assert.equal(r.body.code, 'validation_error');
        assert.ok(
          r.body.errors?.some((e) => e.field === field),
          `${JSON.stringify(body)}: ${r.text}`,
        );
      }
      assert.deepEqual((await asAdmin.get('/admin/nodes/{node}', at(n.node))).body, n, 'unchanged');
      const missing = await asAdmin.patch('/admin/nodes/{node}', { ...at('no-such-node'), body: { gpu_count: 2 } });
      assert.equal(missing.status, 404, missing.text);
      assert.equal(missing.body.code, 'not_found');
    });

    test('gpus_allocated / gpus_free follow the VMs; gpu_count cannot go below the GPUs in use (400 invalid_state)', async () => {
      const n = await createNode(t(), admin.token, { gpu_count: 8 });
      const a = await vm(n, 4);
      const b = await vm(n, 2, { rental_type: 'interruptible' });
      const g = await nodeOf(n.node);
      assert.equal(g.gpus_allocated, 6);
      assert.equal(g.gpus_free, 2);
      const list = await asAdmin.get('/admin/nodes', { query: { limit: 100 } });
      assert.equal(list.status, 200, list.text);
      const listed = list.body.find((x) => x.node === n.node);
      assert.ok(listed, `${n.node} is listed`);
      assert.equal(listed.gpus_allocated, 6);
      assert.equal(listed.gpus_free, 2);

      const r = await asAdmin.patch('/admin/nodes/{node}', { ...at(n.node), body: { gpu_count: 4 } });
      assert.equal(r.status, 400, r.text);
      assert.equal(r.body.code, 'invalid_state');
      assert.match(r.body.detail, /6/);
      assert.equal((await nodeOf(n.node)).gpu_count, 8, 'unchanged');
      // Down to exactly the GPUs in use is fine
      const exact = await asAdmin.patch('/admin/nodes/{node}', { ...at(n.node), body: { gpu_count: 6 } });
      assert.equal(exact.status, 200, exact.text);
      assert.equal(exact.body.gpus_free, 0);
      await destroy(b.id);
      const lower = await asAdmin.patch('/admin/nodes/{node}', { ...at(n.node), body: { gpu_count: 4 } });
      assert.equal(lower.status, 200, lower.text);
      assert.deepEqual([lower.body.gpu_count, lower.body.gpus_allocated, lower.body.gpus_free], [4, 4, 0]);
      await destroy(a.id);
      const after = await nodeOf(n.node);
      assert.deepEqual([after.gpus_allocated, after.gpus_free], [0, 4]);
    });

    test('gpu_type cannot change while the node has VMs (400 invalid_state); without VMs it can, and gpu_ram_mb follows the new type', async () => {
      const n = await createNode(t(), admin.token, { gpu_type: '4090', gpu_count: 8 });
      const v = await vm(n, 1);
      const r = await asAdmin.patch('/admin/nodes/{node}', { ...at(n.node), body: { gpu_type: '5090' } });
      assert.equal(r.status, 400, r.text);
      assert.equal(r.body.code, 'invalid_state');
      // Naming the type it already has is not a change
      const same = await asAdmin.patch('/admin/nodes/{node}', {
        ...at(n.node),
        body: { gpu_type: '4090', ram_gb: 1024 },
      });
      assert.equal(same.status, 200, same.text);
      assert.equal(same.body.gpu_ram_mb, DEFAULTS['4090'].gpu_ram_mb);
      await destroy(v.id);
      const ok = await asAdmin.patch('/admin/nodes/{node}', { ...at(n.node), body: { gpu_type: 'pro6000' } });
      assert.equal(ok.status, 200, ok.text);
      assert.equal(ok.body.gpu_type, 'pro6000');
      assert.equal(ok.body.gpu_ram_mb, DEFAULTS.pro6000.gpu_ram_mb);
      const explicit = await asAdmin.patch('/admin/nodes/{node}', {
        ...at(n.node),
        body: { gpu_type: '5090', gpu_ram_mb: 30_000 },
      });
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
      assert.equal((await vmOf(a.id)).status, 'interrupted');
      const r = await asAdmin.delete('/admin/nodes/{node}', at(n.node));
      assert.equal(r.status, 400, r.text);
      assert.equal(r.body.code, 'invalid_state');
      assert.match(r.body.detail, /2 VM/);
      await destroy(b.id);
      const r2 = await asAdmin.delete('/admin/nodes/{node}', at(n.node));
      assert.equal(r2.status, 400, 'the interrupted VM still lives');
      assert.match(r2.body.detail, /1 VM/);
      await destroy(a.id);
      const ok = await asAdmin.delete('/admin/nodes/{node}', at(n.node));
      assert.equal(ok.status, 204, ok.text);
      assert.equal(ok.text, '');
      assert.equal((await asAdmin.get('/admin/nodes/{node}', at(n.node))).status, 404);
      const again = await asAdmin.delete('/admin/nodes/{node}', at(n.node));
      assert.equal(again.status, 404);
      assert.equal(again.body.code, 'not_found');
      // The id is free again
      assert.equal((await asAdmin.post('/admin/nodes', { body: nodeBody({ node: n.node }) })).status, 201);
    });

    test('a failed VM does not keep a node from being deleted', async () => {
      const n = await createNode(t(), admin.token, { gpu_count: 2 });
      const f = await asAdmin.post('/admin/simulator/faults', {
        body: { node: n.node, action: 'provision', count: 1 },
      });
      assert.equal(f.status, 200, f.text);
      const v = await vm(n, 1);
      await advance(t(), admin.token, 1);
      assert.equal((await vmOf(v.id)).status, 'failed');
      const del = await asAdmin.delete('/admin/nodes/{node}', at(n.node));
      assert.equal(del.status, 204, del.text);
    });

    test('concurrent registrations of one id: exactly one 201, the others 400 conflict', async () => {
      const body = nodeBody();
      const rs = await Promise.all(
        Array.from({ length: 5 }, (_, i) => asAdmin.post('/admin/nodes', { body: { ...body, gpu_count: i + 1 } })),
      );
      const created = rs.filter((r) => r.status === 201);
      assert.equal(created.length, 1, rs.map((r) => r.text).join('\n'));
      for (const r of rs.filter((x) => x.status !== 201)) assert.deepEqual([r.status, r.body.code], [400, 'conflict']);
      assert.deepEqual((await asAdmin.get('/admin/nodes/{node}', at(body.node))).body, created[0]!.body);
    });

    test('node changes racing VM creates never leave a node with more GPUs handed out than it has, nor VMs on a deleted node', async () => {
      const n = await createNode(t(), admin.token, { gpu_count: 8 });
      const creates = Array.from({ length: 4 }, () =>
        asRenter.post('/vms', {
          body: { node: n.node, gpu_type: '4090', gpu_count: 2, storage_gb: 50, template_vmid: 100 },
        }),
      );
      const [patch, ...made] = await Promise.all([
        asAdmin.patch('/admin/nodes/{node}', { ...at(n.node), body: { gpu_count: 4 } }),
        ...creates,
      ]);
      const ok = made.filter((r) => r.status === 201);
      for (const r of made.filter((x) => x.status !== 201))
        assert.deepEqual([r.status, r.body.code], [400, 'gpu_unavailable'], r.text);
      const g = await nodeOf(n.node);
      assert.equal(g.gpus_allocated, ok.length * 2);
      assert.ok(g.gpus_allocated <= g.gpu_count, JSON.stringify(g));
      assert.equal(g.gpu_count, patch.status === 200 ? 4 : 8, patch.text);
      if (patch.status !== 200) assert.equal(patch.body.code, 'invalid_state');
      for (const r of ok) await destroy(r.body.id);

      const m = await createNode(t(), admin.token, { gpu_count: 8 });
      const creates2 = Array.from({ length: 3 }, () =>
        asRenter.post('/vms', {
          body: { node: m.node, gpu_type: '4090', gpu_count: 1, storage_gb: 50, template_vmid: 100 },
        }),
      );
      const [del, ...made2] = await Promise.all([asAdmin.delete('/admin/nodes/{node}', at(m.node)), ...creates2]);
      const live = made2.filter((r) => r.status === 201);
      if (del.status === 204) {
        assert.equal(live.length, 0, 'no VM on a deleted node');
        // (a 201 has no code: undefined, as the check expects none)
        for (const r of made2)
          assert.deepEqual([r.status, r.status === 201 ? undefined : r.body.code], [400, 'gpu_unavailable'], r.text);
      } else {
        assert.deepEqual([del.status, del.body.code], [400, 'invalid_state'], del.text);
        assert.ok(live.length > 0);
        for (const r of live) await destroy(r.body.id);
        assert.equal((await asAdmin.delete('/admin/nodes/{node}', at(m.node))).status, 204);
      }
    });

    test("admin only: 401 without a token, 403 for a user and for a user's read_write API key", async () => {
      const n = await createNode(t(), admin.token);
      const key = await createApiKey(t(), user.token, 'read_write');
      const calls = [
        ['GET /admin/nodes', (c: Api) => c.get('/admin/nodes')],
        ['POST /admin/nodes', (c: Api) => c.post('/admin/nodes', { body: nodeBody() })],
        [`GET /admin/nodes/${n.node}`, (c: Api) => c.get('/admin/nodes/{node}', at(n.node))],
        [
          `PATCH /admin/nodes/${n.node}`,
          (c: Api) => c.patch('/admin/nodes/{node}', { ...at(n.node), body: { status: 'offline' } }),
        ],
        [`DELETE /admin/nodes/${n.node}`, (c: Api) => c.delete('/admin/nodes/{node}', at(n.node))],
      ] as const;
      for (const [what, call] of calls) {
        const anon = await call(api(t()));
        assert.equal(anon.status, 401, what);
        assert.equal(anon.body.code, 'unauthorized');
        for (const token of [user.token, key]) {
          const r = await call(api(t(), token));
          assert.equal(r.status, 403, `${what}: ${r.text}`);
          assert.equal(r.body.code, 'forbidden');
        }
      }
      assert.deepEqual((await asAdmin.get('/admin/nodes/{node}', at(n.node))).body, n, 'nothing changed');
    });
  });

  describe('pricing: per GPU type, fixed on a VM at its creation', () => {
    const restore = async () => {
      for (const [gpuType, p] of Object.entries(DEFAULTS)) {
        const r = await asAdmin.put('/admin/pricing/{gpu_type}', { ...pricing(gpuType), body: p });
        assert.equal(r.status, 200, r.text);
      }
    };
    afterEach(restore);

    test('GET /admin/pricing lists the three GPU types with the shipped defaults', async () => {
      const r = await asAdmin.get('/admin/pricing');
      assert.equal(r.status, 200, r.text);
      assert.equal(r.headers['cache-control'], 'no-store');
      assert.deepEqual(
        r.body.map((p) => p.gpu_type),
        ['5090', '4090', 'pro6000'],
      );
      for (const p of r.body) {
        assert.deepEqual(Object.keys(p).sort(), PRICE_KEYS);
        const { gpu_type, updated_at, ...rest } = p;
        assert.deepEqual(rest, DEFAULTS[gpu_type], gpu_type);
        assert.ok(!Number.isNaN(Date.parse(updated_at)));
      }
    });

    test('PUT is a partial update: fields not sent keep their value; updated_at is now', async () => {
      await advance(t(), admin.token, 2);
      const r = await asAdmin.put('/admin/pricing/{gpu_type}', {
        ...pricing('4090'),
        body: { gpu_price_hourly: 0.5, reserved_discount_3mo: 12.5 },
      });
      assert.equal(r.status, 200, r.text);
      assert.deepEqual(r.body, {
        gpu_type: '4090',
        ...DEFAULTS['4090'],
        gpu_price_hourly: 0.5,
        reserved_discount_3mo: 12.5,
        updated_at: nowIso(),
      });
      const r2 = await asAdmin.put('/admin/pricing/{gpu_type}', {
        ...pricing('4090'),
        body: { storage_price_gb_hourly: 0.000123, gpu_ram_mb: 24_000 },
      });
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
      const list = await prices();
      assert.deepEqual(
        list.find((p) => p.gpu_type === '4090'),
        r2.body,
      );
      // The other types are untouched
      for (const p of list.filter((x) => x.gpu_type !== '4090')) {
        const { gpu_type, updated_at: _u, ...rest } = p;
        assert.deepEqual(rest, DEFAULTS[gpu_type]);
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
      const r3 = await asAdmin.put('/admin/pricing/{gpu_type}', { ...pricing('pro6000'), body: all });
      assert.equal(r3.status, 200, r3.text);
      assert.deepEqual(r3.body, { gpu_type: 'pro6000', ...all, updated_at: nowIso() });
    });

    test('PUT validation: 7 decimals, over 100 %, more than 2 decimals of a percent, negative, wrong types, unknown or no field are 422; nothing changes', async () => {
      const before = await asAdmin.get('/admin/pricing');
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
        const r = await asAdmin.put('/admin/pricing/{gpu_type}', { ...pricing('4090'), rawBody: body });
        assert.equal(r.status, 422, `${JSON.stringify(body)}: ${r.text}`);
        assert.equal(r.body.code, 'validation_error');
        assert.ok(
          r.body.errors?.some((e) => e.field === field),
          `${JSON.stringify(body)}: ${r.text}`,
        );
      }
      // A valid field next to an invalid one changes nothing either
      const mixed = await asAdmin.put('/admin/pricing/{gpu_type}', {
        ...pricing('4090'),
        rawBody: {
          gpu_price_hourly: 0.99,
          reserved_discount_1mo: 12.345,
        },
      });
      assert.equal(mixed.status, 422, mixed.text);
      assert.deepEqual((await asAdmin.get('/admin/pricing')).body, before.body, 'nothing changed');
    });

    test('PUT for an unknown GPU type is 404 not_found', async () => {
      for (const gpuType of ['a100', 'H100', '40900', '4090x']) {
        const r = await asAdmin.put('/admin/pricing/{gpu_type}', {
          ...pricing(gpuType),
          body: { gpu_price_hourly: 1 },
        });
        assert.equal(r.status, 404, `${gpuType}: ${r.text}`);
        assert.equal(r.body.code, 'not_found');
      }
      assert.equal((await prices()).length, 3);
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
      const rs = await Promise.all(
        updates.map((u) => asAdmin.put('/admin/pricing/{gpu_type}', { ...pricing('4090'), body: u })),
      );
      for (const r of rs) assert.equal(r.status, 200, r.text);
      const got = (await prices()).find((p) => p.gpu_type === '4090');
      assert.ok(got, '4090 is listed');
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

      const p = await asAdmin.put('/admin/pricing/{gpu_type}', {
        ...pricing('4090'),
        body: {
          gpu_price_hourly: 0.611111,
          interruptible_rate: 0.333333,
          storage_price_gb_hourly: 0.000015,
        },
      });
      assert.equal(p.status, 200, p.text);

      const again = await vmOf(old.id);
      assert.deepEqual([again.gpu_hourly_rate, again.storage_hourly_rate, again.hourly_rate], [0.88, 0.02, 0.9]);
      const againSpot = await vmOf(oldSpot.id);
      assert.equal(againSpot.hourly_rate, 0.23);

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
      const anon = api(t());
      const asUser = api(t(), user.token);
      const change = { ...pricing('4090'), body: { gpu_price_hourly: 0.01 } };
      assert.equal((await anon.get('/admin/pricing')).status, 401);
      assert.equal((await anon.put('/admin/pricing/{gpu_type}', change)).status, 401);
      const g = await asUser.get('/admin/pricing');
      assert.equal(g.status, 403);
      assert.equal(g.body.code, 'forbidden');
      const p = await asUser.put('/admin/pricing/{gpu_type}', change);
      assert.equal(p.status, 403);
      const got = (await prices()).find((x) => x.gpu_type === '4090');
      assert.ok(got, '4090 is listed');
      assert.equal(got.gpu_price_hourly, 0.44, 'unchanged');
    });
  });
});
