/**
 * The GPU limit is on GPUs in use, whenever they are taken: a create, a
 * start and an automatic restart all meet it (docs/vms.md#limits-per-account).
 * Stopping VMs, creating others and starting the first ones again never puts
 * more GPUs in use than the limit. An automatic restart also needs the money
 * a manual start would.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { describeEachDb } from '../helpers/app.js';
import { api, type Api, type RequestBody } from '../helpers/api.js';
import { createNode, createUser, credit } from '../helpers/factories.js';

/** A VM's status as its owner reads it. */
async function statusOf(client: Api, vmId: string) {
  const r = await client.get('/vms/{vm_id}', { params: { vm_id: vmId } });
  assert.equal(r.status, 200, r.text);
  return r.body.status;
}

describeEachDb('the GPU limit at start and auto-restart', (t) => {
  const vmBody = (node: string, extra: Partial<RequestBody<'/vms', 'post'>> = {}): RequestBody<'/vms', 'post'> => ({
    node,
    gpu_type: '4090',
    gpu_count: 2,
    storage_gb: 50,
    template_vmid: 100,
    auth_method: 'password',
    password: 'a-vm-password-1234',
    ...extra,
  });

  test('a start that would put more GPUs in use than the limit is 400 limit_exceeded; within it, it starts', async () => {
    const admin = await createUser(t(), { admin: true });
    const { node } = await createNode(t(), admin.token, { gpu_count: 8 });
    const u = await createUser(t());
    await credit(t(), admin.token, u.id, 1000);
    const uc = api(t(), u.token);
    assert.equal(
      (
        await api(t(), admin.token).patch('/admin/users/{user_id}', {
          params: { user_id: u.id },
          body: { max_gpus: 2 },
        })
      ).status,
      200,
    );
    const a = await uc.post('/vms', { body: vmBody(node) });
    assert.equal(a.status, 201, a.text);
    const vmA = { params: { vm_id: a.body.id } };
    await t().services.clock.advance(1);
    assert.equal((await uc.post('/vms/{vm_id}/stop', vmA)).status, 200);
    await t().services.clock.advance(1);
    // Stopped, it holds no GPUs: another VM fits under the limit.
    const b = await uc.post('/vms', { body: vmBody(node) });
    assert.equal(b.status, 201, b.text);
    await t().services.clock.advance(1);

    const refused = await uc.post('/vms/{vm_id}/start', vmA);
    assert.equal(refused.status, 400, refused.text);
    assert.equal(refused.body.code, 'limit_exceeded');
    assert.match(refused.body.detail, /GPU limit reached: 2 of 2 GPUs in use, 2 requested/);
    const after = await uc.get('/vms/{vm_id}', vmA);
    assert.equal(after.status, 200, after.text);
    assert.equal(after.body.status, 'stopped', 'nothing changed');

    // Once the other VM's GPUs are free again, the start goes through.
    assert.equal((await uc.post('/vms/{vm_id}/stop', { params: { vm_id: b.body.id } })).status, 200);
    await t().services.clock.advance(1);
    const started = await uc.post('/vms/{vm_id}/start', vmA);
    assert.equal(started.status, 200, started.text);
  });

  test('an interrupted VM whose restart would exceed the limit stays interrupted until GPUs are free under it', async () => {
    const admin = await createUser(t(), { admin: true });
    const spotNode = (await createNode(t(), admin.token, { gpu_count: 2 })).node;
    const otherNode = (await createNode(t(), admin.token, { gpu_count: 8 })).node;
    const u = await createUser(t());
    const taker = await createUser(t());
    for (const x of [u, taker]) await credit(t(), admin.token, x.id, 1000);
    const uc = api(t(), u.token);
    assert.equal(
      (
        await api(t(), admin.token).patch('/admin/users/{user_id}', {
          params: { user_id: u.id },
          body: { max_gpus: 2 },
        })
      ).status,
      200,
    );
    const spot = await uc.post('/vms', { body: vmBody(spotNode, { rental_type: 'interruptible' }) });
    assert.equal(spot.status, 201, spot.text);
    const spotStatus = () => statusOf(uc, spot.body.id);
    await t().services.clock.advance(1);
    // Another user's on-demand VM takes the GPUs: the interruptible VM is interrupted and holds none.
    const demand = await uc.as(taker.token).post('/vms', { body: vmBody(spotNode) });
    assert.equal(demand.status, 201, demand.text);
    await t().services.clock.advance(1);
    assert.equal(await spotStatus(), 'interrupted');
    // Meanwhile the user takes their 2 GPUs elsewhere.
    const mine = await uc.post('/vms', { body: vmBody(otherNode) });
    assert.equal(mine.status, 201, mine.text);
    // The GPUs on the first node come free: the restart would put 4 in use, so it waits.
    assert.equal((await uc.as(taker.token).delete('/vms/{vm_id}', { params: { vm_id: demand.body.id } })).status, 200);
    await t().services.clock.advance(5);
    assert.equal(await spotStatus(), 'interrupted');
    // Under the limit again, it comes back on its own.
    assert.equal((await uc.delete('/vms/{vm_id}', { params: { vm_id: mine.body.id } })).status, 200);
    await t().services.clock.advance(5);
    assert.equal(await spotStatus(), 'running');
  });

  test('an interrupted VM whose owner cannot pay an hour stays interrupted, with nothing written, until credited', async () => {
    const admin = await createUser(t(), { admin: true });
    const spotNode = (await createNode(t(), admin.token, { gpu_count: 2 })).node;
    const u = await createUser(t());
    const taker = await createUser(t());
    await credit(t(), admin.token, taker.id, 1000);
    const uc = api(t(), u.token);
    // Exactly the hour a create needs: the interruption then charges the seconds it ran, leaving less.
    const body = vmBody(spotNode, { rental_type: 'interruptible' });
    const refused = await uc.post('/vms', { body });
    assert.equal(refused.status, 400, refused.text);
    const required = /required (\d+\.\d+)/.exec(refused.body.detail)?.[1];
    assert.ok(required, refused.body.detail);
    await credit(t(), admin.token, u.id, Number(required));
    const spot = await uc.post('/vms', { body });
    assert.equal(spot.status, 201, spot.text);
    const spotStatus = () => statusOf(uc, spot.body.id);
    const eventsOfSpot = async () => {
      const r = await uc.get('/events', { query: { vm_id: spot.body.id, limit: 200 } });
      assert.equal(r.status, 200, r.text);
      return r.body.map((e) => e.type);
    };
    await t().services.clock.advance(60);
    assert.equal(await spotStatus(), 'running');
    const demand = await uc.as(taker.token).post('/vms', { body: vmBody(spotNode) });
    assert.equal(demand.status, 201, demand.text);
    await t().services.clock.advance(1);
    assert.equal(await spotStatus(), 'interrupted');
    const balance = await uc.get('/billing/balance');
    assert.equal(balance.status, 200, balance.text);
    assert.ok(balance.body.balance < Number(required), `${balance.body.balance} is less than an hour`);

    // The GPUs come free, but an hour is not paid for: the restart is rolled back, event and all.
    assert.equal((await uc.as(taker.token).delete('/vms/{vm_id}', { params: { vm_id: demand.body.id } })).status, 200);
    const before = await eventsOfSpot();
    await t().services.clock.advance(5);
    assert.equal(await spotStatus(), 'interrupted');
    assert.deepEqual(await eventsOfSpot(), before, 'no status change and no vm.restarted were kept');

    await credit(t(), admin.token, u.id, 10);
    await t().services.clock.advance(5);
    assert.equal(await spotStatus(), 'running');
    assert.ok((await eventsOfSpot()).includes('vm.restarted'));
  });
});
