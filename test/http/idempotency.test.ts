/**
 * Idempotency-Key on POST /ssh-keys and POST /api-keys (docs/errors.md#idempotency-keys).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import http from 'node:http';
import net from 'node:net';
import type { AddressInfo } from 'node:net';
import { describeEachDb, type Res } from '../helpers/app.js';
import { PostgresDb } from '../../src/db/db.js';
import { createApiKey, createUser } from '../helpers/factories.js';
import { api, codeOf, type RequestBody } from '../helpers/api.js';
import { generateKey } from '../ssh-keys/keygen.js';

/** Asserts that `b` answered as `a` did; narrows `b` to the status of `a`. */
function same<A extends Res, B extends Res>(a: A, b: B, what = 'replay'): asserts b is B & { status: A['status'] } {
  assert.equal(b.status, a.status, `${what}: status`);
  assert.deepEqual(b.body, a.body, `${what}: body`);
  assert.equal(b.headers['content-type'], a.headers['content-type'], `${what}: content type`);
}

/** The error code of an answer whose status the test does not check, if its body has one. */

describeEachDb('idempotency', (t) => {
  const idemHeaders = (idem?: string): Record<string, string> =>
    idem === undefined ? {} : { 'idempotency-key': idem };
  /** POST /ssh-keys with `token`, and the Idempotency-Key `idem` if given. */
  const sshKey = (token: string, body: RequestBody<'/ssh-keys', 'post'>, idem?: string) =>
    api(t(), token).post('/ssh-keys', { body, headers: idemHeaders(idem) });
  /** POST /ssh-keys with a body that is not valid. */
  const sshKeyRaw = (token: string, rawBody: unknown, idem?: string) =>
    api(t(), token).post('/ssh-keys', { rawBody, headers: idemHeaders(idem) });
  /** POST /api-keys with `token`, and the Idempotency-Key `idem` if given. */
  const apiKey = (token: string, body: RequestBody<'/api-keys', 'post'>, idem?: string) =>
    api(t(), token).post('/api-keys', { body, headers: idemHeaders(idem) });

  async function count(table: 'ssh_keys' | 'api_keys', userId: number): Promise<number> {
    return (await t().db.query<{ n: number }>(`SELECT count(*)::int8 AS n FROM ${table} WHERE user_id = $1`, [userId]))
      .rows[0]!.n;
  }

  /** Every text column of every table of the test database, for secrets at rest. */
  async function databaseText(): Promise<string> {
    const tables = await t().db.query<{ table_name: string }>(
      `SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'`,
    );
    const parts: string[] = [];
    for (const { table_name } of tables.rows) {
      const rows = await t().db.query<{ row: string }>(`SELECT x::text AS row FROM "${table_name}" x`);
      parts.push(...rows.rows.map((r) => r.row));
    }
    assert.ok(parts.length > 0);
    return parts.join('\n');
  }

  test('POST /ssh-keys: same key and body -> same status and body, one row', async () => {
    const u = await createUser(t());
    const k = generateKey();
    t().forbidSecret(k.data);
    const idem = randomUUID();
    const first = await sshKey(u.token, { ssh_public_key: k.line, label: 'laptop' }, idem);
    assert.equal(first.status, 201, first.text);
    await t().services.clock.advance(5);
    const second = await sshKey(u.token, { ssh_public_key: k.line, label: 'laptop' }, idem);
    same(first, second);
    // Key order in the body does not matter: it is the same body.
    const third = await sshKey(u.token, { label: 'laptop', ssh_public_key: k.line }, idem);
    same(first, third, 'reordered body');
    assert.equal(await count('ssh_keys', u.id), 1);
    // Without the header the request acts again (and is a duplicate now).
    const plain = await sshKey(u.token, { ssh_public_key: k.line, label: 'laptop' });
    assert.equal(plain.status, 400);
    assert.equal(plain.body.code, 'conflict');
  });

  test('POST /api-keys: the replay returns the same key, one row; the key is nowhere in the database in clear', async () => {
    const u = await createUser(t());
    const idem = `create-ci-key-${randomUUID()}`;
    const first = await apiKey(u.token, { name: 'ci', scope: 'read_only' }, idem);
    assert.equal(first.status, 201, first.text);
    const second = await apiKey(u.token, { name: 'ci', scope: 'read_only' }, idem);
    same(first, second);
    assert.equal(second.body.key, first.body.key);
    assert.equal(second.body.id, first.body.id);
    assert.equal(second.headers['cache-control'], 'no-store');
    assert.equal(await count('api_keys', u.id), 1);
    assert.equal((await api(t(), first.body.key).get('/account')).status, 200, 'the replayed key works');

    // An API key is only ever stored hashed: not in api_keys, and not in the stored idempotent response either.
    const text = await databaseText();
    assert.ok(!text.includes(first.body.key), 'the API key is stored in clear somewhere');
    assert.ok(
      !text.includes(first.body.key.slice(first.body.prefix.length)),
      'the secret part of the key is stored in clear',
    );
    t().forbidSecret(first.body.key);
    const list = await api(t(), u.token).get('/api-keys');
    assert.equal(list.status, 200, list.text);
    assert.equal(list.body.length, 1);
  });

  test('same key with another body -> 422 idempotency_mismatch, nothing created', async () => {
    const u = await createUser(t());
    const idem = randomUUID();
    const first = await apiKey(u.token, { name: 'one' }, idem);
    assert.equal(first.status, 201);
    const bodies: RequestBody<'/api-keys', 'post'>[] = [
      { name: 'two' },
      { name: 'one', scope: 'read_write' },
      { name: 'one', scope: 'read_only' },
    ];
    for (const body of bodies) {
      const r = await apiKey(u.token, body, idem);
      assert.equal(r.status, 422, `${JSON.stringify(body)}: ${r.text}`);
      assert.equal(r.body.code, 'idempotency_mismatch');
    }
    // The same key on another endpoint is another request too.
    const k = generateKey();
    t().forbidSecret(k.data);
    const ssh = await sshKey(u.token, { ssh_public_key: k.line }, idem);
    assert.equal(ssh.status, 422, ssh.text);
    assert.equal(ssh.body.code, 'idempotency_mismatch');
    assert.equal(await count('api_keys', u.id), 1);
    assert.equal(await count('ssh_keys', u.id), 0);
    // And the original still replays.
    same(first, await apiKey(u.token, { name: 'one' }, idem));
    t().forbidSecret(first.body.key);
  });

  test('Idempotency-Key: up to 255 characters; longer or empty -> 422', async () => {
    const u = await createUser(t());
    const long = await apiKey(u.token, { name: 'x' }, 'k'.repeat(256));
    assert.equal(long.status, 422, long.text);
    assert.equal(long.body.code, 'validation_error');
    assert.match(String(long.body.errors?.[0]?.field), /idempotency-key/i);
    const empty = await apiKey(u.token, { name: 'x' }, '');
    assert.equal(empty.status, 422, empty.text);
    assert.equal(await count('api_keys', u.id), 0);
    const max = 'K'.repeat(255);
    const ok = await apiKey(u.token, { name: 'x' }, max);
    assert.equal(ok.status, 201, ok.text);
    same(ok, await apiKey(u.token, { name: 'x' }, max));
    t().forbidSecret(ok.body.key);
    // Any characters a header can carry.
    const odd = 'ünïcödé? key / with spaces & symbols {}[]"\'';
    const oddRes = await apiKey(u.token, { name: 'odd' }, Buffer.from(odd, 'utf8').toString('latin1'));
    assert.equal(oddRes.status, 201, oddRes.text);
    t().forbidSecret(oddRes.body.key);
    assert.equal(await count('api_keys', u.id), 2);
  });

  test('a failed request is replayed as the same failure (422 invalid key text, 400 limit)', async () => {
    const u = await createUser(t());
    const idem = randomUUID();
    const bad = await sshKey(u.token, { ssh_public_key: 'ssh-ed25519 not-a-key' }, idem);
    assert.equal(bad.status, 422, bad.text);
    assert.equal(bad.body.errors?.[0]?.field, 'body.ssh_public_key');
    same(bad, await sshKey(u.token, { ssh_public_key: 'ssh-ed25519 not-a-key' }, idem));
    // The key is spent on that request: a corrected body needs a new key.
    const k = generateKey();
    t().forbidSecret(k.data);
    const fixed = await sshKey(u.token, { ssh_public_key: k.line }, idem);
    assert.equal(fixed.status, 422);
    assert.equal(fixed.body.code, 'idempotency_mismatch');

    // So is a body that fails schema validation.
    const idemSchema = randomUUID();
    const noKey = await sshKeyRaw(u.token, { label: 'no key given' }, idemSchema);
    assert.equal(noKey.status, 422);
    assert.equal(noKey.body.errors?.[0]?.field, 'body.ssh_public_key');
    same(noKey, await sshKeyRaw(u.token, { label: 'no key given' }, idemSchema));
    const corrected = await sshKey(u.token, { label: 'no key given', ssh_public_key: k.line }, idemSchema);
    assert.equal(codeOf(corrected.body), 'idempotency_mismatch');

    // A 400 is stored too: replayed even after the cause went away.
    for (let i = 0; i < 5; i++) {
      const g = generateKey();
      t().forbidSecret(g.data);
      assert.equal((await sshKey(u.token, { ssh_public_key: g.line })).status, 201);
    }
    const sixth = generateKey();
    t().forbidSecret(sixth.data);
    const idem2 = randomUUID();
    const full = await sshKey(u.token, { ssh_public_key: sixth.line }, idem2);
    assert.equal(full.status, 400);
    assert.equal(full.body.code, 'limit_exceeded');
    const list = await api(t(), u.token).get('/ssh-keys');
    assert.equal(list.status, 200, list.text);
    const oldest = list.body[0];
    assert.ok(oldest, 'a key is listed');
    assert.equal((await api(t(), u.token).delete('/ssh-keys/{key_id}', { params: { key_id: oldest.id } })).status, 204);
    same(full, await sshKey(u.token, { ssh_public_key: sixth.line }, idem2), 'replayed 400');
    assert.equal(await count('ssh_keys', u.id), 4, 'not acted upon again');
  });

  test('keys are per user: another user may use the same Idempotency-Key independently', async () => {
    const a = await createUser(t());
    const b = await createUser(t());
    const idem = 'shared-key';
    const ka = generateKey();
    const kb = generateKey();
    t().forbidSecret(ka.data);
    t().forbidSecret(kb.data);
    const ra = await sshKey(a.token, { ssh_public_key: ka.line }, idem);
    const rb = await sshKey(b.token, { ssh_public_key: kb.line }, idem);
    assert.equal(ra.status, 201);
    assert.equal(rb.status, 201, rb.text);
    assert.notEqual(ra.body.id, rb.body.id);
    assert.equal(rb.body.fingerprint, kb.fingerprint);
    // Even with the very same body, B's request is B's own.
    const same1 = await apiKey(a.token, { name: 'n' }, 'shared-2');
    const same2 = await apiKey(b.token, { name: 'n' }, 'shared-2');
    assert.equal(same1.status, 201);
    assert.equal(same2.status, 201);
    t().forbidSecret(same1.body.key);
    t().forbidSecret(same2.body.key);
    assert.notEqual(same1.body.id, same2.body.id);
    assert.equal(await count('api_keys', a.id), 1);
    assert.equal(await count('api_keys', b.id), 1);
    // Another user cannot read A's stored response through the key either.
    const theirs = await api(t(), b.token).get('/ssh-keys');
    assert.equal(theirs.status, 200, theirs.text);
    assert.equal(theirs.body.length, 1);
  });

  test('the same key with an API key credential and with a session of the same user is one key', async () => {
    const u = await createUser(t());
    const rw = await createApiKey(t(), u.token, 'read_write');
    const idem = randomUUID();
    const viaSession = await apiKey(u.token, { name: 'x' }, idem);
    assert.equal(viaSession.status, 201);
    same(viaSession, await apiKey(rw, { name: 'x' }, idem), 'replayed to the API key');
    t().forbidSecret(viaSession.body.key);
    assert.equal(await count('api_keys', u.id), 2);
  });

  test('after 24 h the key may be reused for a new request', async () => {
    const u = await createUser(t());
    const rw = await createApiKey(t(), u.token, 'read_write'); // outlives the clock jump, unlike the JWT
    const idem = randomUUID();
    const k1 = generateKey();
    const k2 = generateKey();
    t().forbidSecret(k1.data);
    t().forbidSecret(k2.data);
    const first = await sshKey(rw, { ssh_public_key: k1.line }, idem);
    assert.equal(first.status, 201);
    const apiFirst = await apiKey(rw, { name: 'daily' }, `${idem}-api`);
    assert.equal(apiFirst.status, 201, apiFirst.text);
    t().forbidSecret(apiFirst.body.key);

    await t().services.clock.advance(86_399);
    const stillMismatch = await sshKey(rw, { ssh_public_key: k2.line }, idem);
    assert.equal(codeOf(stillMismatch.body), 'idempotency_mismatch', 'within 24 h the key is still taken');
    await t().services.clock.advance(2);

    const second = await sshKey(rw, { ssh_public_key: k2.line }, idem);
    assert.equal(second.status, 201, second.text);
    assert.equal(second.body.fingerprint, k2.fingerprint);
    assert.equal(await count('ssh_keys', u.id), 2);
    // The same body acts again too: a second API key.
    const apiAgain = await apiKey(rw, { name: 'daily' }, `${idem}-api`);
    assert.equal(apiAgain.status, 201);
    t().forbidSecret(apiAgain.body.key);
    assert.notEqual(apiAgain.body.id, apiFirst.body.id);
    assert.notEqual(apiAgain.body.key, apiFirst.body.key);
    assert.equal(await count('api_keys', u.id), 3);
    // ... and is itself replayed from now on.
    same(second, await sshKey(rw, { ssh_public_key: k2.line }, idem));
  });

  test('expired idempotency records are removed, not kept forever', async () => {
    const u = await createUser(t());
    const rw = await createApiKey(t(), u.token, 'read_write');
    for (let i = 0; i < 3; i++) {
      const r = await apiKey(rw, { name: `old-${i}` }, `old-${i}`);
      assert.equal(r.status, 201, r.text);
      t().forbidSecret(r.body.key);
    }
    const stored = async () =>
      (await t().db.query<{ n: number }>('SELECT count(*)::int8 AS n FROM idempotency_keys WHERE user_id = $1', [u.id]))
        .rows[0]!.n;
    assert.equal(await stored(), 3);
    await t().services.clock.advance(86_401);
    const r = await apiKey(rw, { name: 'new' }, 'new');
    assert.equal(r.status, 201, r.text);
    t().forbidSecret(r.body.key);
    assert.equal(await stored(), 1, 'only the live record remains');
  });

  test('20 concurrent requests with one key create one resource and all get the same response', async () => {
    const u = await createUser(t());
    const k = generateKey();
    t().forbidSecret(k.data);
    const idem = randomUUID();
    const ssh = await Promise.all(Array.from({ length: 20 }, () => sshKey(u.token, { ssh_public_key: k.line }, idem)));
    const firstSsh = ssh[0]!;
    assert.equal(firstSsh.status, 201, firstSsh.text);
    for (const r of ssh) same(firstSsh, r, 'concurrent ssh-keys');
    assert.equal(await count('ssh_keys', u.id), 1);

    const idem2 = randomUUID();
    const keys = await Promise.all(Array.from({ length: 20 }, () => apiKey(u.token, { name: 'burst' }, idem2)));
    const firstKey = keys[0]!;
    assert.equal(firstKey.status, 201, firstKey.text);
    for (const r of keys) same(firstKey, r, 'concurrent api-keys');
    // Every one is a 201 (same() above): the key of each.
    assert.equal(new Set(keys.map((r) => (r.status === 201 ? r.body.key : undefined))).size, 1);
    t().forbidSecret(firstKey.body.key);
    assert.equal(await count('api_keys', u.id), 1);
  });

  test('20 concurrent requests with one key through two service instances create one resource', async () => {
    const u = await createUser(t());
    const other = await t().another();
    const idem = randomUUID();
    const body = JSON.stringify({ name: 'two-instances' });
    const results = await Promise.all(
      Array.from({ length: 20 }, (_, i) =>
        (i % 2 ? other : t().app).inject({
          method: 'POST',
          url: '/api-keys',
          headers: { authorization: `Bearer ${u.token}`, 'content-type': 'application/json', 'idempotency-key': idem },
          payload: body,
        }),
      ),
    );
    assert.equal(results[0]!.statusCode, 201, results[0]!.body);
    for (const r of results) {
      assert.equal(r.statusCode, 201);
      assert.equal(r.body, results[0]!.body);
    }
    t().forbidSecret(JSON.parse(results[0]!.body).key);
    assert.equal(await count('api_keys', u.id), 1);
  });

  test('the key is honoured only on the idempotent routes: elsewhere it is ignored', async () => {
    const u = await createUser(t());
    const k = generateKey();
    t().forbidSecret(k.data);
    const made = await sshKey(u.token, { ssh_public_key: k.line }, 'x-1');
    assert.equal(made.status, 201, made.text);
    const del1 = await api(t(), u.token).delete('/ssh-keys/{key_id}', {
      params: { key_id: made.body.id },
      headers: { 'idempotency-key': 'x-2' },
    });
    assert.equal(del1.status, 204);
    const del2 = await api(t(), u.token).delete('/ssh-keys/{key_id}', {
      params: { key_id: made.body.id },
      headers: { 'idempotency-key': 'x-2' },
    });
    assert.equal(del2.status, 404, 'DELETE is not replayed');
  });

  test('an unauthenticated or forbidden request does not consume the key', async () => {
    const u = await createUser(t());
    const ro = await createApiKey(t(), u.token, 'read_only');
    const idem = randomUUID();
    assert.equal((await apiKey('gpc_nope', { name: 'x' }, idem)).status, 401);
    assert.equal((await apiKey(ro, { name: 'x' }, idem)).status, 403);
    const ok = await apiKey(u.token, { name: 'x' }, idem);
    assert.equal(ok.status, 201, ok.text);
    t().forbidSecret(ok.body.key);
  });
});

/**
 * A crash cannot split a change from its recorded answer: the answer is
 * written in the change's own transaction (so it is there the moment the
 * change commits, before the response is sent), and a key left pending by a
 * dead request (no change was committed) is taken over by a retry once its
 * lease ran out.
 */
describeEachDb('idempotency across crashes', (t) => {
  test('the answer is recorded in the transaction that makes the change', async () => {
    const admin = await createUser(t(), { admin: true });
    const u = await createUser(t());
    const seen: string[] = [];
    const db = t().db;
    const original = db.transaction.bind(db);
    db.transaction = (async (fn: Parameters<typeof original>[0]) => {
      const result = await original(fn);
      // Right after COMMIT, before the response goes out: the key is already answered.
      const r = await db.query<{ state: string; response_status: number }>(
        `SELECT state, response_status FROM idempotency_keys WHERE user_id = $1`,
        [admin.id],
      );
      seen.push(...r.rows.map((x) => `${x.state} ${x.response_status}`));
      return result;
    }) as typeof db.transaction;
    try {
      const r = await api(t(), admin.token).post('/admin/users/{user_id}/credits', {
        params: { user_id: u.id },
        body: { amount: 5 },
        headers: { 'idempotency-key': 'crash-1' },
      });
      assert.equal(r.status, 201, r.text);
      assert.deepEqual(seen, ['done 201']);
    } finally {
      db.transaction = original;
    }
    const replay = await api(t(), admin.token).post('/admin/users/{user_id}/credits', {
      params: { user_id: u.id },
      body: { amount: 5 },
      headers: { 'idempotency-key': 'crash-1' },
    });
    assert.equal(replay.status, 201);
    assert.equal(replay.headers['idempotent-replayed'], 'true');
    const balance = await api(t(), u.token).get('/billing/balance');
    assert.equal(balance.status, 200, balance.text);
    assert.equal(balance.body.balance, 5, 'credited once');
  });

  test('a key left pending by a dead request is taken over once its lease ran out', async () => {
    const admin = await createUser(t(), { admin: true });
    const u = await createUser(t());
    const body = { amount: 7 };
    const first = await api(t(), admin.token).post('/admin/users/{user_id}/credits', {
      params: { user_id: u.id },
      body,
      headers: { 'idempotency-key': 'crash-2' },
    });
    assert.equal(first.status, 201, first.text);
    // As if the request had died before its change committed: nothing applied, the key pending, its owner gone.
    await t().db.query(
      `UPDATE idempotency_keys SET state = 'pending', response_status = NULL, response_body = NULL, owner = 'dead', lease_until_ms = 1 WHERE user_id = $1`,
      [admin.id],
    );
    await t().db.query(`DELETE FROM transactions WHERE user_id = $1`, [u.id]);
    await t().db.query(`UPDATE balances SET balance_micros = 0 WHERE user_id = $1`, [u.id]);
    const retry = await api(t(), admin.token).post('/admin/users/{user_id}/credits', {
      params: { user_id: u.id },
      body,
      headers: { 'idempotency-key': 'crash-2' },
    });
    assert.equal(retry.status, 201, retry.text);
    assert.equal(retry.headers['idempotent-replayed'], undefined, 'executed, not replayed');
    const again = await api(t(), admin.token).post('/admin/users/{user_id}/credits', {
      params: { user_id: u.id },
      body,
      headers: { 'idempotency-key': 'crash-2' },
    });
    assert.equal(again.headers['idempotent-replayed'], 'true');
    const balance = await api(t(), u.token).get('/billing/balance');
    assert.equal(balance.status, 200, balance.text);
    assert.equal(balance.body.balance, 7, 'applied exactly once');
  });

  /** The id of an instance that was alive and is gone (its database connection closed with it). */
  const goneInstance = async (): Promise<string> => {
    if (t().kind === 'pglite') return (await t().db.presence.id()) === '1' ? '2' : '1'; // one process per database
    const other = new PostgresDb(process.env.DATABASE_URL!, { max: 1 });
    const id = await other.presence.id();
    await other.close();
    return id;
  };

  /** A credit with `key`, answered; then its key made pending again under `owner`, its lease running 10 minutes. */
  const pendingCredit = async (key: string, owner: string) => {
    const admin = await createUser(t(), { admin: true });
    const u = await createUser(t());
    const send = () =>
      api(t(), admin.token).post('/admin/users/{user_id}/credits', {
        params: { user_id: u.id },
        body: { amount: 3 },
        headers: { 'idempotency-key': key },
      });
    assert.equal((await send()).status, 201);
    const [answer] = (
      await t().db.query<{ response_status: number; response_body: string }>(
        'SELECT response_status, response_body FROM idempotency_keys WHERE user_id = $1',
        [admin.id],
      )
    ).rows;
    await t().db.query(
      `UPDATE idempotency_keys SET state = 'pending', response_status = NULL, response_body = NULL, owner = $2,
              lease_until_ms = $3 WHERE user_id = $1`,
      [admin.id, owner, Date.now() + 600_000],
    );
    const balance = async () => {
      const r = await api(t(), u.token).get('/billing/balance');
      assert.equal(r.status, 200, r.text);
      return r.body.balance;
    };
    return { admin, answer: answer!, send, balance };
  };

  test('a key left pending by an instance that is gone is taken over at once, its lease still running', async () => {
    const { send, balance } = await pendingCredit('gone-1', `${await goneInstance()}:${randomUUID()}`);
    // As if the request had died with its instance before its change committed: the change is not there.
    const retry = await send();
    assert.equal(retry.status, 201, retry.text);
    assert.equal(retry.headers['idempotent-replayed'], undefined, 'executed again at once, not waited for');
    assert.equal(await balance(), 6, 'the first credit (left in place here) and the retry: the key was taken over');
  });

  test("a key pending at a live instance is waited for, not taken over, and its owner's answer is replayed", async () => {
    const live = await t().db.presence.id();
    const { admin, answer, send, balance } = await pendingCredit('live-1', `${live}:${randomUUID()}`);
    const retry = send();
    // The owner answers a moment later.
    await new Promise((r) => setTimeout(r, 300));
    await t().db.query(
      `UPDATE idempotency_keys SET state = 'done', response_status = $2, response_body = $3 WHERE user_id = $1`,
      [admin.id, answer.response_status, answer.response_body],
    );
    const r = await retry;
    assert.equal(r.status, 201, r.text);
    assert.equal(r.headers['idempotent-replayed'], 'true');
    assert.equal(await balance(), 3, 'credited once');
  });
});

/**
 * Only requests that carry an Idempotency-Key open the scope their answer is
 * recorded through, and a keep-alive connection serves request after request
 * from the same async resources: a later request on the connection must
 * never commit an earlier request's answer, whether the scope storage is off
 * (no keyed request in flight) or on (one is, on another connection).
 */
describeEachDb('idempotency over keep-alive connections', (t) => {
  test("a later request on the same connection never records an earlier request's answer", async () => {
    await t().app.listen({ host: '127.0.0.1', port: 0 });
    const port = (t().app.server.address() as AddressInfo).port;
    const u = await createUser(t());
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    const call = (body: unknown, idem?: string) =>
      new Promise<{ status: number; text: string; socket: unknown }>((resolve, reject) => {
        const req = http.request(
          {
            host: '127.0.0.1',
            port,
            method: 'POST',
            path: '/ssh-keys',
            agent,
            headers: {
              authorization: `Bearer ${u.token}`,
              'content-type': 'application/json',
              ...(idem ? { 'idempotency-key': idem } : {}),
            },
          },
          (res) => {
            let text = '';
            res
              .setEncoding('utf8')
              .on('data', (c: string) => (text += c))
              .on('end', () => resolve({ status: res.statusCode!, text, socket: req.socket }));
          },
        );
        req.on('error', reject).end(JSON.stringify(body));
      });
    // A keyed request on another connection that stays in flight (its body never completes) keeps the storage on.
    const held = net.connect(port, '127.0.0.1');
    await new Promise((r) => held.once('connect', r));
    try {
      for (const storageOn of [false, true]) {
        if (storageOn) {
          held.write(
            `POST /ssh-keys HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${u.token}\r\nContent-Type: application/json\r\nIdempotency-Key: held\r\nContent-Length: 100\r\n\r\n{`,
          );
          await new Promise((r) => setTimeout(r, 100));
        }
        const idem = randomUUID();
        // Refused by the service after the key was claimed and its answer bound: nothing commits.
        const refused = await call({ ssh_public_key: 'ssh-ed25519 not-a-key' }, idem);
        assert.equal(refused.status, 422, refused.text);
        // The next request on the same connection makes a change without a key.
        const k = generateKey();
        t().forbidSecret(k.data);
        const made = await call({ ssh_public_key: k.line });
        assert.equal(made.status, 201, made.text);
        assert.equal(made.socket, refused.socket, 'the same connection');
        const replay = await call({ ssh_public_key: 'ssh-ed25519 not-a-key' }, idem);
        assert.equal(replay.status, 422, `storage ${storageOn ? 'on' : 'off'}: the key keeps its own answer`);
        assert.equal(replay.text, refused.text);
      }
    } finally {
      held.destroy();
      agent.destroy();
    }
  });
});
