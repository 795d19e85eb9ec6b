/**
 * What can lock an owner out of the account needs the owner's own session:
 * 2FA enrolment and removal, the password, ending every session. Keys made by
 * a key die with it. Enabling or disabling 2FA and changing the password end
 * the account's other sessions (the caller's goes on); logout-all ends them
 * all.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { describeEachDb } from '../helpers/app.js';
import { api, type ErrorBody, type Reply } from '../helpers/api.js';
import { challengeOf, createApiKey, createUser, tokensOf, type TestUser } from '../helpers/factories.js';
import { stepAt, totpAt } from '../../src/modules/auth/totp.js';

/** Any answer of the client: a 403 is an ErrorBody on every route. */
type Answer =
  | Reply<403, ErrorBody>
  | Reply<
      200 | 201 | 204 | 400 | 401 | 404 | 405 | 409 | 410 | 413 | 415 | 422 | 429 | 431 | 500 | 502 | 503 | 504,
      unknown
    >;

describeEachDb('account security', (t) => {
  const code = (secret: string) => totpAt(secret, stepAt(t().clock.nowMs()));
  const account = (token: string) => api(t(), token).get('/account');
  const login = async (u: TestUser, password = u.password) => {
    const r = await api(t()).post('/auth/login', { body: { email: u.email, password } });
    return r;
  };
  /** The challenge token of a login of `u` (two-factor on). */
  const challenge = async (u: TestUser) => {
    const r = await login(u);
    assert.equal(r.status, 200, r.text);
    return challengeOf(r.body).challenge_token;
  };
  /** A second session of the same account (another device). */
  const otherSession = async (u: TestUser) => {
    const r = await login(u);
    assert.equal(r.status, 200, r.text);
    const tokens = tokensOf(r.body);
    return { access: tokens.access_token, refresh: tokens.refresh_token };
  };
  const refresh = (refresh_token: string) => api(t()).post('/auth/refresh', { body: { refresh_token } });
  const expect403 = (r: Answer, what: string) => {
    assert.equal(r.status, 403, `${what}: ${r.text}`);
    assert.equal(r.body.code, 'forbidden');
  };

  test('a read_write key can neither enrol nor remove 2FA, change the password nor end sessions', async () => {
    const u = await createUser(t());
    const key = api(t(), await createApiKey(t(), u.token, 'read_write'));
    expect403(await key.post('/auth/2fa/setup'), 'setup');
    expect403(await key.post('/auth/2fa/enable', { body: { code: '123456' } }), 'enable');
    expect403(await key.post('/auth/2fa/disable', { body: { code: '123456' } }), 'disable');
    expect403(
      await key.post('/account/password', {
        body: { current_password: u.password, new_password: 'a brand new password' },
      }),
      'password',
    );
    expect403(await key.post('/auth/logout-all'), 'logout-all');
    // Nothing changed: no 2FA, the same password, the session alive.
    const me = await account(u.token);
    assert.equal(me.status, 200, me.text);
    assert.equal(me.body.two_factor_enabled, false);
    assert.equal((await login(u)).status, 200);
    assert.equal((await account(u.token)).status, 200);
  });

  test('revoking a key revokes every key made through it, at any depth; other keys live on', async () => {
    const u = await createUser(t());
    const c = api(t(), u.token);
    const k1 = await createApiKey(t(), u.token, 'read_write', 'k1');
    const k2 = await createApiKey(t(), k1, 'read_write', 'k2 by k1');
    const k3 = await createApiKey(t(), k2, 'read_only', 'k3 by k2');
    const sibling = await createApiKey(t(), u.token, 'read_only', 'by the session');
    const other = await createUser(t());
    const othersKey = await createApiKey(t(), other.token, 'read_only');
    for (const k of [k1, k2, k3, sibling]) assert.equal((await account(k)).status, 200);
    const list = await c.get('/api-keys');
    assert.equal(list.status, 200, list.text);
    const id1 = list.body.find((k) => k.name === 'k1')?.id;
    assert.ok(id1, list.text);
    assert.equal((await c.delete('/api-keys/{key_id}', { params: { key_id: id1 } })).status, 204);
    for (const k of [k1, k2, k3]) assert.equal((await account(k)).status, 401, 'the key and what it made are dead');
    assert.equal((await account(sibling)).status, 200);
    assert.equal((await account(othersKey)).status, 200);
    const after = await c.get('/api-keys');
    assert.equal(after.status, 200, after.text);
    assert.deepEqual(after.body.map((k) => k.name).sort(), ['by the session'], 'the list shows the live keys');
    // A read_write key still manages keys: it revokes what it made, and itself.
    const k4 = await createApiKey(t(), u.token, 'read_write', 'k4');
    const k5 = await createApiKey(t(), k4, 'read_only', 'k5 by k4');
    const list4 = await c.as(k4).get('/api-keys');
    assert.equal(list4.status, 200, list4.text);
    const id5 = list4.body.find((k) => k.name === 'k5 by k4')?.id;
    assert.ok(id5, list4.text);
    assert.equal((await c.as(k4).delete('/api-keys/{key_id}', { params: { key_id: id5 } })).status, 204);
    assert.equal((await account(k5)).status, 401);
    assert.equal((await account(k4)).status, 200);
  });

  test("enabling 2FA ends the other sessions; disabling it too; the caller's session goes on", async () => {
    const u = await createUser(t());
    const c = api(t(), u.token);
    const phone = await otherSession(u);
    const s = await c.post('/auth/2fa/setup');
    assert.equal(s.status, 200, s.text);
    const secret = s.body.secret;
    t().forbidSecret(secret);
    const e = await c.post('/auth/2fa/enable', { body: { code: code(secret) } });
    assert.equal(e.status, 200, e.text);
    for (const rc of e.body.recovery_codes) t().forbidSecret(rc);
    assert.match(e.body.message, /every other session/);
    assert.equal((await account(phone.access)).status, 401, "the other session's access token is dead");
    assert.equal((await refresh(phone.refresh)).status, 401, 'and so is its refresh token');
    assert.equal((await account(u.token)).status, 200, 'the caller goes on');

    const recovery = e.body.recovery_codes[0];
    assert.ok(recovery, e.text);
    const laptop = await api(t()).post('/auth/2fa/verify', {
      body: { challenge_token: await challenge(u), code: recovery },
    });
    assert.equal(laptop.status, 200, laptop.text);
    await t().services.clock.advance(30);
    const d = await c.post('/auth/2fa/disable', { body: { code: code(secret) } });
    assert.equal(d.status, 200, d.text);
    assert.equal((await account(laptop.body.access_token)).status, 401);
    assert.equal((await account(u.token)).status, 200);
  });

  test("logout-all ends every session, the caller's too; keys are untouched", async () => {
    const u = await createUser(t());
    const c = api(t(), u.token);
    const key = await createApiKey(t(), u.token, 'read_only');
    const phone = await otherSession(u);
    const r = await c.post('/auth/logout-all');
    assert.equal(r.status, 204, r.text);
    assert.equal(r.headers['cache-control'], 'no-store');
    for (const access of [u.token, phone.access]) assert.equal((await account(access)).status, 401);
    for (const rt of [u.refresh, phone.refresh]) assert.equal((await refresh(rt)).status, 401);
    assert.equal((await account(key)).status, 200);
    assert.equal((await login(u)).status, 200, 'a new login works');
    assert.equal((await c.post('/auth/logout-all')).status, 401, 'the ended session cannot call it again');
    // logout-all takes no body: this one is sent as given.
    assert.equal((await c.post('/auth/logout-all', { rawBody: { all: true } })).status, 401);
  });

  test('password change: the current password is checked, other sessions end, the new one logs in', async () => {
    const u = await createUser(t());
    const c = api(t(), u.token);
    const phone = await otherSession(u);
    const next = 'a completely new password';
    t().forbidSecret(next);
    const wrong = await c.post('/account/password', {
      body: { current_password: 'not it at all', new_password: next },
    });
    assert.equal(wrong.status, 422, wrong.text);
    assert.equal(wrong.body.errors?.[0]?.field, 'body.current_password');
    assert.equal((await account(phone.access)).status, 200, 'a refused change ends nothing');
    for (const [body, field] of [
      [{ current_password: u.password, new_password: 'short' }, 'body.new_password'],
      [{ current_password: u.password }, 'body.new_password'],
      [{ new_password: next }, 'body.current_password'],
      [{ current_password: u.password, new_password: next, extra: 1 }, 'body.extra'],
    ] as const) {
      const r = await c.post('/account/password', { rawBody: body });
      assert.equal(r.status, 422, `${JSON.stringify(body)}: ${r.text}`);
      assert.ok(
        r.body.errors?.some((e) => e.field === field),
        r.text,
      );
    }
    const ok = await c.post('/account/password', {
      body: { current_password: u.password, new_password: next },
    });
    assert.equal(ok.status, 200, ok.text);
    assert.equal(ok.headers['cache-control'], 'no-store');
    assert.equal((await account(phone.access)).status, 401, 'the other session ended');
    assert.equal((await refresh(phone.refresh)).status, 401);
    assert.equal((await account(u.token)).status, 200, 'this one goes on');
    assert.equal((await login(u)).status, 401, 'the old password no longer logs in');
    assert.equal((await login(u, next)).status, 200);
  });

  test("wrong second-factor codes lock the account's second factor for 15 minutes, across logins and disable attempts", async () => {
    const u = await createUser(t());
    const c = api(t(), u.token);
    const anon = api(t());
    const s = await c.post('/auth/2fa/setup');
    assert.equal(s.status, 200, s.text);
    const secret = s.body.secret;
    t().forbidSecret(secret);
    const e = await c.post('/auth/2fa/enable', { body: { code: code(secret) } });
    assert.equal(e.status, 200, e.text);
    for (const rc of e.body.recovery_codes) t().forbidSecret(rc);
    await t().services.clock.advance(30);
    const wrong = () => String((Number(code(secret)) + 500_000) % 1_000_000).padStart(6, '0');
    // Two wrong codes through disable (the session), eight through logins: ten in a row.
    for (let i = 0; i < 2; i++)
      assert.equal((await c.post('/auth/2fa/disable', { body: { code: wrong() } })).status, 400);
    let challengeToken = '';
    for (let i = 0; i < 8; i++) {
      if (i % 4 === 0) challengeToken = await challenge(u); // a fresh challenge now and then
      const r = await anon.post('/auth/2fa/verify', { body: { challenge_token: challengeToken, code: wrong() } });
      assert.equal(r.status, 401, `wrong code ${i + 3}: ${r.text}`);
    }
    // Locked: even the right code is refused, with when to come back.
    const locked = await anon.post('/auth/2fa/verify', {
      body: { challenge_token: await challenge(u), code: code(secret) },
    });
    assert.equal(locked.status, 429, locked.text);
    assert.equal(locked.body.code, 'rate_limited');
    assert.equal(locked.headers['retry-after'], '900');
    assert.equal((await c.post('/auth/2fa/disable', { body: { code: code(secret) } })).status, 429);
    // After the lock, the right code works and the count starts again.
    await t().services.clock.advance(15 * 60);
    const ok = await anon.post('/auth/2fa/verify', {
      body: { challenge_token: await challenge(u), code: code(secret) },
    });
    assert.equal(ok.status, 200, ok.text);
    t().forbidSecret(ok.body.refresh_token);
    const row = await t().db.query<{ f: number; l: Date | null }>(
      'SELECT totp_failures AS f, totp_locked_until AS l FROM users WHERE id = $1',
      [u.id],
    );
    assert.deepEqual([row.rows[0]!.f, row.rows[0]!.l], [0, null]);
  });
});
