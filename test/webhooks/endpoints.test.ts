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

const PUBLIC = 'https://93.184.216.34/hooks/gpucloud';

describeEachDb('webhooks: endpoints', (t) => {
  let u: TestUser;
  let key: string;

  before(async () => {
    u = await createUser(t());
    key = await createApiKey(t(), u.token, 'read_write');
  });

  const create = (body: unknown, token = key) => t().req('POST', '/webhooks', { token, body });

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

    const list = await t().req('GET', '/webhooks', { token: key });
    assert.equal(list.status, 200);
    assert.equal(list.headers['x-total-count'], '2');
    assert.deepEqual(
      list.body.map((w: { id: string }) => w.id),
      [all.body.id, r.body.id],
      'newest first',
    );
    assert.ok(list.body.every((w: object) => !('secret' in w)));
    const one = await t().req('GET', `/webhooks/${r.body.id}`, { token: key });
    assert.equal(one.status, 200);
    assert.equal('secret' in one.body, false);

    await t().services.clock.advance(60);
    const changed = await t().req('PATCH', `/webhooks/${r.body.id}`, {
      token: key,
      body: { event_types: null, description: 'all of it', url: 'http://93.184.216.34:8443/x' },
    });
    assert.equal(changed.status, 200, changed.text);
    assert.deepEqual(
      [changed.body.event_types, changed.body.description, changed.body.url],
      [null, 'all of it', 'http://93.184.216.34:8443/x'],
    );
    assert.equal(changed.body.created_at, r.body.created_at);
    assert.notEqual(changed.body.updated_at, r.body.updated_at);
    const off = await t().req('PATCH', `/webhooks/${r.body.id}`, { token: key, body: { enabled: false } });
    assert.deepEqual([off.body.enabled, off.body.disabled_reason], [false, null]);

    const rot = await t().req('POST', `/webhooks/${r.body.id}/rotate-secret`, { token: key });
    assert.equal(rot.status, 200);
    t().forbidSecret(rot.body.secret);
    assert.match(rot.body.secret, /^whsec_/);
    assert.notEqual(rot.body.secret, r.body.secret);

    for (const id of [r.body.id, all.body.id])
      assert.equal((await t().req('DELETE', `/webhooks/${id}`, { token: key })).status, 204);
    assert.equal((await t().req('GET', `/webhooks/${r.body.id}`, { token: key })).status, 404);
    assert.equal((await t().req('DELETE', `/webhooks/${r.body.id}`, { token: key })).status, 404);
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
      const r = await create(body);
      assert.equal(r.status, 422, `${JSON.stringify(body).slice(0, 80)}: ${r.text}`);
      assert.equal(r.body.code, 'validation_error');
      assert.ok(
        r.body.errors.some((e: { field: string }) => e.field === field || e.field.startsWith(field)),
        `${JSON.stringify(body).slice(0, 80)} names ${field}: ${r.text}`,
      );
    }
    assert.equal((await t().req('GET', '/webhooks', { token: key })).body.length, 0);
    const h = await create({ url: PUBLIC });
    t().forbidSecret(h.body.secret);
    for (const body of [{}, { enabled: 'yes' }, { url: 'http://10.0.0.1/' }, { event_types: [] }, { id: h.body.id }]) {
      const r = await t().req('PATCH', `/webhooks/${h.body.id}`, { token: key, body });
      assert.equal(r.status, 422, `${JSON.stringify(body)}: ${r.text}`);
    }
    assert.equal((await t().req('GET', `/webhooks/${h.body.id}`, { token: key })).body.url, PUBLIC, 'unchanged');
    assert.equal((await t().req('DELETE', `/webhooks/${h.body.id}`, { token: key })).status, 204);
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
      assert.equal(r.body.errors[0].field, 'body.url');
    }
    const lh = await create({ url: 'http://localhost:9000/hook' });
    assert.match(
      lh.body.detail,
      /localhost resolves to (127\.0\.0\.1|::1), a loopback, private, link-local, multicast or reserved address/,
    );
    const meta = await create({ url: 'http://169.254.169.254/' });
    assert.match(
      meta.body.detail,
      /169\.254\.169\.254 is a loopback, private, link-local, multicast or reserved address/,
    );
    // Public addresses pass, IPv4 and IPv6, NAT64 of a public address too.
    for (const url of [
      PUBLIC,
      'http://8.8.8.8:8080/',
      'https://[2606:4700:4700::1111]/hook',
      'http://[64:ff9b::808:808]/',
      'http://172.32.0.1/',
    ]) {
      const r = await create({ url });
      assert.equal(r.status, 201, `${url}: ${r.text}`);
      t().forbidSecret(r.body.secret);
      assert.equal((await t().req('DELETE', `/webhooks/${r.body.id}`, { token: key })).status, 204);
    }
  });

  test(`at most ${MAX_WEBHOOKS} per account, then 400 limit_exceeded; deleting one makes room`, async () => {
    const made = await Promise.all(Array.from({ length: MAX_WEBHOOKS + 3 }, () => create({ url: PUBLIC })));
    const ok = made.filter((r) => r.status === 201);
    for (const r of ok) t().forbidSecret(r.body.secret);
    assert.equal(ok.length, MAX_WEBHOOKS, 'creates at once cannot pass the limit together');
    for (const r of made.filter((x) => x.status !== 201)) {
      assert.equal(r.status, 400, r.text);
      assert.equal(r.body.code, 'limit_exceeded');
    }
    assert.equal((await t().req('DELETE', `/webhooks/${ok[0]!.body.id}`, { token: key })).status, 204);
    const again = await create({ url: PUBLIC });
    assert.equal(again.status, 201);
    t().forbidSecret(again.body.secret);
    for (const r of [...ok.slice(1), again])
      assert.equal((await t().req('DELETE', `/webhooks/${r.body.id}`, { token: key })).status, 204);
  });

  test('read_only and billing_only keys cannot see or manage webhooks; a session and a read_write key can', async () => {
    const h = await create({ url: PUBLIC });
    t().forbidSecret(h.body.secret);
    for (const scope of ['read_only', 'billing_only']) {
      const k = await createApiKey(t(), u.token, scope);
      for (const [method, url] of [
        ['GET', '/webhooks'],
        ['POST', '/webhooks'],
        ['GET', `/webhooks/${h.body.id}`],
        ['PATCH', `/webhooks/${h.body.id}`],
        ['DELETE', `/webhooks/${h.body.id}`],
        ['POST', `/webhooks/${h.body.id}/rotate-secret`],
        ['POST', `/webhooks/${h.body.id}/test`],
        ['GET', `/webhooks/${h.body.id}/deliveries`],
      ] as const) {
        const r = await t().req(method, url, {
          token: k,
          ...(method === 'POST' || method === 'PATCH' ? { body: { url: PUBLIC } } : {}),
        });
        assert.equal(r.status, 403, `${scope} ${method} ${url}: ${r.text}`);
        assert.equal(r.body.code, 'forbidden');
      }
    }
    assert.equal((await t().req('GET', '/webhooks', {})).status, 401);
    assert.equal((await t().req('GET', '/webhooks', { token: u.token })).status, 200, 'a login session');
    assert.equal((await t().req('DELETE', `/webhooks/${h.body.id}`, { token: key })).status, 204);
  });

  test("another user's endpoint is 404 for every operation, and stays as it was", async () => {
    const h = await create({ url: PUBLIC, description: 'mine' });
    t().forbidSecret(h.body.secret);
    const other = await createUser(t());
    const otherKey = await createApiKey(t(), other.token, 'read_write');
    for (const [method, path, body] of [
      ['GET', '', undefined],
      ['PATCH', '', { description: 'theirs' }],
      ['DELETE', '', undefined],
      ['POST', '/rotate-secret', undefined],
      ['POST', '/test', undefined],
      ['GET', '/deliveries', undefined],
    ] as const) {
      const r = await t().req(method, `/webhooks/${h.body.id}${path}`, { token: otherKey, ...(body ? { body } : {}) });
      assert.equal(r.status, 404, `${method} ${path}: ${r.text}`);
      assert.equal(r.body.code, 'not_found');
    }
    assert.deepEqual((await t().req('GET', '/webhooks', { token: otherKey })).body, []);
    const mine = await t().req('GET', `/webhooks/${h.body.id}`, { token: key });
    assert.equal(mine.body.description, 'mine');
    assert.deepEqual(
      (await t().req('GET', `/webhooks/${h.body.id}/deliveries`, { token: key })).body,
      [],
      'no test was sent',
    );
    // Ids that cannot exist are 404 too, whatever their form.
    for (const id of ['nope', '00000000-0000-4000-8000-000000000000', 'x'.repeat(300)]) {
      assert.equal((await t().req('GET', `/webhooks/${id}`, { token: key })).status, 404);
    }
    assert.equal((await t().req('DELETE', `/webhooks/${h.body.id}`, { token: key })).status, 204);
  });

  test("an administrator may ask for the operator's node events", async () => {
    const admin = await createUser(t(), { admin: true });
    const r = await create({ url: PUBLIC, event_types: ['node.offline', 'node.online'] }, admin.token);
    assert.equal(r.status, 201, r.text);
    t().forbidSecret(r.body.secret);
    assert.equal((await t().req('DELETE', `/webhooks/${r.body.id}`, { token: admin.token })).status, 204);
  });
});
