/**
 * Events: each change a customer cares about writes one, in the change's
 * transaction, and GET /events reads them back oldest first after a cursor,
 * filtered by type and VM; operators also see their nodes'.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { describeEachDb, type TestApp } from '../helpers/app.js';
import {
  challengeOf,
  createApiKey,
  createNode,
  createUser,
  credit,
  tokensOf,
  uploadSshKey,
  type TestUser,
} from '../helpers/factories.js';
import { api, type BodyFor, type RequestBody } from '../helpers/api.js';
import { stepAt, totpAt } from '../../src/modules/auth/totp.js';

const H = 3600;
const VM_PASSWORD = 'a-vm-password-1234';
type Ev = BodyFor<'/events', 'get', 200>[number];
type EventQuery = Record<string, string | number | string[]>;

async function events(t: TestApp, token: string, query: EventQuery = {}): Promise<Ev[]> {
  const r = await api(t, token).get('/events', { rawQuery: query });
  assert.equal(r.status, 200, r.text);
  return r.body;
}

/** Every event of the caller after `after`, through pages of `limit`. */
async function allEvents(t: TestApp, token: string, after?: string, limit = 200): Promise<Ev[]> {
  const out: Ev[] = [];
  for (let cursor = after; ;) {
    const page = await events(t, token, { limit, ...(cursor ? { after: cursor } : {}) });
    out.push(...page);
    if (page.length < limit) return out;
    cursor = page[page.length - 1]!.id;
  }
}

const statusChanges = (evs: Ev[], vmId: string) =>
  evs
    .filter((e) => e.type === 'vm.status_changed' && e.vm_id === vmId)
    .map((e) => `${e.data.from}>${e.data.to}:${e.data.reason}`);

async function launch(t: TestApp, key: string, node: string, over: Partial<RequestBody<'/vms', 'post'>> = {}) {
  const r = await api(t, key).post('/vms', {
    body: {
      node,
      gpu_type: '4090',
      gpu_count: 4,
      storage_gb: 50,
      template_vmid: 100,
      auth_method: 'password',
      password: VM_PASSWORD,
      ...over,
    },
  });
  assert.equal(r.status, 201, r.text);
  return r.body;
}

describeEachDb('events', (t) => {
  let admin: TestUser;
  let adminKey: string;
  let u: TestUser;
  let key: string;
  let node: string;
  const advance = (s: number) => t().services.clock.advance(s);

  test('a login, keys, credit: each writes its event, oldest first', async () => {
    admin = await createUser(t(), { admin: true });
    adminKey = await createApiKey(t(), admin.token, 'read_write', 'admin');
    u = await createUser(t());
    const login = await api(t()).post('/auth/login', {
      body: { email: u.email, password: u.password },
      headers: { 'user-agent': 'events-test/1.0' },
    });
    assert.equal(login.status, 200);
    key = await createApiKey(t(), u.token, 'read_write', 'main');
    const child = await api(t(), key).post('/api-keys', { body: { name: 'child', scope: 'read_only' } });
    assert.equal(child.status, 201);
    const parent = await api(t(), u.token).post('/api-keys', { body: { name: 'parent', scope: 'read_write' } });
    assert.equal(parent.status, 201, parent.text);
    const grandchild = await api(t(), parent.body.key).post('/api-keys', {
      body: { name: 'grandchild', scope: 'read_only' },
    });
    assert.equal(grandchild.status, 201, grandchild.text);
    const revokedParent = await api(t(), u.token).delete('/api-keys/{key_id}', { params: { key_id: parent.body.id } });
    assert.equal(revokedParent.status, 204);
    const sshId = await uploadSshKey(t(), key);
    assert.equal((await api(t(), key).delete('/ssh-keys/{key_id}', { params: { key_id: sshId } })).status, 204);
    await credit(t(), adminKey, u.id, 500);

    const evs = await allEvents(t(), key);
    assert.deepEqual(
      evs.map((e) => e.type),
      [
        'account.login',
        'account.login',
        'api_key.created',
        'api_key.created',
        'api_key.created',
        'api_key.created',
        'api_key.revoked',
        'api_key.revoked',
        'ssh_key.created',
        'ssh_key.deleted',
        'billing.credit_added',
      ],
    );
    const logins = evs.filter((e) => e.type === 'account.login');
    assert.equal(logins[1]!.data.user_agent, 'events-test/1.0');
    assert.equal(typeof logins[1]!.data.ip, 'string');
    assert.equal(logins[1]!.data.second_factor, false);
    const revoked = evs
      .filter((e) => e.type === 'api_key.revoked')
      .map((e) => e.data.api_key_id)
      .sort();
    assert.deepEqual(revoked, [parent.body.id, grandchild.body.id].sort(), 'the key and the key made with it');
    assert.equal(evs.at(-1)!.data.amount, 500);
    assert.equal(evs.at(-1)!.data.balance, 500);
    for (const e of evs) {
      assert.equal(e.vm_id, null);
      assert.equal(e.created_at, new Date(Date.parse(e.created_at)).toISOString());
    }
    // Nobody else sees them.
    const other = await createUser(t());
    assert.deepEqual(
      (await events(t(), other.token)).map((e) => e.type),
      ['account.login'],
    );
  });

  test("a VM's life: created, every status change with its reason, interrupted, restarted, destroyed", async () => {
    ({ node } = await createNode(t(), adminKey, { gpu_type: '4090', gpu_count: 8 }));
    const since = (await allEvents(t(), key)).at(-1)!.id;
    const spot = await launch(t(), key, node, { rental_type: 'interruptible' });
    const a = await launch(t(), key, node);
    await advance(0);
    // `a` took 4 GPUs that were free: spot keeps running. A second on-demand VM preempts it.
    const b = await launch(t(), key, node);
    await advance(0);
    assert.equal((await api(t(), key).post('/vms/{vm_id}/stop', { params: { vm_id: a.id } })).status, 200);
    await advance(60); // a stopped on-demand VM frees its GPUs: spot restarts
    assert.equal((await api(t(), key).delete('/vms/{vm_id}', { params: { vm_id: b.id } })).status, 200);
    const evs = await allEvents(t(), key, since);

    assert.deepEqual(
      evs.filter((e) => e.type === 'vm.created').map((e) => [e.vm_id, e.data.rental_type]),
      [
        [spot.id, 'interruptible'],
        [a.id, 'on_demand'],
        [b.id, 'on_demand'],
      ],
    );
    assert.deepEqual(statusChanges(evs, a.id), [
      'creating>starting:provisioned',
      'starting>running:started',
      'running>stopping:user',
      'stopping>stopped:stopped',
    ]);
    assert.deepEqual(statusChanges(evs, b.id).slice(-1), ['running>destroyed:user']);
    assert.deepEqual(
      evs.filter((e) => e.type === 'vm.destroyed').map((e) => [e.vm_id, e.data.reason]),
      [[b.id, 'user']],
    );
    const interrupted = evs.filter((e) => e.type === 'vm.interrupted');
    assert.deepEqual(
      interrupted.map((e) => [e.vm_id, e.data.auto_restart]),
      [[spot.id, true]],
    );
    assert.ok(statusChanges(evs, spot.id).some((s) => s.endsWith(':preempted')));
    assert.deepEqual(
      evs.filter((e) => e.type === 'vm.restarted').map((e) => e.vm_id),
      [spot.id],
    );
    assert.ok(
      statusChanges(evs, spot.id).some((s) => s === 'interrupted>starting:auto_restart'),
      JSON.stringify(statusChanges(evs, spot.id)),
    );
    // Written in order: each VM's events follow its history.
    const seen = evs.filter((e) => e.vm_id === spot.id).map((e) => e.type);
    assert.equal(seen[0], 'vm.created');
    assert.ok(seen.indexOf('vm.interrupted') < seen.indexOf('vm.restarted'));

    // Filters: one VM, some types (repeated or comma-separated), a page size.
    const onlyA = await events(t(), key, { vm_id: a.id, limit: 200 });
    assert.ok(onlyA.length >= 5 && onlyA.every((e) => e.vm_id === a.id));
    const typed = await events(t(), key, { after: since, type: ['vm.created,vm.destroyed', 'vm.restarted'] });
    assert.deepEqual(
      typed.map((e) => e.type),
      ['vm.created', 'vm.created', 'vm.created', 'vm.restarted', 'vm.destroyed'],
    );
    const two = await events(t(), key, { after: since, limit: 2 });
    assert.deepEqual(
      two.map((e) => e.id),
      evs.slice(0, 2).map((e) => e.id),
    );
    assert.deepEqual(await events(t(), key, { after: evs.at(-1)!.id }), [], 'nothing after the last one');
    for (const vm of [spot, a]) {
      assert.equal((await api(t(), key).delete('/vms/{vm_id}', { params: { vm_id: vm.id } })).status, 200);
    }
  });

  test('money: low balance stops VMs with that reason; reservations are created, cancelled, used up and expire', async () => {
    const since = (await allEvents(t(), key)).at(-1)!.id;
    const r1 = await launch(t(), key, node, { gpu_count: 1, rental_type: 'reserved', reservation_months: 1 });
    await advance(0);
    const cancel = await api(t(), key).delete('/reservations/{reservation_id}', {
      params: { reservation_id: r1.reservation_id! },
    });
    assert.equal(cancel.status, 200, cancel.text);
    const r2 = await launch(t(), key, node, { gpu_count: 1, rental_type: 'reserved', reservation_months: 1 });
    await advance(0);
    // What is left of the deposit covers only part of the next hour.
    await t().db.query('UPDATE reservations SET remaining_micros = 1000 WHERE id = $1', [r2.reservation_id]);
    await advance(H);
    await advance(31 * 24 * H);
    const evs = await allEvents(t(), key, since);
    assert.deepEqual(
      evs.filter((e) => e.type.startsWith('reservation.')).map((e) => [e.type, e.data.reservation_id]),
      [
        ['reservation.created', r1.reservation_id],
        ['reservation.cancelled', r1.reservation_id],
        ['reservation.created', r2.reservation_id],
        ['reservation.exhausted', r2.reservation_id],
        ['reservation.expired', r2.reservation_id],
      ],
    );
    const cancelled = evs.find((e) => e.type === 'reservation.cancelled')!;
    assert.equal(cancelled.data.reason, 'user');
    assert.ok((cancelled.data.refund as number) > 0 && (cancelled.data.cancellation_fee as number) > 0);
    assert.equal(evs.find((e) => e.type === 'reservation.expired')!.data.status, 'converted_to_on_demand');

    // 500 of credit does not last a month of two VMs: the charge that crossed zero stopped both, with that reason.
    assert.equal(evs.filter((e) => e.type === 'billing.low_balance').length, 1);
    assert.ok(
      statusChanges(evs, r1.id).includes('running>stopping:low_balance'),
      JSON.stringify(statusChanges(evs, r1.id)),
    );
    assert.ok(
      statusChanges(evs, r2.id).includes('running>stopping:low_balance'),
      JSON.stringify(statusChanges(evs, r2.id)),
    );
    const last = evs.at(-1)!.id;
    await credit(t(), adminKey, u.id, -1);
    assert.deepEqual(await events(t(), key, { after: last }), [], 'an adjustment down is not a credit');
  });

  test('two-factor changes and a two-factor login are recorded', async () => {
    const since = (await allEvents(t(), key)).at(-1)!.id;
    const code = (secret: string) => totpAt(secret, stepAt(t().clock.nowMs()));
    const anon = api(t());
    const login = await anon.post('/auth/login', { body: { email: u.email, password: u.password } });
    assert.equal(login.status, 200, login.text);
    const fresh = api(t(), tokensOf(login.body).access_token);
    const s = await fresh.post('/auth/2fa/setup');
    assert.equal(s.status, 200, s.text);
    const secret = s.body.secret;
    assert.equal((await fresh.post('/auth/2fa/enable', { body: { code: code(secret) } })).status, 200);
    await advance(31);
    const ch = await anon.post('/auth/login', { body: { email: u.email, password: u.password } });
    assert.equal(ch.status, 200, ch.text);
    const v = await anon.post('/auth/2fa/verify', {
      body: { challenge_token: challengeOf(ch.body).challenge_token, code: code(secret) },
    });
    assert.equal(v.status, 200, v.text);
    await advance(31);
    const disable = await api(t(), v.body.access_token).post('/auth/2fa/disable', { body: { code: code(secret) } });
    assert.equal(disable.status, 200);
    const evs = await allEvents(t(), key, since);
    assert.deepEqual(
      evs.map((e) => [e.type, e.data.second_factor]),
      [
        ['account.login', false],
        ['account.2fa_enabled', undefined],
        ['account.login', true],
        ['account.2fa_disabled', undefined],
      ],
    );
  });

  test('operators see their nodes go offline and come back; customers do not', async () => {
    const since = (await allEvents(t(), adminKey)).at(-1)?.id;
    const ops = api(t(), adminKey);
    assert.equal(
      (await ops.patch('/admin/nodes/{node}', { params: { node }, body: { status: 'offline' } })).status,
      200,
    );
    assert.equal(
      (await ops.patch('/admin/nodes/{node}', { params: { node }, body: { status: 'active' } })).status,
      200,
    );
    const evs = (await allEvents(t(), adminKey, since)).filter((e) => e.type.startsWith('node.'));
    assert.deepEqual(
      evs.map((e) => [e.type, e.data.node, e.data.reason]),
      [
        ['node.offline', node, 'admin'],
        ['node.online', node, 'admin'],
      ],
    );
    assert.deepEqual(
      (await allEvents(t(), key)).filter((e) => e.type.startsWith('node.')),
      [],
    );
    // A customer cannot use an operator event as a cursor either.
    const r = await api(t(), key).get('/events', { query: { after: evs[0]!.id } });
    assert.equal(r.status, 422);
  });

  test('bad input and scopes', async () => {
    const bad = async (query: EventQuery, field: string) => {
      const r = await api(t(), key).get('/events', { rawQuery: query });
      assert.equal(r.status, 422, `${JSON.stringify(query)}: ${r.text}`);
      assert.equal(r.body.code, 'validation_error');
      assert.ok(
        r.body.errors?.some((e) => e.field.includes(field)),
        r.text,
      );
    };
    await bad({ type: 'vm.nope' }, 'type');
    await bad({ type: 'vm.created,,nope' }, 'type');
    await bad({ after: 'not-a-uuid' }, 'after');
    await bad({ after: '00000000-0000-4000-8000-000000000000' }, 'after');
    await bad({ limit: 0 }, 'limit');
    await bad({ limit: 201 }, 'limit');
    await bad({ vm_id: 42 }, 'vm_id');
    await bad({ colour: 'red' }, 'colour');
    assert.equal((await api(t()).get('/events')).status, 401);
    const ro = await createApiKey(t(), key, 'read_only', 'ro');
    assert.equal((await api(t(), ro).get('/events')).status, 200);
    const billing = await createApiKey(t(), key, 'billing_only', 'b');
    assert.equal((await api(t(), billing).get('/events')).status, 403);
  });
});
