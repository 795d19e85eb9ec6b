/**
 * The SDK against a real server listening on a port: typed calls,
 * automatic token refresh, retries of 429 after Retry-After and of
 * 5xx / network errors only where safe, its own Idempotency-Key on creates so
 * a retried create makes one VM, a streamed upload range, GpuCloudError (the error body), waitForVm, and the
 * committed generated SDK matching the server (`generate-sdk --check`).
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { buildTestApp, type TestApp } from '../helpers/app.js';
import { api } from '../helpers/api.js';
import {
  createNode,
  createUser,
  credit,
  tokensOf,
  uniqueEmail,
  uploadSshKey,
  type TestUser,
} from '../helpers/factories.js';
import { stepAt, totpAt } from '../../src/modules/auth/totp.js';
import {
  GpuCloudClient,
  GpuCloudError,
  retryAfterMs,
  type CreateVmRequest,
  type SessionTokens,
  type Vm,
} from '../../src/sdk/index.js';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const PASSWORD = 'sdk-test-password-123';

/** Every request the client sent, as the server (or the injected failure) saw it. */
interface Sent {
  method: string;
  path: string;
  authorization: string | null;
  idempotencyKey: string | null;
}

interface Harness {
  fetch: (input: Request) => Promise<Response>;
  sent: Sent[];
  sleeps: number[];
  sleep: (ms: number) => Promise<void>;
}

/**
 * A recording fetch over the real one. `intercept` may answer a request
 * itself (a synthetic response), throw (a network error), or return undefined
 * to let it through.
 */
function harness(
  intercept?: (req: Request, n: number) => Promise<Response | undefined> | Response | undefined,
): Harness {
  const sent: Sent[] = [];
  const sleeps: number[] = [];
  return {
    sent,
    sleeps,
    sleep: async (ms) => {
      sleeps.push(ms);
    },
    fetch: async (req) => {
      sent.push({
        method: req.method,
        path: new URL(req.url).pathname,
        authorization: req.headers.get('authorization'),
        idempotencyKey: req.headers.get('idempotency-key'),
      });
      const own = await intercept?.(req, sent.length);
      return own ?? fetch(req);
    },
  };
}

const jsonResponse = (status: number, body: unknown, headers: Record<string, string> = {}) =>
  new Response(JSON.stringify(body), { status, headers: { 'content-type': 'application/json', ...headers } });

async function register(baseUrl: string, email = uniqueEmail('sdk')): Promise<string> {
  const r = await fetch(`${baseUrl}/auth/register`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ email, password: PASSWORD, name: 'SDK user' }),
  });
  assert.equal(r.status, 201, await r.text());
  return email;
}

const VM_BODY = (node: string): CreateVmRequest => ({
  node,
  gpu_type: '4090',
  gpu_count: 1,
  storage_gb: 50,
  template_vmid: 100,
});

describe('SDK client', () => {
  let t: TestApp;
  let baseUrl: string;
  let admin: TestUser;
  let node: string;

  before(async () => {
    t = await buildTestApp('pglite');
    baseUrl = await t.app.listen({ port: 0, host: '127.0.0.1' });
    admin = await createUser(t, { admin: true });
    node = (await createNode(t, admin.token)).node;
  });
  after(async () => {
    await t?.close();
  });

  /** A fresh admin access token: tests move the manual clock past the 3600 s of older ones. */
  async function adminToken(): Promise<string> {
    const r = await api(t).post('/auth/login', { body: { email: admin.email, password: admin.password } });
    assert.equal(r.status, 200, r.text);
    return tokensOf(r.body).access_token;
  }

  /** A user with credit and an SSH key, ready to create VMs. */
  async function customer(): Promise<TestUser> {
    const u = await createUser(t);
    await credit(t, await adminToken(), u.id, 100);
    await uploadSshKey(t, u.token);
    return u;
  }

  test('typed calls: register over fetch, login and calls through the SDK', async () => {
    const email = await register(baseUrl);
    const seen: SessionTokens[] = [];
    const client = new GpuCloudClient({ baseUrl, onTokens: (p) => void seen.push(p) });

    const login = await client.login(email, PASSWORD);
    assert.ok('access_token' in login, 'no 2FA: a token pair');
    assert.equal(login.token_type, 'bearer');
    assert.deepEqual(seen, [{ accessToken: login.access_token, refreshToken: login.refresh_token }]);
    assert.deepEqual(client.tokens, seen[0]);

    const account = await client.api.GET('/account');
    assert.equal(account.response.status, 200);
    assert.equal(account.data?.email, email);
    assert.equal(account.data?.two_factor_enabled, false);

    // Public, typed query parameters; limit and offset have defaults and may be left out.
    const offers = await client.api.GET('/search', { params: { query: { gpu_type: '4090' } } });
    assert.equal(offers.response.status, 200);
    assert.ok(
      offers.data!.some((o) => o.node === node && o.gpu_count === 8),
      JSON.stringify(offers.data),
    );
    assert.equal(offers.response.headers.get('x-total-count'), String(offers.data!.length));

    // Typed error bodies.
    const missing = await client.api.GET('/vms/{vm_id}', { params: { path: { vm_id: 'no-such-vm' } } });
    assert.equal(missing.response.status, 404);
    assert.equal(missing.error?.code, 'not_found');

    const vms = await client.listVms();
    assert.deepEqual(vms, []);
    // The convenience methods are typed, not `any`.
    // @ts-expect-error no such field on a VM
    void vms[0]?.no_such_field;
  });

  test('login with two-factor on answers the challenge; verify2fa completes it', async () => {
    const u = await createUser(t);
    const setup = await api(t, u.token).post('/auth/2fa/setup');
    assert.equal(setup.status, 200, setup.text);
    const secret = setup.body.secret;
    const code = (offset = 0) => totpAt(secret, stepAt(t.clock.nowMs()) + offset);
    assert.equal((await api(t, u.token).post('/auth/2fa/enable', { body: { code: code() } })).status, 200);
    await t.services.clock.advance(30); // the enable code is used up

    const seen: SessionTokens[] = [];
    const client = new GpuCloudClient({ baseUrl, onTokens: (p) => void seen.push(p) });
    const first = await client.login(u.email, u.password);
    assert.ok('two_factor_required' in first && first.two_factor_required);
    assert.equal(seen.length, 0);
    assert.equal(client.tokens.accessToken, undefined);

    const wrong = await client
      .verify2fa(first.challenge_token, code() === '000000' ? '111111' : '000000')
      .catch((e: unknown) => e);
    assert.ok(wrong instanceof GpuCloudError);
    assert.equal(wrong.status, 401);
    assert.equal(wrong.code, 'unauthorized');

    const pair = await client.verify2fa(first.challenge_token, code());
    assert.deepEqual(seen, [{ accessToken: pair.access_token, refreshToken: pair.refresh_token }]);
    assert.equal((await client.api.GET('/account')).data?.two_factor_enabled, true);
  });

  test('an expired access token is refreshed by itself, once, and onTokens sees the rotated pair', async () => {
    const email = await register(baseUrl);
    const seen: SessionTokens[] = [];
    const h = harness();
    const client = new GpuCloudClient({ baseUrl, fetch: h.fetch, sleep: h.sleep, onTokens: (p) => void seen.push(p) });
    await client.login(email, PASSWORD);
    const original = seen[0]!;

    await t.services.clock.advance(3601); // access tokens live 3600 s
    h.sent.length = 0;
    const me = await client.api.GET('/account');
    assert.equal(me.response.status, 200, JSON.stringify(me.error));
    assert.equal(me.data?.email, email);
    assert.deepEqual(
      h.sent.map((s) => `${s.method} ${s.path}`),
      ['GET /account', 'POST /auth/refresh', 'GET /account'],
    );
    assert.equal(h.sent[1]!.authorization, null, 'no credential on the refresh call');
    assert.equal(seen.length, 2);
    const rotated = seen[1]!;
    assert.notEqual(rotated.accessToken, original.accessToken);
    assert.notEqual(rotated.refreshToken, original.refreshToken);
    assert.deepEqual(client.tokens, rotated);
    assert.equal(h.sent[2]!.authorization, `Bearer ${rotated.accessToken}`);
    assert.deepEqual(h.sleeps, [], 'a refresh is not a retry');

    // The old refresh token stopped working at the rotation (refresh tokens are single use)...
    const reuse = await fetch(`${baseUrl}/auth/refresh`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ refresh_token: original.refreshToken }),
    });
    assert.equal(reuse.status, 401);
    // ...and reusing it revoked the family: the SDK's session is gone too, and it says so.
    const revoked = await client.getVm('x').catch((e: unknown) => e);
    assert.ok(revoked instanceof GpuCloudError);
    assert.equal(revoked.status, 401);
  });

  test('concurrent requests after expiry share one refresh (a second one would revoke the session)', async () => {
    const email = await register(baseUrl);
    const seen: SessionTokens[] = [];
    const h = harness();
    const client = new GpuCloudClient({ baseUrl, fetch: h.fetch, onTokens: (p) => void seen.push(p) });
    await client.login(email, PASSWORD);
    await t.services.clock.advance(3601);
    h.sent.length = 0;
    const results = await Promise.all(Array.from({ length: 5 }, () => client.api.GET('/account')));
    for (const r of results) assert.equal(r.response.status, 200, JSON.stringify(r.error));
    assert.equal(h.sent.filter((s) => s.path === '/auth/refresh').length, 1);
    assert.equal(seen.length, 2);
    // Still a live session afterwards.
    assert.equal((await client.api.GET('/account')).response.status, 200);

    // A client started from saved tokens only (no access token) refreshes before its first call.
    const later = new GpuCloudClient({ baseUrl, refreshToken: client.tokens.refreshToken! });
    assert.equal((await later.api.GET('/account')).data?.email, email);
  });

  test('a refused refresh token gives the original 401 and is forgotten', async () => {
    const u = await createUser(t);
    await t.services.clock.advance(3601);
    const h = harness();
    const client = new GpuCloudClient({
      baseUrl,
      fetch: h.fetch,
      accessToken: u.token,
      refreshToken: 'not-a-refresh-token',
    });
    const err = await client.listVms().catch((e: unknown) => e);
    assert.ok(err instanceof GpuCloudError);
    assert.equal(err.status, 401);
    assert.equal(err.code, 'unauthorized');
    assert.equal(client.tokens.refreshToken, undefined);
    await client.listVms().catch(() => undefined);
    assert.equal(h.sent.filter((s) => s.path === '/auth/refresh').length, 1, 'not retried once refused');
  });

  test('an API key is sent as the bearer and never refreshed', async () => {
    const email = await register(baseUrl);
    const session = new GpuCloudClient({ baseUrl });
    await session.login(email, PASSWORD);
    const created = await session.api.POST('/api-keys', { body: { name: 'ci', scope: 'read_only' } });
    assert.equal(created.response.status, 201, JSON.stringify(created.error));
    const key = created.data!.key;
    assert.match(key, /^gpc_/);

    const h = harness();
    const client = new GpuCloudClient({
      baseUrl,
      apiKey: key,
      refreshToken: 'ignored-with-an-api-key',
      fetch: h.fetch,
    });
    assert.deepEqual(await client.listVms(), []);
    assert.equal(h.sent[0]!.authorization, `Bearer ${key}`);
    // A read_only key cannot create; the error carries the API's code and detail.
    const denied = await client.createVm(VM_BODY(node)).catch((e: unknown) => e);
    assert.ok(denied instanceof GpuCloudError);
    assert.equal(denied.status, 403);
    assert.equal(denied.code, 'forbidden');
    assert.match(denied.detail, /read_only/);

    const del = await session.api.DELETE('/api-keys/{key_id}', { params: { path: { key_id: created.data!.id } } });
    assert.equal(del.response.status, 204);
    h.sent.length = 0;
    const revoked = await client.listVms().catch((e: unknown) => e);
    assert.ok(revoked instanceof GpuCloudError && revoked.status === 401);
    assert.deepEqual(
      h.sent.map((s) => s.path),
      ['/vms'],
      'no refresh attempt with an API key',
    );
  });

  test('followEvents: what was missed, then live; a dropped stream resumes after the last event; a refusal throws', async () => {
    const u = await createUser(t);
    const made = async (name: string) => {
      const r = await api(t, u.token).post('/api-keys', { body: { name, scope: 'read_only' } });
      assert.equal(r.status, 201, r.text);
      return r.body.id;
    };
    for (const name of ['one', 'two', 'three']) await made(name);
    const listed = await api(t, u.token).get('/events', { query: { type: ['api_key.created'] } });
    assert.equal(listed.status, 200, listed.text);
    const [one, two] = listed.body;
    const resumedWith: (string | null)[] = [];
    // The first stream drops after one event; the client opens another after it.
    const h = harness(async (req) => {
      if (!new URL(req.url).pathname.endsWith('/events/stream')) return undefined;
      resumedWith.push(req.headers.get('last-event-id'));
      if (resumedWith.length > 1) return undefined;
      return new Response(`retry: 10\n\nid: ${two!.id}\nevent: api_key.created\ndata: ${JSON.stringify(two)}\n\n`, {
        status: 200,
        headers: { 'content-type': 'text/event-stream' },
      });
    });
    const client = new GpuCloudClient({ baseUrl, fetch: h.fetch, sleep: h.sleep, accessToken: u.token });
    const stop = new AbortController();
    const got: string[] = [];
    for await (const e of client.followEvents({ after: one!.id, types: ['api_key.created'], signal: stop.signal })) {
      got.push(e.data.name as string);
      if (got.length === 2) await made('four'); // live, while following
      if (got.length === 3) stop.abort();
    }
    assert.deepEqual(got, ['two', 'three', 'four']);
    assert.deepEqual(resumedWith, [one!.id, two!.id]);

    const refused = new GpuCloudClient({ baseUrl, accessToken: u.token });
    await assert.rejects(
      async () => {
        for await (const _ of refused.followEvents({ types: ['vm.nope'] })) assert.fail('no event expected');
      },
      (err: unknown) =>
        err instanceof GpuCloudError &&
        err.code === 'validation_error' &&
        err.status === 422 &&
        /unknown event type "vm.nope"/.test(err.detail),
    );
  });

  test('429 is retried after Retry-After, for any method', async () => {
    const email = await register(baseUrl);
    // The first request of each kind is refused by a synthetic 429 with Retry-After: 7.
    const limited = new Set<string>();
    const h = harness((req) => {
      const k = `${req.method} ${new URL(req.url).pathname}`;
      if (limited.has(k)) return undefined;
      limited.add(k);
      return jsonResponse(429, { detail: 'Rate limit exceeded', code: 'rate_limited' }, { 'retry-after': '7' });
    });
    const client = new GpuCloudClient({ baseUrl, fetch: h.fetch, sleep: h.sleep });
    const login = await client.login(email, PASSWORD); // a POST without Idempotency-Key: a 429 means nothing was done
    assert.ok('access_token' in login);
    assert.equal((await client.api.GET('/account')).data?.email, email);
    assert.deepEqual(h.sleeps, [7000, 7000]);
    assert.deepEqual(
      h.sent.map((s) => `${s.method} ${s.path}`),
      ['POST /auth/login', 'POST /auth/login', 'GET /account', 'GET /account'],
    );
  });

  test('5xx: a POST without Idempotency-Key is not retried, a GET is', async () => {
    const u = await createUser(t);
    const failFirst = new Set<string>();
    const h = harness((req) => {
      const k = `${req.method} ${new URL(req.url).pathname}`;
      if (failFirst.has(k)) return undefined;
      failFirst.add(k);
      return jsonResponse(500, { detail: 'Internal error (request id x)', code: 'internal' });
    });
    const client = new GpuCloudClient({ baseUrl, accessToken: u.token, fetch: h.fetch, sleep: h.sleep });

    const calc = await client.api.POST('/reservations/calculate', {
      body: { gpu_type: '4090', gpu_count: 1, storage_gb: 50 },
    });
    assert.equal(calc.response.status, 500);
    assert.equal(calc.error?.code, 'internal');
    assert.equal(h.sent.length, 1, 'POST without Idempotency-Key: not retried');
    assert.equal(h.sleeps.length, 0);

    const me = await client.api.GET('/account');
    assert.equal(me.response.status, 200);
    assert.equal(h.sent.length, 3, 'GET: retried');
    assert.equal(h.sleeps.length, 1);
    assert.ok(h.sleeps[0]! > 0);

    // A GET that keeps failing gives up after maxRetries and reports the error.
    const always = harness(() => jsonResponse(503, { detail: 'Database unreachable', code: 'internal' }));
    const gives = new GpuCloudClient({
      baseUrl,
      accessToken: u.token,
      fetch: always.fetch,
      sleep: always.sleep,
      maxRetries: 2,
    });
    const err = await gives.listVms().catch((e: unknown) => e);
    assert.ok(err instanceof GpuCloudError);
    assert.equal(err.status, 503);
    assert.equal(err.code, 'internal');
    assert.equal(err.detail, 'Database unreachable');
    assert.equal(always.sent.length, 3);
    assert.equal(always.sleeps.length, 2);
    assert.ok(always.sleeps[1]! >= always.sleeps[0]! / 2, 'backoff grows');
  });

  test('network errors: a GET is retried, a POST without Idempotency-Key is not', async () => {
    const u = await createUser(t);
    let failures = 0;
    const h = harness((req) => {
      if (failures++ < 1 || new URL(req.url).pathname === '/reservations/calculate')
        throw new TypeError('fetch failed');
      return undefined;
    });
    const client = new GpuCloudClient({ baseUrl, accessToken: u.token, fetch: h.fetch, sleep: h.sleep });
    assert.equal((await client.api.GET('/account')).data?.email, u.email);
    assert.equal(h.sent.length, 2);
    await assert.rejects(
      client.api.POST('/reservations/calculate', { body: { gpu_type: '4090', gpu_count: 1, storage_gb: 50 } }),
      /fetch failed/,
    );
    assert.equal(h.sent.length, 3);
  });

  test('putImageUploadRange streams a range; replayed with a fresh stream after a refresh; 5xx and network errors are not retried', async () => {
    const seen: SessionTokens[] = [];
    const h = harness();
    const client = new GpuCloudClient({ baseUrl, fetch: h.fetch, sleep: h.sleep, onTokens: (p) => void seen.push(p) });
    await client.login(admin.email, admin.password);
    const bytes = Buffer.from(Array.from({ length: 3000 }, (_, i) => i % 251));
    const started = await client.api.POST('/admin/images/uploads', { body: { size_bytes: bytes.length } });
    assert.equal(started.response.status, 201, JSON.stringify(started.error));
    const id = started.data!.id;
    let made = 0;
    /** Bytes [from, to) of the image as a stream, in small chunks; counts the streams made. */
    const range = (from: number, to: number) => () => {
      made++;
      let at = from;
      return new ReadableStream<Uint8Array>({
        pull(c) {
          if (at >= to) return c.close();
          c.enqueue(bytes.subarray(at, Math.min(at + 256, to)));
          at += 256;
        },
      });
    };

    const first = await client.putImageUploadRange(id, 0, range(0, 1000));
    assert.equal(first.received_bytes, 1000);
    assert.equal(made, 1);

    // The access token expires: refreshed once, and the range sent again from a new stream.
    await t.services.clock.advance(3601);
    h.sent.length = 0;
    const second = await client.putImageUploadRange(id, 1000, range(1000, 2000));
    assert.equal(second.received_bytes, 2000);
    assert.deepEqual(
      h.sent.map((x) => `${x.method} ${x.path}`),
      [`PUT /admin/images/uploads/${id}`, 'POST /auth/refresh', `PUT /admin/images/uploads/${id}`],
    );
    assert.equal(made, 3);

    // The wrong offset: the API's refusal, naming the right one.
    const wrong = await client.putImageUploadRange(id, 0, range(0, 1000)).catch((e: unknown) => e);
    assert.ok(wrong instanceof GpuCloudError);
    assert.equal(wrong.status, 400);
    assert.equal(wrong.code, 'conflict');
    assert.match(wrong.detail, /offset=2000/);

    // A 5xx or a network error is not retried (the caller asks where the upload ends); nothing is sent twice.
    const token = client.tokens.accessToken!;
    for (const fail of [
      () => jsonResponse(503, { detail: 'Service unavailable', code: 'internal' }),
      () => {
        throw new TypeError('fetch failed');
      },
    ]) {
      const broken = harness((req) => (req.method === 'PUT' ? fail() : undefined));
      const c = new GpuCloudClient({ baseUrl, accessToken: token, fetch: broken.fetch, sleep: broken.sleep });
      const err = await c.putImageUploadRange(id, 2000, range(2000, 3000)).catch((e: unknown) => e);
      assert.ok(err instanceof Error);
      assert.equal(broken.sent.length, 1, 'one attempt');
      assert.deepEqual(broken.sleeps, []);
    }
    const state = await client.api.GET('/admin/images/uploads/{upload_id}', { params: { path: { upload_id: id } } });
    assert.equal(state.data?.received_bytes, 2000);
    const last = await client.putImageUploadRange(id, 2000, range(2000, 3000));
    assert.equal(last.received_bytes, 3000);
  });

  test('a create whose response is lost is retried with the same Idempotency-Key and makes one VM', async () => {
    const u = await customer();
    let dropped = false;
    let replayed: string | null = null;
    const h = harness(async (req) => {
      if (req.method !== 'POST' || new URL(req.url).pathname !== '/vms') return undefined;
      const res = await fetch(req); // the server does the work...
      if (!dropped) {
        dropped = true;
        await res.arrayBuffer();
        throw new TypeError('fetch failed: other side closed'); // ...but the answer never arrives
      }
      replayed = res.headers.get('idempotent-replayed');
      return res;
    });
    const client = new GpuCloudClient({ baseUrl, accessToken: u.token, fetch: h.fetch, sleep: h.sleep });
    const vm = await client.createVm(VM_BODY(node));
    assert.equal(vm.status, 'creating');

    const posts = h.sent.filter((s) => s.method === 'POST' && s.path === '/vms');
    assert.equal(posts.length, 2);
    assert.match(posts[0]!.idempotencyKey ?? '', /^[0-9a-f-]{36}$/);
    assert.equal(posts[1]!.idempotencyKey, posts[0]!.idempotencyKey);
    assert.equal(replayed, 'true', 'the server replayed the first response (same Idempotency-Key, same body)');
    assert.equal(h.sleeps.length, 1);

    const vms = await client.listVms();
    assert.deepEqual(
      vms.map((v) => v.id),
      [vm.id],
    );
    assert.equal((await client.getVm(vm.vmid)).id, vm.id); // a VM is found by its vmid too

    // waitForVm: the injected sleep moves the manual clock, which provisions the VM.
    const statuses: string[] = [];
    const waiter = new GpuCloudClient({
      baseUrl,
      accessToken: u.token,
      sleep: async () => {
        await t.services.clock.advance(1);
      },
    });
    const running = await waiter.waitForVm(vm.id, 'running', {
      intervalMs: 1000,
      onStatus: (v) => void statuses.push(v.status),
    });
    assert.equal(running.status, 'running');
    assert.equal(statuses[0], 'creating');
    assert.equal(statuses.at(-1), 'running');

    // Waiting for a status that does not come: a timeout...
    const stuck = new GpuCloudClient({ baseUrl, accessToken: u.token, sleep: async () => {} });
    const timeout = await stuck
      .waitForVm(vm.id, 'stopped', { intervalMs: 1000, timeoutMs: 3000 })
      .catch((e: unknown) => e);
    assert.ok(timeout instanceof GpuCloudError);
    assert.equal(timeout.code, 'timeout');
    // ...or a VM that can never get there.
    assert.equal((await api(t, u.token).delete('/vms/{vm_id}', { params: { vm_id: vm.id } })).status, 200);
    const gone = await stuck.waitForVm(vm.id, 'running').catch((e: unknown) => e);
    assert.ok(gone instanceof GpuCloudError);
    assert.equal(gone.code, 'invalid_state');
    assert.match(gone.detail, /destroyed/);
  });

  test("waitForVm follows the VM's events: it reads the VM when the stream opens and after each change, never on a timer", async () => {
    const u = await customer();
    const h = harness();
    const client = new GpuCloudClient({ baseUrl, accessToken: u.token, fetch: h.fetch, sleep: h.sleep });
    const vm = await client.createVm(VM_BODY(node));
    const statuses: string[] = [];
    const waiting = client.waitForVm(vm.vmid, 'running', { onStatus: (v) => void statuses.push(v.status) });
    // The VM is built and started while the client waits: the clock moves only once the stream is open.
    const deadline = Date.now() + 20_000;
    while (!h.sent.some((s) => s.path === '/events/stream') && Date.now() < deadline)
      await new Promise((r) => setTimeout(r, 20));
    await new Promise((r) => setTimeout(r, 200));
    await t.services.clock.advance(60);
    const running = await waiting;
    assert.equal(running.status, 'running');
    assert.equal(statuses[0], 'creating');
    assert.equal(statuses.at(-1), 'running');
    assert.deepEqual(h.sleeps, [], 'no polling');
    const reads = h.sent.filter((s) => s.method === 'GET' && s.path.startsWith('/vms/')).length;
    const changed = await api(t, u.token).get('/events', { query: { vm_id: vm.id, type: ['vm.status_changed'] } });
    assert.equal(changed.status, 200, changed.text);
    const changes = changed.body.length;
    assert.ok(
      reads <= changes + 2,
      `${reads} reads for ${changes} changes: the first, one when the stream opened, one per change`,
    );
    assert.equal(h.sent.filter((s) => s.path === '/events/stream').length, 1);

    // A VM that is destroyed while waited for: invalid_state, at once.
    const stopping = client.waitForVm(vm.id, 'stopped');
    while (h.sent.filter((s) => s.path === '/events/stream').length < 2) await new Promise((r) => setTimeout(r, 20));
    await new Promise((r) => setTimeout(r, 200));
    assert.equal((await api(t, u.token).delete('/vms/{vm_id}', { params: { vm_id: vm.id } })).status, 200);
    const gone = await stopping.catch((e: unknown) => e);
    assert.ok(gone instanceof GpuCloudError);
    assert.equal(gone.code, 'invalid_state');

    // Nothing happening: a timeout, and the stream is closed behind it.
    const other = await client.createVm(VM_BODY(node));
    const stuck = await client.waitForVm(other.id, 'running', { timeoutMs: 1500 }).catch((e: unknown) => e);
    assert.ok(stuck instanceof GpuCloudError);
    assert.equal(stuck.code, 'timeout');
  });

  test('every create route gets an Idempotency-Key; a caller-given one is kept', async () => {
    const u = await customer();
    const h = harness();
    let n = 0;
    const client = new GpuCloudClient({
      baseUrl,
      accessToken: u.token,
      fetch: h.fetch,
      idempotencyKey: () => `k-${++n}`,
    });
    const adminClient = new GpuCloudClient({
      baseUrl,
      accessToken: await adminToken(),
      fetch: h.fetch,
      idempotencyKey: () => `k-${++n}`,
    });

    await client.api.POST('/api-keys', { body: { name: 'a' } });
    await client.api.POST('/api-keys', { body: { name: 'b' }, headers: { 'Idempotency-Key': 'mine' } });
    await adminClient.api.POST('/admin/users/{user_id}/credits', {
      params: { path: { user_id: u.id } },
      body: { amount: 1, description: 'sdk' },
    });
    await client.api.POST('/ssh-keys', { body: { ssh_public_key: 'not a key' } });
    await client.api.POST('/webhooks', { body: { url: 'ftp://nowhere' } });
    await client.api.POST('/reservations/calculate', { body: { gpu_type: '4090', gpu_count: 1, storage_gb: 50 } });
    await client.api.GET('/vms');
    assert.deepEqual(
      h.sent.map((s) => [s.method, s.path, s.idempotencyKey]),
      [
        ['POST', '/api-keys', 'k-1'],
        ['POST', '/api-keys', 'mine'],
        ['POST', `/admin/users/${u.id}/credits`, 'k-2'],
        ['POST', '/ssh-keys', 'k-3'],
        ['POST', '/webhooks', 'k-4'],
        ['POST', '/reservations/calculate', null],
        ['GET', '/vms', null],
      ],
    );
  });

  test('GpuCloudError carries status, code, detail and field errors', async () => {
    const u = await createUser(t); // no credit, no SSH key
    const client = new GpuCloudClient({ baseUrl, accessToken: u.token });

    const poor = await client.createVm(VM_BODY(node)).catch((e: unknown) => e);
    assert.ok(poor instanceof GpuCloudError);
    assert.equal(poor.status, 400);
    assert.equal(poor.code, 'insufficient_balance');
    assert.match(poor.detail, /\d/);
    assert.ok(poor.requestId, 'names the request (X-Request-Id)');
    assert.match(poor.message, /insufficient_balance/);

    const invalid = await client.createVm({ ...VM_BODY(node), gpu_count: 3 as 1 }).catch((e: unknown) => e);
    assert.ok(invalid instanceof GpuCloudError);
    assert.equal(invalid.status, 422);
    assert.equal(invalid.code, 'validation_error');
    assert.ok(
      invalid.errors?.some((e) => e.field === 'body.gpu_count'),
      JSON.stringify(invalid.errors),
    );

    // The same Idempotency-Key with another body: 422 idempotency_mismatch.
    const c = await customer();
    const rich = new GpuCloudClient({ baseUrl, accessToken: c.token });
    await rich.createVm(VM_BODY(node), { idempotencyKey: 'same-key' });
    const again = await rich
      .createVm({ ...VM_BODY(node), storage_gb: 60 }, { idempotencyKey: 'same-key' })
      .catch((e: unknown) => e);
    assert.ok(again instanceof GpuCloudError);
    assert.equal(again.code, 'idempotency_mismatch');
    assert.equal((await rich.listVms()).length, 1);

    const missing = await client.getVm(999_999).catch((e: unknown) => e);
    assert.ok(missing instanceof GpuCloudError);
    assert.equal(missing.status, 404);
    assert.equal(missing.code, 'not_found');
  });

  test('Retry-After: seconds or an HTTP date', () => {
    assert.equal(retryAfterMs('7'), 7000);
    assert.equal(retryAfterMs(' 0 '), 0);
    assert.equal(retryAfterMs(new Date(10_000 + 5000).toUTCString(), 10_000), 5000);
    assert.equal(retryAfterMs('soon'), undefined);
    assert.equal(retryAfterMs(null), undefined);
  });
});

describe('SDK client against the real rate limiter', () => {
  let t: TestApp;
  let baseUrl: string;
  before(async () => {
    t = await buildTestApp('pglite', { env: { GPUCLOUD_RATE_LIMIT_DEFAULT: '3' } });
    baseUrl = await t.app.listen({ port: 0, host: '127.0.0.1' });
  });
  after(async () => {
    await t?.close();
  });

  test("429s are retried after the server's Retry-After, then reported", async () => {
    // Windows are real, epoch-aligned 60 s windows: start with enough of one left.
    const left = 60_000 - (Date.now() % 60_000);
    if (left < 15_000) await new Promise((r) => setTimeout(r, left + 50));
    const u = await createUser(t);
    const retryAfter: number[] = [];
    const h = harness(async (req) => {
      const res = await fetch(req);
      if (res.status === 429) retryAfter.push(Number(res.headers.get('retry-after')));
      return res;
    });
    const client = new GpuCloudClient({ baseUrl, accessToken: u.token, fetch: h.fetch, sleep: h.sleep, maxRetries: 2 });
    // GPUCLOUD_RATE_LIMIT_DEFAULT=3, of which createUser's GET /account took one.
    const answered: Vm[][] = [];
    let err: unknown;
    while (answered.length < 4 && err === undefined) {
      await client.listVms().then(
        (v) => answered.push(v),
        (e: unknown) => (err = e),
      );
    }
    assert.equal(answered.length, 2);
    assert.ok(err instanceof GpuCloudError);
    assert.equal(err.status, 429);
    assert.equal(err.code, 'rate_limited');
    assert.match(err.detail, /Rate limit/);
    assert.equal(h.sent.length, 2 + 3, 'two answered, then one call tried three times');
    assert.equal(retryAfter.length, 3);
    assert.ok(
      retryAfter.every((s) => s >= 1 && s <= 60),
      String(retryAfter),
    );
    assert.deepEqual(
      h.sleeps,
      retryAfter.slice(0, 2).map((s) => s * 1000),
      'slept what the server asked',
    );
  });
});

describe('generated SDK', () => {
  test('the committed sdk/openapi.json and src/sdk/schema.ts match the server (generate-sdk --check)', () => {
    const r = spawnSync(process.execPath, ['--import', 'tsx', 'scripts/generate-sdk.ts', '--check'], {
      cwd: ROOT,
      encoding: 'utf8',
      timeout: 110_000,
    });
    assert.equal(r.status, 0, `generate-sdk --check failed:\n${r.stdout}\n${r.stderr}`);
    assert.match(r.stdout, /match the server/);
  });
});
