/**
 * /api-keys over HTTP and API keys as credentials: the key record, status
 * codes, pagination, scopes, expiry, revocation, ownership and no-store.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { describeEachDb } from '../helpers/app.js';
import { createApiKey, createUser } from '../helpers/factories.js';

const CREATED_FIELDS = ['created_at', 'expires_at', 'id', 'key', 'last_used_at', 'name', 'prefix', 'scope'];
const RECORD_FIELDS = CREATED_FIELDS.filter((f) => f !== 'key');
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

describeEachDb('api-keys', (t) => {
  const iso = (offsetSeconds = 0) => new Date(t().clock.nowMs() + offsetSeconds * 1000).toISOString();

  async function create(token: string, body: unknown) {
    const r = await t().req('POST', '/api-keys', { token, body });
    if (r.status === 201) t().forbidSecret(r.body.key);
    return r;
  }

  async function rowCount(userId: number): Promise<number> {
    return (await t().db.query<{ n: number }>('SELECT count(*)::int8 AS n FROM api_keys WHERE user_id = $1', [userId])).rows[0]!.n;
  }

  test('create: 201 with exactly the key record fields plus key, gpc_ key shown once, default scope read_write, no-store', async () => {
    const u = await createUser(t());
    const r = await create(u.token, { name: 'ci' });
    assert.equal(r.status, 201, r.text);
    assert.deepEqual(Object.keys(r.body).sort(), CREATED_FIELDS);
    assert.match(r.body.id, UUID);
    assert.equal(r.body.name, 'ci');
    assert.equal(r.body.scope, 'read_write');
    assert.match(r.body.key, /^gpc_[A-Za-z0-9_-]{40,}$/);
    assert.ok(r.body.key.startsWith(r.body.prefix), 'prefix is the start of the key');
    assert.ok(r.body.prefix.startsWith('gpc_') && r.body.prefix.length < r.body.key.length / 2, 'prefix reveals only a little');
    assert.equal(r.body.created_at, t().clock.now().toISOString());
    assert.equal(r.body.expires_at, null);
    assert.equal(r.body.last_used_at, null);
    assert.equal(r.headers['cache-control'], 'no-store');

    // The key is a working credential.
    const me = await t().req('GET', '/account', { token: r.body.key });
    assert.equal(me.status, 200, me.text);
    assert.equal(me.body.id, u.id);

    // Listed without the key (forbidSecret makes every response prove it never comes back).
    const list = await t().req('GET', '/api-keys', { token: u.token });
    assert.equal(list.status, 200);
    assert.equal(list.headers['cache-control'], 'no-store');
    assert.equal(list.body.length, 1);
    assert.deepEqual(Object.keys(list.body[0]).sort(), RECORD_FIELDS);
    const { key: _key, ...record } = r.body;
    assert.deepEqual({ ...list.body[0], last_used_at: null }, record);
  });

  test('keys are random and stored hashed: no column of the api_keys row holds the key', async () => {
    const u = await createUser(t());
    const a = await create(u.token, { name: 'a' });
    const b = await create(u.token, { name: 'b' });
    assert.notEqual(a.body.key, b.body.key);
    assert.notEqual(a.body.prefix, b.body.prefix);
    for (const r of [a, b]) {
      const rows = await t().db.query<Record<string, unknown>>('SELECT * FROM api_keys WHERE id = $1', [r.body.id]);
      assert.equal(rows.rows.length, 1);
      for (const [col, value] of Object.entries(rows.rows[0]!)) {
        const text = value instanceof Date ? value.toISOString() : String(value);
        assert.ok(!text.includes(r.body.key), `column ${col} holds the key`);
        // Nor the part after the displayed prefix.
        assert.ok(!text.includes(r.body.key.slice(r.body.prefix.length)), `column ${col} holds the secret part`);
      }
      const whole = await t().db.query<{ row: string }>('SELECT k::text AS row FROM api_keys k WHERE id = $1', [r.body.id]);
      assert.ok(!whole.rows[0]!.row.includes(r.body.key.slice(8)));
    }
  });

  test('scopes: a session creates any scope; explicit scope and expires_at are kept', async () => {
    const u = await createUser(t());
    for (const scope of ['read_write', 'read_only', 'billing_only']) {
      const r = await create(u.token, { name: scope, scope });
      assert.equal(r.status, 201, r.text);
      assert.equal(r.body.scope, scope);
    }
    const exp = await create(u.token, { name: 'exp', expires_at: iso(7200) });
    assert.equal(exp.status, 201, exp.text);
    assert.equal(exp.body.expires_at, iso(7200));
    // Any offset is accepted and returned in UTC.
    const when = new Date(t().clock.nowMs() + 86_400_000);
    const withOffset = new Date(when.getTime() + 2 * 3_600_000).toISOString().replace('Z', '+02:00'); // the same instant
    const off = await create(u.token, { name: 'offset', expires_at: withOffset });
    assert.equal(off.status, 201, off.text);
    assert.equal(off.body.expires_at, when.toISOString());
    const nul = await create(u.token, { name: 'null', expires_at: null });
    assert.equal(nul.status, 201);
    assert.equal(nul.body.expires_at, null);
    // The name is trimmed.
    const trimmed = await create(u.token, { name: '  deploy bot  ' });
    assert.equal(trimmed.body.name, 'deploy bot');
    assert.equal((await create(u.token, { name: 'n'.repeat(64) })).status, 201, '64 characters is fine');
  });

  test('validation: name, scope, expires_at, unknown fields, body shape -> 422 naming the field', async () => {
    const u = await createUser(t());
    const cases: [unknown, string][] = [
      [{}, 'body.name'],
      [{ name: '' }, 'body.name'],
      [{ name: '   ' }, 'body.name'],
      [{ name: 'n'.repeat(65) }, 'body.name'],
      [{ name: 42 }, 'body.name'],
      [{ name: null }, 'body.name'],
      [{ name: 'x', scope: 'admin' }, 'body.scope'],
      [{ name: 'x', scope: 'READ_ONLY' }, 'body.scope'],
      [{ name: 'x', scope: null }, 'body.scope'],
      [{ name: 'x', expires_at: iso(-1) }, 'body.expires_at'],
      [{ name: 'x', expires_at: iso(0) }, 'body.expires_at'],
      [{ name: 'x', expires_at: '2001-01-01T00:00:00Z' }, 'body.expires_at'],
      [{ name: 'x', expires_at: 'tomorrow' }, 'body.expires_at'],
      [{ name: 'x', expires_at: '2099-13-01T00:00:00Z' }, 'body.expires_at'],
      [{ name: 'x', expires_at: '2099-01-01' }, 'body.expires_at'],
      [{ name: 'x', expires_at: 4102444800 }, 'body.expires_at'],
      [{ name: 'x', key: 'gpc_chosen_by_me' }, 'body.key'],
      [{ name: 'x', user_id: 1 }, 'body.user_id'],
      [['x'], 'body'],
    ];
    for (const [body, field] of cases) {
      const r = await t().req('POST', '/api-keys', { token: u.token, body });
      assert.equal(r.status, 422, `${JSON.stringify(body)}: ${r.text}`);
      assert.equal(r.body.code, 'validation_error');
      assert.ok(r.body.errors.some((e: { field: string }) => e.field === field), `${JSON.stringify(body)}: ${r.text}`);
    }
    assert.equal(await rowCount(u.id), 0, 'nothing was created');
    const noBody = await t().req('POST', '/api-keys', { token: u.token });
    assert.equal(noBody.status, 422, noBody.text);
    const text = await t().req('POST', '/api-keys', { token: u.token, body: 'name=x', headers: { 'content-type': 'text/plain' } });
    assert.equal(text.status, 415);
  });

  test('an expired key is 401; it works until its expiry', async () => {
    const u = await createUser(t());
    const r = await create(u.token, { name: 'short', scope: 'read_only', expires_at: iso(600) });
    assert.equal(r.status, 201);
    assert.equal((await t().req('GET', '/account', { token: r.body.key })).status, 200);
    await t().services.clock.advance(599);
    assert.equal((await t().req('GET', '/account', { token: r.body.key })).status, 200, 'one second before expiry');
    await t().services.clock.advance(1);
    const expired = await t().req('GET', '/account', { token: r.body.key });
    assert.equal(expired.status, 401, expired.text);
    assert.equal(expired.body.code, 'unauthorized');
    // Still listed (it was not revoked), with its expiry in the past.
    const list = await t().req('GET', '/api-keys', { token: u.token });
    const item = list.body.find((k: { id: string }) => k.id === r.body.id);
    assert.ok(item);
    assert.ok(new Date(item.expires_at).getTime() <= t().clock.nowMs());
  });

  test('a revoked key is 401 at once; DELETE is 204, then 404; it leaves the list', async () => {
    const u = await createUser(t());
    const keep = await createApiKey(t(), u.token, 'read_only', 'keep');
    const r = await create(u.token, { name: 'gone' });
    assert.equal((await t().req('GET', '/account', { token: r.body.key })).status, 200);
    const del = await t().req('DELETE', `/api-keys/${r.body.id}`, { token: u.token });
    assert.equal(del.status, 204);
    assert.equal(del.text, '');
    const after = await t().req('GET', '/account', { token: r.body.key });
    assert.equal(after.status, 401);
    assert.equal(after.body.code, 'unauthorized');
    const again = await t().req('DELETE', `/api-keys/${r.body.id}`, { token: u.token });
    assert.equal(again.status, 404);
    assert.equal(again.body.code, 'not_found');
    const list = await t().req('GET', '/api-keys', { token: u.token });
    assert.deepEqual(list.body.map((k: { name: string }) => k.name), ['keep']);
    assert.equal(list.headers['x-total-count'], '1');
    assert.equal((await t().req('GET', '/account', { token: keep })).status, 200, 'other keys unaffected');
  });

  test('a read_write key may revoke itself; from then on it is 401', async () => {
    const u = await createUser(t());
    const r = await create(u.token, { name: 'self' });
    const del = await t().req('DELETE', `/api-keys/${r.body.id}`, { token: r.body.key });
    assert.equal(del.status, 204);
    assert.equal((await t().req('GET', '/api-keys', { token: r.body.key })).status, 401);
  });

  test('another user\'s key is 404 exactly like a missing one, and keeps working; malformed ids are 404', async () => {
    const owner = await createUser(t());
    const other = await createUser(t());
    const r = await create(owner.token, { name: 'mine' });
    const missing = await t().req('DELETE', `/api-keys/${randomUUID()}`, { token: other.token });
    assert.equal(missing.status, 404);
    const theirs = await t().req('DELETE', `/api-keys/${r.body.id}`, { token: other.token });
    assert.equal(theirs.status, 404);
    assert.equal(theirs.body.code, 'not_found');
    assert.equal(theirs.body.detail, missing.body.detail, 'no existence leak');
    assert.equal((await t().req('GET', '/account', { token: r.body.key })).status, 200);
    assert.deepEqual((await t().req('GET', '/api-keys', { token: other.token })).body, []);
    for (const id of ['not-a-uuid', '1', "1' OR '1'='1", r.body.id.replace(/-/g, ''), 'a'.repeat(80)]) {
      const res = await t().req('DELETE', `/api-keys/${encodeURIComponent(id)}`, { token: owner.token });
      assert.equal(res.status, 404, `${id}: ${res.text}`);
      assert.equal(res.body.code, 'not_found');
    }
    assert.equal(await rowCount(owner.id), 1);
  });

  test('read_only and billing_only keys can neither create, list nor revoke keys (403); read_write can', async () => {
    const u = await createUser(t());
    const ro = await createApiKey(t(), u.token, 'read_only', 'ro');
    const bo = await createApiKey(t(), u.token, 'billing_only', 'bo');
    const rw = await createApiKey(t(), u.token, 'read_write', 'rw');
    const victim = await create(u.token, { name: 'victim' });
    for (const [token, name] of [[ro, 'read_only'], [bo, 'billing_only']] as const) {
      for (const scope of [undefined, 'read_write', 'read_only', 'billing_only']) {
        const r = await t().req('POST', '/api-keys', { token, body: scope ? { name: 'x', scope } : { name: 'x' } });
        assert.equal(r.status, 403, `${name} creating ${scope}: ${r.text}`);
        assert.equal(r.body.code, 'forbidden');
      }
      const del = await t().req('DELETE', `/api-keys/${victim.body.id}`, { token });
      assert.equal(del.status, 403, `${name} revoking`);
      assert.equal((await t().req('GET', '/api-keys', { token })).status, 403, `${name} listing`);
    }
    assert.equal(await rowCount(u.id), 4, 'nothing created');
    assert.equal((await t().req('GET', '/account', { token: victim.body.key })).status, 200, 'nothing revoked');

    const made = await create(rw, { name: 'by-key', scope: 'read_only' });
    assert.equal(made.status, 201, made.text);
    assert.equal(made.body.scope, 'read_only');
    const madeRw = await create(rw, { name: 'by-key-rw' });
    assert.equal(madeRw.body.scope, 'read_write');
    assert.equal((await t().req('GET', '/api-keys', { token: rw })).status, 200);
    assert.equal((await t().req('DELETE', `/api-keys/${victim.body.id}`, { token: rw })).status, 204);
  });

  test('list: X-Total-Count, newest first, limit/offset and their bounds', async () => {
    const u = await createUser(t());
    const ids: string[] = [];
    for (let i = 0; i < 5; i++) {
      ids.push((await create(u.token, { name: `k${i}` })).body.id);
      await t().services.clock.advance(1);
    }
    const token = u.token;
    const all = await t().req('GET', '/api-keys', { token });
    assert.equal(all.headers['x-total-count'], '5');
    assert.deepEqual(all.body.map((k: { id: string }) => k.id), [...ids].reverse());
    const p = await t().req('GET', '/api-keys', { token, query: { limit: 2, offset: 1 } });
    assert.deepEqual(p.body.map((k: { id: string }) => k.id), [ids[3], ids[2]]);
    assert.equal(p.headers['x-total-count'], '5');
    const end = await t().req('GET', '/api-keys', { token, query: { limit: 100, offset: 5 } });
    assert.deepEqual(end.body, []);
    assert.equal(end.headers['x-total-count'], '5');
    for (const [query, field] of [
      [{ limit: 0 }, 'query.limit'],
      [{ limit: 101 }, 'query.limit'],
      [{ limit: 1.5 }, 'query.limit'],
      [{ limit: 'all' }, 'query.limit'],
      [{ offset: -1 }, 'query.offset'],
      [{ offset: 'x' }, 'query.offset'],
      [{ sort: 'name' }, 'query.sort'],
    ] as const) {
      const r = await t().req('GET', '/api-keys', { token, query });
      assert.equal(r.status, 422, `${JSON.stringify(query)}: ${r.text}`);
      assert.equal(r.body.code, 'validation_error');
      assert.equal(r.body.errors[0].field, field);
    }
  });

  test('last_used_at is set on use (at most once a minute)', async () => {
    const u = await createUser(t());
    const r = await create(u.token, { name: 'used', scope: 'read_only' });
    const before = await t().req('GET', '/api-keys', { token: u.token });
    assert.equal(before.body[0].last_used_at, null, 'listing with a session does not touch the key');
    const usedAt = iso();
    assert.equal((await t().req('GET', '/account', { token: r.body.key })).status, 200);
    const read = async () => {
      return (await t().req('GET', '/api-keys', { token: u.token })).body.find((k: { id: string }) => k.id === r.body.id).last_used_at;
    };
    assert.equal(await read(), usedAt);
    await t().services.clock.advance(30);
    await t().req('GET', '/account', { token: r.body.key });
    assert.equal(await read(), usedAt, 'not rewritten within a minute');
    await t().services.clock.advance(31);
    const later = iso();
    await t().req('GET', '/account', { token: r.body.key });
    assert.equal(await read(), later);
  });

  test('bad credentials: unknown, malformed or truncated keys are 401', async () => {
    const u = await createUser(t());
    const key = await createApiKey(t(), u.token, 'read_write');
    for (const token of ['gpc_unknown', key.slice(0, -1), key + 'x', key.toUpperCase(), 'gpc_', `${'gpc_'}${'a'.repeat(300)}`]) {
      const r = await t().req('GET', '/api-keys', { token });
      assert.equal(r.status, 401, token);
      assert.equal(r.body.code, 'unauthorized');
    }
    for (const authorization of [key, `Basic ${key}`, `Bearer ${key} extra`, 'Bearer']) {
      const r = await t().req('GET', '/api-keys', { headers: { authorization } });
      assert.equal(r.status, 401, authorization);
    }
    assert.equal((await t().req('GET', '/api-keys', { headers: { authorization: `bearer ${key}` } })).status, 200, 'scheme is case-insensitive');
    const none = await t().req('POST', '/api-keys', { body: { name: 'x' } });
    assert.equal(none.status, 401);
  });

  test('a key keeps working after its creator\'s session ends (keys are independent of sessions)', async () => {
    const u = await createUser(t());
    const key = await createApiKey(t(), u.token, 'read_only');
    const out = await t().req('POST', '/auth/logout', { token: u.token, body: { refresh_token: u.refresh } });
    assert.equal(out.status, 204, out.text);
    await t().services.clock.advance(3601);
    assert.equal((await t().req('GET', '/account', { token: u.token })).status, 401, 'the JWT has expired');
    assert.equal((await t().req('GET', '/account', { token: key })).status, 200, 'the key without expiry has not');
  });
});
