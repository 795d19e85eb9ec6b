/**
 * Managing webhook endpoints: create, list, get, change, delete, rotate,
 * test; every validation rule, the limit per account, the scopes, another
 * user's endpoints, and every address a webhook may never go to (the
 * service here does not allow private addresses, as in production).
 */
import { before, test } from 'node:test';
import assert from 'node:assert/strict';
import { describeEachDb } from '../helpers/app.js';
import { createApiKey, createUser, type TestUser } from '../helpers/factories.js';
import { MAX_WEBHOOKS } from '../../src/modules/webhooks/service.js';
import { api, type RequestBody } from '../helpers/api.js';

const PUBLIC = 'https://93.184.216.34/hooks/gpucloud';

describeEachDb('webhooks: endpoints', (t) => {
  let u: TestUser;
  let key: string;

  before(async () => {
    u = await createUser(t());
    key = await createApiKey(t(), u.token, 'read_write');
  });

  const create = (body: RequestBody<'/webhooks', 'post'>, token = key) => api(t(), token).post('/webhooks', { body });
  /** POST /webhooks with a body that is not valid. */
  const createRaw = (rawBody: unknown, token = key) => api(t(), token).post('/webhooks', { rawBody });
  /** The user's read_write key. */
  const c = () => api(t(), key);
  const del = (webhook_id: string, token = key) =>
    api(t(), token).delete('/webhooks/{webhook_id}', { params: { webhook_id } });

  test('create shows the secret once; list, get and change never show it', async () => {
    const r = await create({
      url: PUBLIC,
      event_types: ['vm.status_changed', 'billing.low_balance', 'vm.status_changed'],
      description: '  pager  ',
    });
    assert.equal(r.status, 201, r.text);
    t().forbidSecret(r.body.secret);
    assert.match(r.body.secret, /^whsec_[A-Za-z0-9+/]{43}=$/);
    assert.equal(Buffer.from(r.body.secret.slice(6), 'base64').length, 32);
    assert.deepEqual(
      { ...r.body, id: undefined, secret: undefined, created_at: undefined, updated_at: undefined },
      {
        id: undefined,
        secret: undefined,
        created_at: undefined,
        updated_at: undefined,
        url: PUBLIC,
        event_types: ['vm.status_changed', 'billing.low_balance'],
        description: 'pager',
        enabled: true,
        disabled_reason: null,
        failing_since: null,
      },
    );
    assert.equal(r.body.created_at, new Date(t().clock.nowMs()).toISOString());
    assert.equal(r.headers['cache-control'], 'no-store');
    const all = await create({ url: PUBLIC });
    assert.equal(all.status, 201);
    t().forbidSecret(all.body.secret);
    assert.equal(all.body.event_types, null, 'every type by default');
    assert.equal(all.body.description, '');

    const list = await c().get('/webhooks');
    assert.equal(list.status, 200);
    assert.equal(list.headers['x-total-count'], '2');
    assert.deepEqual(
      list.body.map((w) => w.id),
      [all.body.id, r.body.id],
      'newest first',
    );
    assert.ok(list.body.every((w) => !('secret' in w)));
    const one = await c().get('/webhooks/{webhook_id}', { params: { webhook_id: r.body.id } });
    assert.equal(one.status, 200);
    assert.equal('secret' in one.body, false);

    await t().services.clock.advance(60);
    const changed = await c().patch('/webhooks/{webhook_id}', {
      params: { webhook_id: r.body.id },
      body: { event_types: null, description: 'all of it', url: 'http://93.184.216.34:8443/x' },
    });
    assert.equal(changed.status, 200, changed.text);
    assert.deepEqual(
      [changed.body.event_types, changed.body.description, changed.body.url],
      [null, 'all of it', 'http://93.184.216.34:8443/x'],
    );
    assert.equal(changed.body.created_at, r.body.created_at);
    assert.notEqual(changed.body.updated_at, r.body.updated_at);
    const off = await c().patch('/webhooks/{webhook_id}', {
      params: { webhook_id: r.body.id },
      body: { enabled: false },
    });
    assert.equal(off.status, 200, off.text);
    assert.deepEqual([off.body.enabled, off.body.disabled_reason], [false, null]);

    const rot = await c().post('/webhooks/{webhook_id}/rotate-secret', { params: { webhook_id: r.body.id } });
    assert.equal(rot.status, 200);
    t().forbidSecret(rot.body.secret);
    assert.match(rot.body.secret, /^whsec_/);
    assert.notEqual(rot.body.secret, r.body.secret);

    for (const id of [r.body.id, all.body.id]) assert.equal((await del(id)).status, 204);
    assert.equal((await c().get('/webhooks/{webhook_id}', { params: { webhook_id: r.body.id } })).status, 404);
    assert.equal((await del(r.body.id)).status, 404);
  });

  test('every validation rule: 422 with the field named, nothing created', async () => {
    const cases: Array<[unknown, string]> = [
      [{}, 'body.url'],
      [{ url: '' }, 'body.url'],
      [{ url: 'not a url' }, 'body.url'],
      [{ url: 'ftp://93.184.216.34/x' }, 'body.url'],
      [{ url: 'file:///etc/passwd' }, 'body.url'],
      [{ url: 'javascript:alert(1)' }, 'body.url'],
      [{ url: `https://93.184.216.34/${'x'.repeat(2100)}` }, 'body.url'],
      [{ url: 42 }, 'body.url'],
      [{ url: PUBLIC, event_types: [] }, 'body.event_types'],
      [{ url: PUBLIC, event_types: ['vm.exploded'] }, 'body.event_types'],
      [{ url: PUBLIC, event_types: ['webhook.test'] }, 'body.event_types'],
      [{ url: PUBLIC, event_types: ['node.offline'] }, 'body.event_types'],
      [{ url: PUBLIC, event_types: 'vm.created' }, 'body.event_types'],
      [{ url: PUBLIC, description: 'x'.repeat(201) }, 'body.description'],
      [{ url: PUBLIC, description: 'bell\u0007' }, 'body.description'],
      [{ url: PUBLIC, enabled: false }, 'body.enabled'],
      [{ url: PUBLIC, secret: 'whsec_mine' }, 'body.secret'],
    ];
    for (const [body, field] of cases) {
      const r = await createRaw(body);
      assert.equal(r.status, 422, `${JSON.stringify(body).slice(0, 80)}: ${r.text}`);
      assert.equal(r.body.code, 'validation_error');
      assert.ok(
        r.body.errors?.some((e) => e.field === field || e.field.startsWith(field)),
        `${JSON.stringify(body).slice(0, 80)} names ${field}: ${r.text}`,
      );
    }
    const none = await c().get('/webhooks');
    assert.equal(none.status, 200, none.text);
    assert.equal(none.body.length, 0);
    const h = await create({ url: PUBLIC });
    assert.equal(h.status, 201, h.text);
    t().forbidSecret(h.body.secret);
    const id = h.body.id;
    for (const body of [{}, { enabled: 'yes' }, { url: 'http://10.0.0.1/' }, { event_types: [] }, { id }]) {
      const r = await c().patch('/webhooks/{webhook_id}', { params: { webhook_id: id }, rawBody: body });
      assert.equal(r.status, 422, `${JSON.stringify(body)}: ${r.text}`);
    }
    const unchanged = await c().get('/webhooks/{webhook_id}', { params: { webhook_id: h.body.id } });
    assert.equal(unchanged.status, 200, unchanged.text);
    assert.equal(unchanged.body.url, PUBLIC, 'unchanged');
    assert.equal((await del(h.body.id)).status, 204);
  });

  test('every address a webhook may never go to is refused at creation', async () => {
    const refused = [
      'http://127.0.0.1/',
      'http://127.1/',
      'http://2130706433/',
      'http://0x7f000001/',
      'http://127.255.255.254:8080/x',
      'http://localhost:9000/hook',
      'http://0.0.0.0/',
      'http://10.1.2.3/',
      'http://172.16.5.4/',
      'http://172.31.255.255/',
      'http://192.168.1.10/',
      'http://100.64.0.1/',
      'http://100.100.100.200/latest/meta-data',
      'http://169.254.169.254/latest/meta-data/',
      'http://169.254.1.1/',
      'http://192.0.0.192/',
      'http://224.0.0.1/',
      'http://255.255.255.255/',
      'http://[::1]/',
      'http://[::]/',
      'http://[::ffff:127.0.0.1]/',
      'http://[::ffff:7f00:1]/',
      'http://[::ffff:169.254.169.254]/',
      'http://[::ffff:10.0.0.1]/',
      'http://[::127.0.0.1]/',
      'http://[64:ff9b::a9fe:a9fe]/',
      'http://[64:ff9b::808:808]/',
      'http://[64:ff9b:1::7f00:1]/',
      'http://[::ffff:0:7f00:1]/',
      'http://[2002:7f00:1::1]/',
      'http://[fe80::1]/',
      'http://[fd00:ec2::254]/',
      'http://[fc00::1]/',
      'http://[ff02::1]/',
      'http://does-not-exist.invalid/',
    ];
    for (const url of refused) {
      const r = await create({ url });
      assert.equal(r.status, 422, `${url}: ${r.text}`);
      assert.equal(r.body.errors?.[0]?.field, 'body.url');
    }
    const lh = await create({ url: 'http://localhost:9000/hook' });
    assert.equal(lh.status, 422, lh.text);
    assert.match(
      lh.body.detail,
      /localhost resolves to (127\.0\.0\.1|::1), a special-purpose address \((127\.0\.0\.0\/8|::1\/128), loopback\)/,
    );
    const meta = await create({ url: 'http://169.254.169.254/' });
    assert.equal(meta.status, 422, meta.text);
    assert.match(meta.body.detail, /169\.254\.169\.254 is a special-purpose address \(169\.254\.0\.0\/16, link-local/);
    // Public addresses pass, IPv4 and IPv6 (not behind a NAT64 prefix, refused whole above).
    for (const url of [PUBLIC, 'http://8.8.8.8:8080/', 'https://[2606:4700:4700::1111]/hook', 'http://172.32.0.1/']) {
      const r = await create({ url });
      assert.equal(r.status, 201, `${url}: ${r.text}`);
      t().forbidSecret(r.body.secret);
      assert.equal((await del(r.body.id)).status, 204);
    }
  });

  test(`at most ${MAX_WEBHOOKS} per account, then 400 limit_exceeded; deleting one makes room`, async () => {
    const made = await Promise.all(Array.from({ length: MAX_WEBHOOKS + 3 }, () => create({ url: PUBLIC })));
    const ok = made.flatMap((r) => (r.status === 201 ? [r] : []));
    for (const r of ok) t().forbidSecret(r.body.secret);
    assert.equal(ok.length, MAX_WEBHOOKS, 'creates at once cannot pass the limit together');
    for (const r of made) {
      if (r.status === 201) continue;
      assert.equal(r.status, 400, r.text);
      assert.equal(r.body.code, 'limit_exceeded');
    }
    assert.equal((await del(ok[0]!.body.id)).status, 204);
    const again = await create({ url: PUBLIC });
    assert.equal(again.status, 201);
    t().forbidSecret(again.body.secret);
    for (const r of [...ok.slice(1), again]) assert.equal((await del(r.body.id)).status, 204);
  });

  test('read_only and billing_only keys cannot see or manage webhooks; a session and a read_write key can', async () => {
    const h = await create({ url: PUBLIC });
    assert.equal(h.status, 201, h.text);
    t().forbidSecret(h.body.secret);
    const id = h.body.id;
    const params = { webhook_id: id };
    for (const scope of ['read_only', 'billing_only'] as const) {
      const k = api(t(), await createApiKey(t(), u.token, scope));
      // Every POST and PATCH carries { url: PUBLIC }, the routes without a request body too.
      for (const [method, url, call] of [
        ['GET', '/webhooks', () => k.get('/webhooks')],
        ['POST', '/webhooks', () => k.post('/webhooks', { body: { url: PUBLIC } })],
        ['GET', `/webhooks/${id}`, () => k.get('/webhooks/{webhook_id}', { params })],
        ['PATCH', `/webhooks/${id}`, () => k.patch('/webhooks/{webhook_id}', { params, body: { url: PUBLIC } })],
        ['DELETE', `/webhooks/${id}`, () => k.delete('/webhooks/{webhook_id}', { params })],
        [
          'POST',
          `/webhooks/${id}/rotate-secret`,
          () => k.post('/webhooks/{webhook_id}/rotate-secret', { params, rawBody: { url: PUBLIC } }),
        ],
        [
          'POST',
          `/webhooks/${id}/test`,
          () => k.post('/webhooks/{webhook_id}/test', { params, rawBody: { url: PUBLIC } }),
        ],
        ['GET', `/webhooks/${id}/deliveries`, () => k.get('/webhooks/{webhook_id}/deliveries', { params })],
      ] as const) {
        const r = await call();
        assert.equal(r.status, 403, `${scope} ${method} ${url}: ${r.text}`);
        assert.equal(r.body.code, 'forbidden');
      }
    }
    assert.equal((await api(t()).get('/webhooks')).status, 401);
    assert.equal((await api(t(), u.token).get('/webhooks')).status, 200, 'a login session');
    assert.equal((await del(h.body.id)).status, 204);
  });

  test("another user's endpoint is 404 for every operation, and stays as it was", async () => {
    const h = await create({ url: PUBLIC, description: 'mine' });
    assert.equal(h.status, 201, h.text);
    t().forbidSecret(h.body.secret);
    const other = await createUser(t());
    const theirs = api(t(), await createApiKey(t(), other.token, 'read_write'));
    const params = { webhook_id: h.body.id };
    for (const [method, path, call] of [
      ['GET', '', () => theirs.get('/webhooks/{webhook_id}', { params })],
      ['PATCH', '', () => theirs.patch('/webhooks/{webhook_id}', { params, body: { description: 'theirs' } })],
      ['DELETE', '', () => theirs.delete('/webhooks/{webhook_id}', { params })],
      ['POST', '/rotate-secret', () => theirs.post('/webhooks/{webhook_id}/rotate-secret', { params })],
      ['POST', '/test', () => theirs.post('/webhooks/{webhook_id}/test', { params })],
      ['GET', '/deliveries', () => theirs.get('/webhooks/{webhook_id}/deliveries', { params })],
    ] as const) {
      const r = await call();
      assert.equal(r.status, 404, `${method} ${path}: ${r.text}`);
      assert.equal(r.body.code, 'not_found');
    }
    assert.deepEqual((await theirs.get('/webhooks')).body, []);
    const mine = await c().get('/webhooks/{webhook_id}', { params });
    assert.equal(mine.status, 200, mine.text);
    assert.equal(mine.body.description, 'mine');
    assert.deepEqual((await c().get('/webhooks/{webhook_id}/deliveries', { params })).body, [], 'no test was sent');
    // Ids that cannot exist are 404 too, whatever their form.
    for (const id of ['nope', '00000000-0000-4000-8000-000000000000', 'x'.repeat(300)]) {
      assert.equal((await c().get('/webhooks/{webhook_id}', { params: { webhook_id: id } })).status, 404);
    }
    assert.equal((await del(h.body.id)).status, 204);
  });

  test("an administrator may ask for the operator's node events", async () => {
    const admin = await createUser(t(), { admin: true });
    const r = await create({ url: PUBLIC, event_types: ['node.offline', 'node.online'] }, admin.token);
    assert.equal(r.status, 201, r.text);
    t().forbidSecret(r.body.secret);
    assert.equal((await del(r.body.id, admin.token)).status, 204);
  });
});
