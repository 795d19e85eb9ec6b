/**
 * The scope matrix (docs/security.md#what-each-credential-may-do): every route of the app, read from
 * GET /openapi.json, called with each kind of credential. A route added later
 * is covered without touching this file.
 *
 * The expected policy below is written from the documented scope rules, not copied from
 * src/http/scopes.ts:
 *   read_write   everything (and a JWT session is read_write);
 *   read_only    every GET of /vms, /ssh-keys, /reservations, /billing,
 *                /account, plus search and pricing; anything else 403;
 *   billing_only GET /billing/*, GET /account, POST /reservations/calculate;
 *                anything else 403.
 * Allowed calls may answer anything but 401/403 (404 and 422 are expected,
 * since the calls carry made-up ids and no body).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { describeEachDb, type Res, type TestApp } from '../helpers/app.js';
import { createApiKey, createUser } from '../helpers/factories.js';
import { api, errorBody } from '../helpers/api.js';
import { scopePermits, type Scope } from '../../src/http/scopes.js';
import { declaredRoutes, routeName } from '../../src/http/route-rules.js';

const METHODS = ['get', 'post', 'put', 'patch', 'delete'] as const;

interface Route {
  method: string;
  /** OpenAPI form, e.g. /ssh-keys/{key_id}. */
  path: string;
  /** With made-up values for the path parameters. */
  url: string;
  public: boolean;
  admin: boolean;
  stream: boolean;
}

/**
 * The parts of GET /openapi.json read here. That route is not an operation of the document itself (so not in
 * src/sdk/schema.ts), and the routes are enumerated at run time: the document is read through this local shape.
 */
interface DocParameter {
  in?: string;
  name?: string;
  schema?: { type?: string };
}
interface DocOperation {
  parameters?: DocParameter[];
  security?: unknown[];
  responses?: Record<string, { content?: Record<string, unknown> }>;
}
type DocPathItem = Partial<Record<(typeof METHODS)[number], DocOperation>> & { parameters?: DocParameter[] };
interface Doc {
  paths: Record<string, DocPathItem>;
  security?: unknown[];
}

/**
 * The error body of a call to a route enumerated at run time (so untyped): t().req has asserted that every error
 * answer has the ErrorBody shape.
 */

const under = (path: string, prefix: string) => path === prefix || path.startsWith(prefix + '/');

/** The API key scopes, restated. */
function expectedAllowed(scope: Scope, method: string, path: string): boolean {
  if (scope === 'read_write') return true;
  if (scope === 'read_only') {
    // GET /events and GET /images came after the first list of scopes: a read_only key may read them too
    // (docs/events.md, docs/images.md).
    return (
      method === 'GET' &&
      ['/vms', '/ssh-keys', '/reservations', '/billing', '/account', '/search', '/pricing', '/events', '/images'].some(
        (p) => under(path, p),
      )
    );
  }
  return (
    (method === 'GET' && (under(path, '/billing') || path === '/account')) ||
    (method === 'POST' && path === '/reservations/calculate')
  );
}

async function loadRoutes(t: TestApp): Promise<Route[]> {
  const doc = await t.req('GET', '/openapi.json');
  assert.equal(doc.status, 200);
  const body = doc.body as Doc;
  const routes: Route[] = [];
  for (const [path, item] of Object.entries(body.paths)) {
    for (const m of METHODS) {
      const op = item[m];
      if (!op) continue;
      const params: DocParameter[] = [...(item.parameters ?? []), ...(op.parameters ?? [])].filter(
        (p) => p.in === 'path',
      );
      const url = path.replace(/\{([^}]+)\}/g, (_all, name: string) => {
        const p = params.find((x) => x.name === name);
        const type = p?.schema?.type;
        return type === 'integer' || type === 'number' ? '2147483647' : randomUUID();
      });
      const security = op.security ?? body.security;
      // /metrics is for operators: an administrator (or the metrics token), like /admin.
      // A stream never ends by itself: such routes are called with a resume point that cannot exist (422 once allowed
      // in).
      const stream = 'text/event-stream' in (op.responses?.['200']?.content ?? {});
      routes.push({
        method: m.toUpperCase(),
        path,
        url,
        public: Array.isArray(security) && security.length === 0,
        admin: under(path, '/admin') || path === '/metrics',
        stream,
      });
    }
  }
  return routes;
}

const show = (r: Route, res: Res) => `${r.method} ${r.path} -> ${res.status} ${res.text.slice(0, 200)}`;

/** Routes that could lock the owner out: a signed-in session only, never an API key, whatever its scope. */
const SESSION_ONLY = [
  'POST /auth/2fa/setup',
  'POST /auth/2fa/enable',
  'POST /auth/2fa/disable',
  'POST /auth/logout-all',
  'POST /account/password',
];

describeEachDb('scope matrix', (t) => {
  let cached: Route[] | undefined;
  const routes = async () => (cached ??= await loadRoutes(t()));
  // From another machine: loopback clients may read /metrics without credentials.
  const call = (r: Route, token?: string) =>
    t().req(r.method, r.url, {
      ...(token ? { token } : {}),
      remoteAddress: '203.0.113.7',
      ...(r.stream ? { headers: { 'last-event-id': 'not-an-event-id' } } : {}),
    });

  test('the route list from /openapi.json covers the known routes', async () => {
    const all = await routes();
    const names = new Set(all.map((r) => `${r.method} ${r.path}`));
    for (const known of [
      'GET /account',
      'POST /api-keys',
      'GET /api-keys',
      'DELETE /api-keys/{key_id}',
      'POST /ssh-keys',
      'GET /ssh-keys',
      'GET /ssh-keys/{key_id}',
      'DELETE /ssh-keys/{key_id}',
      'POST /auth/login',
      'GET /admin/users',
    ]) {
      assert.ok(names.has(known), `${known} missing from the OpenAPI document`);
    }
    assert.ok(
      all.filter((r) => r.public).some((r) => r.path === '/auth/login'),
      'login is public',
    );
    assert.ok(all.filter((r) => !r.public).length >= 10);
  });

  test('without credentials every non-public route is 401; public ones are not', async () => {
    for (const r of await routes()) {
      const res = await call(r);
      if (r.public) {
        assert.ok(res.status !== 401 && res.status !== 403, `public ${show(r, res)}`);
      } else {
        assert.equal(res.status, 401, show(r, res));
        assert.equal(errorBody(res).code, 'unauthorized');
        const bad = await call(r, 'not-a-token');
        assert.equal(bad.status, 401, `bad token: ${show(r, bad)}`);
        const badKey = await call(r, 'gpc_' + 'x'.repeat(43));
        assert.equal(badKey.status, 401, `unknown key: ${show(r, badKey)}`);
      }
    }
  });

  test('read_only and billing_only keys (of an admin): 403 exactly where their scope does not allow', async () => {
    const admin = await createUser(t(), { admin: true });
    const keys: Record<'read_only' | 'billing_only', string> = {
      read_only: await createApiKey(t(), admin.token, 'read_only'),
      billing_only: await createApiKey(t(), admin.token, 'billing_only'),
    };
    let denied = 0;
    let allowed = 0;
    for (const r of await routes()) {
      if (r.public) continue;
      for (const scope of ['read_only', 'billing_only'] as const) {
        const res = await call(r, keys[scope]);
        if (expectedAllowed(scope, r.method, r.path)) {
          allowed++;
          assert.ok(res.status !== 403 && res.status !== 401, `${scope} should be allowed: ${show(r, res)}`);
        } else {
          denied++;
          assert.equal(res.status, 403, `${scope} should be refused: ${show(r, res)}`);
          assert.equal(errorBody(res).code, 'forbidden');
        }
      }
    }
    assert.ok(denied > 0 && allowed > 0, `denied ${denied}, allowed ${allowed}`);
  });

  test("admin routes: an admin's read_only and billing_only keys are 403; the admin's session and read_write key are not", async () => {
    const admin = await createUser(t(), { admin: true });
    const ro = await createApiKey(t(), admin.token, 'read_only');
    const bo = await createApiKey(t(), admin.token, 'billing_only');
    const rw = await createApiKey(t(), admin.token, 'read_write');
    const adminRoutes = (await routes()).filter((r) => r.admin);
    assert.ok(adminRoutes.length >= 4, 'admin routes are enumerated');
    for (const r of adminRoutes) {
      for (const token of [ro, bo]) {
        const res = await call(r, token);
        assert.equal(res.status, 403, show(r, res));
      }
      for (const token of [admin.token, rw]) {
        const res = await call(r, token);
        assert.ok(res.status !== 403 && res.status !== 401, show(r, res));
      }
    }
  });

  test('a JWT session and a read_write key are read_write: no non-admin route refuses them, but the session-only ones refuse every key', async () => {
    const u = await createUser(t());
    const rw = await createApiKey(t(), u.token, 'read_write');
    const sessionOnly = (r: { method: string; path: string }) => SESSION_ONLY.includes(`${r.method} ${r.path}`);
    const all = await routes();
    for (const key of SESSION_ONLY)
      assert.ok(
        all.some((r) => `${r.method} ${r.path}` === key),
        `${key} is served`,
      );
    for (const r of all) {
      if (r.public || r.admin) continue;
      if (sessionOnly(r)) {
        const res = await call(r, rw);
        assert.equal(res.status, 403, `read_write key: ${show(r, res)}`);
        assert.match(errorBody(res).detail, /needs a signed-in session/);
        if (r.path === '/auth/logout-all') continue; // would end the session the loop goes on with: below
      }
      for (const token of sessionOnly(r) ? [u.token] : [u.token, rw]) {
        const res = await call(r, token);
        assert.ok(
          res.status !== 403 && res.status !== 401,
          `${token === rw ? 'read_write key' : 'session'}: ${show(r, res)}`,
        );
      }
    }
    // The session is still good afterwards (nothing above logged it out) ...
    const c = api(t(), u.token);
    assert.equal((await c.get('/account')).status, 200);
    // ... until it ends every session, itself included; the key goes on working.
    assert.equal((await c.post('/auth/logout-all')).status, 204);
    assert.equal((await c.get('/account')).status, 401);
    assert.equal((await c.as(rw).get('/account')).status, 200);
  });

  test('admin routes are 403 for a non-admin, whatever the credential', async () => {
    const u = await createUser(t());
    const rw = await createApiKey(t(), u.token, 'read_write');
    for (const r of (await routes()).filter((x) => x.admin)) {
      for (const token of [u.token, rw]) {
        const res = await call(r, token);
        assert.equal(res.status, 403, show(r, res));
        assert.equal(errorBody(res).code, 'forbidden');
      }
    }
  });

  test('spot checks on concrete calls', async () => {
    const u = await createUser(t());
    const ro = await createApiKey(t(), u.token, 'read_only');
    const bo = await createApiKey(t(), u.token, 'billing_only');
    const c = api(t());
    // Sent without a body, as an API key would be refused before reading it (rawBody undefined: no body at all).
    const cases: [string, string, string, number, (token: string) => Promise<Res>][] = [
      [ro, 'GET', '/account', 200, (token) => c.get('/account', { token })],
      [bo, 'GET', '/account', 200, (token) => c.get('/account', { token })],
      [ro, 'GET', '/ssh-keys', 200, (token) => c.get('/ssh-keys', { token })],
      [bo, 'GET', '/ssh-keys', 403, (token) => c.get('/ssh-keys', { token })],
      [ro, 'GET', '/api-keys', 403, (token) => c.get('/api-keys', { token })],
      [bo, 'GET', '/api-keys', 403, (token) => c.get('/api-keys', { token })],
      [ro, 'POST', '/ssh-keys', 403, (token) => c.post('/ssh-keys', { token, rawBody: undefined })],
      [ro, 'POST', '/auth/2fa/setup', 403, (token) => c.post('/auth/2fa/setup', { token })],
      [bo, 'POST', '/auth/2fa/setup', 403, (token) => c.post('/auth/2fa/setup', { token })],
      [ro, 'POST', '/auth/logout', 403, (token) => c.post('/auth/logout', { token, rawBody: undefined })],
    ];
    for (const [token, method, url, status, call] of cases) {
      const res = await call(token);
      assert.equal(res.status, status, `${token === ro ? 'read_only' : 'billing_only'} ${method} ${url}: ${res.text}`);
    }
    // HEAD is a GET without a body (so it bypasses the helper's error-body check).
    for (const [token, url, status] of [
      [ro, '/ssh-keys', 200],
      [bo, '/ssh-keys', 403],
      [bo, '/account', 200],
      [ro, '/api-keys', 403],
    ] as const) {
      const res = await t().app.inject({ method: 'HEAD', url, headers: { authorization: `Bearer ${token}` } });
      assert.equal(res.statusCode, status, `HEAD ${url}`);
    }
  });
});

/**
 * The scope rules, case by case, against what the app's routes declare (`config.scopes`, with the route's
 * pattern, e.g. /vms/:vm_id). A HEAD route is the one Fastify makes from the GET route, with its config.
 * Paths no route serves are 404 whatever the credential: the table names them as not served.
 */
const SCOPE_CASES: [Scope, string, string, boolean][] = [
  ['read_only', 'GET', '/vms', true],
  ['read_only', 'GET', '/vms/:vm_id/access-info', true],
  ['read_only', 'HEAD', '/vms/:vm_id', true],
  ['read_only', 'POST', '/vms', false],
  ['read_only', 'POST', '/vms/:vm_id/start', false],
  ['read_only', 'DELETE', '/vms/:vm_id', false],
  ['read_only', 'GET', '/reservations', true],
  ['read_only', 'POST', '/reservations/calculate', false],
  ['read_only', 'DELETE', '/reservations/:reservation_id', false],
  ['read_only', 'GET', '/billing/usage', true],
  ['read_only', 'GET', '/search', true],
  ['read_only', 'GET', '/pricing', true],
  ['read_only', 'GET', '/events', true],
  ['billing_only', 'GET', '/events', false],
  ['read_only', 'GET', '/account', true],
  ['read_only', 'GET', '/account/sessions', true],
  ['read_only', 'PATCH', '/account', false],
  ['billing_only', 'GET', '/account/sessions', false],
  ['billing_only', 'PATCH', '/account', false],
  ['read_only', 'GET', '/api-keys', false],
  ['read_only', 'GET', '/admin/vms', false],
  ['read_only', 'GET', '/vmsx', false],
  ['read_only', 'GET', '/metrics', false],
  ['billing_only', 'GET', '/billing/balance', true],
  ['billing_only', 'GET', '/billing/transactions', true],
  ['billing_only', 'HEAD', '/billing/usage', true],
  ['billing_only', 'POST', '/billing/anything', false],
  ['billing_only', 'GET', '/billingx', false],
  ['billing_only', 'GET', '/account', true],
  ['billing_only', 'POST', '/reservations/calculate', true],
  ['billing_only', 'GET', '/reservations', false],
  ['billing_only', 'GET', '/vms', false],
  ['billing_only', 'GET', '/search', false],
  ['billing_only', 'GET', '/pricing', false],
  ['billing_only', 'GET', '/ssh-keys', false],
  ['billing_only', 'POST', '/api-keys', false],
  ['read_write', 'DELETE', '/vms/:vm_id', true],
  ['read_write', 'POST', '/admin/clock/advance', true],
];
/** Paths of the table no route serves (a request for one is 404 to every caller). */
const NOT_SERVED = new Set([
  'GET /vmsx',
  'GET /account/sessions',
  'PATCH /account',
  'POST /billing/anything',
  'GET /billingx',
]);
/** Routes of the table that are public: they take any caller, whatever a key's scope (so they declare none). */
const PUBLIC = new Set(['GET /search', 'GET /pricing']);

describeEachDb('declared scopes', (t) => {
  const routeFor = (method: string, url: string) =>
    declaredRoutes(t().app).find((r) => r.url === url && ([] as string[]).concat(r.method).includes(method));

  test('each route of the table declares the scopes the scope rules give it', () => {
    for (const [scope, method, path, want] of SCOPE_CASES) {
      const where = `${scope} ${method} ${path}`;
      if (method !== 'HEAD') assert.equal(expectedAllowed(scope, method, path), want, `test policy ${where}`);
      const route = routeFor(method, path);
      if (NOT_SERVED.has(`${method} ${path}`)) {
        assert.equal(route, undefined, `${method} ${path} is served now: give it a case of its own`);
        continue;
      }
      assert.ok(route, `${method} ${path} is not served`);
      assert.equal(route.config?.auth === 'public', PUBLIC.has(`${method} ${path}`), `public: ${where}`);
      if (route.config?.auth === 'public') continue;
      assert.equal(scopePermits(scope, route.config?.scopes), want, where);
    }
  });

  test('every route that takes credentials declares exactly the scopes the scope rules give it', () => {
    let checked = 0;
    for (const route of declaredRoutes(t().app)) {
      if (route.config?.auth === 'public') continue;
      for (const method of ([] as string[]).concat(route.method)) {
        for (const scope of ['read_only', 'billing_only'] as const) {
          assert.equal(
            scopePermits(scope, route.config?.scopes),
            expectedAllowed(scope, method === 'HEAD' ? 'GET' : method, route.url),
            `${scope} ${routeName(route)}`,
          );
          checked++;
        }
      }
    }
    assert.ok(checked > 100, `${checked} checks`);
  });
});
