/**
 * Two-factor authentication through the HTTP API: setup,
 * enable, the login challenge, verify with TOTP (drift, replay) or recovery
 * codes, challenge expiry and attempt limits, disable. The pure TOTP helpers
 * are covered by totp.test.ts; here the service clock drives every code.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes as nodeRandomBytes } from 'node:crypto';
import { describeEachDb } from '../helpers/app.js';
import { api, expectError, type Op, type ReplyOf } from '../helpers/api.js';
import { challengeOf, createUser, tokensOf, type TestUser, type TokenPair } from '../helpers/factories.js';
import { stepAt, totpAt } from '../../src/modules/auth/totp.js';
import { setRandomSourceForTests } from '../../src/ids.js';
import { Secret, TOTP, URI } from 'otpauth';

const TOKEN_KEYS = ['access_token', 'expires_in', 'refresh_token', 'token_type'];

describeEachDb('two-factor', (t) => {
  const advance = (s: number) => t().services.clock.advance(s);
  const step = () => stepAt(t().clock.nowMs());
  /** The code for the current step plus `offset`. */
  const code = (secret: string, offset = 0) => totpAt(secret, step() + offset);
  /** A 6-digit code that is valid for none of the steps current-2..current+2. */
  function wrongCode(secret: string): string {
    const near = new Set([-2, -1, 0, 1, 2].map((o) => code(secret, o)));
    let n = (Number(code(secret)) + 500_000) % 1_000_000;
    while (near.has(String(n).padStart(6, '0'))) n = (n + 1) % 1_000_000;
    return String(n).padStart(6, '0');
  }
  /**
   * A code for `offset` steps away that differs from every code in the accepted window (so it tests the window
   * alone).
   */
  function outsideCode(secret: string, offset: number): string | undefined {
    const c = code(secret, offset);
    return [-1, 0, 1].some((o) => code(secret, o) === c) ? undefined : c;
  }

  const account = (token: string) => api(t(), token).get('/account');
  const setup = (token: string) => api(t(), token).post('/auth/2fa/setup');
  const enable = (token: string, c: string) => api(t(), token).post('/auth/2fa/enable', { body: { code: c } });
  const disable = (token: string, c: string) => api(t(), token).post('/auth/2fa/disable', { body: { code: c } });
  const verify = (challenge_token: string, c: string) =>
    api(t()).post('/auth/2fa/verify', { body: { challenge_token, code: c } });
  const login = (u: TestUser) => api(t()).post('/auth/login', { body: { email: u.email, password: u.password } });

  async function challenge(u: TestUser): Promise<string> {
    const r = await login(u);
    assert.equal(r.status, 200, r.text);
    const ch = challengeOf(r.body);
    assert.equal(ch.two_factor_required, true, r.text);
    return ch.challenge_token;
  }

  /** setup + enable; leaves the clock one step past the step the enable code used. */
  async function enable2fa(u: TestUser): Promise<{ secret: string; recovery: string[] }> {
    const s = await setup(u.token);
    assert.equal(s.status, 200, s.text);
    t().forbidSecret(s.body.secret);
    const e = await enable(u.token, code(s.body.secret));
    assert.equal(e.status, 200, e.text);
    for (const c of e.body.recovery_codes) t().forbidSecret(c);
    await advance(30);
    return { secret: s.body.secret, recovery: e.body.recovery_codes };
  }

  /** Asserts `r` is a token pair of `userId` (a verify, or a login without a second factor); returns it. */
  async function assertTokens(
    r: ReplyOf<Op<'/auth/2fa/verify', 'post'>> | ReplyOf<Op<'/auth/login', 'post'>>,
    userId: number,
    what = '',
  ): Promise<TokenPair> {
    assert.equal(r.status, 200, `${what}: ${r.text}`);
    assert.deepEqual(Object.keys(r.body).sort(), TOKEN_KEYS);
    const tokens = tokensOf(r.body);
    assert.equal(tokens.token_type, 'bearer');
    assert.equal(tokens.expires_in, 3600);
    assert.equal(r.headers['cache-control'], 'no-store');
    const me = await account(tokens.access_token);
    assert.equal(me.status, 200, me.text);
    assert.equal(me.body.id, userId);
    return tokens;
  }

  // ---- setup and enable ----

  test('setup returns a secret and its otpauth URL, and enables nothing yet', async () => {
    const u = await createUser(t());
    const s = await setup(u.token);
    assert.equal(s.status, 200, s.text);
    assert.deepEqual(Object.keys(s.body).sort(), ['otpauth_url', 'secret']);
    assert.equal(s.headers['cache-control'], 'no-store');
    const { secret, otpauth_url } = s.body;
    t().forbidSecret(secret);
    assert.match(secret, /^[A-Z2-7]{32}$/);
    const url = new URL(otpauth_url);
    assert.equal(url.protocol, 'otpauth:');
    assert.equal(url.host, 'totp');
    assert.equal(decodeURIComponent(url.pathname), `/gpucloud:${u.email}`);
    assert.equal(url.searchParams.get('secret'), secret);
    assert.equal(url.searchParams.get('issuer'), 'gpucloud');
    assert.equal(url.searchParams.get('algorithm'), 'SHA1');
    assert.equal(url.searchParams.get('digits'), '6');
    assert.equal(url.searchParams.get('period'), '30');
    // Not enabled until confirmed with a code.
    const me = await account(u.token);
    assert.equal(me.status, 200, me.text);
    assert.equal(me.body.two_factor_enabled, false);
    const l = await login(u);
    await assertTokens(l, u.id, 'login before enable');
    // Setting up again replaces the pending secret: the first one can no longer be confirmed.
    const s2 = await setup(u.token);
    assert.equal(s2.status, 200, s2.text);
    t().forbidSecret(s2.body.secret);
    assert.notEqual(s2.body.secret, secret);
    const c1 = code(secret);
    if (![-1, 0, 1].some((o) => code(s2.body.secret, o) === c1)) {
      expectError(await enable(u.token, c1), 400, 'invalid_code', undefined, 'code of the replaced secret');
    }
    const e = await enable(u.token, code(s2.body.secret));
    assert.equal(e.status, 200, e.text);
  });

  test('enable: wrong code 400 invalid_code, right code gives 10 recovery codes', async () => {
    const u = await createUser(t());
    const s = await setup(u.token);
    assert.equal(s.status, 200, s.text);
    const secret = s.body.secret;
    t().forbidSecret(secret);
    for (const bad of [wrongCode(secret), 'abcdef', '12345', '1234567', '000000x']) {
      const r = await enable(u.token, bad);
      expectError(r, 400, 'invalid_code', undefined, bad);
      assert.equal(r.headers['cache-control'], 'no-store');
    }
    const c = api(t(), u.token);
    expectError(await c.post('/auth/2fa/enable', { rawBody: {} }), 422, 'validation_error');
    expectError(await c.post('/auth/2fa/enable', { body: { code: '' } }), 422, 'validation_error');
    expectError(await c.post('/auth/2fa/enable', { rawBody: { code: 123456 } }), 422, 'validation_error');
    expectError(await c.post('/auth/2fa/enable', { rawBody: { code: code(secret), secret } }), 422, 'validation_error');
    // The failures above did not enable anything.
    const before = await account(u.token);
    assert.equal(before.status, 200, before.text);
    assert.equal(before.body.two_factor_enabled, false);
    const e = await enable(u.token, code(secret));
    assert.equal(e.status, 200, e.text);
    assert.deepEqual(Object.keys(e.body).sort(), ['message', 'recovery_codes']);
    assert.equal(typeof e.body.message, 'string');
    assert.equal(e.headers['cache-control'], 'no-store');
    const codes = e.body.recovery_codes;
    for (const c of codes) t().forbidSecret(c);
    assert.equal(codes.length, 10);
    assert.equal(new Set(codes).size, 10);
    for (const c of codes) assert.match(c, /^[a-z2-7]{4}-[a-z2-7]{4}-[a-z2-7]{4}$/);
    const me = await account(u.token);
    assert.equal(me.status, 200);
    assert.equal(me.body.two_factor_enabled, true);
    // The session that enabled 2FA keeps working.
    assert.equal(me.body.id, u.id);
  });

  test('state errors: enable without setup, setup or enable while enabled, disable while disabled', async () => {
    const u = await createUser(t());
    expectError(await enable(u.token, '123456'), 400, 'invalid_state', undefined, 'enable without setup');
    expectError(await disable(u.token, '123456'), 400, 'invalid_state', undefined, 'disable while off');
    const { secret } = await enable2fa(u);
    const again = await setup(u.token);
    expectError(again, 400, 'invalid_state', undefined, 'setup while enabled');
    assert.ok(!again.text.includes(secret));
    expectError(await enable(u.token, code(secret)), 400, 'invalid_state', undefined, 'enable while enabled');
  });

  test('setup takes no body: none, null or {} are fine, any field is 422 (unknown fields are refused)', async () => {
    const u = await createUser(t());
    const c = api(t(), u.token);
    // setup has no request body in the schema: these are sent as given.
    for (const body of [undefined, {}, null]) {
      const r = await c.post('/auth/2fa/setup', { rawBody: body });
      assert.equal(r.status, 200, `${JSON.stringify(body)}: ${r.text}`);
      t().forbidSecret(r.body.secret);
    }
    const extra = await c.post('/auth/2fa/setup', {
      rawBody: { secret: 'JBSWY3DPEHPK3PXPJBSWY3DPEHPK3PXP' },
    });
    expectError(extra, 422, 'validation_error', undefined, 'field');
    assert.deepEqual(
      extra.body.errors?.map((e) => e.field),
      ['body.secret'],
    );
    expectError(await c.post('/auth/2fa/setup', { rawBody: [1] }), 422, 'validation_error', undefined, 'array');
    expectError(await c.post('/auth/2fa/setup', { rawBody: '"x"' }), 422, 'validation_error', undefined, 'string');
  });

  test('the 2FA management endpoints need a bearer; verify does not', async () => {
    for (const path of ['/auth/2fa/setup', '/auth/2fa/enable', '/auth/2fa/disable'] as const) {
      const r = await api(t()).post(path, { rawBody: path.endsWith('setup') ? undefined : { code: '123456' } });
      expectError(r, 401, 'unauthorized', undefined, path);
    }
    const v = await verify('no-such-challenge', '123456');
    expectError(v, 401, 'unauthorized', undefined, 'verify unknown challenge');
  });

  // ---- login challenge and verify ----

  test('login with 2FA returns only a challenge; verify with a valid code gives tokens', async () => {
    const u = await createUser(t());
    const { secret } = await enable2fa(u);
    const l = await login(u);
    assert.equal(l.status, 200, l.text);
    assert.deepEqual(Object.keys(l.body).sort(), ['challenge_token', 'expires_in', 'two_factor_required']);
    const ch = challengeOf(l.body);
    assert.equal(ch.two_factor_required, true);
    assert.equal(ch.expires_in, 300);
    assert.equal(typeof ch.challenge_token, 'string');
    assert.ok(ch.challenge_token.length >= 32);
    assert.equal(l.headers['cache-control'], 'no-store');
    assert.ok(!('access_token' in l.body) && !('refresh_token' in l.body));
    // A wrong password is still just a wrong password.
    expectError(
      await api(t()).post('/auth/login', { body: { email: u.email, password: u.password + 'x' } }),
      401,
      'unauthorized',
    );
    // The challenge token is not a bearer credential.
    expectError(await account(ch.challenge_token), 401, 'unauthorized');
    const v = await verify(ch.challenge_token, code(secret));
    const vt = await assertTokens(v, u.id, 'verify');
    // The tokens behave like any session: refresh works.
    const r = await api(t()).post('/auth/refresh', { body: { refresh_token: vt.refresh_token } });
    assert.equal(r.status, 200, r.text);
    // A challenge is single-use, even with another valid code later.
    await advance(30);
    expectError(await verify(ch.challenge_token, code(secret)), 401, 'unauthorized', undefined, 'challenge reuse');
  });

  test('a TOTP code is accepted at most once', async () => {
    const u = await createUser(t());
    const { secret } = await enable2fa(u);
    const c = code(secret);
    await assertTokens(await verify(await challenge(u), c), u.id, 'first use');
    const replay = await verify(await challenge(u), c);
    expectError(replay, 401, 'unauthorized', undefined, 'replay');
    assert.ok(!('access_token' in replay.body));
    // The next step's code is fresh and works.
    await advance(30);
    await assertTokens(await verify(await challenge(u), code(secret)), u.id, 'next step');
  });

  test('the code used to enable 2FA cannot log in', async () => {
    const u = await createUser(t());
    const s = await setup(u.token);
    assert.equal(s.status, 200, s.text);
    t().forbidSecret(s.body.secret);
    const c = code(s.body.secret);
    assert.equal((await enable(u.token, c)).status, 200);
    expectError(await verify(await challenge(u), c), 401, 'unauthorized', undefined, 'enable code replayed at verify');
  });

  test('one step of drift either way is accepted, two steps are not', async () => {
    const u = await createUser(t());
    const { secret } = await enable2fa(u);
    await advance(90);
    // Previous step (a slow phone clock).
    await assertTokens(await verify(await challenge(u), code(secret, -1)), u.id, 'step - 1');
    await advance(30);
    // Next step (a fast phone clock).
    await assertTokens(await verify(await challenge(u), code(secret, +1)), u.id, 'step + 1');
    // Having accepted step+1, the current step's code is older than the last one used: refused.
    const afterFuture = await challenge(u);
    const current = code(secret);
    if (current !== code(secret, 1))
      expectError(await verify(afterFuture, current), 401, 'unauthorized', undefined, 'older than last used');
    await advance(120);
    const ch = await challenge(u);
    for (const offset of [-2, 2, -3, 3]) {
      const c = outsideCode(secret, offset);
      if (c) expectError(await verify(ch, c), 401, 'unauthorized', undefined, `step ${offset}`);
    }
    // Four wrong attempts so far at most: the challenge still takes the current code.
    await assertTokens(await verify(ch, code(secret)), u.id, 'current step after refusals');
  });

  test('a recovery code works once, in any case and with or without dashes', async () => {
    const u = await createUser(t());
    const { recovery } = await enable2fa(u);
    const [first, second, third] = recovery as [string, string, string];
    await assertTokens(await verify(await challenge(u), first), u.id, 'recovery code');
    expectError(await verify(await challenge(u), first), 401, 'unauthorized', undefined, 'recovery code reused');
    await assertTokens(
      await verify(await challenge(u), second.toUpperCase().replace(/-/g, '')),
      u.id,
      'normalized form',
    );
    expectError(await verify(await challenge(u), second), 401, 'unauthorized', undefined, 'normalized one reused');
    await assertTokens(await verify(await challenge(u), ` ${third.replace(/-/g, ' ')} `), u.id, 'spaces');
    // Made-up and other users' codes do not work.
    const other = await createUser(t());
    const theirs = await enable2fa(other);
    expectError(
      await verify(await challenge(u), theirs.recovery[0]!),
      401,
      'unauthorized',
      undefined,
      "another user's recovery code",
    );
    expectError(await verify(await challenge(u), 'aaaa-bbbb-cccc'), 401, 'unauthorized', undefined, 'made-up code');
    // ...and that user's code still works for that user.
    await assertTokens(await verify(await challenge(other), theirs.recovery[0]!), other.id, 'their own code');
  });

  test('an expired challenge is 401 (300 s, service clock)', async () => {
    const u = await createUser(t());
    const { secret } = await enable2fa(u);
    const early = await challenge(u);
    const late = await challenge(u);
    await advance(299);
    await assertTokens(await verify(early, code(secret)), u.id, 'at 299 s');
    await advance(2);
    await advance(30); // a fresh step, so only the expiry can refuse
    const r = await verify(late, code(secret));
    expectError(r, 401, 'unauthorized', undefined, 'at 331 s');
    assert.match(r.body.detail, /expired|unknown/i);
  });

  test('unknown or malformed challenges are 401, bad bodies 422', async () => {
    const u = await createUser(t());
    const { secret } = await enable2fa(u);
    for (const ch of ['nope', 'x'.repeat(512), u.token, u.refresh, 'nul\u0000']) {
      expectError(await verify(ch, code(secret)), 401, 'unauthorized', undefined, ch.slice(0, 20));
    }
    const real = await challenge(u);
    for (const body of [
      { challenge_token: real },
      { code: code(secret) },
      { challenge_token: '', code: '123456' },
      { challenge_token: real, code: '123456', remember: true },
    ]) {
      const r = await api(t()).post('/auth/2fa/verify', { rawBody: body });
      expectError(r, 422, 'validation_error', undefined, JSON.stringify(body).slice(0, 40));
    }
    // None of the validation failures counted against the real challenge.
    await assertTokens(await verify(real, code(secret)), u.id, 'real challenge');
  });

  test('five wrong codes burn the challenge; four do not', async () => {
    const u = await createUser(t());
    const { secret, recovery } = await enable2fa(u);
    const burnt = await challenge(u);
    const survivor = await challenge(u);
    for (let i = 0; i < 5; i++)
      expectError(await verify(burnt, wrongCode(secret)), 401, 'unauthorized', undefined, `wrong ${i + 1}`);
    expectError(await verify(burnt, code(secret)), 401, 'unauthorized', undefined, 'right code after 5 wrong');
    // Recovery codes cannot revive it either, and are not spent by the attempt.
    expectError(await verify(burnt, recovery[0]!), 401, 'unauthorized', undefined, 'recovery code after 5 wrong');
    for (let i = 0; i < 4; i++)
      expectError(await verify(survivor, wrongCode(secret)), 401, 'unauthorized', undefined, `wrong ${i + 1}`);
    // The refused right code above was not consumed: the survivor accepts it.
    await assertTokens(await verify(survivor, code(secret)), u.id, 'right code after 4 wrong');

    await assertTokens(await verify(await challenge(u), recovery[0]!), u.id, 'recovery code still unused');
  });

  test('concurrent verifies of one challenge: at most one session', async () => {
    const u = await createUser(t());
    const { secret, recovery } = await enable2fa(u);
    const ch = await challenge(u);
    const rs = await Promise.all([verify(ch, code(secret)), verify(ch, code(secret)), verify(ch, recovery[0]!)]);
    assert.equal(rs.filter((r) => r.status === 200).length, 1, rs.map((r) => r.status).join(','));
    for (const r of rs) assert.ok(r.status === 200 || r.status === 401, r.text);
    // Two challenges racing with the same code: one wins.
    await advance(30);
    const [a, b] = [await challenge(u), await challenge(u)];
    const c = code(secret);
    const both = await Promise.all([verify(a, c), verify(b, c)]);
    assert.equal(both.filter((r) => r.status === 200).length, 1, both.map((r) => r.status).join(','));
  });

  test('a user suspended between login and verify gets 403', async () => {
    const admin = await createUser(t(), { admin: true });
    const u = await createUser(t());
    const { secret } = await enable2fa(u);
    const ch = await challenge(u);
    const p = await api(t(), admin.token).patch('/admin/users/{user_id}', {
      params: { user_id: u.id },
      body: { suspended: true },
    });
    assert.equal(p.status, 200, p.text);
    expectError(await verify(ch, code(secret)), 403, 'forbidden', undefined, 'suspended');
  });

  // ---- disable ----

  test('disable: wrong code 400 invalid_code; right code turns 2FA off', async () => {
    const u = await createUser(t());
    const { secret, recovery } = await enable2fa(u);
    const other = await createUser(t());
    const theirs = await enable2fa(other);
    for (const bad of [wrongCode(secret), 'abcdef', theirs.recovery[0]!, 'aaaa-bbbb-cccc']) {
      const r = await disable(u.token, bad);
      expectError(r, 400, 'invalid_code', undefined, bad);
      assert.equal(r.headers['cache-control'], 'no-store');
    }
    expectError(await api(t(), u.token).post('/auth/2fa/disable', { rawBody: {} }), 422, 'validation_error');
    // Still on after the failures.
    const still = await account(u.token);
    assert.equal(still.status, 200, still.text);
    assert.equal(still.body.two_factor_enabled, true);
    const d = await disable(u.token, code(secret));
    assert.equal(d.status, 200, d.text);
    assert.deepEqual(Object.keys(d.body), ['message']);
    const off = await account(u.token);
    assert.equal(off.status, 200, off.text);
    assert.equal(off.body.two_factor_enabled, false);
    // Login is back to a plain token pair.
    await assertTokens(await login(u), u.id, 'login after disable');
    // Enabling again gives a new secret and new recovery codes; the old ones are gone.
    const again = await enable2fa(u);
    assert.notEqual(again.secret, secret);
    assert.equal(again.recovery.filter((c) => recovery.includes(c)).length, 0);
    expectError(
      await verify(await challenge(u), recovery[1]!),
      401,
      'unauthorized',
      undefined,
      'old recovery code after re-enable',
    );
    const oldC = code(secret);
    if (![-1, 0, 1].some((o) => code(again.secret, o) === oldC)) {
      expectError(await verify(await challenge(u), oldC), 401, 'unauthorized', undefined, 'old secret after re-enable');
    }
    await assertTokens(await verify(await challenge(u), code(again.secret)), u.id, 'new secret');
  });

  test('disable: a recovery code works, once; a replayed TOTP does not', async () => {
    const u = await createUser(t());
    const { secret, recovery } = await enable2fa(u);
    const c = code(secret);
    await assertTokens(await verify(await challenge(u), c), u.id, 'login');
    expectError(await disable(u.token, c), 400, 'invalid_code', undefined, 'replayed TOTP');
    await assertTokens(await verify(await challenge(u), recovery[0]!), u.id, 'spend a recovery code');
    expectError(await disable(u.token, recovery[0]!), 400, 'invalid_code', undefined, 'spent recovery code');
    const d = await disable(u.token, recovery[1]!);
    assert.equal(d.status, 200, d.text);
    const off = await account(u.token);
    assert.equal(off.status, 200, off.text);
    assert.equal(off.body.two_factor_enabled, false);
  });

  test('no response ever shows the TOTP secret after setup', async () => {
    const admin = await createUser(t(), { admin: true });
    const u = await createUser(t());
    const { secret } = await enable2fa(u); // registers the secret: every response below is checked for it
    const l = await verify(await challenge(u), code(secret));
    assert.equal(l.status, 200);
    const a = api(t(), admin.token);
    for (const r of [
      await account(l.body.access_token),
      await a.get('/admin/users/{user_id}', { params: { user_id: u.id } }),
      await a.get('/admin/users', { query: { email: u.email } }),
      await a.patch('/admin/users/{user_id}', { params: { user_id: u.id }, body: { max_vms: 3 } }),
      await setup(l.body.access_token),
      await disable(l.body.access_token, wrongCode(secret)),
    ]) {
      assert.ok(r.status < 500, r.text);
      assert.ok(!r.text.toUpperCase().includes(secret));
    }
    const adminView = await a.get('/admin/users/{user_id}', { params: { user_id: u.id } });
    assert.equal(adminView.status, 200, adminView.text);
    assert.equal(adminView.body.two_factor_enabled, true);
  });

  // ---- interoperability: codes from another implementation ----

  // Last, because it moves this app's clock to 2033 (the RFC 6238 vector T = 2000000000).
  test("RFC 6238 vector and drift with codes generated by otpauth on its own, at the service clock's time", async (ctx) => {
    const RFC_KEY = '12345678901234567890'; // RFC 6238 Appendix B, SHA-1
    const T_MS = 2_000_000_000_000;
    const toVector = T_MS - t().clock.nowMs();
    if (toVector < 0) {
      ctx.skip('the test clock starts after the RFC vector time');
      return;
    }
    await advance(toVector / 1000);
    assert.equal(t().clock.nowMs(), T_MS);
    const u = await createUser(t());
    // The service draws the secret from the project's randomness source: hand it the RFC key.
    let handed = false;
    const restore = setRandomSourceForTests((n) => {
      if (n === 20 && !handed) {
        handed = true;
        return Buffer.from(RFC_KEY, 'ascii');
      }
      return nodeRandomBytes(n);
    });
    let s: Awaited<ReturnType<typeof setup>>;
    try {
      s = await setup(u.token);
    } finally {
      restore();
    }
    assert.equal(s.status, 200, s.text);
    assert.ok(handed);
    const secret = s.body.secret;
    t().forbidSecret(secret);
    assert.equal(secret, 'GEZDGNBVGY3TQOJQGEZDGNBVGY3TQOJQ');
    // otpauth reads the provisioning URL back as the same TOTP.
    const parsed = URI.parse(s.body.otpauth_url);
    assert.ok(parsed instanceof TOTP);
    assert.equal(parsed.issuer, 'gpucloud');
    assert.equal(parsed.label, u.email);
    assert.equal(parsed.secret.base32, secret);
    assert.equal(parsed.algorithm, 'SHA1');
    assert.equal(parsed.digits, 6);
    assert.equal(parsed.period, 30);

    const otp = new TOTP({ secret: Secret.fromLatin1(RFC_KEY), algorithm: 'SHA1', digits: 6, period: 30 });
    /** otpauth's code for the service clock's time plus `offset` steps. */
    const at = (offset: number) => otp.generate({ timestamp: t().clock.nowMs() + offset * 30_000 });
    assert.equal(at(0), '279037'); // RFC 6238: 69279037 at T = 2000000000
    const e = await enable(u.token, at(0));
    assert.equal(e.status, 200, e.text);
    for (const c of e.body.recovery_codes) t().forbidSecret(c);

    await advance(90);
    await assertTokens(await verify(await challenge(u), at(-1)), u.id, 'otpauth step - 1');
    await advance(30);
    await assertTokens(await verify(await challenge(u), at(+1)), u.id, 'otpauth step + 1');
    await advance(120);
    const ch = await challenge(u);
    const window = new Set([-1, 0, 1].map(at));
    for (const offset of [-2, 2]) {
      const c = at(offset);
      if (!window.has(c)) expectError(await verify(ch, c), 401, 'unauthorized', undefined, `otpauth step ${offset}`);
    }
    await assertTokens(await verify(ch, at(0)), u.id, 'otpauth current step');
  });
  test('records: a login challenge is forgotten 30 days after it expired', async () => {
    const u = await createUser(t());
    const { secret } = await enable2fa(u);
    const ch = await challenge(u);
    const rows = async () =>
      Number(
        (
          await t().db.query<{ n: number }>('SELECT count(*)::int8 AS n FROM auth_challenges WHERE user_id = $1', [
            u.id,
          ])
        ).rows[0]!.n,
      );
    assert.equal(await rows(), 1);
    await advance(300 + 30 * 86_400 - 60);
    assert.equal(await rows(), 1, 'kept until 30 days past its expiry');
    expectError(await verify(ch, code(secret)), 401, 'unauthorized', undefined, 'expired');
    await advance(120);
    assert.equal(await rows(), 0, 'forgotten by the housekeeping pass');
    expectError(await verify(ch, code(secret)), 401, 'unauthorized', undefined, 'unknown');
  });
});
