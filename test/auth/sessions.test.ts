/**
 * Sessions: access tokens (expiry, forgery, algorithm
 * confusion, bad headers), refresh-token rotation and reuse detection,
 * refresh expiry, concurrent refreshes, logout.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { SignJWT, decodeJwt, decodeProtectedHeader, type JWTPayload } from 'jose';
import { describeEachDb, JWT_SECRET, request } from '../helpers/app.js';
import { api, expectError, type ErrorBody, type Reply } from '../helpers/api.js';
import { createUser, tokensOf, type TestUser } from '../helpers/factories.js';

const DAY = 86_400;

type Status =
  200 | 201 | 204 | 400 | 401 | 403 | 404 | 405 | 409 | 410 | 413 | 415 | 422 | 429 | 431 | 500 | 502 | 503 | 504;
/** Any answer of the client: a 401 is an ErrorBody on every route. */
type Answer = Reply<401, ErrorBody> | Reply<Exclude<Status, 401>, unknown>;

/** A 401 `unauthorized`, never cached. */
function assertUnauthorized(r: Answer, what = ''): asserts r is Reply<401, ErrorBody> {
  expectError(r, 401, 'unauthorized', undefined, what);
  assert.equal(r.headers['cache-control'], 'no-store', what);
}

const b64 = (v: unknown) => Buffer.from(typeof v === 'string' ? v : JSON.stringify(v)).toString('base64url');

async function sign(claims: JWTPayload, alg = 'HS256', secret = JWT_SECRET): Promise<string> {
  return new SignJWT(claims).setProtectedHeader({ alg, typ: 'JWT' }).sign(new TextEncoder().encode(secret));
}

describeEachDb('sessions', (t) => {
  const account = (token: string) => api(t(), token).get('/account');
  const refresh = (refresh_token: string) => api(t()).post('/auth/refresh', { body: { refresh_token } });
  const logout = (token: string, refresh_token: string) =>
    api(t(), token).post('/auth/logout', { body: { refresh_token } });
  const advance = (s: number) => t().services.clock.advance(s);
  async function login(u: TestUser): Promise<{ access_token: string; refresh_token: string }> {
    const r = await api(t()).post('/auth/login', { body: { email: u.email, password: u.password } });
    assert.equal(r.status, 200, r.text);
    return tokensOf(r.body);
  }
  async function ok(token: string, userId: number, what = ''): Promise<void> {
    const r = await account(token);
    assert.equal(r.status, 200, `${what}: ${r.text}`);
    assert.equal(r.body.id, userId);
  }

  // ---- access tokens ----

  test('access token: accepted until 3600 s, 401 after (service clock)', async () => {
    const u = await createUser(t());
    await ok(u.token, u.id, 'fresh');
    await advance(3599);
    await ok(u.token, u.id, 'at 3599 s');
    await advance(2);
    const r = await account(u.token);
    assertUnauthorized(r, 'at 3601 s');
    assert.match(r.body.detail, /expired/i);
    // The refresh token outlives it and gives a working access token.
    const fresh = await refresh(u.refresh);
    assert.equal(fresh.status, 200, fresh.text);
    await ok(fresh.body.access_token, u.id, 'refreshed');
  });

  test('access token: malformed and tampered tokens are 401', async () => {
    const u = await createUser(t());
    const [h, p, s] = u.token.split('.') as [string, string, string];
    const other = await createUser(t());
    const otherPayload = b64({ ...decodeJwt(u.token), sub: String(other.id) });
    const flip = (str: string) => str.slice(0, -2) + (str.at(-2) === 'A' ? 'B' : 'A') + str.slice(-1);
    const bad = [
      'abc',
      'a.b.c',
      'a.b',
      '...',
      `${h}.${p}`,
      `${h}.${p}.`,
      `${h}..${s}`,
      `.${p}.${s}`,
      `${h}.${p}.${s}.${s}`,
      `${h}.${p}.${flip(s)}`,
      `${h}.${flip(p)}.${s}`,
      `${h}.${otherPayload}.${s}`, // someone else's sub with my signature
      `${b64('not json')}.${p}.${s}`,
      `${h}.${b64('not json')}.${s}`,
      `${h}.${b64('[]')}.${s}`,
      u.token.slice(0, -1),
      u.token + 'A',
      u.token.toUpperCase(),
      'x'.repeat(4000),
      'gpc_notarealkey',
    ];
    for (const token of bad) assertUnauthorized(await account(token), token.slice(0, 60));
    // None of that harmed the real token.
    await ok(u.token, u.id);
  });

  test('access token: the same claims re-signed are accepted only as HS256 with the service secret', async () => {
    const u = await createUser(t());
    const claims = decodeJwt(u.token);
    assert.equal(decodeProtectedHeader(u.token).alg, 'HS256');
    // Sanity: our re-signing reproduces a valid token, so the refusals below are about alg/key alone.
    await ok(await sign(claims), u.id, 're-signed HS256');
    assertUnauthorized(await account(await sign(claims, 'HS256', 'another-secret-'.padEnd(48, 'y'))), 'wrong secret');
    assertUnauthorized(await account(await sign(claims, 'HS256', JWT_SECRET + 'x')), 'longer secret');
    assertUnauthorized(await account(await sign(claims, 'HS512')), 'HS512');
    assertUnauthorized(await account(await sign(claims, 'HS384')), 'HS384');
  });

  test('access token: alg none is refused', async () => {
    const u = await createUser(t());
    const payload = u.token.split('.')[1]!;
    const signature = u.token.split('.')[2]!;
    for (const alg of ['none', 'None', 'NONE', 'nOnE']) {
      const header = b64({ alg, typ: 'JWT' });
      assertUnauthorized(await account(`${header}.${payload}.`), `alg ${alg}`);
      assertUnauthorized(await account(`${header}.${payload}.${signature}`), `alg ${alg} with signature`);
    }
    assertUnauthorized(await account(`${b64({ typ: 'JWT' })}.${payload}.${signature}`), 'no alg');
    await ok(u.token, u.id);
  });

  test('access token: correctly signed but wrong claims are refused', async () => {
    const u = await createUser(t());
    const c = decodeJwt(u.token);
    const cases: Array<[string, JWTPayload]> = [
      ['no sid', { ...c, sid: undefined }],
      ['sid of no session', { ...c, sid: randomUUID() }],
      ['sid that is not a uuid', { ...c, sid: 'not-a-uuid' }],
      ['numeric sid', { ...c, sid: 42 }],
      ['no jti', { ...c, jti: undefined }],
      ['no exp', { ...c, exp: undefined }],
      ['no iat', { ...c, iat: undefined }],
      ['no sub', { ...c, sub: undefined }],
      ['non-numeric sub', { ...c, sub: 'admin' }],
      ['negative sub', { ...c, sub: '-1' }],
      ['zero sub', { ...c, sub: '0' }],
      ['sub beyond bigint', { ...c, sub: '99999999999999999999' }],
      ['numeric (not string) sub', { ...c, sub: Number(c.sub) as unknown as string }],
      ['other issuer', { ...c, iss: 'evil' }],
      ['no issuer', { ...c, iss: undefined }],
      ['other type', { ...c, typ: 'launch' }],
      ['no type', { ...c, typ: undefined }],
      ['expired', { ...c, exp: c.iat! - 1 }],
      ['not yet valid', { ...c, nbf: c.iat! + 600 }],
    ];
    for (const [what, claims] of cases) {
      const clean = Object.fromEntries(Object.entries(claims).filter(([, v]) => v !== undefined));
      assertUnauthorized(await account(await sign(clean)), what);
    }
    // Another user's session id with my sub: the session must be mine.
    const other = await createUser(t());
    assertUnauthorized(await account(await sign({ ...c, sid: decodeJwt(other.token).sid })), "another user's sid");
    // A purpose token (e.g. a VM launch token) signed with the same key is not an access token.
    const purpose = await t().services.tokens.signPurpose('launch', { sub: String(u.id), sid: c.sid }, 300);
    assertUnauthorized(await account(purpose.token), 'purpose token');
  });

  test('access token: a deleted or unknown user is 401', async () => {
    const ghost = await t().services.tokens.signAccess(2_000_000_000, randomUUID());
    assertUnauthorized(await account(ghost.token), 'unknown user');
    const u = await createUser(t());
    await ok(u.token, u.id);
    await t().db.query('DELETE FROM users WHERE id = $1', [u.id]);
    assertUnauthorized(await account(u.token), 'deleted user');
    assertUnauthorized(await refresh(u.refresh), 'deleted user refresh');
    const l = await api(t()).post('/auth/login', { body: { email: u.email, password: u.password } });
    assertUnauthorized(l, 'deleted user login');
  });

  test('Authorization header: missing or garbled is 401 unauthorized', async () => {
    const u = await createUser(t());
    const none = await api(t()).get('/account');
    assertUnauthorized(none, 'missing');
    assert.match(none.body.detail, /Bearer/);
    const garbled = [
      '',
      'Bearer',
      'Bearer ',
      `Bearer${u.token}`,
      u.token,
      `Basic ${Buffer.from(`${u.email}:${u.password}`).toString('base64')}`,
      `Token ${u.token}`,
      `Bearer ${u.token} extra`,
      `Bearer ${u.token}, Bearer ${u.token}`,
      `Bearer "${u.token}"`,
    ];
    for (const authorization of garbled) {
      assertUnauthorized(
        await api(t()).get('/account', { headers: { authorization } }),
        JSON.stringify(authorization.slice(0, 30)),
      );
    }
    // The scheme is case-insensitive (RFC 7235) and extra spaces are tolerated.
    for (const authorization of [
      `bearer ${u.token}`,
      `BEARER ${u.token}`,
      `Bearer   ${u.token}`,
      `Bearer ${u.token} `,
    ]) {
      const r = await api(t()).get('/account', { headers: { authorization } });
      assert.equal(r.status, 200, `${JSON.stringify(authorization.slice(0, 12))}: ${r.text}`);
    }
  });

  // ---- refresh: rotation, reuse detection, expiry ----

  test('refresh: rotation returns a new pair and retires the old refresh token', async () => {
    const u = await createUser(t());
    const r = await refresh(u.refresh);
    assert.equal(r.status, 200, r.text);
    assert.deepEqual(Object.keys(r.body).sort(), ['access_token', 'expires_in', 'refresh_token', 'token_type']);
    assert.equal(r.body.token_type, 'bearer');
    assert.equal(r.body.expires_in, 3600);
    assert.equal(r.headers['cache-control'], 'no-store');
    assert.notEqual(r.body.refresh_token, u.refresh);
    assert.notEqual(r.body.access_token, u.token);
    // Same session family: the sid carries over.
    assert.equal(decodeJwt(r.body.access_token).sid, decodeJwt(u.token).sid);
    assert.equal(decodeJwt(r.body.access_token).sub, String(u.id));
    await ok(r.body.access_token, u.id, 'new access');
    // The new refresh token works once more.
    const r2 = await refresh(r.body.refresh_token);
    assert.equal(r2.status, 200, r2.text);
    await ok(r2.body.access_token, u.id, 'third access');
  });

  test('refresh: reusing a rotated token revokes the whole family', async () => {
    const u = await createUser(t());
    const other = await login(u); // a second session of the same user
    const r2 = await refresh(u.refresh);
    assert.equal(r2.status, 200, r2.text);
    const r3 = await refresh(r2.body.refresh_token);
    assert.equal(r3.status, 200, r3.text);
    await ok(r3.body.access_token, u.id, 'before reuse');
    // Replay of the first, rotated token: 401, and the family dies.
    const reuse = await refresh(u.refresh);
    assertUnauthorized(reuse, 'reuse');
    assert.match(reuse.body.detail, /revoked|already used/i);
    assertUnauthorized(await refresh(r3.body.refresh_token), 'newest refresh of the family');
    assertUnauthorized(await refresh(r2.body.refresh_token), 'middle refresh of the family');
    for (const [what, token] of [
      ['first access', u.token],
      ['second access', r2.body.access_token],
      ['newest access', r3.body.access_token],
    ] as const) {
      assertUnauthorized(await account(token), what);
    }
    // The revocation is lasting: replaying again changes nothing.
    assertUnauthorized(await refresh(u.refresh), 'second reuse');
    // The other session of the same user is untouched.
    await ok(other.access_token, u.id, 'other session access');
    const o2 = await refresh(other.refresh_token);
    assert.equal(o2.status, 200, o2.text);
    await ok(o2.body.access_token, u.id, 'other session refreshed');
    // And the user can simply log in again.
    const again = await login(u);
    await ok(again.access_token, u.id, 'new login');
  });

  test('refresh: reuse of the token just rotated (the immediate predecessor) also revokes', async () => {
    const u = await createUser(t());
    const r2 = await refresh(u.refresh);
    assert.equal(r2.status, 200);
    assertUnauthorized(await refresh(u.refresh), 'immediate reuse');
    assertUnauthorized(await refresh(r2.body.refresh_token), 'successor');
    assertUnauthorized(await account(r2.body.access_token), 'successor access');
  });

  test('refresh: valid for 30 days from issue, and a session no longer than 30 days from its login; then 401', async () => {
    const u = await createUser(t());
    await advance(30 * DAY - 10);
    const r = await refresh(u.refresh);
    assert.equal(r.status, 200, r.text);
    await ok(r.body.access_token, u.id, 'after 30 d - 10 s');
    // The new token would have its own 30 days, but the session it belongs to ends 30 days after its login.
    await advance(9);
    const r2 = await refresh(r.body.refresh_token);
    assert.equal(r2.status, 200, r2.text);
    await advance(1);
    const ended = await refresh(r2.body.refresh_token);
    assertUnauthorized(ended, 'at exactly 30 d from the login');
    assert.match(ended.body.detail, /log in again/i);
    // A refresh token not refreshed expires 30 days after its issue.
    const fresh = await login(u);
    await advance(30 * DAY);
    const expired = await refresh(fresh.refresh_token);
    assertUnauthorized(expired, 'a token 30 d old');
    assert.match(expired.body.detail, /expired|invalid|log in again/i);
    // An expired token is not "reuse": a fresh login of the same user is unaffected.
    const again = await login(u);
    await ok(again.access_token, u.id);
    const a2 = await refresh(again.refresh_token);
    assert.equal(a2.status, 200, a2.text);
  });

  test('refresh: unknown, malformed or wrong-kind tokens are 401; bad bodies 422', async () => {
    const u = await createUser(t());
    for (const bogus of [
      'nope',
      'x'.repeat(512),
      u.token,
      u.refresh + 'x',
      u.refresh.slice(1),
      ' ' + u.refresh,
      'nul\u0000byte',
    ]) {
      assertUnauthorized(await refresh(bogus), bogus.slice(0, 20));
    }
    for (const body of [
      {},
      { refresh_token: '' },
      { refresh_token: 5 },
      { refresh_token: null },
      { refresh_token: u.refresh, extra: 1 },
      { refresh_token: 'x'.repeat(513) },
    ]) {
      const r = await api(t()).post('/auth/refresh', { rawBody: body });
      assert.equal(r.status, 422, `${JSON.stringify(body).slice(0, 40)}: ${r.text}`);
      assert.equal(r.body.code, 'validation_error');
    }
    // The real token survived all that (none of it counted as reuse).
    const r = await refresh(u.refresh);
    assert.equal(r.status, 200, r.text);
  });

  test('refresh: concurrent refreshes with one token, at most one succeeds', async () => {
    for (const n of [2, 5]) {
      const u = await createUser(t());
      const rs = await Promise.all(Array.from({ length: n }, () => refresh(u.refresh)));
      const okCount = rs.filter((r) => r.status === 200).length;
      assert.ok(okCount <= 1, `${okCount} of ${n} concurrent refreshes succeeded`);
      for (const r of rs) assert.ok(r.status === 200 || r.status === 401, `unexpected ${r.status}: ${r.text}`);
      // Whatever the interleaving, at most one live refresh token came out of it.
      const issued = rs.flatMap((r) => (r.status === 200 ? [r.body.refresh_token] : []));
      const live = (await Promise.all(issued.map((tok) => refresh(tok)))).filter((r) => r.status === 200);
      assert.ok(live.length <= 1);
    }
  });

  test('refresh: concurrent refreshes through two service instances, at most one succeeds', async () => {
    const app2 = await t().another();
    for (let i = 0; i < 3; i++) {
      const u = await createUser(t());
      const rs = await Promise.all([
        refresh(u.refresh),
        request(app2, new Set<string>(), 'POST', '/auth/refresh', { body: { refresh_token: u.refresh } }),
      ]);
      const okCount = rs.filter((r) => r.status === 200).length;
      assert.ok(okCount <= 1, `${okCount} refreshes succeeded: ${rs.map((r) => r.status)}`);
      for (const r of rs) assert.ok(r.status === 200 || r.status === 401, `unexpected ${r.status}: ${r.text}`);
    }
  });

  // ---- logout: revokes the token's family ----

  test('logout: 204, the family is revoked, other sessions are not', async () => {
    const u = await createUser(t());
    const other = await login(u);
    // Rotate once so the family holds an old and a new refresh token and two access tokens.
    const r2 = await refresh(u.refresh);
    assert.equal(r2.status, 200);
    const out = await logout(r2.body.access_token, r2.body.refresh_token);
    assert.equal(out.status, 204, out.text);
    assert.equal(out.text, '');
    assert.equal(out.headers['cache-control'], 'no-store');
    assertUnauthorized(await refresh(r2.body.refresh_token), 'logged-out refresh');
    assertUnauthorized(await account(r2.body.access_token), 'logged-out access');
    assertUnauthorized(await account(u.token), 'older access of the family');
    assertUnauthorized(await refresh(u.refresh), 'older refresh of the family');
    // The other session is unaffected, even after the reuse attempt above.
    await ok(other.access_token, u.id, 'other session');
    const o2 = await refresh(other.refresh_token);
    assert.equal(o2.status, 200, o2.text);
    await ok(o2.body.access_token, u.id, 'other session refreshed');
  });

  test('logout: with a rotated refresh token of the family still revokes the family', async () => {
    const u = await createUser(t());
    const r2 = await refresh(u.refresh);
    assert.equal(r2.status, 200);
    const out = await logout(r2.body.access_token, u.refresh);
    assert.equal(out.status, 204, out.text);
    assertUnauthorized(await refresh(r2.body.refresh_token), 'newest refresh');
    assertUnauthorized(await account(r2.body.access_token), 'newest access');
  });

  test('logout from another session of the same user', async () => {
    const u = await createUser(t());
    const other = await login(u);
    const out = await logout(other.access_token, u.refresh);
    assert.equal(out.status, 204, out.text);
    assertUnauthorized(await account(u.token), 'logged-out session');
    await ok(other.access_token, u.id, 'session that called logout');
    // Logging out an already logged-out session is harmless.
    const again = await logout(other.access_token, u.refresh);
    assert.equal(again.status, 204, again.text);
    await ok(other.access_token, u.id);
  });

  test('records: an expired refresh token is kept 30 days past its expiry, then forgotten', async () => {
    const tokenRows = async (userId: number) =>
      Number(
        (
          await t().db.query<{ n: number }>('SELECT count(*)::int8 AS n FROM refresh_tokens WHERE user_id = $1', [
            userId,
          ])
        ).rows[0]!.n,
      );
    const u = await createUser(t());
    const rotated = await refresh(u.refresh);
    assert.equal(rotated.status, 200, rotated.text);
    const other = await createUser(t());
    assert.equal(await tokenRows(u.id), 2);
    // Both expire with the session, 30 days after the login; kept 30 days more.
    await advance(60 * DAY - 120);
    assert.equal(await tokenRows(u.id), 2, 'kept until 30 days past expiry');
    assertUnauthorized(await refresh(rotated.body.refresh_token), 'expired');
    const later = await login(u); // a new session, to log the old one out with
    assert.equal((await logout(later.access_token, u.refresh)).status, 204, 'an expired token still names its session');
    await advance(240); // the housekeeping pass of the advance forgets them
    assert.equal(await tokenRows(u.id), 1, "only the new session's token is left");
    assertUnauthorized(await logout(later.access_token, rotated.body.refresh_token), 'forgotten: an unknown token');
    const goesOn = await refresh(later.refresh_token);
    assert.equal(goesOn.status, 200, goesOn.text);
    await ok(goesOn.body.access_token, u.id, 'the new session goes on');
    assert.equal(await tokenRows(other.id), 0, "another user's expired token went too");
  });

  test("logout: unknown token 401, someone else's token 401 and untouched, no bearer 401, bad body 422", async () => {
    const u = await createUser(t());
    const victim = await createUser(t());
    assertUnauthorized(await logout(u.token, 'no-such-refresh-token'), 'unknown');
    assertUnauthorized(await logout(u.token, u.token), 'an access token');
    const cross = await logout(u.token, victim.refresh);
    assertUnauthorized(cross, "another user's refresh token");
    await ok(victim.token, victim.id, 'victim access');
    const v2 = await refresh(victim.refresh);
    assert.equal(v2.status, 200, v2.text);
    // Logout needs a bearer (it is not one of the public endpoints).
    assertUnauthorized(await api(t()).post('/auth/logout', { body: { refresh_token: u.refresh } }), 'no bearer');
    for (const body of [{}, { refresh_token: '' }, { refresh_token: u.refresh, all: true }]) {
      const r = await api(t(), u.token).post('/auth/logout', { rawBody: body });
      assert.equal(r.status, 422, r.text);
      assert.equal(r.body.code, 'validation_error');
    }
    // None of that logged u out.
    await ok(u.token, u.id);
    assert.equal((await refresh(u.refresh)).status, 200);
  });
});

describeEachDb(
  'sessions longer than a refresh token',
  (t) => {
    const refresh = (refresh_token: string) => api(t()).post('/auth/refresh', { body: { refresh_token } });
    const advance = (s: number) => t().services.clock.advance(s);

    test("a session's length still counts from its login after its first tokens are forgotten", async () => {
      const u = await createUser(t());
      let token = u.refresh;
      // Refreshed every 20 days: by day 80 the tokens of the first 20 days expired more than 30 days ago.
      for (let day = 20; day <= 80; day += 20) {
        await advance(20 * DAY);
        const r = await refresh(token);
        assert.equal(r.status, 200, `day ${day}: ${r.text}`);
        token = r.body.refresh_token;
      }
      await advance(10 * DAY + 60); // day 90 and a minute: the session is 90 days old
      assertUnauthorized(await refresh(token), 'past GPUCLOUD_SESSION_MAX_DAYS');
      // Every token of the session is kept while the session can be alive: its first one says when it began.
      const kept = await t().db.query('SELECT 1 FROM refresh_tokens WHERE user_id = $1', [u.id]);
      assert.equal(kept.rows.length, 5);
    });
  },
  { env: { GPUCLOUD_SESSION_MAX_DAYS: '90' } },
);
