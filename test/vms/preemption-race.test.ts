/**
 * An on-demand create that needs to preempt, racing an interruptible VM that
 * starts stopping (PostgreSQL: the stop holds the VM's row lock in another
 * connection while the create runs). A stopping VM still holds its GPUs but
 * can no longer be preempted, so the create must not count on its GPUs: it is
 * refused with gpu_unavailable, and the node never holds more GPUs than it
 * has. (The create used to count the VM as preemptible from a read taken
 * before it locked it, and overcommitted the node until the VM stopped.)
 *
 * Skipped unless DATABASE_URL is set.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { buildTestApp, type TestApp } from '../helpers/app.js';
import { api, type Op, type ReplyOf, type RequestBody } from '../helpers/api.js';
import { createApiKey, createNode, createUser, credit } from '../helpers/factories.js';

const skip = process.env.DATABASE_URL ? false : 'needs DATABASE_URL';
let t: TestApp;

before(async () => {
  if (!skip) t = await buildTestApp('postgres');
});
after(async () => {
  await t?.close();
});

test(
  'a VM that starts stopping while an on-demand create counts on preempting it is not counted on',
  { skip },
  async () => {
    const admin = await createUser(t, { admin: true });
    const adminKey = await createApiKey(t, admin.token, 'read_write');
    const { node } = await createNode(t, adminKey, { gpu_type: '4090', gpu_count: 4 });
    const spot = await createUser(t);
    const demand = await createUser(t);
    for (const u of [spot, demand]) await credit(t, adminKey, u.id, 1000);
    const body: RequestBody<'/vms', 'post'> = {
      node,
      gpu_type: '4090',
      gpu_count: 4,
      storage_gb: 50,
      template_vmid: 100,
      auth_method: 'password',
      password: 'a-vm-password-1234',
    };
    const victim = await api(t, spot.token).post('/vms', { body: { ...body, rental_type: 'interruptible' } });
    assert.equal(victim.status, 201, victim.text);
    await t.services.clock.advance(60);

    const other = await t.testDb.openAnother();
    let answer: ReplyOf<Op<'/vms', 'post'>> | undefined;
    await other.transaction(async (tx) => {
      // The stop's transaction: the VM's row is locked and becomes stopping, not yet committed.
      await tx.query(`UPDATE vms SET status = 'stopping' WHERE id = $1`, [victim.body.id]);
      void api(t, demand.token)
        .post('/vms', { body })
        .then((a) => (answer = a));
      await new Promise((r) => setTimeout(r, 500)); // the create reads the usage and waits on the VM's lock
      assert.equal(answer, undefined, 'the create waits for the stop to commit');
    });
    for (const until = Date.now() + 10_000; !answer && Date.now() < until;) await new Promise((r) => setTimeout(r, 20));
    assert.ok(answer, 'the create answered once the stop committed');
    assert.equal(answer.status, 400, answer.text);
    assert.equal(answer.body.code, 'gpu_unavailable');
    const held = await t.db.query<{ n: string }>(
      'SELECT coalesce(sum(gpu_count), 0) AS n FROM vms WHERE node = $1 AND holds_gpus',
      [node],
    );
    assert.equal(Number(held.rows[0]!.n), 4, 'the node holds no more GPUs than it has');
    const vm = await api(t, spot.token).get('/vms/{vm_id}', { params: { vm_id: victim.body.id } });
    assert.equal(vm.status, 200, vm.text);
    assert.equal(vm.body.status, 'stopping', 'the stopping VM was not preempted');
  },
);
