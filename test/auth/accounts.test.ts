/**
 * Accounts: register, login, GET /account, password hashing, roles,
 * suspension, and the rule that a token or API key never touches a password hash.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { decodeJwt, decodeProtectedHeader } from 'jose';
import { describeEachDb, type TestApp } from '../helpers/app.js';
import { api, expectError, type ErrorBody, type Reply, type RequestBody } from '../helpers/api.js';
import { createApiKey, createUser, tokensOf, uniqueEmail } from '../helpers/factories.js';
import { DUMMY_HASH, PasswordHasher } from '../../src/modules/auth/passwords.js';
import { AppError } from '../../src/errors.js';

const USER_KEYS = ['created_at', 'email', 'id', 'name', 'role', 'two_factor_enabled'];
const TOKEN_KEYS = ['access_token', 'expires_in', 'refresh_token', 'token_type'];
const PASSWORD = 'correct horse battery';

type ErrorStatus = 400 | 401 | 403 | 404 | 405 | 409 | 410 | 413 | 415 | 422 | 429 | 431 | 500 | 502 | 503 | 504;
/** Any answer of the client: an error status is an ErrorBody on every route. */
type Answer = Reply<ErrorStatus, ErrorBody> | Reply<200 | 201 | 204, unknown>;

function assertValidation(r: Answer, field: string): asserts r is Reply<422, ErrorBody> {
  expectError(r, 422, 'validation_error');
  assert.ok(Array.isArray(r.body.errors), r.text);
  const fields = r.body.errors.map((e) => e.field);
  assert.ok(fields.includes(field), `expected an error for ${field}, got ${JSON.stringify(r.body.errors)}`);
  for (const e of r.body.errors) {
    assert.equal(typeof e.field, 'string');
    assert.equal(typeof e.message, 'string');
    assert.ok(e.message.length > 0);
  }
}

/** Counts every call to the password hasher (hash, verify, verifyDummy) while `fn` runs. */
async function countPasswordWork(
  t: TestApp,
  fn: () => Promise<void>,
): Promise<{ hash: number; verify: number; verifyDummy: number }> {
  const pw = t.services.passwords;
  const counts = { hash: 0, verify: 0, verifyDummy: 0 };
  const orig = { hash: pw.hash, verify: pw.verify, verifyDummy: pw.verifyDummy };
  pw.hash = function (this: typeof pw, ...a: Parameters<typeof pw.hash>) {
    counts.hash++;
    return orig.hash.apply(this, a);
  };
  pw.verify = function (this: typeof pw, ...a: Parameters<typeof pw.verify>) {
    counts.verify++;
    return orig.verify.apply(this, a);
  };
  pw.verifyDummy = function (this: typeof pw, ...a: Parameters<typeof pw.verifyDummy>) {
    counts.verifyDummy++;
    return orig.verifyDummy.apply(this, a);
  };
  try {
    await fn();
  } finally {
    // Back to the prototype's methods.
    delete (pw as Partial<typeof pw>).hash;
    delete (pw as Partial<typeof pw>).verify;
    delete (pw as Partial<typeof pw>).verifyDummy;
  }
  return counts;
}

describeEachDb('accounts', (t) => {
  const register = (body: RequestBody<'/auth/register', 'post'>) => api(t()).post('/auth/register', { body });
  /** Deliberately invalid bodies, sent as given. */
  const registerRaw = (body: unknown) => api(t()).post('/auth/register', { rawBody: body });
  const login = (email: string, password: string) => api(t()).post('/auth/login', { body: { email, password } });
  const account = (token?: string) => api(t(), token).get('/account');

  // ---- register ----

  test('register: 201 with exactly the user record, no-store', async () => {
    const email = uniqueEmail('reg');
    const before = t().clock.nowMs();
    const r = await register({ email, password: PASSWORD, name: 'Ada Lovelace' });
    assert.equal(r.status, 201, r.text);
    assert.deepEqual(Object.keys(r.body).sort(), USER_KEYS);
    assert.ok(Number.isSafeInteger(r.body.id) && r.body.id > 0);
    assert.equal(r.body.email, email);
    assert.equal(r.body.name, 'Ada Lovelace');
    assert.equal(r.body.role, 'user');
    assert.equal(r.body.two_factor_enabled, false);
    assert.match(r.body.created_at, /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z$/);
    // created_at follows the service clock, not the wall clock.
    assert.equal(new Date(r.body.created_at).getTime(), before);
    assert.equal(r.headers['cache-control'], 'no-store');
    assert.doesNotMatch(r.text, /password/i);
  });

  test('register: name is optional, null, or trimmed; blank becomes null', async () => {
    const a = await register({ email: uniqueEmail(), password: PASSWORD });
    assert.equal(a.status, 201, a.text);
    assert.equal(a.body.name, null);
    const b = await register({ email: uniqueEmail(), password: PASSWORD, name: null });
    assert.equal(b.status, 201, b.text);
    assert.equal(b.body.name, null);
    const c = await register({ email: uniqueEmail(), password: PASSWORD, name: '  Grace  ' });
    assert.equal(c.status, 201, c.text);
    assert.equal(c.body.name, 'Grace');
    const d = await register({ email: uniqueEmail(), password: PASSWORD, name: '   ' });
    assert.equal(d.status, 201, d.text);
    assert.equal(d.body.name, null);
  });

  test('register: ids are distinct', async () => {
    const a = await register({ email: uniqueEmail(), password: PASSWORD });
    const b = await register({ email: uniqueEmail(), password: PASSWORD });
    assert.equal(a.status, 201);
    assert.equal(b.status, 201);
    assert.notEqual(a.body.id, b.body.id);
  });

  test('register: every validation rule is a 422 naming the field', async () => {
    assertValidation(await registerRaw({ password: PASSWORD }), 'body.email');
    assertValidation(await registerRaw({ email: uniqueEmail() }), 'body.password');
    const both = await registerRaw({});
    assertValidation(both, 'body.email');
    assertValidation(both, 'body.password');
    for (const bad of ['not-an-email', 'a@', '@example.com', 'a b@example.com', '', 'ada@example.com\n']) {
      assertValidation(await registerRaw({ email: bad, password: PASSWORD }), 'body.email');
    }
    assertValidation(await registerRaw({ email: 'x'.repeat(250) + '@example.com', password: PASSWORD }), 'body.email');
    assertValidation(await registerRaw({ email: 42, password: PASSWORD }), 'body.email');
    // Password: at least 12 characters (11 refused, 12 accepted).
    assertValidation(await registerRaw({ email: uniqueEmail(), password: 'elevenchars' }), 'body.password');
    assertValidation(await registerRaw({ email: uniqueEmail(), password: '' }), 'body.password');
    assertValidation(await registerRaw({ email: uniqueEmail(), password: 123456789012 }), 'body.password');
    const twelve = await register({ email: uniqueEmail(), password: 'twelve-chars' });
    assert.equal(twelve.status, 201, twelve.text);
    // Unknown fields are rejected, not ignored (no self-made admins).
    const role = await registerRaw({ email: uniqueEmail(), password: PASSWORD, role: 'admin' });
    assertValidation(role, 'body.role');
    assertValidation(
      await registerRaw({ email: uniqueEmail(), password: PASSWORD, two_factor_enabled: true }),
      'body.two_factor_enabled',
    );
    assertValidation(
      await registerRaw({ email: uniqueEmail(), password: PASSWORD, name: 'n'.repeat(101) }),
      'body.name',
    );
    assertValidation(await registerRaw({ email: uniqueEmail(), password: PASSWORD, name: 7 }), 'body.name');
    // The body itself must be an object.
    expectError(await registerRaw([{ email: uniqueEmail(), password: PASSWORD }]), 422, 'validation_error');
  });

  test('register: a validation failure creates nothing', async () => {
    const email = uniqueEmail('noop');
    assertValidation(await register({ email, password: 'short' }), 'body.password');
    assertValidation(await registerRaw({ email, password: PASSWORD, extra: 1 }), 'body.extra');
    const ok = await register({ email, password: PASSWORD });
    assert.equal(ok.status, 201, ok.text);
  });

  test('register: malformed JSON 400, wrong media type 415, oversized 413; all no-store', async () => {
    const bad = await api(t()).post('/auth/register', {
      rawBody: '{"email": "a@b.c", ',
      headers: { 'content-type': 'application/json' },
    });
    expectError(bad, 400, 'malformed_json');
    assert.equal(bad.headers['cache-control'], 'no-store');
    const text = await api(t()).post('/auth/register', {
      rawBody: 'email=a@b.c',
      headers: { 'content-type': 'text/plain' },
    });
    expectError(text, 415, 'unsupported_media_type');
    const form = await api(t()).post('/auth/register', {
      rawBody: 'email=a%40b.c&password=xxxxxxxxxxxxxx',
      headers: { 'content-type': 'application/x-www-form-urlencoded' },
    });
    expectError(form, 415, 'unsupported_media_type');
    const big = await register({ email: uniqueEmail(), password: PASSWORD, name: 'x'.repeat(70 * 1024) });
    expectError(big, 413, 'payload_too_large');
  });

  test('register: control characters never reach the database (no 500)', async () => {
    const nulName = await register({ email: uniqueEmail(), password: PASSWORD, name: 'Ada\u0000Lovelace' });
    assertValidation(nulName, 'body.name');
    const ctlName = await register({ email: uniqueEmail(), password: PASSWORD, name: 'Ada\u001bLovelace' });
    assertValidation(ctlName, 'body.name');
    // A password is hashed, never stored: any character is fine in it.
    const email = uniqueEmail('nulpw');
    const pw = 'pass\u0000word-\u00e9\u{1F600}-long';
    const ok = await register({ email, password: pw });
    assert.equal(ok.status, 201, ok.text);
    assert.equal((await login(email, pw)).status, 200);
    expectError(await login(email, 'pass'), 401, 'unauthorized');
  });

  test('register: a taken email is 400 conflict, case-insensitively', async () => {
    const email = uniqueEmail('Dup');
    const first = await register({ email, password: PASSWORD });
    assert.equal(first.status, 201, first.text);
    for (const variant of [
      email,
      email.toUpperCase(),
      email.toLowerCase(),
      email.replace(/^./, (c) => c.toUpperCase()),
    ]) {
      const r = await register({ email: variant, password: 'another-password-123' });
      expectError(r, 400, 'conflict');
      assert.equal(r.headers['cache-control'], 'no-store');
      assert.match(r.body.detail, /already/i);
    }
    // The original password still works: the conflicting attempts changed nothing.
    assert.equal((await login(email, PASSWORD)).status, 200);
    expectError(await login(email, 'another-password-123'), 401, 'unauthorized');
  });

  test('register: concurrent registrations of one email, one wins', async () => {
    const email = uniqueEmail('race');
    const rs = await Promise.all([
      register({ email, password: PASSWORD }),
      register({ email: email.toUpperCase(), password: PASSWORD }),
      register({ email, password: PASSWORD }),
    ]);
    const statuses = rs.map((r) => r.status).sort();
    assert.deepEqual(statuses, [201, 400, 400], rs.map((r) => r.text).join('\n'));
    for (const r of rs) if (r.status === 400) assert.equal(r.body.code, 'conflict');
  });

  test('register: the email keeps its case for display; login works with any case', async () => {
    const email = uniqueEmail('MiXeD').replace('@example.com', '@Example.COM');
    const r = await register({ email, password: PASSWORD });
    assert.equal(r.status, 201, r.text);
    assert.equal(r.body.email, email);
    for (const variant of [email, email.toLowerCase(), email.toUpperCase(), `  ${email}  `]) {
      const l = await login(variant, PASSWORD);
      assert.equal(l.status, 200, `${variant}: ${l.text}`);
    }
  });

  // ---- login: password check, token pair ----

  test('login: token response shape and a working access token', async () => {
    const email = uniqueEmail('login');
    const reg = await register({ email, password: PASSWORD });
    assert.equal(reg.status, 201, reg.text);
    const r = await login(email, PASSWORD);
    assert.equal(r.status, 200, r.text);
    assert.deepEqual(Object.keys(r.body).sort(), TOKEN_KEYS);
    const tokens = tokensOf(r.body);
    assert.equal(tokens.token_type, 'bearer');
    assert.equal(tokens.expires_in, 3600);
    assert.equal(r.headers['cache-control'], 'no-store');
    assert.equal(typeof tokens.refresh_token, 'string');
    assert.ok(tokens.refresh_token.length >= 32);
    assert.ok(!tokens.refresh_token.includes('.'), 'the refresh token is opaque, not a JWT');
    // The access token is a JWT, HS256, with sub/iat/exp/jti, valid 3600 s.
    const header = decodeProtectedHeader(tokens.access_token);
    assert.equal(header.alg, 'HS256');
    const claims = decodeJwt(tokens.access_token);
    assert.equal(claims.sub, String(reg.body.id));
    assert.equal(claims.iat, Math.floor(t().clock.nowMs() / 1000));
    assert.equal(claims.exp, claims.iat! + 3600);
    assert.equal(typeof claims.jti, 'string');
    assert.ok(claims.jti!.length > 0);
    const me = await account(tokens.access_token);
    assert.equal(me.status, 200, me.text);
    assert.deepEqual(me.body, reg.body);
  });

  test('login: every login is a new session with distinct tokens', async () => {
    const u = await createUser(t());
    const a = await login(u.email, u.password);
    const b = await login(u.email, u.password);
    assert.equal(a.status, 200);
    assert.equal(b.status, 200);
    const [ta, tb] = [tokensOf(a.body), tokensOf(b.body)];
    assert.notEqual(ta.refresh_token, tb.refresh_token);
    assert.notEqual(ta.access_token, tb.access_token);
    assert.notEqual(decodeJwt(ta.access_token).jti, decodeJwt(tb.access_token).jti);
  });

  test('login: wrong password and unknown email are the same 401', async () => {
    const u = await createUser(t());
    const wrong = await login(u.email, u.password + 'x');
    const unknown = await login(uniqueEmail('nobody'), u.password);
    const caseWrong = await login(u.email, u.password.toUpperCase());
    const checked = (r: Answer) => {
      expectError(r, 401, 'unauthorized');
      assert.equal(r.headers['cache-control'], 'no-store');
      assert.deepEqual(Object.keys(r.body).sort(), ['code', 'detail']);
      return r.body;
    };
    const [w, un, cw] = [checked(wrong), checked(unknown), checked(caseWrong)];
    assert.equal(w.detail, un.detail);
    assert.equal(w.detail, cw.detail);
    assert.doesNotMatch(un.detail, /not found|no such|unknown|exist/i);
  });

  test('login: an unknown email costs one password verification, like a known one, and no hashing (no timing tell)', async () => {
    const u = await createUser(t());
    const known = await countPasswordWork(t(), async () => {
      expectError(await login(u.email, 'wrong-password-000'), 401, 'unauthorized');
    });
    const unknown = await countPasswordWork(t(), async () => {
      expectError(await login(uniqueEmail('ghost'), 'wrong-password-000'), 401, 'unauthorized');
    });
    const unknownAgain = await countPasswordWork(t(), async () => {
      expectError(await login(uniqueEmail('ghost'), 'wrong-password-000'), 401, 'unauthorized');
    });
    assert.deepEqual(known, { hash: 0, verify: 1, verifyDummy: 0 });
    // The unknown email goes through verifyDummy, which does exactly one verify (against DUMMY_HASH,
    // whose parameters the next test checks) and no hashing.
    for (const c of [unknown, unknownAgain]) {
      assert.equal(c.verifyDummy, 1);
      assert.equal(c.verify, 1);
      assert.equal(c.hash, 0);
    }
  });

  test('the dummy hash for unknown emails has the parameters of real hashes, at either cost', async () => {
    const params = (h: string) => h.split('$').slice(1, 4).join('$');
    for (const hasher of [t().services.passwords, new PasswordHasher(1), new PasswordHasher(1, 1, 'test')]) {
      const real = await hasher.hash('some-password-123');
      assert.equal(params(hasher.dummyHash), params(real));
      assert.match(params(real), /^argon2id\$v=19\$m=\d+,t=\d+,p=\d+$/);
      assert.equal(await hasher.verify(hasher.dummyHash, 'some-password-123'), false);
    }
    assert.equal(new PasswordHasher(1).dummyHash, DUMMY_HASH);
    assert.equal(params(DUMMY_HASH), 'argon2id$v=19$m=19456,t=2,p=1', "production: OWASP's parameters");
    // A hash made at one cost verifies at the other: the parameters travel in the hash.
    assert.equal(
      await new PasswordHasher(1).verify(
        await new PasswordHasher(1, 1, 'test').hash('pw-123456789012'),
        'pw-123456789012',
      ),
      true,
    );
  });

  test('login: validation and edge inputs', async () => {
    const anon = api(t());
    assertValidation(await anon.post('/auth/login', { rawBody: { email: uniqueEmail() } }), 'body.password');
    assertValidation(await anon.post('/auth/login', { rawBody: { password: PASSWORD } }), 'body.email');
    assertValidation(await anon.post('/auth/login', { body: { email: '', password: PASSWORD } }), 'body.email');
    assertValidation(await anon.post('/auth/login', { body: { email: uniqueEmail(), password: '' } }), 'body.password');
    assertValidation(
      await anon.post('/auth/login', { rawBody: { email: uniqueEmail(), password: PASSWORD, totp: '123456' } }),
      'body.totp',
    );
    // Odd but well-formed strings are just wrong credentials: never a 500.
    for (const email of ['not-an-email', "' OR 1=1 --", '%', '\ud800@example.com']) {
      const r = await login(email, PASSWORD);
      expectError(r, 401, 'unauthorized');
    }
    // A NUL character is no email at all (and no database could store it).
    assertValidation(await login('nul\u0000@example.com', PASSWORD), 'body.email');
    // A password can be long (up to 1024 characters) and odd.
    const email = uniqueEmail('longpw');
    const long = 'p'.repeat(1024);
    assert.equal((await register({ email, password: long })).status, 201);
    assert.equal((await login(email, long)).status, 200);
    assertValidation(await login(email, long + 'p'), 'body.password');
  });

  test('login: a suspended user gets the same 403 whatever the password (no oracle for a right one)', async () => {
    const admin = await createUser(t(), { admin: true });
    const u = await createUser(t());
    const a = api(t(), admin.token);
    const patch = await a.patch('/admin/users/{user_id}', { params: { user_id: u.id }, body: { suspended: true } });
    assert.equal(patch.status, 200, patch.text);
    assert.equal(patch.body.suspended, true);
    const r = await login(u.email, u.password);
    expectError(r, 403, 'forbidden');
    assert.match(r.body.detail, /suspended/i);
    assert.ok(!('access_token' in r.body));
    // A wrong password gets exactly the same answer: guessing cannot tell when it hit the right one.
    const wrong = await login(u.email, u.password + '!');
    expectError(wrong, 403, 'forbidden');
    assert.equal(wrong.body.detail, r.body.detail);
    // The tokens it already holds are refused too (a suspended account gets 403 on every call), as is refreshing them.
    const me = await account(u.token);
    expectError(me, 403, 'forbidden');
    expectError(await api(t()).post('/auth/refresh', { body: { refresh_token: u.refresh } }), 403, 'forbidden');
    // Lifting the suspension lets the user in again.
    const lift = await a.patch('/admin/users/{user_id}', { params: { user_id: u.id }, body: { suspended: false } });
    assert.equal(lift.status, 200, lift.text);
    assert.equal((await login(u.email, u.password)).status, 200);
    assert.equal((await account(u.token)).status, 200);
  });

  test('admin user search with a NUL character is 422 instead of failing', async () => {
    const admin = await createUser(t(), { admin: true });
    const a = api(t(), admin.token);
    const r = await a.get('/admin/users', { query: { email: 'a\u0000b' } });
    assert.equal(r.status, 422, r.text);
    assert.equal(r.body.errors?.[0]?.field, 'query.email');
    const found = await a.get('/admin/users', { query: { email: admin.email.toUpperCase() } });
    assert.equal(found.status, 200, found.text);
    assert.deepEqual(
      found.body.map((u) => u.id),
      [admin.id],
    );
  });

  test('login: a non-admin cannot suspend anyone', async () => {
    const u = await createUser(t());
    const other = await createUser(t());
    const r = await api(t(), u.token).patch('/admin/users/{user_id}', {
      params: { user_id: other.id },
      body: { suspended: true },
    });
    expectError(r, 403, 'forbidden');
    assert.equal((await login(other.email, other.password)).status, 200);
  });

  test('admin role comes from ensureUser (environment bootstrap or CLI) and shows in the record', async () => {
    const admin = await createUser(t(), { admin: true });
    const me = await account(admin.token);
    assert.equal(me.status, 200, me.text);
    assert.equal(me.body.role, 'admin');
    // ensureUser on an existing account resets its password and role.
    const again = await t().services.auth.ensureUser(admin.email.toUpperCase(), 'a-brand-new-password', 'admin');
    assert.equal(again.created, false);
    assert.equal(again.user.id, admin.id);
    expectError(await login(admin.email, admin.password), 401, 'unauthorized');
    assert.equal((await login(admin.email, 'a-brand-new-password')).status, 200);
  });

  test('ensureUser: concurrent bootstraps of one admin (several instances starting) both succeed', async () => {
    const email = uniqueEmail('boot');
    const results = await Promise.all([
      t().services.auth.ensureUser(email, 'bootstrap-password-1', 'admin'),
      t().services.auth.ensureUser(email.toUpperCase(), 'bootstrap-password-1', 'admin'),
      t().services.auth.ensureUser(email, 'bootstrap-password-1', 'admin'),
    ]);
    assert.equal(results.filter((r) => r.created).length, 1);
    assert.equal(new Set(results.map((r) => r.user.id)).size, 1);
    for (const r of results) assert.equal(r.user.role, 'admin');
    const l = await login(email, 'bootstrap-password-1');
    assert.equal(l.status, 200, l.text);
    const me = await account(tokensOf(l.body).access_token);
    assert.equal(me.status, 200, me.text);
    assert.equal(me.body.role, 'admin');
    assert.equal(me.body.id, results[0]!.user.id);
  });

  // ---- GET /account ----

  test("GET /account: the caller's record, no-store, 401 without credentials", async () => {
    const email = uniqueEmail('acct');
    const reg = await register({ email, password: PASSWORD, name: 'Acct' });
    assert.equal(reg.status, 201, reg.text);
    const l = await login(email, PASSWORD);
    assert.equal(l.status, 200, l.text);
    const me = await account(tokensOf(l.body).access_token);
    assert.equal(me.status, 200, me.text);
    assert.deepEqual(Object.keys(me.body).sort(), USER_KEYS);
    assert.deepEqual(me.body, reg.body);
    assert.equal(me.headers['cache-control'], 'no-store');
    const anon = await account();
    expectError(anon, 401, 'unauthorized');
    assert.equal(anon.headers['cache-control'], 'no-store');
    // Another user's token sees only that user.
    const other = await createUser(t());
    const theirs = await account(other.token);
    assert.equal(theirs.status, 200, theirs.text);
    assert.equal(theirs.body.id, other.id);
    assert.notEqual(theirs.body.id, reg.body.id);
  });

  test('GET /account works with an API key of every scope', async () => {
    const u = await createUser(t());
    for (const scope of ['read_write', 'read_only', 'billing_only'] as const) {
      const key = await createApiKey(t(), u.token, scope, `k-${scope}`);
      const me = await account(key);
      assert.equal(me.status, 200, `${scope}: ${me.text}`);
      assert.equal(me.body.id, u.id);
      assert.equal(me.headers['cache-control'], 'no-store');
    }
  });

  // ---- no password work on authenticated requests (authenticate.ts) ----

  test('a valid token or API key never touches a password hash', async () => {
    const u = await createUser(t());
    const key = await createApiKey(t(), u.token, 'read_only', 'spy');
    const counts = await countPasswordWork(t(), async () => {
      for (let i = 0; i < 3; i++) {
        assert.equal((await account(u.token)).status, 200);
        assert.equal((await account(key)).status, 200);
      }
      // Failed credentials do not fall back to password checks either.
      expectError(await account(u.token + 'x'), 401, 'unauthorized');
      expectError(await account(key + 'x'), 401, 'unauthorized');
      // Nor does refreshing a session.
      assert.equal((await api(t()).post('/auth/refresh', { body: { refresh_token: u.refresh } })).status, 200);
    });
    assert.deepEqual(counts, { hash: 0, verify: 0, verifyDummy: 0 });
    // The spy itself works: a login does verify.
    const loginCounts = await countPasswordWork(t(), async () => {
      assert.equal((await login(u.email, u.password)).status, 200);
    });
    assert.equal(loginCounts.verify, 1);
  });

  test('Cache-Control: no-store on every auth and account response', async () => {
    const u = await createUser(t());
    const anon = api(t());
    const responses = [
      await anon.post('/auth/login', { body: { email: u.email, password: u.password } }),
      await anon.post('/auth/login', { rawBody: { email: u.email } }),
      await anon.post('/auth/refresh', { body: { refresh_token: 'nope' } }),
      await anon.post('/auth/refresh', { body: { refresh_token: u.refresh } }),
      await anon.post('/auth/2fa/verify', { body: { challenge_token: 'nope', code: '123456' } }),
      await anon.post('/auth/2fa/setup'),
      await account('garbage'),
    ];
    for (const r of responses) assert.equal(r.headers['cache-control'], 'no-store', r.text);
    // Public, cacheable routes are not marked.
    const health = await anon.get('/healthz');
    assert.notEqual(health.headers['cache-control'], 'no-store');
  });
});

describe('PasswordHasher', () => {
  test('hash and verify round trip; salts differ; a malformed stored hash is just "no"', async () => {
    const h = new PasswordHasher(2);
    const a = await h.hash('correct horse battery');
    const b = await h.hash('correct horse battery');
    assert.match(a, /^\$argon2id\$v=19\$m=19456,t=2,p=1\$/);
    assert.notEqual(a, b, 'per-user salt');
    assert.equal(await h.verify(a, 'correct horse battery'), true);
    assert.equal(await h.verify(b, 'correct horse battery'), true);
    assert.equal(await h.verify(a, 'correct horse batterY'), false);
    assert.equal(await h.verify('not-a-hash', 'x'), false);
    assert.equal(await h.verify('', 'x'), false);
    assert.equal(await h.verifyDummy('anything'), false);
  });

  test('bounds concurrent work and refuses past the queue with 429 rate_limited', async () => {
    const h = new PasswordHasher(1, 1);
    const results = await Promise.allSettled([
      h.hash('password-one-1'),
      h.hash('password-two-2'),
      h.hash('password-three'),
    ]);
    assert.equal(results[0]!.status, 'fulfilled');
    assert.equal(results[1]!.status, 'fulfilled', 'the queued one runs once the slot frees');
    const third = results[2]!;
    assert.equal(third.status, 'rejected');
    const err = (third as PromiseRejectedResult).reason;
    assert.ok(err instanceof AppError);
    assert.equal(err.code, 'rate_limited');
    assert.equal(err.status, 429);
    assert.ok(Number(err.headers?.['retry-after']) >= 1);
    // The slots were all released: new work still runs.
    const again = await Promise.all([
      h.verify((results[0] as PromiseFulfilledResult<string>).value, 'password-one-1'),
      h.hash('x'.repeat(12)),
    ]);
    assert.equal(again[0], true);
  });
});
