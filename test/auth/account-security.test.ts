/**
 * What can lock an owner out of the account needs the owner's own session:
 * 2FA enrolment and removal, the password, ending every session. Keys made by
 * a key die with it. Enabling or disabling 2FA and changing the password end
 * the account's other sessions (the caller's goes on); logout-all ends them
 * all.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { describeEachDb, type Res } from '../helpers/app.js';
import { createApiKey, createUser, type TestUser } from '../helpers/factories.js';
import { stepAt, totpAt } from '../../src/modules/auth/totp.js';

describeEachDb('account security', (t) => {
  const code = (secret: string) => totpAt(secret, stepAt(t().clock.nowMs()));
  const account = (token: string) => t().req('GET', '/account', { token });
  const login = async (u: TestUser, password = u.password) => {
    const r = await t().req('POST', '/auth/login', { body: { email: u.email, password } });
    return r;
  };
  /** A second session of the same account (another device). */
  const otherSession = async (u: TestUser) => {
    const r = await login(u);
    assert.equal(r.status, 200, r.text);
    return { access: r.body.access_token as string, refresh: r.body.refresh_token as string };
  };
  const refresh = (refresh_token: string) => t().req('POST', '/auth/refresh', { body: { refresh_token } });
  const expect403 = (r: Res, what: string) => {
    assert.equal(r.status, 403, `${what}: ${r.text}`);
    assert.equal(r.body.code, 'forbidden');
  };

  test('a read_write key can neither enrol nor remove 2FA, change the password nor end sessions', async () => {
    const u = await createUser(t());
    const key = await createApiKey(t(), u.token, 'read_write');
    expect403(await t().req('POST', '/auth/2fa/setup', { token: key }), 'setup');
    expect403(await t().req('POST', '/auth/2fa/enable', { token: key, body: { code: '123456' } }), 'enable');
    expect403(await t().req('POST', '/auth/2fa/disable', { token: key, body: { code: '123456' } }), 'disable');
    expect403(
      await t().req('POST', '/account/password', {
        token: key,
        body: { current_password: u.password, new_password: 'a brand new password' },
      }),
      'password',
    );
    expect403(await t().req('POST', '/auth/logout-all', { token: key }), 'logout-all');
    // Nothing changed: no 2FA, the same password, the session alive.
    assert.equal((await account(u.token)).body.two_factor_enabled, false);
    assert.equal((await login(u)).status, 200);
    assert.equal((await account(u.token)).status, 200);
  });

  test('revoking a key revokes every key made through it, at any depth; other keys live on', async () => {
    const u = await createUser(t());
    const k1 = await createApiKey(t(), u.token, 'read_write', 'k1');
    const k2 = await createApiKey(t(), k1, 'read_write', 'k2 by k1');
    const k3 = await createApiKey(t(), k2, 'read_only', 'k3 by k2');
    const sibling = await createApiKey(t(), u.token, 'read_only', 'by the session');
    const other = await createUser(t());
    const othersKey = await createApiKey(t(), other.token, 'read_only');
    for (const k of [k1, k2, k3, sibling]) assert.equal((await account(k)).status, 200);
    const list = await t().req('GET', '/api-keys', { token: u.token });
    const id1 = list.body.find((k: { name: string }) => k.name === 'k1').id;
    assert.equal((await t().req('DELETE', `/api-keys/${id1}`, { token: u.token })).status, 204);
    for (const k of [k1, k2, k3]) assert.equal((await account(k)).status, 401, 'the key and what it made are dead');
    assert.equal((await account(sibling)).status, 200);
    assert.equal((await account(othersKey)).status, 200);
    const after = (await t().req('GET', '/api-keys', { token: u.token })).body as {
      name: string;
      revoked_at?: string | null;
    }[];
    assert.deepEqual(after.map((k) => k.name).sort(), ['by the session'], 'the list shows the live keys');
    // A read_write key still manages keys: it revokes what it made, and itself.
    const k4 = await createApiKey(t(), u.token, 'read_write', 'k4');
    const k5 = await createApiKey(t(), k4, 'read_only', 'k5 by k4');
    const id5 = (await t().req('GET', '/api-keys', { token: k4 })).body.find(
      (k: { name: string }) => k.name === 'k5 by k4',
    ).id;
    assert.equal((await t().req('DELETE', `/api-keys/${id5}`, { token: k4 })).status, 204);
    assert.equal((await account(k5)).status, 401);
    assert.equal((await account(k4)).status, 200);
  });

  test("enabling 2FA ends the other sessions; disabling it too; the caller's session goes on", async () => {
    const u = await createUser(t());
    const phone = await otherSession(u);
    const s = await t().req('POST', '/auth/2fa/setup', { token: u.token });
    t().forbidSecret(s.body.secret);
    const e = await t().req('POST', '/auth/2fa/enable', { token: u.token, body: { code: code(s.body.secret) } });
    assert.equal(e.status, 200, e.text);
    for (const c of e.body.recovery_codes) t().forbidSecret(c);
    assert.match(e.body.message, /every other session/);
    assert.equal((await account(phone.access)).status, 401, "the other session's access token is dead");
    assert.equal((await refresh(phone.refresh)).status, 401, 'and so is its refresh token');
    assert.equal((await account(u.token)).status, 200, 'the caller goes on');

    const laptop = await t().req('POST', '/auth/2fa/verify', {
      body: { challenge_token: (await login(u)).body.challenge_token, code: e.body.recovery_codes[0] },
    });
    assert.equal(laptop.status, 200, laptop.text);
    await t().services.clock.advance(30);
    const d = await t().req('POST', '/auth/2fa/disable', { token: u.token, body: { code: code(s.body.secret) } });
    assert.equal(d.status, 200, d.text);
    assert.equal((await account(laptop.body.access_token)).status, 401);
    assert.equal((await account(u.token)).status, 200);
  });

  test("logout-all ends every session, the caller's too; keys are untouched", async () => {
    const u = await createUser(t());
    const key = await createApiKey(t(), u.token, 'read_only');
    const phone = await otherSession(u);
    const r = await t().req('POST', '/auth/logout-all', { token: u.token });
    assert.equal(r.status, 204, r.text);
    assert.equal(r.headers['cache-control'], 'no-store');
    for (const access of [u.token, phone.access]) assert.equal((await account(access)).status, 401);
    for (const rt of [u.refresh, phone.refresh]) assert.equal((await refresh(rt)).status, 401);
    assert.equal((await account(key)).status, 200);
    assert.equal((await login(u)).status, 200, 'a new login works');
    assert.equal(
      (await t().req('POST', '/auth/logout-all', { token: u.token })).status,
      401,
      'the ended session cannot call it again',
    );
    assert.equal((await t().req('POST', '/auth/logout-all', { token: u.token, body: { all: true } })).status, 401);
  });

  test('password change: the current password is checked, other sessions end, the new one logs in', async () => {
    const u = await createUser(t());
    const phone = await otherSession(u);
    const next = 'a completely new password';
    t().forbidSecret(next);
    const wrong = await t().req('POST', '/account/password', {
      token: u.token,
      body: { current_password: 'not it at all', new_password: next },
    });
    assert.equal(wrong.status, 422, wrong.text);
    assert.equal(wrong.body.errors[0].field, 'body.current_password');
    assert.equal((await account(phone.access)).status, 200, 'a refused change ends nothing');
    for (const [body, field] of [
      [{ current_password: u.password, new_password: 'short' }, 'body.new_password'],
      [{ current_password: u.password }, 'body.new_password'],
      [{ new_password: next }, 'body.current_password'],
      [{ current_password: u.password, new_password: next, extra: 1 }, 'body.extra'],
    ] as const) {
      const r = await t().req('POST', '/account/password', { token: u.token, body });
      assert.equal(r.status, 422, `${JSON.stringify(body)}: ${r.text}`);
      assert.ok(
        r.body.errors.some((e: { field: string }) => e.field === field),
        r.text,
      );
    }
    const ok = await t().req('POST', '/account/password', {
      token: u.token,
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
    const s = await t().req('POST', '/auth/2fa/setup', { token: u.token });
    t().forbidSecret(s.body.secret);
    const e = await t().req('POST', '/auth/2fa/enable', { token: u.token, body: { code: code(s.body.secret) } });
    assert.equal(e.status, 200, e.text);
    for (const c of e.body.recovery_codes) t().forbidSecret(c);
    await t().services.clock.advance(30);
    const wrong = () => String((Number(code(s.body.secret)) + 500_000) % 1_000_000).padStart(6, '0');
    // Two wrong codes through disable (the session), eight through logins: ten in a row.
    for (let i = 0; i < 2; i++)
      assert.equal(
        (await t().req('POST', '/auth/2fa/disable', { token: u.token, body: { code: wrong() } })).status,
        400,
      );
    let challenge = '';
    for (let i = 0; i < 8; i++) {
      if (i % 4 === 0) challenge = (await login(u)).body.challenge_token; // a fresh challenge now and then
      const r = await t().req('POST', '/auth/2fa/verify', { body: { challenge_token: challenge, code: wrong() } });
      assert.equal(r.status, 401, `wrong code ${i + 3}: ${r.text}`);
    }
    // Locked: even the right code is refused, with when to come back.
    const locked = await t().req('POST', '/auth/2fa/verify', {
      body: { challenge_token: (await login(u)).body.challenge_token, code: code(s.body.secret) },
    });
    assert.equal(locked.status, 429, locked.text);
    assert.equal(locked.body.code, 'rate_limited');
    assert.equal(locked.headers['retry-after'], '900');
    assert.equal(
      (await t().req('POST', '/auth/2fa/disable', { token: u.token, body: { code: code(s.body.secret) } })).status,
      429,
    );
    // After the lock, the right code works and the count starts again.
    await t().services.clock.advance(15 * 60);
    const ok = await t().req('POST', '/auth/2fa/verify', {
      body: { challenge_token: (await login(u)).body.challenge_token, code: code(s.body.secret) },
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
