/**
 * /api-keys over HTTP and API keys as credentials: the key record, status
 * codes, pagination, scopes, expiry, revocation, ownership and no-store.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { describeEachDb } from '../helpers/app.js';
import type { Api, RequestBody } from '../helpers/api.js';
import { world } from '../helpers/world.js';

const CREATED_FIELDS = ['created_at', 'expires_at', 'id', 'key', 'last_used_at', 'name', 'prefix', 'scope'];
const RECORD_FIELDS = CREATED_FIELDS.filter((f) => f !== 'key');
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

describeEachDb('api-keys', (t) => {
  const iso = (offsetSeconds = 0) => new Date(t().clock.nowMs() + offsetSeconds * 1000).toISOString();

  /** POST /api-keys as `as`; a created key is forbidden in every later response. */
  async function create(as: Api, body: RequestBody<'/api-keys', 'post'>) {
    const r = await as.post('/api-keys', { body });
    if (r.status === 201) t().forbidSecret(r.body.key);
    return r;
  }

  async function rowCount(userId: number): Promise<number> {
    return (await t().db.query<{ n: number }>('SELECT count(*)::int8 AS n FROM api_keys WHERE user_id = $1', [userId]))
      .rows[0]!.n;
  }

  test('create: 201 with exactly the key record fields plus key, gpc_ key shown once, default scope read_write, no-store', async () => {
    const w = await world(t());
    const u = w.user;
    const r = await create(u.api, { name: 'ci' });
    assert.equal(r.status, 201, r.text);
    assert.deepEqual(Object.keys(r.body).sort(), CREATED_FIELDS);
    assert.match(r.body.id, UUID);
    assert.equal(r.body.name, 'ci');
    assert.equal(r.body.scope, 'read_write');
    assert.match(r.body.key, /^gpc_[A-Za-z0-9_-]{40,}$/);
    assert.ok(r.body.key.startsWith(r.body.prefix), 'prefix is the start of the key');
    assert.ok(
      r.body.prefix.startsWith('gpc_') && r.body.prefix.length < r.body.key.length / 2,
      'prefix reveals only a little',
    );
    assert.equal(r.body.created_at, t().clock.now().toISOString());
    assert.equal(r.body.expires_at, null);
    assert.equal(r.body.last_used_at, null);
    assert.equal(r.headers['cache-control'], 'no-store');

    // The key is a working credential.
    const me = await w.as(r.body.key).get('/account');
    assert.equal(me.status, 200, me.text);
    assert.equal(me.body.id, u.id);

    // Listed without the key (forbidSecret makes every response prove it never comes back).
    const list = await u.api.get('/api-keys');
    assert.equal(list.status, 200);
    assert.equal(list.headers['cache-control'], 'no-store');
    assert.equal(list.body.length, 1);
    const [item] = list.body;
    assert.ok(item);
    assert.deepEqual(Object.keys(item).sort(), RECORD_FIELDS);
    const { key: _key, ...record } = r.body;
    assert.deepEqual({ ...item, last_used_at: null }, record);
  });

  test('keys are random and stored hashed: no column of the api_keys row holds the key', async () => {
    const { user: u } = await world(t());
    const a = await create(u.api, { name: 'a' });
    const b = await create(u.api, { name: 'b' });
    assert.equal(a.status, 201, a.text);
    assert.equal(b.status, 201, b.text);
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
      const whole = await t().db.query<{ row: string }>('SELECT k::text AS row FROM api_keys k WHERE id = $1', [
        r.body.id,
      ]);
      assert.ok(!whole.rows[0]!.row.includes(r.body.key.slice(8)));
    }
  });

  test('scopes: a session creates any scope; explicit scope and expires_at are kept', async () => {
    const { user: u } = await world(t());
    for (const scope of ['read_write', 'read_only', 'billing_only'] as const) {
      const r = await create(u.api, { name: scope, scope });
      assert.equal(r.status, 201, r.text);
      assert.equal(r.body.scope, scope);
    }
    const exp = await create(u.api, { name: 'exp', expires_at: iso(7200) });
    assert.equal(exp.status, 201, exp.text);
    assert.equal(exp.body.expires_at, iso(7200));
    // Any offset is accepted and returned in UTC.
    const when = new Date(t().clock.nowMs() + 86_400_000);
    const withOffset = new Date(when.getTime() + 2 * 3_600_000).toISOString().replace('Z', '+02:00'); // the same instant
    const off = await create(u.api, { name: 'offset', expires_at: withOffset });
    assert.equal(off.status, 201, off.text);
    assert.equal(off.body.expires_at, when.toISOString());
    const nul = await create(u.api, { name: 'null', expires_at: null });
    assert.equal(nul.status, 201);
    assert.equal(nul.body.expires_at, null);
    // The name is trimmed.
    const trimmed = await create(u.api, { name: '  deploy bot  ' });
    assert.equal(trimmed.status, 201, trimmed.text);
    assert.equal(trimmed.body.name, 'deploy bot');
    assert.equal((await create(u.api, { name: 'n'.repeat(64) })).status, 201, '64 characters is fine');
  });

  test('validation: name, scope, expires_at, unknown fields, body shape -> 422 naming the field', async () => {
    const { user: u } = await world(t());
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
      const r = await u.api.post('/api-keys', { rawBody: body });
      assert.equal(r.status, 422, `${JSON.stringify(body)}: ${r.text}`);
      assert.equal(r.body.code, 'validation_error');
      assert.ok(
        r.body.errors?.some((e) => e.field === field),
        `${JSON.stringify(body)}: ${r.text}`,
      );
    }
    assert.equal(await rowCount(u.id), 0, 'nothing was created');
    const noBody = await u.api.post('/api-keys', { rawBody: undefined });
    assert.equal(noBody.status, 422, noBody.text);
    const text = await u.api.post('/api-keys', { rawBody: 'name=x', headers: { 'content-type': 'text/plain' } });
    assert.equal(text.status, 415);
  });

  test('an expired key is 401; it works until its expiry', async () => {
    const w = await world(t());
    const u = w.user;
    const r = await create(u.api, { name: 'short', scope: 'read_only', expires_at: iso(600) });
    assert.equal(r.status, 201);
    const key = w.as(r.body.key);
    assert.equal((await key.get('/account')).status, 200);
    await t().services.clock.advance(599);
    assert.equal((await key.get('/account')).status, 200, 'one second before expiry');
    await t().services.clock.advance(1);
    const expired = await key.get('/account');
    assert.equal(expired.status, 401, expired.text);
    assert.equal(expired.body.code, 'unauthorized');
    // Still listed (it was not revoked), with its expiry in the past.
    const list = await u.api.get('/api-keys');
    assert.equal(list.status, 200, list.text);
    const item = list.body.find((k) => k.id === r.body.id);
    assert.ok(item);
    assert.ok(item.expires_at !== null && new Date(item.expires_at).getTime() <= t().clock.nowMs());
  });

  test('a revoked key is 401 at once; DELETE is 204, then 404; it leaves the list', async () => {
    const w = await world(t(), { keys: ['read_only'] });
    const u = w.user;
    const r = await create(u.api, { name: 'gone' });
    assert.equal(r.status, 201, r.text);
    const gone = w.as(r.body.key);
    const id = { params: { key_id: r.body.id } };
    assert.equal((await gone.get('/account')).status, 200);
    const del = await u.api.delete('/api-keys/{key_id}', id);
    assert.equal(del.status, 204);
    assert.equal(del.text, '');
    const after = await gone.get('/account');
    assert.equal(after.status, 401);
    assert.equal(after.body.code, 'unauthorized');
    const again = await u.api.delete('/api-keys/{key_id}', id);
    assert.equal(again.status, 404);
    assert.equal(again.body.code, 'not_found');
    const list = await u.api.get('/api-keys');
    assert.equal(list.status, 200, list.text);
    assert.deepEqual(
      list.body.map((k) => k.name),
      ['read_only'],
      'only the kept key (the world names keys by scope)',
    );
    assert.equal(list.headers['x-total-count'], '1');
    assert.equal((await w.as(w.keys.read_only).get('/account')).status, 200, 'other keys unaffected');
  });

  test('a read_write key may revoke itself; from then on it is 401', async () => {
    const w = await world(t());
    const r = await create(w.user.api, { name: 'self' });
    assert.equal(r.status, 201, r.text);
    const self = w.as(r.body.key);
    const del = await self.delete('/api-keys/{key_id}', { params: { key_id: r.body.id } });
    assert.equal(del.status, 204);
    assert.equal((await self.get('/api-keys')).status, 401);
  });

  test("another user's key is 404 exactly like a missing one, and keeps working; malformed ids are 404", async () => {
    const w = await world(t());
    const owner = w.user;
    const other = await w.newUser();
    const r = await create(owner.api, { name: 'mine' });
    assert.equal(r.status, 201, r.text);
    const missing = await other.api.delete('/api-keys/{key_id}', { params: { key_id: randomUUID() } });
    assert.equal(missing.status, 404);
    const theirs = await other.api.delete('/api-keys/{key_id}', { params: { key_id: r.body.id } });
    assert.equal(theirs.status, 404);
    assert.equal(theirs.body.code, 'not_found');
    assert.equal(theirs.body.detail, missing.body.detail, 'no existence leak');
    assert.equal((await w.as(r.body.key).get('/account')).status, 200);
    assert.deepEqual((await other.api.get('/api-keys')).body, []);
    // The client puts the id in the path with encodeURIComponent.
    for (const id of ['not-a-uuid', '1', "1' OR '1'='1", r.body.id.replace(/-/g, ''), 'a'.repeat(80)]) {
      const res = await owner.api.delete('/api-keys/{key_id}', { params: { key_id: id } });
      assert.equal(res.status, 404, `${id}: ${res.text}`);
      assert.equal(res.body.code, 'not_found');
    }
    assert.equal(await rowCount(owner.id), 1);
  });

  test('read_only and billing_only keys can neither create, list nor revoke keys (403); read_write can', async () => {
    const w = await world(t(), { keys: true });
    const ro = w.as(w.keys.read_only);
    const bo = w.as(w.keys.billing_only);
    const rw = w.as(w.keys.read_write);
    const victim = await create(w.user.api, { name: 'victim' });
    assert.equal(victim.status, 201, victim.text);
    const id = { params: { key_id: victim.body.id } };
    for (const [c, name] of [
      [ro, 'read_only'],
      [bo, 'billing_only'],
    ] as const) {
      for (const scope of [undefined, 'read_write', 'read_only', 'billing_only'] as const) {
        const r = await c.post('/api-keys', { body: scope ? { name: 'x', scope } : { name: 'x' } });
        assert.equal(r.status, 403, `${name} creating ${scope}: ${r.text}`);
        assert.equal(r.body.code, 'forbidden');
      }
      const del = await c.delete('/api-keys/{key_id}', id);
      assert.equal(del.status, 403, `${name} revoking`);
      assert.equal((await c.get('/api-keys')).status, 403, `${name} listing`);
    }
    assert.equal(await rowCount(w.user.id), 4, 'nothing created');
    assert.equal((await w.as(victim.body.key).get('/account')).status, 200, 'nothing revoked');

    const made = await create(rw, { name: 'by-key', scope: 'read_only' });
    assert.equal(made.status, 201, made.text);
    assert.equal(made.body.scope, 'read_only');
    const madeRw = await create(rw, { name: 'by-key-rw' });
    assert.equal(madeRw.status, 201, madeRw.text);
    assert.equal(madeRw.body.scope, 'read_write');
    assert.equal((await rw.get('/api-keys')).status, 200);
    assert.equal((await rw.delete('/api-keys/{key_id}', id)).status, 204);
  });

  test('list: X-Total-Count, newest first, limit/offset and their bounds', async () => {
    const { user: u } = await world(t());
    const ids: string[] = [];
    for (let i = 0; i < 5; i++) {
      const r = await create(u.api, { name: `k${i}` });
      assert.equal(r.status, 201, r.text);
      ids.push(r.body.id);
      await t().services.clock.advance(1);
    }
    const all = await u.api.get('/api-keys');
    assert.equal(all.status, 200, all.text);
    assert.equal(all.headers['x-total-count'], '5');
    assert.deepEqual(
      all.body.map((k) => k.id),
      [...ids].reverse(),
    );
    const p = await u.api.get('/api-keys', { query: { limit: 2, offset: 1 } });
    assert.equal(p.status, 200, p.text);
    assert.deepEqual(
      p.body.map((k) => k.id),
      [ids[3], ids[2]],
    );
    assert.equal(p.headers['x-total-count'], '5');
    const end = await u.api.get('/api-keys', { query: { limit: 100, offset: 5 } });
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
    ] as [Record<string, string | number>, string][]) {
      const r = await u.api.get('/api-keys', { rawQuery: query });
      assert.equal(r.status, 422, `${JSON.stringify(query)}: ${r.text}`);
      assert.equal(r.body.code, 'validation_error');
      assert.equal(r.body.errors?.[0]?.field, field);
    }
  });

  test('last_used_at is set on use (at most once a minute)', async () => {
    const w = await world(t());
    const u = w.user;
    const r = await create(u.api, { name: 'used', scope: 'read_only' });
    assert.equal(r.status, 201, r.text);
    const key = w.as(r.body.key);
    const before = await u.api.get('/api-keys');
    assert.equal(before.status, 200, before.text);
    assert.equal(before.body[0]?.last_used_at, null, 'listing with a session does not touch the key');
    const usedAt = iso();
    assert.equal((await key.get('/account')).status, 200);
    const read = async () => {
      const list = await u.api.get('/api-keys');
      assert.equal(list.status, 200, list.text);
      return list.body.find((k) => k.id === r.body.id)?.last_used_at;
    };
    assert.equal(await read(), usedAt);
    await t().services.clock.advance(30);
    await key.get('/account');
    assert.equal(await read(), usedAt, 'not rewritten within a minute');
    await t().services.clock.advance(31);
    const later = iso();
    await key.get('/account');
    assert.equal(await read(), later);
  });

  test('bad credentials: unknown, malformed or truncated keys are 401', async () => {
    const w = await world(t(), { keys: ['read_write'] });
    const key = w.keys.read_write;
    for (const token of [
      'gpc_unknown',
      key.slice(0, -1),
      key + 'x',
      key.toUpperCase(),
      'gpc_',
      `${'gpc_'}${'a'.repeat(300)}`,
    ]) {
      const r = await w.as(token).get('/api-keys');
      assert.equal(r.status, 401, token);
      assert.equal(r.body.code, 'unauthorized');
    }
    const anon = w.as();
    for (const authorization of [key, `Basic ${key}`, `Bearer ${key} extra`, 'Bearer']) {
      const r = await anon.get('/api-keys', { headers: { authorization } });
      assert.equal(r.status, 401, authorization);
    }
    assert.equal(
      (await anon.get('/api-keys', { headers: { authorization: `bearer ${key}` } })).status,
      200,
      'scheme is case-insensitive',
    );
    const none = await anon.post('/api-keys', { body: { name: 'x' } });
    assert.equal(none.status, 401);
  });

  test("a key keeps working after its creator's session ends (keys are independent of sessions)", async () => {
    const w = await world(t(), { keys: ['read_only'] });
    const u = w.user;
    const out = await u.api.post('/auth/logout', { body: { refresh_token: u.refresh } });
    assert.equal(out.status, 204, out.text);
    await t().services.clock.advance(3601);
    assert.equal((await u.api.get('/account')).status, 401, 'the JWT has expired');
    assert.equal((await w.as(w.keys.read_only).get('/account')).status, 200, 'the key without expiry has not');
  });
});
