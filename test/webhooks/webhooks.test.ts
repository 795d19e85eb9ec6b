/**
 * Webhooks: managing endpoints (every rule, every refusal, another user's
 * endpoints), and delivering events to real receivers on loopback, checked
 * with the `standardwebhooks` package as a customer's receiver would:
 * filtering, retries with backoff, giving up, turning a failing endpoint off,
 * secret rotation, tests, redirects, timeouts, order per VM, and two
 * instances delivering at once.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { describeEachDb, JWT_SECRET } from '../helpers/app.js';
import { createApiKey, createNode, createUser, credit, type TestUser } from '../helpers/factories.js';
import { startReceiver, type Receiver } from '../helpers/receiver.js';
import { api, type BodyFor, type Op, type RequestBody } from '../helpers/api.js';
import { DISABLE_AFTER_MS, RETRY_DELAYS_MS, WebhookService } from '../../src/modules/webhooks/service.js';

/** An endpoint as POST /webhooks answers it (with its secret). */
type Hook = BodyFor<'/webhooks', 'post', 201>;
/** One delivery attempt, as GET /webhooks/{webhook_id}/deliveries lists it. */
type Attempt = BodyFor<'/webhooks/{webhook_id}/deliveries', 'get', 200>[number];

describeEachDb(
  'webhooks: delivery',
  (t) => {
    let rec: Receiver;
    let u: TestUser;
    let key: string;
    let admin: TestUser;
    let adminKey: string;
    const deliver = () => t().services.webhooks.deliverDue();
    const advance = (s: number) => t().services.clock.advance(s);

    before(async () => {
      rec = await startReceiver();
      admin = await createUser(t(), { admin: true });
      adminKey = await createApiKey(t(), admin.token, 'read_write', 'admin');
      u = await createUser(t());
      key = await createApiKey(t(), u.token, 'read_write', 'main');
    });
    after(async () => rec.close());

    async function hook(body: RequestBody<'/webhooks', 'post'>, token = key): Promise<Hook> {
      const r = await api(t(), token).post('/webhooks', { body });
      assert.equal(r.status, 201, r.text);
      t().forbidSecret(r.body.secret);
      return r.body;
    }
    const attempts = async (id: string, token = key): Promise<Attempt[]> => {
      const r = await api(t(), token).get('/webhooks/{webhook_id}/deliveries', {
        params: { webhook_id: id },
        query: { limit: 100 },
      });
      assert.equal(r.status, 200, r.text);
      return r.body;
    };
    /** An event of the user's: an SSH-less, harmless one (an API key made). */
    const makeEvent = async () => {
      const r = await api(t(), key).post('/api-keys', { body: { name: 'ev', scope: 'read_only' } });
      assert.equal(r.status, 201, r.text);
      return r.body.id;
    };
    const remove = async (id: string) =>
      assert.equal((await api(t(), key).delete('/webhooks/{webhook_id}', { params: { webhook_id: id } })).status, 204);
    /** GET /webhooks/{webhook_id} with the user's key. */
    const getHook = async (id: string) => {
      const r = await api(t(), key).get('/webhooks/{webhook_id}', { params: { webhook_id: id } });
      assert.equal(r.status, 200, r.text);
      return r.body;
    };
    /** GET /events with the user's key. */
    const events = async (query: NonNullable<Op<'/events', 'get'>['parameters']['query']>) => {
      const r = await api(t(), key).get('/events', { query });
      assert.equal(r.status, 200, r.text);
      return r.body;
    };

    test('an event reaches its endpoint once, signed, in the documented envelope, and the attempt is listed', async () => {
      rec.received.length = 0;
      rec.answer = () => 204;
      const h = await hook({ url: `${rec.url}/a`, description: 'main' });
      const keyId = await makeEvent();
      assert.equal(await deliver(), 1);
      assert.equal(await deliver(), 0, 'a delivered event is not sent again');
      assert.equal(rec.received.length, 1);
      const got = rec.received[0]!;
      assert.equal(got.path, '/a');
      assert.equal(got.headers['content-type'], 'application/json');
      const payload = rec.verify(got, h.secret);
      assert.equal(payload.type, 'api_key.created');
      assert.equal(payload.data.type, 'api_key.created');
      assert.equal(payload.data.id, got.headers['webhook-id'], 'webhook-id is the event id');
      assert.equal(payload.data.data.api_key_id, keyId);
      assert.equal(payload.timestamp, payload.data.created_at);
      assert.equal(payload.data.vm_id, null);
      assert.match(String(got.headers['webhook-signature']), /^v1,[A-Za-z0-9+/]+=*$/, 'one signature');
      // The event is the one GET /events gives.
      const evs = await events({ type: ['api_key.created'] });
      assert.deepEqual(evs.at(-1), payload.data);
      const list = await attempts(h.id);
      assert.equal(list.length, 1);
      assert.deepEqual(
        {
          event_id: list[0]!.event_id,
          event_type: list[0]!.event_type,
          attempt: list[0]!.attempt,
          status_code: list[0]!.status_code,
          error: list[0]!.error,
          outcome: list[0]!.outcome,
          next: list[0]!.next_attempt_at,
        },
        {
          event_id: payload.data.id,
          event_type: 'api_key.created',
          attempt: 1,
          status_code: 204,
          error: null,
          outcome: 'succeeded',
          next: null,
        },
      );
      // A wrong secret does not verify.
      const other = await hook({ url: `${rec.url}/other`, event_types: ['vm.destroyed'] });
      assert.throws(() => rec.verify(got, other.secret));
      await remove(other.id);
      await remove(h.id);
    });

    test("an endpoint receives only the types it asked for; another user's events never", async () => {
      rec.received.length = 0;
      rec.answer = () => 200;
      const h = await hook({ url: `${rec.url}/typed`, event_types: ['api_key.revoked'] });
      const stranger = await createUser(t());
      const strangerKey = await createApiKey(t(), stranger.token, 'read_write');
      await api(t(), key).delete('/api-keys/{key_id}', { params: { key_id: await makeEvent() } });
      await api(t(), strangerKey).post('/api-keys', { body: { name: 'x' } });
      await deliver();
      assert.deepEqual(
        rec.received.map((r) => rec.verify(r, h.secret).type),
        ['api_key.revoked'],
      );
      await remove(h.id);
    });

    test('a failed attempt is retried after the documented delays, then given up and recorded', async () => {
      rec.received.length = 0;
      rec.answer = () => 503;
      const h = await hook({ url: `${rec.url}/down`, event_types: ['api_key.created'] });
      await makeEvent();
      assert.equal(await deliver(), 1);
      for (let i = 0; i < RETRY_DELAYS_MS.length; i++) {
        const [last] = await attempts(h.id);
        assert.equal(last!.outcome, 'retrying');
        assert.equal(last!.status_code, 503);
        assert.equal(last!.error, 'HTTP 503');
        const wait = RETRY_DELAYS_MS[i]! / 1000;
        // Not before its time...
        await advance(wait - 1);
        assert.equal(await deliver(), 0, `attempt ${i + 2} waits ${wait} s`);
        // ...and at it.
        await advance(1);
        assert.equal(await deliver(), 1, `attempt ${i + 2} after ${wait} s`);
      }
      const list = await attempts(h.id);
      assert.equal(list.length, RETRY_DELAYS_MS.length + 1);
      assert.deepEqual(
        list.map((a) => a.attempt),
        Array.from({ length: RETRY_DELAYS_MS.length + 1 }, (_, i) => RETRY_DELAYS_MS.length + 1 - i),
      );
      assert.equal(list[0]!.outcome, 'given_up');
      assert.equal(list[0]!.next_attempt_at, null);
      await advance(86_400);
      assert.equal(await deliver(), 0, 'a given-up delivery is never tried again');
      assert.equal(rec.received.length, RETRY_DELAYS_MS.length + 1);
      const ids = new Set(rec.received.map((r) => r.headers['webhook-id']));
      assert.equal(ids.size, 1, 'every attempt carries the same webhook-id');
      await remove(h.id);
    });

    test('a delivery that comes back 2xx later succeeds, and the endpoint counts as healthy again', async () => {
      rec.received.length = 0;
      rec.answer = (_r, n) => (n === 0 ? 500 : 200);
      const h = await hook({ url: `${rec.url}/flaky`, event_types: ['api_key.created'] });
      await makeEvent();
      await deliver();
      let w = await getHook(h.id);
      assert.ok(w.failing_since, 'failing since the first failure');
      await advance(5);
      await deliver();
      w = await getHook(h.id);
      assert.equal(w.failing_since, null);
      assert.deepEqual(
        (await attempts(h.id)).map((a) => a.outcome),
        ['succeeded', 'retrying'],
      );
      await remove(h.id);
    });

    test('an endpoint failing for 5 days is turned off, with an event; turning it back on starts afresh', async () => {
      rec.received.length = 0;
      rec.answer = (r) => (r.path === '/dead' ? 500 : 200);
      const dead = await hook({ url: `${rec.url}/dead`, event_types: ['api_key.created'] });
      const watcher = await hook({ url: `${rec.url}/watch`, event_types: ['webhook.disabled'] });
      await makeEvent();
      await deliver();
      // Fails on and on: new events keep coming, each retried, for 5 days.
      for (let day = 1; day <= 5; day++) {
        await advance(DISABLE_AFTER_MS / 5 / 1000);
        await makeEvent();
        while ((await deliver()) > 0);
      }
      const w = await getHook(dead.id);
      assert.equal(w.enabled, false);
      assert.equal(w.disabled_reason, 'failing');
      const evs = await events({ type: ['webhook.disabled'] });
      assert.equal(evs.length, 1);
      const disabled = evs[0]!;
      assert.equal(disabled.data.webhook_id, dead.id);
      assert.equal('url' in disabled.data, false, 'not the URL: read_only keys read events');
      const told = rec.received.filter((r) => r.path === '/watch').map((r) => rec.verify(r, watcher.secret));
      assert.deepEqual(
        told.map((p) => [p.type, p.data.data.webhook_id]),
        [['webhook.disabled', dead.id]],
        "the owner's other endpoint hears of it",
      );
      // Off: nothing is queued or sent for it.
      const before = rec.received.filter((r) => r.path === '/dead').length;
      await makeEvent();
      await advance(86_400);
      while ((await deliver()) > 0);
      assert.equal(rec.received.filter((r) => r.path === '/dead').length, before);
      // Back on, fixed: events from now on arrive.
      rec.answer = () => 200;
      const on = await api(t(), key).patch('/webhooks/{webhook_id}', {
        params: { webhook_id: dead.id },
        body: { enabled: true },
      });
      assert.equal(on.status, 200, on.text);
      assert.deepEqual([on.body.enabled, on.body.disabled_reason, on.body.failing_since], [true, null, null]);
      await makeEvent();
      await deliver();
      assert.equal(rec.received.filter((r) => r.path === '/dead').length, before + 1);
      await remove(dead.id);
      await remove(watcher.id);
    });

    test('a rotated secret: both sign for 24 hours, then only the new one', async () => {
      rec.received.length = 0;
      rec.answer = () => 200;
      const h = await hook({ url: `${rec.url}/rot`, event_types: ['api_key.created'] });
      const rot = await api(t(), key).post('/webhooks/{webhook_id}/rotate-secret', { params: { webhook_id: h.id } });
      assert.equal(rot.status, 200, rot.text);
      t().forbidSecret(rot.body.secret);
      assert.notEqual(rot.body.secret, h.secret);
      assert.equal(rot.body.id, h.id);
      await makeEvent();
      await deliver();
      const first = rec.received[0]!;
      assert.equal(String(first.headers['webhook-signature']).split(' ').length, 2, 'two signatures in the overlap');
      rec.verify(first, rot.body.secret);
      rec.verify(first, h.secret);
      await advance(86_400);
      await makeEvent();
      await deliver();
      const second = rec.received[1]!;
      assert.equal(String(second.headers['webhook-signature']).split(' ').length, 1);
      rec.verify(second, rot.body.secret);
      assert.throws(() => rec.verify(second, h.secret), 'the old secret no longer signs');
      await remove(h.id);
    });

    test('a test event goes to that endpoint only, also when it is turned off', async () => {
      rec.received.length = 0;
      rec.answer = () => 200;
      const a = await hook({ url: `${rec.url}/t1` });
      const b = await hook({ url: `${rec.url}/t2` });
      const off = await api(t(), key).patch('/webhooks/{webhook_id}', {
        params: { webhook_id: a.id },
        body: { enabled: false },
      });
      assert.equal(off.status, 200, off.text);
      assert.equal(off.body.enabled, false);
      const r = await api(t(), key).post('/webhooks/{webhook_id}/test', { params: { webhook_id: a.id } });
      assert.equal(r.status, 202, r.text);
      await deliver();
      assert.deepEqual(
        rec.received.map((x) => x.path),
        ['/t1'],
      );
      const p = rec.verify(rec.received[0]!, a.secret);
      assert.equal(p.type, 'webhook.test');
      assert.equal(rec.received[0]!.headers['webhook-id'], r.body.event_id);
      assert.equal(p.data.data.webhook_id, a.id);
      assert.equal((await attempts(a.id))[0]!.event_id, r.body.event_id);
      assert.deepEqual(await attempts(b.id), []);
      await remove(a.id);
      await remove(b.id);
    });

    test('redirects are not followed, answers are read only so far, slow endpoints time out', async () => {
      rec.received.length = 0;
      rec.answer = (r) => {
        if (r.path === '/redirect') return (res) => res.writeHead(307, { location: `${rec.url}/elsewhere` }).end();
        if (r.path === '/big') return (res) => res.writeHead(200).end('x'.repeat(1024 * 1024));
        if (r.path === '/slow') return 'hang';
        return 200;
      };
      const red = await hook({ url: `${rec.url}/redirect`, event_types: ['api_key.created'] });
      const big = await hook({ url: `${rec.url}/big`, event_types: ['api_key.created'] });
      const slow = await hook({ url: `${rec.url}/slow`, event_types: ['api_key.created'] });
      await makeEvent();
      await deliver();
      assert.deepEqual(rec.received.map((r) => r.path).sort(), ['/big', '/redirect', '/slow']);
      const [r1] = await attempts(red.id);
      assert.deepEqual([r1!.status_code, r1!.outcome], [307, 'retrying']);
      const [b1] = await attempts(big.id);
      assert.deepEqual([b1!.status_code, b1!.outcome], [200, 'succeeded']);
      const [s1] = await attempts(slow.id);
      assert.equal(s1!.status_code, null);
      assert.equal(s1!.error, 'no answer within 1 s');
      for (const h of [red, big, slow]) await remove(h.id);
    });

    test('a refused address at delivery time (a name that now resolves to loopback) is a failed attempt, not a request', async () => {
      rec.received.length = 0;
      const h = await hook({
        url: `${rec.url.replace('127.0.0.1', 'localhost')}/rebind`,
        event_types: ['api_key.created'],
      });
      await makeEvent();
      // The same rows, delivered by an instance that does not allow private addresses.
      const strict = new WebhookService(t().db, t().clock, {
        secret: JWT_SECRET,
        allowPrivate: false,
        timeoutMs: 2000,
      });
      assert.equal(await strict.deliverDue(), 1);
      assert.equal(rec.received.length, 0);
      const [a] = await attempts(h.id);
      assert.equal(a!.status_code, null);
      assert.match(a!.error!, /^localhost resolves to (127\.0\.0\.1|::1), a special-purpose address /);
      assert.match(a!.error!, / \((127\.0\.0\.0\/8|::1\/128), loopback\)$/);
      await remove(h.id);
    });

    test('a secret sealed under another signing secret is a failed attempt that says to rotate, and rotating mends it', async () => {
      rec.received.length = 0;
      rec.answer = () => 200;
      const h = await hook({ url: `${rec.url}/resealed`, event_types: ['api_key.created'] });
      await makeEvent();
      // An instance whose own signing secret differs (it was changed) cannot read the sealed secret.
      const other = new WebhookService(t().db, t().clock, {
        secret: 'another-signing-secret-'.padEnd(48, 'y'),
        allowPrivate: true,
        timeoutMs: 2000,
      });
      assert.equal(await other.deliverDue(), 1);
      assert.equal(rec.received.length, 0);
      const [a] = await attempts(h.id);
      assert.deepEqual([a!.outcome, a!.status_code], ['retrying', null]);
      assert.match(a!.error!, /signing secret cannot be read.*rotate-secret/);
      // The owner rotates through the changed service: the new secret signs alone (the old one cannot be read).
      const rot = await other.rotateSecret(
        { userId: u.id, email: u.email, role: 'user', scope: 'read_write', via: 'session' },
        h.id,
      );
      await advance(5);
      assert.equal(await other.deliverDue(), 1);
      assert.equal(String(rec.received[0]!.headers['webhook-signature']).split(' ').length, 1);
      assert.equal(rec.verify(rec.received[0]!, rot.secret).type, 'api_key.created');
      await remove(h.id);
    });

    test("a VM's events arrive in order: a later one waits while an earlier one is retried", async () => {
      rec.received.length = 0;
      let failedOnce = false;
      rec.answer = (r) => {
        if (r.path !== '/vm' || failedOnce) return 200;
        failedOnce = true;
        return 500;
      };
      const h = await hook({ url: `${rec.url}/vm`, event_types: ['vm.created', 'vm.status_changed', 'vm.destroyed'] });
      const { node } = await createNode(t(), adminKey, { gpu_type: '4090', gpu_count: 8 });
      await credit(t(), adminKey, u.id, 500);
      const vm = await api(t(), key).post('/vms', {
        body: {
          node,
          gpu_type: '4090',
          gpu_count: 1,
          storage_gb: 50,
          template_vmid: 100,
          auth_method: 'password',
          password: 'a-vm-password-1234',
        },
      });
      assert.equal(vm.status, 201, vm.text);
      await advance(60); // provisioned, running
      assert.equal((await api(t(), key).delete('/vms/{vm_id}', { params: { vm_id: vm.body.id } })).status, 200);
      await advance(60);
      const written = (await events({ vm_id: vm.body.id, limit: 200 })).map((e) => e.id);
      assert.ok(written.length >= 4, `events: ${written.length}`);
      assert.equal(await deliver(), 1, "only the first of the VM's events goes while it is pending");
      assert.equal(await deliver(), 0, 'the rest wait behind the one being retried');
      await advance(5);
      while ((await deliver()) > 0);
      const ids = rec.received.map((r) => String(r.headers['webhook-id']));
      assert.deepEqual(ids, [written[0], ...written], 'the first twice (failed, then retried), then the rest in order');
      await remove(h.id);
    });

    test("the operator's node events go to administrators' endpoints, never to a customer's", async () => {
      rec.received.length = 0;
      rec.answer = () => 200;
      const ops = await hook({ url: `${rec.url}/ops`, event_types: ['node.offline', 'node.online'] }, adminKey);
      const mine = await hook({ url: `${rec.url}/mine` });
      const { node } = await createNode(t(), adminKey, { gpu_type: '5090', gpu_count: 2 });
      assert.equal(
        (await api(t(), adminKey).patch('/admin/nodes/{node}', { params: { node }, body: { status: 'offline' } }))
          .status,
        200,
      );
      while ((await deliver()) > 0);
      assert.deepEqual(
        rec.received.filter((r) => r.path === '/ops').map((r) => rec.verify(r, ops.secret).type),
        ['node.offline'],
      );
      assert.equal(rec.received.filter((r) => r.path === '/mine').length, 0);
      await remove(mine.id);
      assert.equal(
        (await api(t(), adminKey).delete('/webhooks/{webhook_id}', { params: { webhook_id: ops.id } })).status,
        204,
      );
    });

    test('two instances delivering at once send each event once', async () => {
      rec.received.length = 0;
      rec.answer = () => 200;
      const h = await hook({ url: `${rec.url}/pair`, event_types: ['api_key.created'] });
      for (let i = 0; i < 40; i++) await makeEvent();
      // Another instance: its own connections to the same database (closed with the test app).
      const other = new WebhookService(await t().testDb.openAnother(), t().clock, {
        secret: JWT_SECRET,
        allowPrivate: true,
        timeoutMs: 2000,
      });
      for (;;) {
        const [a, b] = await Promise.all([deliver(), other.deliverDue()]);
        if (a + b === 0) break;
      }
      const ids = rec.received.map((r) => r.headers['webhook-id']);
      assert.equal(ids.length, 40);
      assert.equal(new Set(ids).size, 40, 'no event twice');
      assert.equal((await attempts(h.id)).length, 40);
      await remove(h.id);
    });

    test('a deleted endpoint gets nothing more, and its history goes with it', async () => {
      rec.received.length = 0;
      rec.answer = () => 500;
      const h = await hook({ url: `${rec.url}/gone`, event_types: ['api_key.created'] });
      await makeEvent();
      await deliver();
      await remove(h.id);
      await advance(10);
      assert.equal(await deliver(), 0);
      assert.equal(rec.received.length, 1);
      assert.equal(
        (await api(t(), key).get('/webhooks/{webhook_id}/deliveries', { params: { webhook_id: h.id } })).status,
        404,
      );
    });
  },
  { env: { GPUCLOUD_WEBHOOK_ALLOW_PRIVATE: '1', GPUCLOUD_WEBHOOK_TIMEOUT_S: '1' } },
);
