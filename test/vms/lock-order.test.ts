/**
 * One lock order for every transaction on VMs and money (docs/billing.md#lock-order):
 * node, VM, meter, reservation, balance. Flows that used to take them in
 * opposite orders run at the same time on PostgreSQL, round after round: a
 * start and a stop of the same VM (the start took the balance before the VM,
 * the stop's charge takes it after), a node going offline and back (node
 * before VMs) against starts (VM before node), a suspension (which stops the
 * user's VMs) against the user's starts and stops, and a create that preempts
 * the VMs of users on both sides of its own user's id against the interval
 * close (which takes balances in id order). No transaction may deadlock (a deadlock would be retried
 * and pass unseen: the database counts them), and the money and the GPUs add
 * up afterwards.
 *
 * Skipped unless DATABASE_URL is set.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import type { PostgresDb } from '../../src/db/db.js';
import { buildTestApp, type TestApp } from '../helpers/app.js';
import { api, type RequestBody } from '../helpers/api.js';
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
  'flows that took VMs, nodes and balances in opposite orders run together without a deadlock',
  { skip },
  async () => {
    const admin = await createUser(t, { admin: true });
    const adminKey = await createApiKey(t, admin.token, 'read_write');
    const { node } = await createNode(t, adminKey, { gpu_type: '4090', gpu_count: 8 });
    const users = [await createUser(t), await createUser(t)];
    const keys: string[] = [];
    for (const u of users) {
      await credit(t, adminKey, u.id, 1000);
      keys.push(await createApiKey(t, u.token, 'read_write'));
    }
    const body: RequestBody<'/vms', 'post'> = {
      node,
      gpu_type: '4090',
      gpu_count: 1,
      storage_gb: 50,
      template_vmid: 100,
      auth_method: 'password',
      password: 'a-vm-password-1234',
    };
    const vms: { id: string; key: string }[] = [];
    for (const key of keys) {
      for (let i = 0; i < 2; i++) {
        const r = await api(t, key).post('/vms', { body });
        assert.equal(r.status, 201, r.text);
        vms.push({ id: r.body.id, key });
      }
    }
    await t.services.clock.advance(1);
    const db = t.db as PostgresDb;
    const deadlocksBefore = db.deadlocksRetried;
    const statuses = new Set<number>();
    /** Records the status of a request already sent (`what` names it in the message). */
    const act = async (what: string, sent: Promise<{ status: number; text: string }>) => {
      const r = await sent;
      statuses.add(r.status);
      assert.ok(r.status < 500, `${what}: ${r.status} ${r.text}`);
    };
    const setNode = (status: 'offline' | 'active') =>
      act(
        `PATCH /admin/nodes/${node}`,
        api(t, adminKey).patch('/admin/nodes/{node}', { params: { node }, body: { status } }),
      );

    for (let round = 0; round < 12; round++) {
      await Promise.all([
        ...vms.flatMap((v) => {
          const c = api(t, v.key);
          const vm = { params: { vm_id: v.id } };
          return [
            act(`POST /vms/${v.id}/stop`, c.post('/vms/{vm_id}/stop', vm)),
            act(`POST /vms/${v.id}/start`, c.post('/vms/{vm_id}/start', vm)),
          ];
        }),
        setNode(round % 2 === 0 ? 'offline' : 'active'),
        // A suspension stops the user's running VMs while those VMs are started and stopped.
        act(
          `PATCH /admin/users/${users[1]!.id}`,
          api(t, adminKey).patch('/admin/users/{user_id}', {
            params: { user_id: users[1]!.id },
            body: { suspended: round % 2 === 0 },
          }),
        ),
      ]);
      await setNode('active');
      await t.services.clock.advance(600);
    }

    assert.equal(db.deadlocksRetried - deadlocksBefore, 0, 'no transaction deadlocked');
    assert.ok(statuses.has(200) && statuses.has(400), `both successes and refusals happened: ${[...statuses]}`);
    // The node never held more GPUs than it has, and every balance is the sum of its ledger.
    const held = await t.db.query<{ n: number }>(
      'SELECT COALESCE(SUM(gpu_count), 0)::int8 AS n FROM vms WHERE node = $1 AND holds_gpus',
      [node],
    );
    assert.ok(held.rows[0]!.n <= 8);
    const drift = await t.db.query<{ id: number }>(
      `SELECT b.user_id FROM balances b WHERE b.balance_micros <> (SELECT COALESCE(SUM(amount_micros), 0) FROM transactions x WHERE x.user_id = b.user_id)`,
    );
    assert.deepEqual(drift.rows, []);
  },
);

test(
  'a create preempting VMs of users on both sides of its own id runs beside closes, stops and starts without a deadlock',
  { skip },
  async () => {
    const admin = await createUser(t, { admin: true });
    const adminKey = await createApiKey(t, admin.token, 'read_write');
    const { node: shared } = await createNode(t, adminKey, { gpu_type: '4090', gpu_count: 4 });
    const { node: other } = await createNode(t, adminKey, { gpu_type: '4090', gpu_count: 8 });
    // User ids follow creation: low < creator < high.
    const [low, creator, high] = [await createUser(t), await createUser(t), await createUser(t)];
    const keyOf = new Map<number, string>();
    for (const u of [low, creator, high]) {
      await credit(t, adminKey, u.id, 1000);
      keyOf.set(u.id, await createApiKey(t, u.token, 'read_write'));
    }
    const vmBody = (node: string, more: Partial<RequestBody<'/vms', 'post'>> = {}): RequestBody<'/vms', 'post'> => ({
      node,
      gpu_type: '4090',
      gpu_count: 1,
      storage_gb: 50,
      template_vmid: 100,
      auth_method: 'password',
      password: 'a-vm-password-1234',
      ...more,
    });
    const make = async (key: string, body: RequestBody<'/vms', 'post'>) => {
      const r = await api(t, key).post('/vms', { body });
      assert.equal(r.status, 201, r.text);
      return r.body.id;
    };
    // The victims: two interruptible VMs each of low and high fill the shared node; every user also has an
    // on-demand VM elsewhere, so that each close charges all three.
    const victims: { id: string; key: string }[] = [];
    const others: { id: string; key: string }[] = [];
    for (const u of [low, high]) {
      const key = keyOf.get(u.id)!;
      for (let i = 0; i < 2; i++) {
        victims.push({ id: await make(key, vmBody(shared, { rental_type: 'interruptible' })), key });
      }
    }
    for (const u of [low, creator, high]) {
      const key = keyOf.get(u.id)!;
      others.push({ id: await make(key, vmBody(other)), key });
    }
    await t.services.clock.advance(1);
    const db = t.db as PostgresDb;
    const deadlocksBefore = db.deadlocksRetried;
    const creatorApi = api(t, keyOf.get(creator.id)!);
    let preempted = 0;

    for (let round = 0; round < 10; round++) {
      const [made] = await Promise.all([
        // Four GPUs on the full shared node: all four victims are preempted, owned by users below and above.
        creatorApi.post('/vms', { body: vmBody(shared, { gpu_count: 4 }) }),
        // The interval close of every VM, balances taken in id order.
        t.services.clock.advance(3600),
        ...others.map((v, i) => {
          const c = api(t, v.key);
          const vm = { params: { vm_id: v.id } };
          return round % 2 === i % 2 ? c.post('/vms/{vm_id}/stop', vm) : c.post('/vms/{vm_id}/start', vm);
        }),
      ]);
      assert.ok(made.status === 201 || made.status === 400, `POST /vms: ${made.status} ${made.text}`);
      if (made.status !== 201) continue;
      preempted++;
      const gone = await creatorApi.delete('/vms/{vm_id}', { params: { vm_id: made.body.id } });
      assert.equal(gone.status, 200, gone.text);
      // The victims come back (auto-restart) once the GPUs are free again.
      await t.services.clock.advance(1);
    }

    assert.equal(db.deadlocksRetried - deadlocksBefore, 0, 'no transaction deadlocked');
    assert.ok(preempted >= 5, `the create preempted in ${preempted} of 10 rounds`);
    const interruptions = await t.db.query<{ n: number }>(
      'SELECT count(*)::int8 AS n FROM interruptions WHERE interruptible_vm_id = ANY($1::uuid[])',
      [victims.map((v) => v.id)],
    );
    assert.equal(interruptions.rows[0]!.n, preempted * 4);
    const drift = await t.db.query<{ id: number }>(
      `SELECT b.user_id FROM balances b WHERE b.balance_micros <> (SELECT COALESCE(SUM(amount_micros), 0) FROM transactions x WHERE x.user_id = b.user_id)`,
    );
    assert.deepEqual(drift.rows, []);
  },
);
