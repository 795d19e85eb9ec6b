/**
 * Start on another host (docs/vms.md#start-on-another-host), on simulated nodes: `move: if_needed`
 * moves a stopped VM whose node lacks free GPUs to another active node of its GPU type and starts it
 * there; the default never moves; a failed move leaves the VM stopped where it was; reserved VMs,
 * draining, offline and other-type nodes are never chosen; bad bodies are 422; another user's VM
 * is 404. The real disk transfer between two host agents is in test/agent/move-e2e.test.ts.
 */
import { before, beforeEach, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { describeEachDb } from '../helpers/app.js';
import { api, expectError, type BodyFor, type RequestBody } from '../helpers/api.js';
import { advance, createNode, createUser, credit, uploadSshKey, type TestUser } from '../helpers/factories.js';

type Ev = BodyFor<'/events', 'get', 200>[number];

describeEachDb('Start on another host (simulated nodes)', (t) => {
  let admin: TestUser;
  let owner: TestUser;
  let other: TestUser;
  const as = (u: TestUser) => api(t(), u.token);

  /**
   * A fresh group of 4090 nodes of one GPU each. The nodes of earlier groups are drained first (a
   * draining node is never a move's target), so only the new group's nodes can be chosen.
   */
  const gpu_type = '4090' as const;
  const earlier: string[] = [];
  async function nodes(count: number, over: Partial<RequestBody<'/admin/nodes', 'post'>> = {}) {
    for (const node of earlier.splice(0)) {
      const p = await as(admin).patch('/admin/nodes/{node}', { params: { node }, body: { status: 'draining' } });
      assert.equal(p.status, 200, p.text);
    }
    const made: string[] = [];
    for (let i = 0; i < count; i++) made.push(await node(over));
    return { gpu_type, nodes: made };
  }
  async function node(over: Partial<RequestBody<'/admin/nodes', 'post'>> = {}): Promise<string> {
    const n = (await createNode(t(), admin.token, { gpu_type, gpu_count: 1, ...over })).node;
    if (!over.gpu_type || over.gpu_type === gpu_type) earlier.push(n);
    return n;
  }
  const detailOf = (r: { body: unknown }) => (r.body as { detail: string }).detail;
  const messageOf = (r: { body: unknown }) => (r.body as { message: string }).message;

  const create = async (
    u: TestUser,
    node: string,
    gpu_type: RequestBody<'/vms', 'post'>['gpu_type'],
    over: Partial<RequestBody<'/vms', 'post'>> = {},
  ) => {
    const r = await as(u).post('/vms', {
      body: { node, gpu_type, gpu_count: 1, storage_gb: 60, template_vmid: 100, ...over },
    });
    assert.equal(r.status, 201, r.text);
    return r.body;
  };
  const get = async (u: TestUser, id: string) => {
    const r = await as(u).get('/vms/{vm_id}', { params: { vm_id: id } });
    assert.equal(r.status, 200, r.text);
    return r.body;
  };
  const settle = () => advance(t(), admin.token, 1);
  const start = (u: TestUser, id: string, body?: unknown) =>
    t().req('POST', `/vms/${id}/start`, {
      token: u.token,
      ...(body === undefined ? {} : { body: body as Record<string, unknown> }),
    });
  const stop = async (id: string) => {
    const r = await as(owner).post('/vms/{vm_id}/stop', { params: { vm_id: id } });
    assert.equal(r.status, 200, r.text);
    await settle();
    assert.equal((await get(owner, id)).status, 'stopped');
  };
  const events = async (id: string): Promise<Ev[]> => {
    const r = await as(owner).get('/events', { query: { vm_id: id, limit: 200 } });
    assert.equal(r.status, 200, r.text);
    return r.body;
  };

  /** X running on A, stopped, then A's only GPU rented to another VM: X cannot start there. */
  async function strandedVm(over: Partial<RequestBody<'/vms', 'post'>> = {}) {
    const g = await nodes(2);
    const [a, b] = g.nodes as [string, string];
    const x = await create(owner, a, g.gpu_type, { instance_label: 'keep-me', ...over });
    await settle();
    assert.equal((await get(owner, x.id)).status, 'running');
    await stop(x.id);
    const taker = await create(other, a, g.gpu_type);
    await settle();
    return { ...g, a, b, x, taker };
  }

  before(async () => {
    admin = await createUser(t(), { admin: true });
  });
  // Fresh users for each test: the per-account VM limit never gets in the way.
  beforeEach(async () => {
    owner = await createUser(t());
    other = await createUser(t());
    for (const u of [owner, other]) {
      await credit(t(), admin.token, u.id, 5000);
      await uploadSshKey(t(), u.token);
    }
  });

  test('the default never moves: no body, {} and move=never all answer gpu_unavailable naming the node', async () => {
    const { a, x } = await strandedVm();
    for (const body of [undefined, {}, null, { move: 'never' }]) {
      const r = await start(owner, x.id, body);
      expectError(r, 400, 'gpu_unavailable');
      assert.match(detailOf(r), new RegExp(`Node ${a} has 0 free GPU`));
    }
    const vm = await get(owner, x.id);
    assert.equal(vm.status, 'stopped');
    assert.equal(vm.node, a);
  });

  test('if_needed: moving (billed as stopped), then starting and running on the other node, same id, vmid, rates and label; vm.moved', async () => {
    const { a, b, x } = await strandedVm();
    const before = await get(owner, x.id);
    const r = await start(owner, x.id, { move: 'if_needed' });
    assert.equal(r.status, 200, r.text);
    assert.match(messageOf(r), new RegExp(`moving to node ${b}`));
    const moving = await get(owner, x.id);
    assert.equal(moving.status, 'moving');
    assert.equal(moving.node, b, 'the new node holds its GPUs while the disk travels');
    // Nobody can take b's GPU meanwhile.
    expectError(
      await as(other).post('/vms', {
        body: { node: b, gpu_type, gpu_count: 1, storage_gb: 60, template_vmid: 100 },
      }),
      400,
      'gpu_unavailable',
    );
    // Stop is refused while it moves.
    expectError(await as(owner).post('/vms/{vm_id}/stop', { params: { vm_id: x.id } }), 400, 'invalid_state');
    await settle();
    const after = await get(owner, x.id);
    assert.equal(after.status, 'running');
    assert.equal(after.node, b);
    for (const k of ['id', 'vmid', 'instance_label', 'gpu_hourly_rate', 'storage_hourly_rate', 'rental_type'] as const)
      assert.deepEqual(after[k], before[k], k);
    const evs = await events(x.id);
    const moved = evs.filter((e) => e.type === 'vm.moved');
    assert.equal(moved.length, 1);
    assert.deepEqual(moved[0]!.data, { vmid: x.vmid, from: a, to: b, bytes: 60 * 2 ** 30, seconds: 0 });
    const path = evs
      .filter((e) => e.type === 'vm.status_changed')
      .map((e) => `${String(e.data.from)}>${String(e.data.to)}`)
      .slice(-3);
    assert.deepEqual(path, ['stopped>moving', 'moving>starting', 'starting>running']);
    // A's GPU stays with the VM that took it; b's is X's now.
    const nb = await as(admin).get('/admin/nodes/{node}', { params: { node: b } });
    assert.equal(nb.status, 200, nb.text);
  });

  test('if_needed on a node with free GPUs starts it where it is', async () => {
    const g = await nodes(2);
    const x = await create(owner, g.nodes[0]!, g.gpu_type);
    await settle();
    await stop(x.id);
    const r = await start(owner, x.id, { move: 'if_needed' });
    assert.equal(r.status, 200, r.text);
    assert.match(messageOf(r), /is starting/);
    await settle();
    const vm = await get(owner, x.id);
    assert.equal(vm.status, 'running');
    assert.equal(vm.node, g.nodes[0]);
  });

  test('no node qualifies: 400 gpu_unavailable with the reason; draining, offline, full and other-type nodes are never chosen', async () => {
    const { a, b, x } = await strandedVm({ storage_gb: 60 });
    // b full, a third node draining, a fourth offline, one too small for the disk.
    await create(other, b, gpu_type);
    const drain = await node();
    const down = await node();
    for (const [node, status] of [
      [drain, 'draining'],
      [down, 'offline'],
    ] as const) {
      const p = await as(admin).patch('/admin/nodes/{node}', { params: { node }, body: { status } });
      assert.equal(p.status, 200, p.text);
    }
    const r = await start(owner, x.id, { move: 'if_needed' });
    expectError(r, 400, 'gpu_unavailable');
    const detail = detailOf(r);
    assert.match(detail, new RegExp(`Node ${a} has 0 free GPU`));
    assert.match(
      detail,
      new RegExp(`no other active ${gpu_type} node has 1 free GPU\\(s\\) and room for a 60 GB disk`),
    );
    const vm = await get(owner, x.id);
    assert.equal(vm.status, 'stopped');
    assert.equal(vm.node, a);
    // A node of another GPU type with room is not a target either.
    await node({ gpu_type: '5090' });
    expectError(await start(owner, x.id, { move: 'if_needed' }), 400, 'gpu_unavailable');
  });

  test('a disk larger than a node takes is not moved there', async () => {
    const g = await nodes(1, { max_storage_gb: 2000 });
    const small = await node({ max_storage_gb: 100 });
    const x = await create(owner, g.nodes[0]!, g.gpu_type, { storage_gb: 500 });
    await settle();
    await stop(x.id);
    await create(other, g.nodes[0]!, g.gpu_type);
    const r = await start(owner, x.id, { move: 'if_needed' });
    expectError(r, 400, 'gpu_unavailable');
    assert.match(detailOf(r), /room for a 500 GB disk/);
    assert.equal((await get(owner, x.id)).node, g.nodes[0]);
    assert.ok(small);
  });

  test('a failed move leaves the VM stopped on its node with the reason; a retry succeeds', async () => {
    const { a, b, x } = await strandedVm();
    const f = await as(admin).post('/admin/simulator/faults', { body: { node: b, action: 'move', count: 1 } });
    assert.equal(f.status, 200, f.text);
    assert.equal((await start(owner, x.id, { move: 'if_needed' })).status, 200);
    await settle();
    const failed = await get(owner, x.id);
    assert.equal(failed.status, 'stopped');
    assert.equal(failed.node, a);
    const evs = await events(x.id);
    const mf = evs.filter((e) => e.type === 'vm.move_failed');
    assert.equal(mf.length, 1);
    assert.equal(mf[0]!.data.from, a);
    assert.equal(mf[0]!.data.to, b);
    assert.match(String(mf[0]!.data.error), /simulated move failure/);
    const sc = evs.filter((e) => e.type === 'vm.status_changed').at(-1)!;
    assert.deepEqual([sc.data.from, sc.data.to, sc.data.reason], ['moving', 'stopped', 'move_failed']);
    // b's GPU is free again: another user can have it, or the retry.
    assert.equal((await start(owner, x.id, { move: 'if_needed' })).status, 200);
    await settle();
    const vm = await get(owner, x.id);
    assert.equal(vm.status, 'running');
    assert.equal(vm.node, b);
  });

  test('the destination going offline during the move fails it: the VM is stopped where its disk is', async () => {
    const { a, b, x } = await strandedVm();
    assert.equal((await start(owner, x.id, { move: 'if_needed' })).status, 200);
    const p = await as(admin).patch('/admin/nodes/{node}', { params: { node: b }, body: { status: 'offline' } });
    assert.equal(p.status, 200, p.text);
    const vm = await get(owner, x.id);
    assert.equal(vm.status, 'stopped');
    assert.equal(vm.node, a);
    const mf = (await events(x.id)).filter((e) => e.type === 'vm.move_failed');
    assert.match(String(mf.at(-1)!.data.error), new RegExp(`node ${b} went offline during the move`));
    await settle();
    assert.equal((await get(owner, x.id)).status, 'stopped');
  });

  test('a VM destroyed while moving is destroyed', async () => {
    const { x } = await strandedVm();
    assert.equal((await start(owner, x.id, { move: 'if_needed' })).status, 200);
    const d = await as(owner).delete('/vms/{vm_id}', { params: { vm_id: x.id } });
    assert.equal(d.status, 200, d.text);
    await settle();
    assert.equal((await get(owner, x.id)).status, 'destroyed');
  });

  test('a reserved VM is never moved: it holds its GPUs and starts where it is', async () => {
    const g = await nodes(2);
    const x = await create(owner, g.nodes[0]!, g.gpu_type, { rental_type: 'reserved', reservation_months: 1 });
    await settle();
    await stop(x.id);
    expectError(
      await as(other).post('/vms', {
        body: {
          node: g.nodes[0]!,
          gpu_type: g.gpu_type,
          gpu_count: 1,
          storage_gb: 60,
          template_vmid: 100,
        },
      }),
      400,
      'gpu_unavailable',
    );
    assert.equal((await start(owner, x.id, { move: 'if_needed' })).status, 200);
    await settle();
    const vm = await get(owner, x.id);
    assert.equal(vm.status, 'running');
    assert.equal(vm.node, g.nodes[0]);
  });

  describe('bad input and other users', () => {
    test('an unknown move value, an unknown field or a body that is not an object: 422 naming it', async () => {
      const { x } = await strandedVm();
      for (const [body, field] of [
        [{ move: 'sometimes' }, 'body.move'],
        [{ move: 1 }, 'body.move'],
        [{ move: null }, 'body.move'],
        [{ moving: 'if_needed' }, 'body.moving'],
      ] as const) {
        const r = await start(owner, x.id, body);
        expectError(r, 422, 'validation_error');
        assert.equal((r.body as { errors?: { field: string }[] }).errors?.[0]?.field, field, JSON.stringify(body));
      }
      const arr = await start(owner, x.id, []);
      expectError(arr, 422, 'validation_error');
      assert.equal((await get(owner, x.id)).status, 'stopped');
    });

    test("another user's VM: 404, nothing moves", async () => {
      const { a, x } = await strandedVm();
      expectError(await start(other, x.id, { move: 'if_needed' }), 404, 'not_found');
      const vm = await get(owner, x.id);
      assert.equal(vm.node, a);
      assert.equal(vm.status, 'stopped');
    });

    test('a running VM: 400 invalid_state whatever the move', async () => {
      const g = await nodes(1);
      const x = await create(owner, g.nodes[0]!, g.gpu_type);
      await settle();
      expectError(await start(owner, x.id, { move: 'if_needed' }), 400, 'invalid_state');
    });
  });

  test('the ledger stays sound', async () => {
    const r = await as(admin).get('/admin/ledger-check');
    assert.equal(r.status, 200, r.text);
    assert.equal(r.body.ok, true, r.text);
  });
});
