/**
 * /ssh-keys over HTTP (upload, list, get, delete, limits, ownership, scopes): real keys made by
 * ssh-keygen, fingerprints compared with `ssh-keygen -l -E sha256`.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { describeEachDb } from '../helpers/app.js';
import { api, type Api, type BodyFor } from '../helpers/api.js';
import { world } from '../helpers/world.js';
import { generateKey, skEd25519Key, type GeneratedKey } from './keygen.js';

const RECORD_FIELDS = ['created_at', 'fingerprint', 'id', 'key_type', 'label'];
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

type SshKey = BodyFor<'/ssh-keys', 'post', 201>;

describeEachDb('ssh-keys routes', (t) => {
  /** Uploads a key as `as` and forbids its key material in every later response. */
  async function upload(as: Api, k: GeneratedKey | string, extra: { label?: string | null } = {}) {
    const text = typeof k === 'string' ? k : k.line;
    if (typeof k !== 'string') t().forbidSecret(k.data);
    return as.post('/ssh-keys', { body: { ssh_public_key: text, ...extra } });
  }

  async function storedCount(userId: number): Promise<number> {
    const r = await t().db.query<{ n: number }>('SELECT count(*)::int8 AS n FROM ssh_keys WHERE user_id = $1', [
      userId,
    ]);
    return r.rows[0]!.n;
  }

  test('ed25519 upload: 201, exactly the metadata fields, fingerprint as ssh-keygen prints it', async () => {
    const { user: u } = await world(t());
    const k = generateKey('ed25519');
    const r = await upload(u.api, k);
    assert.equal(r.status, 201, r.text);
    assert.deepEqual(Object.keys(r.body).sort(), RECORD_FIELDS);
    assert.match(r.body.id, UUID);
    assert.equal(r.body.key_type, 'ssh-ed25519');
    assert.equal(r.body.fingerprint, k.fingerprint);
    assert.match(r.body.fingerprint, /^SHA256:[A-Za-z0-9+/]{43}$/);
    assert.equal(r.body.label, 'me@laptop', 'label defaults to the comment');
    assert.equal(r.body.created_at, t().clock.now().toISOString());
    assert.ok(!r.text.includes(k.data), 'the public key text is never returned');
  });

  test('rsa 2048/4096 and ecdsa 256/384/521 keys: key_type and fingerprint match ssh-keygen', async () => {
    const { user: u } = await world(t());
    const keys = [
      generateKey('rsa', { bits: 2048, comment: 'rsa2048' }),
      generateKey('ecdsa', { bits: 256, comment: 'p256' }),
      generateKey('ecdsa', { bits: 384, comment: 'p384' }),
      generateKey('ecdsa', { bits: 521, comment: 'p521' }),
      generateKey('rsa', { bits: 4096, comment: 'rsa4096' }),
    ];
    const expectedTypes = ['ssh-rsa', 'ecdsa-sha2-nistp256', 'ecdsa-sha2-nistp384', 'ecdsa-sha2-nistp521', 'ssh-rsa'];
    for (const [i, k] of keys.entries()) {
      const r = await upload(u.api, k);
      assert.equal(r.status, 201, r.text);
      assert.equal(r.body.key_type, expectedTypes[i]);
      assert.equal(r.body.key_type, k.type);
      assert.equal(r.body.fingerprint, k.fingerprint, `${k.type} ${k.bits}`);
      assert.equal(r.body.label, k.comment);
    }
    assert.equal(await storedCount(u.id), 5);
  });

  test('security-key (sk-ssh-ed25519@openssh.com) keys are accepted and fingerprinted like ssh-keygen', async () => {
    const { user: u } = await world(t());
    const k = skEd25519Key('yubikey');
    const r = await upload(u.api, k);
    assert.equal(r.status, 201, r.text);
    assert.equal(r.body.key_type, 'sk-ssh-ed25519@openssh.com');
    assert.equal(r.body.fingerprint, k.fingerprint);
  });

  test('the key text may carry surrounding whitespace and a comment with spaces', async () => {
    const { user: u } = await world(t());
    const k = generateKey('ed25519', { comment: 'work laptop 2' });
    const r = await upload(u.api, `  \n${k.line.trim()}\n\n`);
    t().forbidSecret(k.data);
    assert.equal(r.status, 201, r.text);
    assert.equal(r.body.label, 'work laptop 2');
    assert.equal(r.body.fingerprint, k.fingerprint);
  });

  test('label: explicit label wins; default is the comment, else key-N (never a label already in use)', async () => {
    const { user: u } = await world(t());
    const a = await upload(u.api, generateKey('ed25519', { comment: 'from-comment' }), { label: '  build box  ' });
    assert.equal(a.status, 201, a.text);
    assert.equal(a.body.label, 'build box', 'label is trimmed');
    const b = await upload(u.api, generateKey('ed25519', { comment: '' }));
    assert.equal(b.status, 201, b.text);
    assert.equal(b.body.label, 'key-2', 'second key of the account, no comment');
    const c = await upload(u.api, generateKey('ed25519', { comment: '' }), { label: null });
    assert.equal(c.status, 201, c.text);
    assert.equal(c.body.label, 'key-3', 'label null also means the default');
    // Deleting key-2 and adding another comment-less key must not produce a second "key-3".
    assert.equal((await u.api.delete('/ssh-keys/{key_id}', { params: { key_id: b.body.id } })).status, 204);
    const d = await upload(u.api, generateKey('ed25519', { comment: '' }));
    assert.equal(d.status, 201, d.text);
    const list = await u.api.get('/ssh-keys');
    assert.equal(list.status, 200, list.text);
    const labels = list.body.map((k) => k.label);
    assert.equal(new Set(labels).size, labels.length, `default labels are unique: ${labels.join(', ')}`);
    assert.match(d.body.label, /^key-\d+$/);
  });

  test('a long comment is cut to a valid label (64 characters, no broken characters)', async () => {
    const { user: u } = await world(t());
    const comment = 'c'.repeat(63) + '\u{1F511}' + 'tail';
    const r = await upload(u.api, generateKey('ed25519', { comment }));
    assert.equal(r.status, 201, r.text);
    assert.equal(r.body.label, 'c'.repeat(63) + '\u{1F511}');
    assert.doesNotMatch(r.body.label, /[\uD800-\uDFFF]/u, 'no lone surrogate');
    const got = await u.api.get('/ssh-keys/{key_id}', { params: { key_id: r.body.id } });
    assert.equal(got.status, 200, got.text);
    assert.equal(got.body.label, r.body.label, 'stored and read back intact');
  });

  test('label validation: empty, blank, too long, not a string -> 422 on body.label', async () => {
    const { user: u } = await world(t());
    const k = generateKey();
    t().forbidSecret(k.data);
    for (const label of ['', '   ', 'x'.repeat(65), 42, ['a']]) {
      const r = await u.api.post('/ssh-keys', { rawBody: { ssh_public_key: k.line, label } });
      assert.equal(r.status, 422, `${JSON.stringify(label)}: ${r.text}`);
      assert.equal(r.body.code, 'validation_error');
      assert.equal(r.body.errors?.[0]?.field, 'body.label', r.text);
    }
    assert.equal((await upload(u.api, k, { label: 'x'.repeat(64) })).status, 201, '64 characters is fine');
  });

  test('invalid key text -> 422 with errors[0].field body.ssh_public_key, nothing stored', async () => {
    const { user: u } = await world(t());
    const good = generateKey('ed25519', { comment: 'x' });
    const other = generateKey('ed25519', { comment: 'y' });
    const rsa = generateKey('rsa', { bits: 2048, comment: 'r' });
    const [, edData] = good.line.trim().split(' ');
    const cases: Record<string, unknown> = {
      empty: '',
      blank: '   ',
      garbage: 'hello world',
      'type only': 'ssh-ed25519',
      'not base64': 'ssh-ed25519 !!!notbase64!!! me',
      'truncated data': `ssh-ed25519 ${edData!.slice(0, 40)} me`,
      'type and data disagree': `ssh-rsa ${edData} me`,
      'unknown type': `ssh-foo ${edData} me`,
      'two keys': `${good.line.trim()}\n${other.line.trim()}`,
      'authorized_keys options': `from="10.0.0.1" ${good.line.trim()}`,
      'private key': '-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----',
      'RFC 4716 block': `---- BEGIN SSH2 PUBLIC KEY ----\n${rsa.data}\n---- END SSH2 PUBLIC KEY ----`,
      dsa: 'ssh-dss AAAAB3NzaC1kc3MAAACBAP1/U4EddRIpUt9KnC7s5Of2EbdSPO9EAMMeP4C2USZpRV1AIlH7WT2NWPq/xfW6MPbLm1Vs14E7 me',
      'bare base64': edData,
      'too long': `ssh-ed25519 ${'A'.repeat(20000)}`,
      number: 12345,
      null: null,
      object: { key: good.line },
    };
    for (const [name, text] of Object.entries(cases)) {
      const r = await u.api.post('/ssh-keys', { rawBody: { ssh_public_key: text } });
      assert.equal(r.status, 422, `${name}: ${r.text}`);
      assert.equal(r.body.code, 'validation_error', name);
      assert.equal(r.body.errors?.[0]?.field, 'body.ssh_public_key', `${name}: ${r.text}`);
    }
    const missing = await u.api.post('/ssh-keys', { rawBody: { label: 'x' } });
    assert.equal(missing.status, 422);
    assert.equal(missing.body.errors?.[0]?.field, 'body.ssh_public_key');
    const unknown = await u.api.post('/ssh-keys', { rawBody: { ssh_public_key: good.line, comment: 'x' } });
    assert.equal(unknown.status, 422);
    assert.equal(unknown.body.errors?.[0]?.field, 'body.comment');
    assert.equal(await storedCount(u.id), 0);
  });

  test('RSA keys under 2048 bits -> 422 naming the size', async () => {
    const { user: u } = await world(t());
    const k = generateKey('rsa', { bits: 1024, comment: 'old' });
    assert.equal(k.bits, 1024);
    const r = await upload(u.api, k);
    assert.equal(r.status, 422, r.text);
    assert.equal(r.body.errors?.[0]?.field, 'body.ssh_public_key');
    assert.match(r.body.detail, /2048/);
    assert.equal(await storedCount(u.id), 0);
  });

  test('the same key twice on one account -> 400 conflict (even with another label); another user may upload it', async () => {
    const w = await world(t());
    const u = w.user;
    const v = await w.newUser();
    const k = generateKey();
    assert.equal((await upload(u.api, k)).status, 201);
    const again = await upload(u.api, k, { label: 'another label' });
    assert.equal(again.status, 400, again.text);
    assert.equal(again.body.code, 'conflict');
    assert.ok(again.body.detail.includes(k.fingerprint), 'detail names the fingerprint');
    // Same key material with another comment is still the same key.
    const recommented = await upload(u.api, `${k.type} ${k.data} different-comment`);
    assert.equal(recommented.status, 400);
    assert.equal(recommented.body.code, 'conflict');
    const theirs = await upload(v.api, k);
    assert.equal(theirs.status, 201, theirs.text);
    assert.equal(theirs.body.fingerprint, k.fingerprint);
    assert.equal(await storedCount(u.id), 1);
    assert.equal(await storedCount(v.id), 1);
  });

  test('at most 5 keys: the sixth -> 400 limit_exceeded; after a delete there is room again', async () => {
    const { user: u } = await world(t());
    const ids: string[] = [];
    for (let i = 0; i < 5; i++) {
      const r = await upload(u.api, generateKey());
      assert.equal(r.status, 201, r.text);
      ids.push(r.body.id);
    }
    const sixth = generateKey();
    const r = await upload(u.api, sixth);
    assert.equal(r.status, 400, r.text);
    assert.equal(r.body.code, 'limit_exceeded');
    assert.match(r.body.detail, /5/);
    assert.equal(await storedCount(u.id), 5);
    assert.equal((await u.api.delete('/ssh-keys/{key_id}', { params: { key_id: ids[0]! } })).status, 204);
    assert.equal((await upload(u.api, sixth)).status, 201);
    assert.equal(await storedCount(u.id), 5);
  });

  test('a duplicate on a full account is reported as conflict, not as the limit', async () => {
    const { user: u } = await world(t());
    const keys = Array.from({ length: 5 }, () => generateKey());
    for (const k of keys) assert.equal((await upload(u.api, k)).status, 201);
    const r = await upload(u.api, keys[2]!);
    assert.equal(r.status, 400);
    assert.equal(r.body.code, 'conflict');
  });

  test('10 concurrent uploads of distinct keys by one user store exactly 5', async () => {
    const { user: u } = await world(t());
    const keys = Array.from({ length: 10 }, () => generateKey());
    const results = await Promise.all(keys.map((k) => upload(u.api, k)));
    const created = results.filter((r) => r.status === 201);
    const refused = results.filter((r) => r.status !== 201);
    assert.equal(
      created.length,
      5,
      results.map((r) => `${r.status} ${r.status === 201 ? '' : r.body.code}`).join(', '),
    );
    for (const r of refused) {
      assert.equal(r.status, 400, r.text);
      assert.equal(r.body.code, 'limit_exceeded');
    }
    assert.equal(await storedCount(u.id), 5);
    const list = await u.api.get('/ssh-keys');
    assert.equal(list.status, 200, list.text);
    assert.equal(list.headers['x-total-count'], '5');
    assert.deepEqual(list.body.map((k) => k.id).sort(), created.map((r) => r.body.id).sort());
  });

  test('10 concurrent uploads of the same key store it once', async () => {
    const { user: u } = await world(t());
    const k = generateKey();
    const results = await Promise.all(Array.from({ length: 10 }, () => upload(u.api, k)));
    assert.equal(results.filter((r) => r.status === 201).length, 1);
    assert.ok(results.filter((r) => r.status !== 201).every((r) => r.status === 400 && r.body.code === 'conflict'));
    assert.equal(await storedCount(u.id), 1);
  });

  test("GET list and GET one: the caller's keys only, same records as create, X-Total-Count, pagination", async () => {
    const w = await world(t());
    const u = w.user;
    const v = await w.newUser();
    const created: SshKey[] = [];
    for (let i = 0; i < 3; i++) {
      const r = await upload(u.api, generateKey('ed25519', { comment: `k${i}` }));
      assert.equal(r.status, 201);
      created.push(r.body);
      await t().services.clock.advance(1); // distinct created_at, so "newest first" is well defined
    }
    assert.equal((await upload(v.api, generateKey())).status, 201);

    const list = await u.api.get('/ssh-keys');
    assert.equal(list.status, 200);
    assert.ok(Array.isArray(list.body), 'a bare array');
    assert.equal(list.headers['x-total-count'], '3');
    assert.deepEqual(list.body, [...created].reverse(), 'newest first, same records as create');
    for (const item of list.body) assert.deepEqual(Object.keys(item).sort(), RECORD_FIELDS);

    const p1 = await u.api.get('/ssh-keys', { query: { limit: 2 } });
    assert.deepEqual(p1.body, [created[2], created[1]]);
    assert.equal(p1.headers['x-total-count'], '3');
    const p2 = await u.api.get('/ssh-keys', { query: { limit: 2, offset: 2 } });
    assert.deepEqual(p2.body, [created[0]]);
    const p3 = await u.api.get('/ssh-keys', { query: { offset: 10 } });
    assert.deepEqual(p3.body, []);
    assert.equal(p3.headers['x-total-count'], '3');
    for (const query of [{ limit: 0 }, { limit: 101 }, { offset: -1 }, { limit: 'ten' }, { page: 1 }] as Record<
      string,
      string | number
    >[]) {
      const bad = await u.api.get('/ssh-keys', { rawQuery: query });
      assert.equal(bad.status, 422, `${JSON.stringify(query)}: ${bad.text}`);
      assert.match(bad.body.errors?.[0]?.field ?? '', /^query\./);
    }
    assert.equal((await u.api.get('/ssh-keys', { query: { limit: 100 } })).status, 200);

    const one = await u.api.get('/ssh-keys/{key_id}', { params: { key_id: created[1]!.id } });
    assert.equal(one.status, 200);
    assert.deepEqual(one.body, created[1]);
  });

  test("another user's key is 404 on GET and DELETE, exactly like a missing one, and survives", async () => {
    const w = await world(t());
    const owner = w.user;
    const other = await w.newUser();
    const r = await upload(owner.api, generateKey());
    assert.equal(r.status, 201, r.text);
    const id = r.body.id;
    const missing = await other.api.get('/ssh-keys/{key_id}', { params: { key_id: randomUUID() } });
    assert.equal(missing.status, 404, missing.text);
    for (const method of ['get', 'delete'] as const) {
      const res = await other.api.request(method, '/ssh-keys/{key_id}', { params: { key_id: id } });
      assert.equal(res.status, 404, `${method}: ${res.text}`);
      assert.equal(res.body.code, 'not_found');
      assert.equal(res.body.detail, missing.body.detail, 'no existence leak');
    }
    const list = await other.api.get('/ssh-keys');
    assert.deepEqual(list.body, []);
    assert.equal((await owner.api.get('/ssh-keys/{key_id}', { params: { key_id: id } })).status, 200);
  });

  test('DELETE: 204 with no body, then GET and DELETE are 404; malformed ids are 404', async () => {
    const { user: u } = await world(t());
    const r = await upload(u.api, generateKey());
    assert.equal(r.status, 201, r.text);
    const key = { params: { key_id: r.body.id } };
    const del = await u.api.delete('/ssh-keys/{key_id}', key);
    assert.equal(del.status, 204);
    assert.equal(del.text, '');
    assert.equal((await u.api.get('/ssh-keys/{key_id}', key)).status, 404);
    const again = await u.api.delete('/ssh-keys/{key_id}', key);
    assert.equal(again.status, 404);
    assert.equal(again.body.code, 'not_found');
    assert.equal(await storedCount(u.id), 0);
    for (const id of ['not-a-uuid', '123', r.body.id.toUpperCase().replace(/-/g, ''), 'x'.repeat(80)]) {
      for (const method of ['get', 'delete'] as const) {
        const res = await u.api.request(method, '/ssh-keys/{key_id}', { params: { key_id: id } });
        assert.equal(res.status, 404, `${method} ${id}: ${res.text}`);
        assert.equal(res.body.code, 'not_found');
      }
    }
  });

  test('key scopes: read_only may list and read but not upload or delete; billing_only may do none of it', async () => {
    const w = await world(t(), { keys: true });
    const ro = w.as(w.keys.read_only);
    const bo = w.as(w.keys.billing_only);
    const rw = w.as(w.keys.read_write);
    const k = generateKey();
    const made = await upload(rw, k);
    assert.equal(made.status, 201, 'a read_write key uploads');
    const key = { params: { key_id: made.body.id } };

    assert.equal((await ro.get('/ssh-keys')).status, 200);
    assert.equal((await ro.get('/ssh-keys/{key_id}', key)).status, 200);
    for (const [c, name] of [
      [ro, 'read_only'],
      [bo, 'billing_only'],
    ] as const) {
      const post = await upload(c, generateKey());
      assert.equal(post.status, 403, `${name} POST: ${post.text}`);
      assert.equal(post.body.code, 'forbidden');
      const del = await c.delete('/ssh-keys/{key_id}', key);
      assert.equal(del.status, 403, `${name} DELETE`);
    }
    assert.equal((await bo.get('/ssh-keys')).status, 403, 'billing_only GET /ssh-keys');
    assert.equal((await bo.get('/ssh-keys/{key_id}', key)).status, 403, `billing_only GET /ssh-keys/${made.body.id}`);
    assert.equal(await storedCount(w.user.id), 1);
    assert.equal((await rw.delete('/ssh-keys/{key_id}', key)).status, 204, 'a read_write key deletes');
  });

  test('without credentials every /ssh-keys call is 401', async () => {
    const anon = api(t());
    const key = { params: { key_id: randomUUID() } };
    const calls = [
      ['GET /ssh-keys', () => anon.get('/ssh-keys')],
      ['POST /ssh-keys', () => anon.post('/ssh-keys', { body: { ssh_public_key: generateKey().line } })],
      ['GET /ssh-keys/{key_id}', () => anon.get('/ssh-keys/{key_id}', key)],
      ['DELETE /ssh-keys/{key_id}', () => anon.delete('/ssh-keys/{key_id}', key)],
    ] as const;
    for (const [what, call] of calls) {
      const r = await call();
      assert.equal(r.status, 401, what);
      assert.equal(r.body.code, 'unauthorized');
    }
  });

  test('a deleted key is really gone from the database, and its fingerprint may be uploaded again', async () => {
    const { user: u } = await world(t());
    const k = generateKey();
    const r = await upload(u.api, k);
    assert.equal(r.status, 201, r.text);
    assert.equal((await u.api.delete('/ssh-keys/{key_id}', { params: { key_id: r.body.id } })).status, 204);
    const again = await upload(u.api, k);
    assert.equal(again.status, 201);
    assert.notEqual(again.body.id, r.body.id);
    assert.equal(again.body.fingerprint, k.fingerprint);
  });
});
