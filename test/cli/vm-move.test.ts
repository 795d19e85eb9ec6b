/**
 * `gpucloud vm start` when the VM's node has no free GPUs, as the process users run, against a real
 * server on both databases (simulated nodes): without --move it says so and names the command that
 * moves it; `--move --wait` shows the move and ends with the VM running on the other node; a move
 * that fails ends with exit 1 and the reason.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describeEachDb } from '../helpers/app.js';
import { api, type BodyFor } from '../helpers/api.js';
import { createApiKey, createNode, createUser, credit, uploadSshKey, type TestUser } from '../helpers/factories.js';
import { cliEnv, fails, gpucloud, ok, type Run } from './harness.js';

describeEachDb('gpucloud vm start --move', (t) => {
  let base: string;
  let admin: TestUser;
  let user: TestUser;
  let other: TestUser;
  let key: string;
  let home: string;

  before(async () => {
    base = await t().app.listen({ port: 0, host: '127.0.0.1' });
    admin = await createUser(t(), { admin: true });
    user = await createUser(t());
    other = await createUser(t());
    for (const u of [user, other]) {
      await credit(t(), admin.token, u.id, 500);
      await uploadSshKey(t(), u.token);
    }
    key = await createApiKey(t(), user.token, 'read_write', 'cli');
    home = mkdtempSync(join(tmpdir(), 'gpucloud-cli-move-'));
  });
  after(() => rmSync(home, { recursive: true, force: true }));

  async function vmOf(id: string) {
    const r = await api(t(), user.token).get('/vms/{vm_id}', { params: { vm_id: id } });
    assert.equal(r.status, 200, r.text);
    return r.body as BodyFor<'/vms/{vm_id}', 'get', 200>;
  }

  /** Runs the CLI while the manual clock moves on, so the background work it waits for happens. */
  async function cli(args: string[]): Promise<Run> {
    let done = false;
    const run = gpucloud(args, cliEnv(home, base, key)).finally(() => (done = true));
    while (!done) {
      await t().services.clock.advance(1);
      await new Promise((r) => setTimeout(r, 100));
    }
    return run;
  }

  /** A stopped VM of `user` on node a, whose only GPU another user has now; node b is free. */
  async function stranded() {
    const made = [];
    for (const gpu_type of ['pro6000', 'pro6000'] as const)
      made.push((await createNode(t(), admin.token, { gpu_type, gpu_count: 1, cluster_name: 'move-cli' })).node);
    const [a, b] = made as [string, string];
    const create = async (u: TestUser) => {
      const r = await api(t(), u.token).post('/vms', {
        body: { node: a, gpu_type: 'pro6000', gpu_count: 1, storage_gb: 50, template_vmid: 100 },
      });
      assert.equal(r.status, 201, r.text);
      return r.body;
    };
    const vm = await create(user);
    await t().services.clock.advance(1);
    assert.equal((await api(t(), user.token).post('/vms/{vm_id}/stop', { params: { vm_id: vm.id } })).status, 200);
    await t().services.clock.advance(1);
    await create(other);
    await t().services.clock.advance(1);
    return { a, b, vm };
  }

  test('without --move: the refusal and the command that moves it; with --move --wait: running on the other node', async () => {
    const { a, b, vm } = await stranded();
    const refused = await cli(['vm', 'start', String(vm.vmid)]);
    fails(refused, 1, new RegExp(`Node ${a} has 0 free GPU`));
    assert.match(refused.stderr, new RegExp(`gpucloud vm start ${vm.vmid} --move`));

    const moved = await cli(['vm', 'start', String(vm.vmid), '--move', '--wait']);
    ok(moved);
    assert.match(moved.stdout, new RegExp(`VM ${vm.vmid} is moving to node ${b}`));
    assert.match(
      moved.stdout,
      new RegExp(`VM ${vm.vmid} is running on ${b}; connect with: gpucloud vm ssh ${vm.vmid}`),
    );
    const after = await vmOf(vm.id);
    assert.equal(after.node, b);
    assert.equal(after.status, 'running');
    // Bad options are refused before any request.
    fails(await cli(['vm', 'start', String(vm.vmid), '--move=sometimes']), 2, /--move/);
  });

  test('a move that fails: exit 1 with the reason; the VM is stopped on its node', async () => {
    const { a, b, vm } = await stranded();
    const f = await api(t(), admin.token).post('/admin/simulator/faults', { body: { node: b, action: 'move' } });
    assert.equal(f.status, 200, f.text);
    const r = await cli(['vm', 'start', String(vm.vmid), '--move', '--wait']);
    fails(r, 1, new RegExp(`VM ${vm.vmid} did not start: simulated move failure on ${b}`));
    const now = await vmOf(vm.id);
    assert.equal(now.status, 'stopped');
    assert.equal(now.node, a);
  });
});
