/**
 * Interrupting other customers is never free: a VM that preempted others pays
 * at least one billing period of itself, however soon it is destroyed. The
 * griefing loop (create an on-demand VM over interruptible ones, destroy it
 * before it runs, again) costs one period per round; a VM that preempted no
 * one still costs nothing until it runs; one that ran longer pays its usage.
 */
import { before, test } from 'node:test';
import assert from 'node:assert/strict';
import { describeEachDb } from '../helpers/app.js';
import { api, type RequestBody } from '../helpers/api.js';
import {
  advance,
  createApiKey,
  createNode,
  createUser,
  credit,
  uploadSshKey,
  type TestUser,
} from '../helpers/factories.js';
import { ledgerCheck } from '../../src/modules/billing/ledger-check.js';

describeEachDb('the minimum charge of a VM that interrupted others', (t) => {
  let admin: TestUser;
  let victim: TestUser;
  let griefer: TestUser;
  let node: string;

  type VmBody = RequestBody<'/vms', 'post'>;
  // Clients are made per call: the third test swaps every user's token for an API key.
  const create = async (u: TestUser, rental: NonNullable<VmBody['rental_type']>, gpus: VmBody['gpu_count'] = 1) => {
    const r = await api(t(), u.token).post('/vms', {
      body: { node, gpu_type: '4090', gpu_count: gpus, storage_gb: 50, template_vmid: 100, rental_type: rental },
    });
    assert.equal(r.status, 201, r.text);
    return r;
  };
  const balance = async (u: TestUser): Promise<number> => {
    const r = await api(t(), u.token).get('/billing/balance');
    assert.equal(r.status, 200, r.text);
    return r.body.balance;
  };
  const statusOf = async (u: TestUser, id: string): Promise<string> => {
    const r = await api(t(), u.token).get('/vms/{vm_id}', { params: { vm_id: id } });
    assert.equal(r.status, 200, r.text);
    return r.body.status;
  };
  const destroy = (u: TestUser, id: string) => api(t(), u.token).delete('/vms/{vm_id}', { params: { vm_id: id } });
  const transactions = async (u: TestUser) => {
    const r = await api(t(), u.token).get('/billing/transactions');
    assert.equal(r.status, 200, r.text);
    return r.body;
  };

  before(async () => {
    admin = await createUser(t(), { admin: true });
    victim = await createUser(t());
    griefer = await createUser(t());
    for (const u of [victim, griefer]) {
      await credit(t(), admin.token, u.id, 100);
      await uploadSshKey(t(), u.token);
    }
    node = (await createNode(t(), admin.token, { gpu_count: 2 })).node;
  });

  test('the griefing loop costs one billing period per round; the victims lost nothing', async () => {
    const spots = [(await create(victim, 'interruptible')).body.id, (await create(victim, 'interruptible')).body.id];
    await advance(t(), admin.token, 5);
    for (const id of spots) assert.equal(await statusOf(victim, id), 'running');
    const start = await balance(griefer);
    let perRound = 0;
    for (let round = 0; round < 3; round++) {
      const od = await create(griefer, 'on_demand', 2); // takes both GPUs: both spot VMs are interrupted
      perRound = od.body.hourly_rate;
      for (const id of spots) assert.equal(await statusOf(victim, id), 'interrupted');
      assert.equal((await destroy(griefer, od.body.id)).status, 200);
      await advance(t(), admin.token, 5); // the spot VMs come back
      for (const id of spots) assert.equal(await statusOf(victim, id), 'running');
    }
    const spent = Math.round((start - (await balance(griefer))) * 1e6);
    assert.equal(
      spent,
      Math.round(3 * perRound * 1e6),
      'three rounds cost three hours of the VM (the billing period is one hour)',
    );
    const tx = await transactions(griefer);
    const minimums = tx.filter((x) => /Minimum charge/.test(x.description));
    assert.equal(minimums.length, 3);
    assert.deepEqual(await ledgerCheck(t().db), []);
    for (const id of spots) await destroy(victim, id);
    await advance(t(), admin.token, 1);
  });

  test('a VM that interrupted no one costs nothing if destroyed before it runs', async () => {
    const start = await balance(griefer);
    const od = await create(griefer, 'on_demand', 2);
    assert.equal((await destroy(griefer, od.body.id)).status, 200);
    await advance(t(), admin.token, 1);
    assert.equal(await balance(griefer), start);
  });

  test('a VM that interrupted others and ran past the period pays its usage and nothing more', async () => {
    // Sessions last an hour of service time: this test spans two, so everyone uses API keys.
    for (const u of [victim, griefer, admin]) u.token = await createApiKey(t(), u.token, 'read_write');
    const spot = (await create(victim, 'interruptible')).body.id;
    await advance(t(), admin.token, 5);
    const start = await balance(griefer);
    const od = await create(griefer, 'on_demand', 2);
    assert.equal(await statusOf(victim, spot), 'interrupted');
    await advance(t(), admin.token, 2 * 3600);
    assert.equal((await destroy(griefer, od.body.id)).status, 200);
    await advance(t(), admin.token, 1);
    const tx = await transactions(griefer);
    assert.equal(
      tx.filter(
        (x) => /Minimum charge/.test(x.description) && Date.parse(x.created_at) > Date.parse(od.body.created_at),
      ).length,
      0,
    );
    assert.ok(start - (await balance(griefer)) > od.body.hourly_rate, 'it paid its usage');
    await destroy(victim, spot);
    await advance(t(), admin.token, 1);
    assert.deepEqual(await ledgerCheck(t().db), []);
  });
});
