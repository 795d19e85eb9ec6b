/**
 * Rate limits through the HTTP API: failed logins per email and address and
 * per email from all addresses, every login per address and in all; per
 * user when authenticated, per client IP otherwise; fixed 60 s windows on real
 * time; X-RateLimit-* headers; 429 `rate_limited` with Retry-After; counters
 * shared between instances through Redis.
 *
 * Windows are real, epoch-aligned 60 s windows, so each test first makes sure
 * that enough of the current window is left for it (freshWindow).
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import type { FastifyInstance } from 'fastify';
import { assertNoSecrets, buildTestApp, type Res, type TestApp } from '../helpers/app.js';
import { tokensOf, uniqueEmail } from '../helpers/factories.js';
import { api, type ErrorBody } from '../helpers/api.js';
import { DB_KINDS } from '../helpers/db.js';

const WINDOW_MS = 60_000;
const LIMITS = { login: 5, loginAccount: 9, loginIp: 12, auth: 4, vm: 6, default: 8 };
const ENV = {
  GPUCLOUD_RATE_LIMIT_LOGIN: String(LIMITS.login),
  GPUCLOUD_RATE_LIMIT_LOGIN_ACCOUNT: String(LIMITS.loginAccount),
  GPUCLOUD_RATE_LIMIT_VM_MUTATIONS: String(LIMITS.vm),
  GPUCLOUD_RATE_LIMIT_LOGIN_IP: String(LIMITS.loginIp),
  GPUCLOUD_RATE_LIMIT_AUTH: String(LIMITS.auth),
  GPUCLOUD_RATE_LIMIT_DEFAULT: String(LIMITS.default),
};

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Waits for the next window unless at least `needMs` of the current one is left. */
async function freshWindow(needMs = 20_000): Promise<void> {
  const left = WINDOW_MS - (Date.now() % WINDOW_MS);
  if (left < needMs) await sleep(left + 50);
}

const randomIp = () => `10.${randomBytes(1)[0]}.${randomBytes(1)[0]}.${1 + (randomBytes(1)[0]! % 250)}`;

interface CallOpts {
  token?: string;
  body?: unknown;
  ip?: string;
}

/**
 * app.inject on any instance (the typed client of helpers/api.ts only knows the test app, not a second instance made
 * by t.another(), nor untyped routes such as /openapi.json or /docs), with a client address, plus the checks every
 * response gets (error shape, API-Version, X-Request-Id).
 */
async function call(app: FastifyInstance, method: string, url: string, o: CallOpts = {}): Promise<Res> {
  const headers: Record<string, string> = {};
  if (o.token) headers.authorization = `Bearer ${o.token}`;
  if (o.body !== undefined) headers['content-type'] = 'application/json';
  const res = await app.inject({
    method: method as 'GET',
    url,
    headers,
    payload: o.body === undefined ? undefined : JSON.stringify(o.body),
    remoteAddress: o.ip ?? '127.0.0.1',
  });
  assertNoSecrets(res.body, [], `${method} ${url}`);
  const body =
    res.body && String(res.headers['content-type'] ?? '').includes('json') ? JSON.parse(res.body) : undefined;
  assert.ok(res.headers['x-request-id']);
  assert.equal(res.headers['api-version'], '1.0.0');
  if (res.statusCode >= 400) {
    assert.equal(typeof body?.detail, 'string', res.body);
    assert.equal(typeof body?.code, 'string', res.body);
  }
  return { status: res.statusCode, body, headers: res.headers, text: res.body };
}

/** The X-RateLimit-* headers as numbers, checked for presence and range. */
function limits(r: Res): { limit: number; remaining: number; reset: number } {
  for (const h of ['x-ratelimit-limit', 'x-ratelimit-remaining', 'x-ratelimit-reset']) {
    assert.match(
      String(r.headers[h]),
      /^\d+$/,
      `${h} missing or not an integer on a ${r.status}: ${String(r.headers[h])}`,
    );
  }
  const out = {
    limit: Number(r.headers['x-ratelimit-limit']),
    remaining: Number(r.headers['x-ratelimit-remaining']),
    reset: Number(r.headers['x-ratelimit-reset']),
  };
  assert.ok(out.reset >= 1 && out.reset <= 60, `X-RateLimit-Reset ${out.reset} is not in 1..60`);
  const expected = Math.ceil((WINDOW_MS - (Date.now() % WINDOW_MS)) / 1000);
  assert.ok(Math.abs(out.reset - expected) <= 2, `X-RateLimit-Reset ${out.reset}, the window ends in ${expected} s`);
  return out;
}

/** Asserts a 429 of the limit; narrows a typed answer to its 429 (whose body is ErrorBody). */
function assertLimited<R extends Res>(r: R, limit: number): asserts r is R & { status: 429; body: ErrorBody } {
  assert.equal(r.status, 429, r.text);
  // Every error answer has the ErrorBody shape: call() and t.req assert it.
  const body = r.body as ErrorBody;
  assert.equal(body.code, 'rate_limited');
  assert.match(body.detail, /rate limit/i);
  const l = limits(r);
  assert.equal(l.limit, limit);
  assert.equal(l.remaining, 0);
  assert.match(String(r.headers['retry-after']), /^\d+$/, 'Retry-After in seconds');
  const retry = Number(r.headers['retry-after']);
  assert.ok(retry >= 1 && retry <= 60, `Retry-After ${retry}`);
  assert.equal(retry, l.reset, 'Retry-After and X-RateLimit-Reset agree');
}

interface User {
  id: number;
  email: string;
  password: string;
  token: string;
}

/** A user made through the services, so that making it spends no rate-limit budget. */
async function makeUser(t: TestApp): Promise<User> {
  const email = uniqueEmail('rl');
  const password = 'a-long-password-' + randomBytes(4).toString('hex');
  const rec = await t.services.auth.register({ email, password });
  const tokens = await t.services.auth.login(email, password);
  assert.ok('access_token' in tokens);
  return { id: rec.id, email, password, token: tokens.access_token };
}

for (const kind of DB_KINDS) {
  describe(`rate limits [${kind}${kind === 'postgres' && process.env.GPUCLOUD_REDIS_URL ? ', redis' : ''}]`, () => {
    let t: TestApp;
    let app: FastifyInstance;
    before(async () => {
      t = await buildTestApp(kind, { env: ENV });
      app = t.app;
    });
    after(() => t.close());

    test('login: one address trying many emails is stopped after GPUCLOUD_RATE_LIMIT_LOGIN_IP; other addresses go on', async () => {
      const ip = randomIp();
      await freshWindow();
      for (let i = 1; i <= LIMITS.loginIp; i++) {
        const r = await api(t).post('/auth/login', {
          body: { email: uniqueEmail('spray'), password: 'a-guessed-password' },
          remoteAddress: ip,
        });
        assert.equal(r.status, 401, `attempt ${i}: ${r.text}`);
      }
      const over = await api(t).post('/auth/login', {
        body: { email: uniqueEmail('spray'), password: 'a-guessed-password' },
        remoteAddress: ip,
      });
      assertLimited(over, LIMITS.loginIp);
      assert.match(over.body.detail, /from this address/);
      const elsewhere = await api(t).post('/auth/login', {
        body: { email: uniqueEmail('spray'), password: 'a-guessed-password' },
        remoteAddress: randomIp(),
      });
      assert.equal(elsewhere.status, 401, elsewhere.text);
    });

    test('login: a 6th failure for one email from one address is 429 there; sign-ins never count', async () => {
      const a = await makeUser(t);
      const b = await makeUser(t);
      const ip = randomIp();
      await freshWindow();
      const seen: number[] = [];
      for (let i = 1; i <= 2 * LIMITS.login - 1; i++) {
        // wrong and right passwords in turn: only the wrong ones count
        const password = i % 2 === 0 ? a.password : 'wrong-password-' + i;
        const r = await api(t).post('/auth/login', { body: { email: a.email, password }, remoteAddress: ip });
        assert.equal(r.status, i % 2 === 0 ? 200 : 401, r.text);
        const l = limits(r);
        assert.equal(l.limit, LIMITS.login);
        seen.push(l.remaining);
        if (r.status === 200) t.forbidSecret(tokensOf(r.body).refresh_token);
      }
      assert.deepEqual(seen, [4, 4, 3, 3, 2, 2, 1, 1, 0], 'X-RateLimit-Remaining counts the failures down');

      const sixth = await api(t).post('/auth/login', {
        body: { email: a.email, password: a.password },
        remoteAddress: ip,
      });
      assertLimited(sixth, LIMITS.login);
      assert.match(sixth.body.detail, /failed logins per minute for this email from this address/);
      assert.equal(
        (sixth.body as { access_token?: unknown }).access_token,
        undefined,
        'no tokens past the limit from that address, even with the right password',
      );
      assertLimited(
        await api(t).post('/auth/login', { body: { email: a.email, password: 'wrong-again' }, remoteAddress: ip }),
        LIMITS.login,
      );

      // Per email, not per spelling.
      const upper = await api(t).post('/auth/login', {
        body: { email: `  ${a.email.toUpperCase()} `, password: a.password },
        remoteAddress: ip,
      });
      assertLimited(upper, LIMITS.login);

      // Another email from the same address still works, with its own counter.
      const other = await api(t).post('/auth/login', {
        body: { email: b.email, password: b.password },
        remoteAddress: ip,
      });
      assert.equal(other.status, 200, other.text);
      t.forbidSecret(tokensOf(other.body).refresh_token);
      assert.equal(limits(other).remaining, LIMITS.login, 'a sign-in uses up nothing');

      // Unknown emails are limited the same way (no account enumeration by rate); from another address, as this
      // one has nearly used up GPUCLOUD_RATE_LIMIT_LOGIN_IP.
      const ghost = uniqueEmail('ghost');
      const ip2 = randomIp();
      for (let i = 0; i < LIMITS.login; i++) {
        const r = await api(t).post('/auth/login', {
          body: { email: ghost, password: 'whatever-password' },
          remoteAddress: ip2,
        });
        assert.equal(r.status, 401);
      }
      assertLimited(
        await api(t).post('/auth/login', { body: { email: ghost, password: 'whatever-password' }, remoteAddress: ip2 }),
        LIMITS.login,
      );

      // Logins do not spend the address's budget for other /auth operations.
      const refresh = await api(t).post('/auth/refresh', { body: { refresh_token: 'nope' }, remoteAddress: ip });
      assert.equal(refresh.status, 401);
      assert.deepEqual([limits(refresh).limit, limits(refresh).remaining], [LIMITS.auth, LIMITS.auth - 1]);
    });

    test('login: wrong passwords from one address never lock the owner out from another', async () => {
      const owner = await makeUser(t);
      const attacker = randomIp();
      const home = randomIp();
      await freshWindow();
      for (let i = 1; i <= LIMITS.login; i++) {
        const r = await api(t).post('/auth/login', {
          body: { email: owner.email, password: `guess-${i}` },
          remoteAddress: attacker,
        });
        assert.equal(r.status, 401, `guess ${i}: ${r.text}`);
      }
      // The attacker's address goes on guessing: every attempt refused, none counted against the account.
      for (let i = 0; i < 3 * LIMITS.loginAccount; i++) {
        const r = await api(t).post('/auth/login', {
          body: { email: owner.email, password: `more-${i}` },
          remoteAddress: attacker,
        });
        assertLimited(r, LIMITS.login);
      }
      // Meanwhile the owner signs in from home, as often as they like.
      for (let i = 0; i < 2 * LIMITS.login; i++) {
        const r = await api(t).post('/auth/login', {
          body: { email: owner.email, password: owner.password },
          remoteAddress: home,
        });
        assert.equal(r.status, 200, `sign-in ${i} from another address: ${r.text}`);
        t.forbidSecret(tokensOf(r.body).refresh_token);
        assert.deepEqual([limits(r).limit, limits(r).remaining], [LIMITS.login, LIMITS.login]);
      }
      // The owner's own typo counts from home only.
      const typo = await api(t).post('/auth/login', {
        body: { email: owner.email, password: 'a-typo' },
        remoteAddress: home,
      });
      assert.equal(typo.status, 401);
      assert.equal(limits(typo).remaining, LIMITS.login - 1);
      // And the attacker's address is still refused, the right password included.
      assertLimited(
        await api(t).post('/auth/login', {
          body: { email: owner.email, password: owner.password },
          remoteAddress: attacker,
        }),
        LIMITS.login,
      );
    });

    test('login: one email guessed from many addresses stops at GPUCLOUD_RATE_LIMIT_LOGIN_ACCOUNT', async () => {
      const victim = await makeUser(t);
      const bystander = await makeUser(t);
      await freshWindow();
      const addresses: string[] = [];
      let failures = 0;
      while (failures < LIMITS.loginAccount) {
        const ip = randomIp();
        addresses.push(ip);
        for (let i = 0; i < LIMITS.login && failures < LIMITS.loginAccount; i++, failures++) {
          const r = await api(t).post('/auth/login', {
            body: { email: victim.email, password: `spray-${failures}` },
            remoteAddress: ip,
          });
          assert.equal(r.status, 401, `failure ${failures + 1} from ${ip}: ${r.text}`);
        }
      }
      assert.ok(addresses.length > 1, 'several addresses were needed');
      // From yet another address: the account's failures are used up, whatever the password.
      const fresh = randomIp();
      const over = await api(t).post('/auth/login', {
        body: { email: victim.email, password: 'spray-again' },
        remoteAddress: fresh,
      });
      assertLimited(over, LIMITS.loginAccount);
      assert.match(over.body.detail, /failed logins per minute for this email exceeded/);
      const right = await api(t).post('/auth/login', {
        body: { email: victim.email.toUpperCase(), password: victim.password },
        remoteAddress: randomIp(),
      });
      assertLimited(right, LIMITS.loginAccount);
      // A refused attempt is no failure, and changes nothing: still refused.
      assertLimited(
        await api(t).post('/auth/login', {
          body: { email: victim.email, password: 'x-long-guess' },
          remoteAddress: fresh,
        }),
        LIMITS.loginAccount,
      );
      // Other accounts, from the same addresses, are not affected.
      for (const ip of [...addresses, fresh]) {
        const r = await api(t).post('/auth/login', {
          body: { email: bystander.email, password: bystander.password },
          remoteAddress: ip,
        });
        assert.equal(r.status, 200, `${ip}: ${r.text}`);
        t.forbidSecret(tokensOf(r.body).refresh_token);
      }
    });

    test('login: attempts running at once never pass a failure limit together', async () => {
      const u = await makeUser(t);
      const ip = randomIp();
      await freshWindow();
      const burst = await Promise.all(
        Array.from({ length: 3 * LIMITS.login }, (_, i) =>
          api(t).post('/auth/login', { body: { email: u.email, password: `burst-${i}` }, remoteAddress: ip }),
        ),
      );
      const tally = (rs: { status: number }[]) => rs.map((r) => r.status).sort((x, y) => x - y);
      assert.deepEqual(tally(burst), [
        ...Array<number>(LIMITS.login).fill(401),
        ...Array<number>(2 * LIMITS.login).fill(429),
      ]);
      const other = await makeUser(t);
      const spread = await Promise.all(
        Array.from({ length: 2 * LIMITS.loginAccount }, (_, i) =>
          api(t).post('/auth/login', {
            body: { email: other.email, password: `spread-${i}` },
            remoteAddress: randomIp(),
          }),
        ),
      );
      assert.deepEqual(tally(spread), [
        ...Array<number>(LIMITS.loginAccount).fill(401),
        ...Array<number>(LIMITS.loginAccount).fill(429),
      ]);
    });

    test('login: invalid and unreadable bodies are counted too, and answered with the headers', async () => {
      const c = await makeUser(t);
      const ip = randomIp();
      await freshWindow();
      const noPassword = await api(t).post('/auth/login', { rawBody: { email: c.email }, remoteAddress: ip });
      assert.equal(noPassword.status, 422);
      assert.deepEqual([limits(noPassword).limit, limits(noPassword).remaining], [LIMITS.login, LIMITS.login - 1]);
      const empty = await api(t).post('/auth/login', {
        body: { email: c.email.toUpperCase(), password: '' },
        remoteAddress: ip,
      });
      assert.equal(empty.status, 422);
      assert.equal(limits(empty).remaining, LIMITS.login - 2, 'counted for the email from this address');
      const elsewhere = await api(t).post('/auth/login', {
        body: { email: c.email, password: '' },
        remoteAddress: randomIp(),
      });
      assert.equal(elsewhere.status, 422);
      assert.equal(limits(elsewhere).remaining, LIMITS.login - 1, 'another address has a count of its own');

      // Without a usable email: per address.
      const malformed = await api(t).post('/auth/login', { rawBody: '{"email":', remoteAddress: ip });
      assert.equal(malformed.status, 400);
      assert.equal(malformed.body.code, 'malformed_json');
      assert.deepEqual([limits(malformed).limit, limits(malformed).remaining], [LIMITS.login, LIMITS.login - 1]);
      const noEmail = await api(t).post('/auth/login', { rawBody: { password: 'x' }, remoteAddress: ip });
      assert.equal(noEmail.status, 422);
      assert.equal(limits(noEmail).remaining, LIMITS.login - 2);

      const ok = await api(t).post('/auth/login', {
        body: { email: c.email, password: c.password },
        remoteAddress: ip,
      });
      assert.equal(ok.status, 200);
      t.forbidSecret(tokensOf(ok.body).refresh_token);
      assert.equal(limits(ok).remaining, LIMITS.login - 2, 'the sign-in itself counts for nothing');
    });

    test('other /auth operations: GPUCLOUD_RATE_LIMIT_AUTH per address before login', async () => {
      const ip = randomIp();
      await freshWindow();
      for (let i = 1; i <= LIMITS.auth; i++) {
        const r = await api(t).post('/auth/refresh', { body: { refresh_token: `bogus-${i}` }, remoteAddress: ip });
        assert.equal(r.status, 401, r.text);
        assert.deepEqual([limits(r).limit, limits(r).remaining], [LIMITS.auth, LIMITS.auth - i]);
      }
      assertLimited(
        await api(t).post('/auth/refresh', { body: { refresh_token: 'bogus' }, remoteAddress: ip }),
        LIMITS.auth,
      );
      // register shares the bucket, and is refused before anything is created
      const email = uniqueEmail('limited');
      const reg = await api(t).post('/auth/register', {
        body: { email, password: 'a-long-password-x' },
        remoteAddress: ip,
      });
      assertLimited(reg, LIMITS.auth);
      const login = await api(t).post('/auth/login', {
        body: { email, password: 'a-long-password-x' },
        remoteAddress: randomIp(),
      });
      assert.equal(login.status, 401, 'the refused registration created no account');
      // even a malformed body is counted (the limit comes first)
      const bad = await api(t).post('/auth/register', { rawBody: { nope: 1 }, remoteAddress: ip });
      assert.equal(bad.status, 429);
      // another address is not affected
      const elsewhere = await api(t).post('/auth/refresh', {
        body: { refresh_token: 'bogus' },
        remoteAddress: randomIp(),
      });
      assert.equal(elsewhere.status, 401);
      assert.equal(limits(elsewhere).remaining, LIMITS.auth - 1);
    });

    test('other /auth operations of a signed-in user are counted per user, apart from the default bucket', async () => {
      const u = await makeUser(t);
      await freshWindow();
      for (let i = 1; i <= LIMITS.auth; i++) {
        // from a different address each time: the user is the subject
        const r = await api(t).post('/auth/2fa/setup', { token: u.token, remoteAddress: randomIp() });
        assert.equal(r.status, 200, r.text);
        t.forbidSecret(r.body.secret);
        assert.deepEqual([limits(r).limit, limits(r).remaining], [LIMITS.auth, LIMITS.auth - i]);
      }
      assertLimited(await api(t).post('/auth/2fa/setup', { token: u.token, remoteAddress: randomIp() }), LIMITS.auth);
      const me = await api(t).get('/account', { token: u.token });
      assert.equal(me.status, 200, 'the default bucket is separate');
      assert.deepEqual([limits(me).limit, limits(me).remaining], [LIMITS.default, LIMITS.default - 1]);
    });

    test('VM mutations: GPUCLOUD_RATE_LIMIT_VM_MUTATIONS per user; reads and other users apart; a refused create makes nothing', async () => {
      const adminEmail = uniqueEmail('rl-admin');
      const adminPassword = 'a-long-password-' + randomBytes(4).toString('hex');
      await t.services.auth.ensureUser(adminEmail, adminPassword, 'admin');
      const adminLogin = await t.services.auth.login(adminEmail, adminPassword);
      assert.ok('access_token' in adminLogin);
      const admin = adminLogin.access_token;
      const u = await makeUser(t);
      const other = await makeUser(t);
      // A node, credit and an SSH key: without the limit, the create below would succeed.
      const node = `rl-${randomBytes(3).toString('hex')}`;
      const made = await api(t).post('/admin/nodes', {
        token: admin,
        body: {
          node,
          gpu_type: '4090',
          gpu_count: 8,
          ram_gb: 256,
          cpu_cores: 32,
          cpu_model: 'EPYC',
          pcie_gen: '4.0',
          max_storage_gb: 1000,
          location: 'eu',
          cluster_name: 'rl',
        },
      });
      assert.equal(made.status, 201, made.text);
      assert.equal(
        (
          await api(t).post('/admin/users/{user_id}/credits', {
            params: { user_id: u.id },
            token: admin,
            body: { amount: 100, description: 'rl' },
          })
        ).status,
        201,
      );
      const { generateKey } = await import('../ssh-keys/keygen.js');
      assert.equal(
        (
          await api(t).post('/ssh-keys', {
            token: u.token,
            body: { ssh_public_key: generateKey('ed25519').line },
          })
        ).status,
        201,
      );

      await freshWindow();
      const missing = '00000000-0000-4000-8000-000000000000';
      // Every kind of VM mutation counts, whatever its answer (the limit comes first), from any address.
      const mutations = [
        () =>
          api(t).post('/vms/{vm_id}/stop', { params: { vm_id: missing }, token: u.token, remoteAddress: randomIp() }),
        () =>
          api(t).post('/vms/{vm_id}/start', { params: { vm_id: missing }, token: u.token, remoteAddress: randomIp() }),
        () => api(t).delete('/vms/{vm_id}', { params: { vm_id: missing }, token: u.token, remoteAddress: randomIp() }),
        () =>
          api(t).post('/vms/{vm_id}/set-label', {
            params: { vm_id: missing },
            token: u.token,
            body: { instance_label: 'x' },
            remoteAddress: randomIp(),
          }),
        () =>
          api(t).post('/vms/{vm_id}/set-auto-restart', {
            params: { vm_id: missing },
            token: u.token,
            body: { auto_restart: true },
            remoteAddress: randomIp(),
          }),
        () =>
          api(t).post('/vms', {
            token: u.token,
            body: { node: 'no-such-node', gpu_type: '4090', gpu_count: 1, storage_gb: 50, template_vmid: 100 },
            remoteAddress: randomIp(),
          }),
      ];
      for (let i = 0; i < LIMITS.vm; i++) {
        const r = await mutations[i % mutations.length]!();
        assert.ok(r.status === 404 || r.status === 400, `mutation ${i}: ${r.status} ${r.text}`);
        assert.deepEqual([limits(r).limit, limits(r).remaining], [LIMITS.vm, LIMITS.vm - 1 - i]);
      }
      const refused = await api(t).post('/vms', {
        token: u.token,
        body: { node, gpu_type: '4090', gpu_count: 1, storage_gb: 50, template_vmid: 100 },
      });
      assertLimited(refused, LIMITS.vm);
      const list = await api(t).get('/vms', { token: u.token });
      assert.equal(list.status, 200, 'reads are not VM mutations');
      assert.deepEqual(list.body, [], 'the refused create made no VM');
      assert.equal(limits(list).limit, LIMITS.default);
      const balance = await api(t).get('/billing/balance', { token: u.token });
      assert.equal(balance.status, 200, balance.text);
      assert.equal(balance.body.balance, 100, 'and charged nothing');
      const theirs = await api(t).post('/vms/{vm_id}/stop', { params: { vm_id: missing }, token: other.token });
      assert.equal(theirs.status, 404, 'another user has a budget of their own');
      assert.equal(limits(theirs).remaining, LIMITS.vm - 1);
    });

    test('default bucket: per user, whatever the credential or address; users are counted apart', async () => {
      const v = await makeUser(t);
      const w = await makeUser(t);
      await freshWindow();
      const key = await api(t).post('/api-keys', { token: v.token, body: { name: 'rl', scope: 'read_only' } });
      assert.equal(key.status, 201, key.text);
      const apiKey = key.body.key;
      t.forbidSecret(apiKey);
      assert.equal(limits(key).remaining, LIMITS.default - 1);
      for (let i = 2; i <= LIMITS.default; i++) {
        // JWT and API key alternate, from changing addresses: one counter
        const r = await api(t).get('/account', { token: i % 2 ? v.token : apiKey, remoteAddress: randomIp() });
        assert.equal(r.status, 200, r.text);
        assert.equal(limits(r).remaining, LIMITS.default - i);
      }
      assertLimited(await api(t).get('/account', { token: v.token }), LIMITS.default);
      assertLimited(await api(t).get('/api-keys', { token: apiKey, remoteAddress: randomIp() }), LIMITS.default);

      const other = await api(t).get('/account', { token: w.token });
      assert.equal(other.status, 200);
      assert.equal(other.body.id, w.id);
      assert.equal(limits(other).remaining, LIMITS.default - 1);
    });

    test('unauthenticated calls and 401s are counted per address', async () => {
      const ip = randomIp();
      const u = await makeUser(t);
      await freshWindow();
      for (let i = 1; i <= LIMITS.default; i++) {
        const r = await api(t).get('/account', { remoteAddress: ip, token: i % 2 ? undefined : 'not-a-valid-token' });
        assert.equal(r.status, 401, r.text);
        assert.deepEqual(
          [limits(r).limit, limits(r).remaining],
          [LIMITS.default, LIMITS.default - i],
          '401s carry the headers too',
        );
      }
      // Past the limit, the address gets 429 instead of 401, whatever it tries.
      assertLimited(await api(t).get('/account', { remoteAddress: ip }), LIMITS.default);
      assertLimited(await api(t).get('/api-keys', { remoteAddress: ip, token: 'Bearer-less-garbage' }), LIMITS.default);
      assertLimited(await api(t).get('/account', { remoteAddress: ip, token: 'gpc_not_a_real_key' }), LIMITS.default);
      // A valid user at that address is counted as itself.
      const mine = await api(t).get('/account', { remoteAddress: ip, token: u.token });
      assert.equal(mine.status, 200);
      assert.equal(limits(mine).remaining, LIMITS.default - 1);
      // Another address still gets plain 401s.
      const elsewhere = await api(t).get('/account', { remoteAddress: randomIp() });
      assert.equal(elsewhere.status, 401);
      assert.equal(limits(elsewhere).remaining, LIMITS.default - 1);
    });

    test('health, metrics, docs and unknown routes are never limited', async () => {
      const ip = randomIp();
      await freshWindow(10_000);
      for (let i = 0; i < LIMITS.default + 3; i++) {
        for (const url of ['/healthz', '/readyz', '/metrics', '/openapi.json']) {
          const r = await call(app, 'GET', url, { ip });
          // /metrics from another machine wants credentials: refused, but never limited either.
          assert.equal(r.status, url === '/metrics' ? 401 : 200, `${url}: ${r.text.slice(0, 100)}`);
          assert.equal(r.headers['x-ratelimit-limit'], undefined, url);
        }
      }
      const docs = await call(app, 'GET', '/docs', { ip });
      assert.equal(docs.status, 200);
      // and they spent nothing of the address's budget
      const r = await api(t).get('/account', { remoteAddress: ip });
      assert.equal(limits(r).remaining, LIMITS.default - 1);
    });
  });
}

const sharedReason = !(process.env.DATABASE_URL && process.env.GPUCLOUD_REDIS_URL)
  ? 'needs DATABASE_URL and GPUCLOUD_REDIS_URL'
  : false;

describe('rate limits shared by two instances through Redis', { skip: sharedReason }, () => {
  let t: TestApp;
  let b: FastifyInstance;
  before(async () => {
    t = await buildTestApp('postgres', { redis: true, env: ENV });
    b = await t.another();
  });
  after(() => t?.close());

  test('the default bucket of a user is one counter across instances', async () => {
    const u = await makeUser(t);
    await freshWindow();
    for (let i = 1; i <= LIMITS.default; i++) {
      const r = await call(i % 2 ? t.app : b, 'GET', '/account', { token: u.token });
      assert.equal(r.status, 200, r.text);
      assert.equal(limits(r).remaining, LIMITS.default - i, `hit ${i}`);
    }
    assertLimited(await call(t.app, 'GET', '/account', { token: u.token }), LIMITS.default);
    assertLimited(await call(b, 'GET', '/account', { token: u.token }), LIMITS.default);
  });

  test('login attempts for one email are one counter across instances', async () => {
    const u = await makeUser(t);
    await freshWindow();
    for (let i = 1; i <= LIMITS.login; i++) {
      const r = await call(i % 2 ? b : t.app, 'POST', '/auth/login', {
        body: { email: u.email, password: 'wrong-password-x' },
      });
      assert.equal(r.status, 401);
      assert.equal(limits(r).remaining, LIMITS.login - i);
    }
    assertLimited(
      await call(b, 'POST', '/auth/login', { body: { email: u.email, password: u.password } }),
      LIMITS.login,
    );
    assertLimited(
      await call(t.app, 'POST', '/auth/login', { body: { email: u.email, password: u.password } }),
      LIMITS.login,
    );
  });

  test('failed logins for one email from all addresses are one counter across instances', async () => {
    const u = await makeUser(t);
    await freshWindow();
    for (let i = 1; i <= LIMITS.loginAccount; i++) {
      const r = await call(i % 2 ? b : t.app, 'POST', '/auth/login', {
        body: { email: u.email, password: `wrong-${i}` },
        ip: randomIp(),
      });
      assert.equal(r.status, 401, r.text);
      if (i === 3) {
        // A sign-in on the other instance in between: counted, then taken back, in the shared counters.
        const ok = await call(i % 2 ? t.app : b, 'POST', '/auth/login', {
          body: { email: u.email, password: u.password },
          ip: randomIp(),
        });
        assert.equal(ok.status, 200, ok.text);
        assert.equal(limits(ok).remaining, LIMITS.login);
      }
    }
    for (const app of [t.app, b]) {
      assertLimited(
        await call(app, 'POST', '/auth/login', { body: { email: u.email, password: u.password }, ip: randomIp() }),
        LIMITS.loginAccount,
      );
    }
  });

  test('unauthenticated calls from one address are one counter across instances', async () => {
    const ip = randomIp();
    await freshWindow();
    for (let i = 1; i <= LIMITS.default; i++) {
      const r = await call(i % 2 ? t.app : b, 'GET', '/account', { ip });
      assert.equal(r.status, 401);
      assert.equal(limits(r).remaining, LIMITS.default - i);
    }
    assertLimited(await call(b, 'GET', '/account', { ip }), LIMITS.default);
  });
});

describe('global login limit', () => {
  let t: TestApp;
  before(async () => {
    t = await buildTestApp('pglite', {
      env: { ...ENV, GPUCLOUD_RATE_LIMIT_LOGIN_GLOBAL: '6', GPUCLOUD_RATE_LIMIT_LOGIN_IP: '1000' },
    });
  });
  after(() => t.close());

  test('logins from many addresses together stop at GPUCLOUD_RATE_LIMIT_LOGIN_GLOBAL (each costs a password hash)', async () => {
    await freshWindow();
    for (let i = 1; i <= 6; i++) {
      const r = await api(t).post('/auth/login', {
        body: { email: uniqueEmail('g'), password: 'a-guessed-password' },
        remoteAddress: randomIp(),
      });
      assert.equal(r.status, 401, `attempt ${i}: ${r.text}`);
    }
    const over = await api(t).post('/auth/login', {
      body: { email: uniqueEmail('g'), password: 'a-guessed-password' },
      remoteAddress: randomIp(),
    });
    assertLimited(over, 6);
    assert.match(over.body.detail, /to this service/);
  });
});
