/**
 * Cross-cutting HTTP rules: bodies and errors, lists, the OpenAPI document,
 * docs, health and metrics, versioning and the headers every answer carries
 * (X-Request-Id, Cache-Control).
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import Fastify, { type FastifyInstance, type InjectOptions } from 'fastify';
import { Type } from 'typebox';
import { assertNoSecrets, describeEachDb, JWT_SECRET, testConfig, type ReqOpts, type Res } from '../helpers/app.js';
import { createApiKey, createUser, tokensOf, type TestUser } from '../helpers/factories.js';
import { api, errorBody } from '../helpers/api.js';
import { DB_KINDS } from '../helpers/db.js';
import { ERROR_CODES, ERROR_STATUS, type ErrorCode } from '../../src/errors.js';
import { buildApp, createServices } from '../../src/app.js';
import { frameworkErrors, registerErrorHandler } from '../../src/http/error-handler.js';
import { validatorCompiler } from '../../src/http/validation.js';
import { MemoryRateLimitStore } from '../../src/http/rate-limit-store.js';
import { ClockService } from '../../src/modules/clock/service.js';
import { ManualClock } from '../../src/clock.js';
import { PgliteDb, PostgresDb, type Db } from '../../src/db/db.js';

/** Every error code is from the closed list, and its status is the one the list gives. */
function assertErrorShape(r: Res, where: string): void {
  if (r.status < 400) return;
  // What this function checks: the shape is not known yet.
  const body = r.body as { code?: unknown; detail?: unknown; errors?: unknown } | undefined;
  const code = body?.code as ErrorCode;
  assert.ok(ERROR_CODES.includes(code), `${where}: code ${String(code)} is not in the closed list of error codes`);
  // /readyz's 503 (not ready) is the one status outside the list; it carries `internal`.
  if (r.status === 503) assert.equal(code, 'internal', where);
  else assert.equal(r.status, ERROR_STATUS[code], `${where}: status ${r.status} does not match code ${code}`);
  assert.ok(typeof body?.detail === 'string' && body.detail.length > 0, `${where}: empty detail`);
  if (code === 'validation_error') {
    const errors: unknown = body?.errors;
    assert.ok(Array.isArray(errors) && errors.length > 0, `${where}: 422 without errors[]`);
    for (const e of errors as { field?: unknown; message?: unknown }[]) {
      assert.equal(typeof e.field, 'string');
      assert.equal(typeof e.message, 'string');
    }
  }
  assert.doesNotMatch(r.text, /\n\s+at /, `${where}: a stack trace leaked`);
}

/** A raw inject with the same checks as t.req (for remote addresses, odd content types, missing headers). */
async function raw(app: FastifyInstance, o: InjectOptions): Promise<Res> {
  const res = await app.inject(o);
  const where = `${o.method ?? 'GET'} ${String(o.url)}`;
  assertNoSecrets(res.body, [], where);
  let body: unknown;
  if (res.body && String(res.headers['content-type'] ?? '').includes('json')) body = JSON.parse(res.body);
  const r: Res = { status: res.statusCode, body, headers: res.headers, text: res.body };
  assert.ok(res.headers['x-request-id'], `${where}: no X-Request-Id`);
  assert.equal(res.headers['api-version'], '1.0.0', `${where}: no API-Version`);
  if (r.status >= 400) {
    assert.equal(
      typeof (body as { detail?: unknown } | undefined)?.detail,
      'string',
      `${where}: error without detail: ${res.body}`,
    );
    assertErrorShape(r, where);
  }
  return r;
}

/** All (method, path) pairs the app serves, from printRoutes (paths in Fastify syntax). */
function appRoutes(app: FastifyInstance): { method: string; path: string }[] {
  const out: { method: string; path: string }[] = [];
  const stack: string[] = [];
  for (const line of app.printRoutes({ commonPrefix: false }).split('\n')) {
    const m = /^((?:[│ ] {3})*)[├└]── (.*?)(?: \(([A-Z, ]+)\))?$/.exec(line);
    if (!m) continue;
    const depth = m[1]!.length / 4;
    stack.length = depth;
    stack.push(m[2]!);
    const path = stack.join('');
    for (const method of (m[3] ?? '')
      .split(',')
      .map((s) => s.trim())
      .filter(Boolean))
      out.push({ method, path });
  }
  return out;
}

/**
 * The body of an error answer of `raw` or `req` (routes outside the OpenAPI document, or calls the typed client cannot
 * express): both ran assertErrorShape on it, so it has the ErrorBody shape.
 */

/**
 * The parts of GET /openapi.json read here: that route is not an operation of the document itself (so not in
 * src/sdk/schema.ts), and the tests walk it generically.
 */
interface DocSchema {
  $ref?: string;
  additionalProperties?: unknown;
  minimum?: number;
  maximum?: number;
  default?: unknown;
  required?: string[];
  properties?: Record<string, unknown>;
  type?: string;
}
interface DocContent {
  schema?: DocSchema;
}
interface DocResponse {
  $ref?: string;
  description?: string;
  content?: Record<string, DocContent>;
}
interface DocParam {
  in: string;
  name: string;
  schema?: DocSchema;
}
interface DocOp {
  summary?: string;
  description?: string;
  responses?: Record<string, DocResponse>;
  security?: unknown[];
  parameters?: DocParam[];
  requestBody?: { content?: Record<string, DocContent> };
}
interface OpenApiDoc {
  openapi: string;
  info: { version: string; title: unknown; description?: string };
  paths: Record<string, Record<string, DocOp>>;
  components: {
    responses: Record<string, DocResponse>;
    schemas?: Record<string, DocSchema>;
    securitySchemes?: Record<string, unknown>;
  };
}

const toOpenApiPath = (p: string) => p.replace(/:(\w+)/g, '{$1}');

/** Resolves a local JSON pointer such as `#/components/schemas/ErrorResponse`. */
function resolvePointer(doc: unknown, ref: string): unknown {
  assert.ok(ref.startsWith('#/'), `non-local $ref ${ref}`);
  let cur: unknown = doc;
  for (const raw of ref.slice(2).split('/')) {
    const key = decodeURIComponent(raw).replace(/~1/g, '/').replace(/~0/g, '~');
    if (cur === null || typeof cur !== 'object' || !(key in (cur as object))) return undefined;
    cur = (cur as Record<string, unknown>)[key];
  }
  return cur;
}

function collectRefs(node: unknown, out: string[] = []): string[] {
  if (Array.isArray(node)) for (const n of node) collectRefs(n, out);
  else if (node && typeof node === 'object') {
    for (const [k, v] of Object.entries(node)) {
      if (k === '$ref' && typeof v === 'string') out.push(v);
      else collectRefs(v, out);
    }
  }
  return out;
}

const BODY_METHODS = ['post', 'put', 'patch'];

describeEachDb('HTTP rules', (t) => {
  let user: TestUser;
  let admin: TestUser;

  /** t().req plus the closed-list check of error codes. */
  async function req(method: string, url: string, opts?: ReqOpts): Promise<Res> {
    const r = await t().req(method, url, opts);
    assertErrorShape(r, `${method} ${url}`);
    return r;
  }

  /** The typed client (helpers/api.ts) with `token`. */
  const as = (token?: string) => api(t(), token);
  /** A typed answer, with the closed-list check of error codes `req` makes. */
  async function chk<R extends Res>(p: Promise<R>): Promise<R> {
    const r = await p;
    assertErrorShape(r, `typed call answered ${r.status}`);
    return r;
  }

  before(async () => {
    user = await createUser(t());
    admin = await createUser(t(), { admin: true });
  });

  describe('input no handler can take (found by an outside audit)', () => {
    test('an offset beyond what the database can count is 422, not a 500', async () => {
      for (const offset of ['9223372036854775808', '18446744073709551616', '100000000000000000000']) {
        const r = await chk(as(admin.token).get('/admin/users', { rawQuery: { offset } }));
        assert.equal(r.status, 422, `${offset}: ${r.text}`);
        assert.equal(r.body.errors?.[0]?.field, 'query.offset');
      }
      const max = await chk(as(admin.token).get('/admin/users', { query: { offset: Number.MAX_SAFE_INTEGER } }));
      assert.equal(max.status, 200, max.text);
      assert.deepEqual(max.body, []);
    });

    test('a NUL character in a body, query or path is 422 naming the field, and changes nothing', async () => {
      const key = await chk(as(user.token).post('/api-keys', { body: { name: 'a\u0000b', scope: 'read_only' } }));
      assert.equal(key.status, 422, key.text);
      assert.equal(key.body.errors?.[0]?.field, 'body.name');
      const list = await chk(as(user.token).get('/api-keys'));
      assert.equal(list.status, 200, list.text);
      assert.deepEqual(
        list.body.filter((k) => k.name.startsWith('a')),
        [],
      );
      const label = await chk(
        as(user.token).post('/ssh-keys', { rawBody: { ssh_public_key: 'ssh-ed25519 AAAA\u0000', name: 'x' } }),
      );
      assert.equal(label.status, 422, label.text);
      const credit = await chk(
        as(admin.token).post('/admin/users/{user_id}/credits', {
          params: { user_id: user.id },
          body: { amount: 1, description: 'gift\u0000' },
        }),
      );
      assert.equal(credit.status, 422, credit.text);
      assert.equal(credit.body.errors?.[0]?.field, 'body.description');
      const query = await chk(as(admin.token).get('/admin/vms', { query: { node: 'n\u0000' } }));
      assert.equal(query.status, 422, query.text);
      assert.equal(query.body.errors?.[0]?.field, 'query.node');
      // 'n\u0000de' goes on the wire as /admin/nodes/n%00de.
      const path = await chk(as(admin.token).get('/admin/nodes/{node}', { params: { node: 'n\u0000de' } }));
      assert.equal(path.status, 422, path.text);
      assert.equal(path.body.errors?.[0]?.field, 'path.node');
      const keyName = await chk(
        as().post('/auth/login', { rawBody: { email: 'a@b.c', password: 'x', ['p\u0000']: 1 } }),
      );
      assert.equal(keyName.status, 422, keyName.text);
    });

    test('a body nested 10,000 deep (with an Idempotency-Key) is 422, not a stack overflow', async () => {
      const deep = '{"a":'.repeat(10_000) + '1' + '}'.repeat(10_000);
      const r = await chk(
        as(user.token).post('/api-keys', { rawBody: deep, headers: { 'idempotency-key': 'deep-body-1' } }),
      );
      assert.equal(r.status, 422, r.text.slice(0, 300));
      assert.match(r.body.detail, /deeper than 32 levels/);
      const arrays = await chk(
        as(user.token).post('/vms', {
          rawBody: '['.repeat(20_000) + ']'.repeat(20_000),
          headers: { 'idempotency-key': 'deep-body-2' },
        }),
      );
      assert.equal(arrays.status, 422, arrays.text.slice(0, 300));
      // The deepest real body still passes the guard.
      const ok = await chk(
        as(user.token).post('/api-keys', {
          body: { name: 'shallow', scope: 'read_only' },
          headers: { 'idempotency-key': 'shallow-1' },
        }),
      );
      assert.equal(ok.status, 201, ok.text);
    });
  });

  describe('bodies', () => {
    test('an unknown body field is 422 naming the field', async () => {
      const r = await chk(
        as().post('/auth/register', {
          rawBody: { email: 'unknown-field@example.com', password: 'a-long-password-1', nickname: 'x' },
        }),
      );
      assert.equal(r.status, 422);
      assert.equal(r.body.code, 'validation_error');
      assert.deepEqual(
        r.body.errors?.map((e) => e.field),
        ['body.nickname'],
      );
      // nothing was created
      const login = await chk(
        as().post('/auth/login', {
          body: { email: 'unknown-field@example.com', password: 'a-long-password-1' },
        }),
      );
      assert.equal(login.status, 401);

      const k = await chk(as(user.token).post('/api-keys', { rawBody: { name: 'k', colour: 'blue' } }));
      assert.equal(k.status, 422);
      assert.ok(
        k.body.errors?.some((e) => e.field === 'body.colour'),
        k.text,
      );
    });

    test('every invalid field is listed, with the part of the request it is in', async () => {
      const r = await chk(as().post('/auth/register', { body: { email: 'not-an-email', password: 'short' } }));
      assert.equal(r.status, 422);
      const fields = r.body.errors?.map((e) => e.field).sort();
      assert.deepEqual(fields, ['body.email', 'body.password']);
      const missing = await chk(as().post('/auth/register', { rawBody: { password: 'a-long-password-1' } }));
      assert.equal(missing.status, 422);
      assert.deepEqual(missing.body.errors, [{ field: 'body.email', message: 'is required' }]);
    });

    test('no type coercion in bodies: a number as a string is 422', async () => {
      const r = await chk(
        as(admin.token).patch('/admin/users/{user_id}', { params: { user_id: user.id }, rawBody: { max_vms: '20' } }),
      );
      assert.equal(r.status, 422);
      assert.equal(r.body.errors?.[0]?.field, 'body.max_vms');
      const b = await chk(
        as(admin.token).patch('/admin/users/{user_id}', {
          params: { user_id: user.id },
          rawBody: { suspended: 'true' },
        }),
      );
      assert.equal(b.status, 422);
    });

    test('malformed JSON is 400 malformed_json', async () => {
      for (const body of ['{"email":', '{"email": "a@b.c",}', '{"a":1} trailing', "{'single': 'quotes'}", 'nul']) {
        const r = await chk(
          as().post('/auth/register', { rawBody: body, headers: { 'content-type': 'application/json' } }),
        );
        assert.equal(r.status, 400, `${body}: ${r.text}`);
        assert.equal(r.body.code, 'malformed_json');
        assert.match(r.body.detail, /JSON/);
      }
    });

    test('a JSON body with __proto__ is refused, not merged', async () => {
      const r = await chk(
        as(user.token).post('/api-keys', { rawBody: '{"name":"p","__proto__":{"scope":"read_write"}}' }),
      );
      assert.equal(r.status, 400, r.text);
      assert.equal(r.body.code, 'malformed_json');
      const c = await chk(
        as(user.token).post('/api-keys', { rawBody: '{"name":"p","constructor":{"prototype":{"x":1}}}' }),
      );
      assert.equal(c.status, 400, c.text);
    });

    test('a JSON body that is not an object is 422', async () => {
      for (const body of ['[]', 'null', '"text"', '42', 'true']) {
        const r = await chk(
          as().post('/auth/register', { rawBody: body, headers: { 'content-type': 'application/json' } }),
        );
        assert.equal(r.status, 422, `${body}: ${r.text}`);
        assert.equal(r.body.errors?.[0]?.field, 'body');
      }
    });

    test('an empty body with Content-Type: application/json on a POST that needs a body is 422', async () => {
      for (const url of ['/auth/register', '/auth/login', '/auth/refresh'] as const) {
        const r = await chk(as().post(url, { rawBody: '', headers: { 'content-type': 'application/json' } }));
        assert.equal(r.status, 422, `${url}: ${r.text}`);
        assert.equal(r.body.code, 'validation_error');
        assert.equal(r.body.errors?.[0]?.field, 'body');
      }
      const k = await chk(
        as(user.token).post('/api-keys', { rawBody: '  ', headers: { 'content-type': 'application/json' } }),
      );
      assert.equal(k.status, 422, k.text);
      // no body and no Content-Type at all
      const none = await raw(t().app, { method: 'POST', url: '/auth/login' });
      assert.equal(none.status, 422, none.text);
      assert.equal(errorBody(none).errors?.[0]?.field, 'body');
    });

    test('a body of exactly 64 KiB is read; one byte more is 413', async () => {
      const make = (size: number) => {
        const head = '{"name":"';
        const tail = '"}';
        return head + 'n'.repeat(size - head.length - tail.length) + tail;
      };
      const fits = make(64 * 1024);
      assert.equal(Buffer.byteLength(fits), 65536);
      const ok = await chk(as(user.token).post('/api-keys', { rawBody: fits }));
      assert.equal(ok.status, 422, 'read and validated (name too long), not refused for its size');
      assert.equal(ok.body.errors?.[0]?.field, 'body.name');
      const big = await chk(as(user.token).post('/api-keys', { rawBody: make(64 * 1024 + 1) }));
      assert.equal(big.status, 413);
      assert.equal(big.body.code, 'payload_too_large');
      const huge = await chk(as().post('/auth/register', { rawBody: 'x'.repeat(1024 * 1024) }));
      assert.equal(huge.status, 413);
    });

    test('a body in another media type is 415 unsupported_media_type', async () => {
      const cases: [string, string][] = [
        ['text/plain', '{"email":"a@b.c","password":"a-long-password-1"}'],
        ['application/xml', '<user><email>a@b.c</email></user>'],
        ['application/x-www-form-urlencoded', 'email=a%40b.c&password=a-long-password-1'],
        [
          'multipart/form-data; boundary=x',
          '--x\r\nContent-Disposition: form-data; name="email"\r\n\r\na@b.c\r\n--x--',
        ],
        ['application/octet-stream', 'AAAA'],
      ];
      for (const [type, body] of cases) {
        const r = await chk(as().post('/auth/register', { rawBody: body, headers: { 'content-type': type } }));
        assert.equal(r.status, 415, `${type}: ${r.text}`);
        assert.equal(r.body.code, 'unsupported_media_type');
      }
      // A body without any Content-Type
      const none = await raw(t().app, {
        method: 'POST',
        url: '/auth/login',
        payload: Buffer.from('{"email":"a@b.c","password":"x"}'),
      });
      assert.equal(none.status, 415, none.text);
    });

    test('application/json with parameters or in another case is accepted', async () => {
      const r = await chk(
        as(user.token).post('/api-keys', {
          body: { name: 'charset' },
          headers: { 'content-type': 'application/json; charset=utf-8' },
        }),
      );
      assert.equal(r.status, 201, r.text);
      t().forbidSecret(r.body.key);
      const r2 = await chk(
        as(user.token).post('/api-keys', {
          body: { name: 'upper' },
          headers: { 'content-type': 'Application/JSON' },
        }),
      );
      assert.equal(r2.status, 201, r2.text);
      t().forbidSecret(r2.body.key);
    });
  });

  describe('errors and routing', () => {
    test('an unknown route is 404 not_found', async () => {
      for (const [method, url] of [
        ['GET', '/nope'],
        ['GET', '/vmsx'],
        ['POST', '/account'],
        ['DELETE', '/healthz'],
        ['GET', '/auth/login'],
        ['PUT', '/api-keys'],
      ] as const) {
        // Routes the document does not have: untyped.
        const r = await req(method, url, { token: user.token });
        assert.equal(r.status, 404, `${method} ${url}: ${r.text}`);
        assert.equal(errorBody(r).code, 'not_found');
        assert.ok(errorBody(r).detail.includes(url), errorBody(r).detail);
      }
    });

    test('an undecodable URL is 404 not_found with the standard headers (needs frameworkErrors in app.ts)', async () => {
      for (const url of ['/%zz', '/api-keys/%E0%A4%A', '/admin/users/%']) {
        const r = await raw(t().app, {
          method: 'GET',
          url,
          headers: { authorization: `Bearer ${user.token}`, 'x-request-id': 'bad-url-1' },
        });
        assert.equal(r.status, 404, `${url}: ${r.status} ${r.text}`);
        assert.equal(errorBody(r).code, 'not_found');
        assert.equal(r.headers['x-request-id'], 'bad-url-1');
      }
    });

    test('a trailing slash is the same route', async () => {
      const r = await req('GET', '/healthz/');
      assert.equal(r.status, 200);
      const a = await req('GET', '/account/', { token: user.token });
      assert.equal(a.status, 200);
      // '/account/' (with the slash) is not a path of the document: untyped, read through a local shape.
      assert.equal((a.body as { id?: unknown }).id, user.id);
    });

    test('missing or bad credentials are 401 unauthorized with a detail', async () => {
      const none = await chk(as().get('/account'));
      assert.equal(none.status, 401);
      assert.equal(none.body.code, 'unauthorized');
      for (const authorization of [
        'Bearer nonsense',
        'Basic dXNlcjpwYXNz',
        'Bearer',
        `Bearer ${user.token}x`,
        'Bearer gpc_notakey',
      ]) {
        const r = await chk(as().get('/account', { headers: { authorization } }));
        assert.equal(r.status, 401, authorization);
        assert.equal(r.body.code, 'unauthorized');
      }
    });

    test('a path parameter of the wrong type is 422 naming it', async () => {
      // A user_id that is not a number: the typed client cannot send it.
      const r = await req('GET', '/admin/users/abc', { token: admin.token });
      assert.equal(r.status, 422);
      assert.equal(errorBody(r).errors?.[0]?.field, 'path.user_id');
    });
  });

  describe('headers', () => {
    test('X-Request-Id is echoed when sent, on success and on error', async () => {
      const a = await chk(as().get('/healthz', { headers: { 'x-request-id': 'client-req-42' } }));
      assert.equal(a.headers['x-request-id'], 'client-req-42');
      const b = await chk(as().get('/account', { headers: { 'x-request-id': 'client-req-43' } }));
      assert.equal(b.status, 401);
      assert.equal(b.headers['x-request-id'], 'client-req-43');
      const c = await chk(
        as().post('/auth/register', {
          rawBody: '{',
          headers: { 'x-request-id': 'client:req.44', 'content-type': 'application/json' },
        }),
      );
      assert.equal(c.status, 400);
      assert.equal(c.headers['x-request-id'], 'client:req.44');
      const d = await req('GET', '/no-such-route', { headers: { 'x-request-id': 'client-req-45' } });
      assert.equal(d.headers['x-request-id'], 'client-req-45');
    });

    test('X-Request-Id is generated when absent, unique per request, and replaced when unusable', async () => {
      const ids = new Set<string>();
      for (let i = 0; i < 5; i++) {
        const r = await chk(as().get('/healthz'));
        const id = String(r.headers['x-request-id']);
        assert.ok(id.length >= 8, id);
        ids.add(id);
      }
      assert.equal(ids.size, 5);
      for (const bad of ['has space', 'x'.repeat(300), 'semi;colon', '<script>']) {
        const r = await chk(as().get('/healthz', { headers: { 'x-request-id': bad } }));
        assert.notEqual(r.headers['x-request-id'], bad);
        assert.match(String(r.headers['x-request-id']), /^[\w.:-]{8,128}$/);
      }
    });

    test('API-Version: 1.0.0 on every kind of response', async () => {
      // t().req asserts the header on every response; these cover the unusual ones.
      // /openapi.json, /docs and /nope are not operations of the document: untyped.
      const responses: Res[] = [
        await req('GET', '/openapi.json'),
        await chk(as().get('/metrics')),
        await req('GET', '/docs'),
        await req('GET', '/nope'),
        await chk(as().post('/auth/login', { rawBody: 'x', headers: { 'content-type': 'text/plain' } })),
        await chk(as().post('/auth/login', { rawBody: 'x'.repeat(70_000) })),
        await chk(as(user.token).get('/admin/users')),
      ];
      for (const r of responses) assert.equal(r.headers['api-version'], '1.0.0');
    });

    test('Cache-Control: no-store on /auth, /account and /admin, successes and errors alike', async () => {
      const login = await chk(as().post('/auth/login', { body: { email: user.email, password: user.password } }));
      const cases: Res[] = [
        login,
        await chk(as().post('/auth/login', { body: { email: user.email, password: 'wrong-password-x' } })),
        await chk(as().post('/auth/register', { rawBody: { email: 'x' } })),
        await chk(as().post('/auth/refresh', { body: { refresh_token: 'nope' } })),
        await chk(as(user.token).get('/account')),
        await chk(as().get('/account')),
        await chk(as(user.token).get('/api-keys')),
        await chk(as(admin.token).get('/admin/users')),
        await chk(as(user.token).get('/admin/users')),
        await chk(as(admin.token).get('/admin/users/{user_id}', { params: { user_id: user.id } })),
        await chk(as(admin.token).get('/admin/clock')),
        // A path no route serves is answered no-store, whatever it looks like (untyped).
        await req('GET', '/auth/no-such-route'),
        await req('GET', '/billing/no-such-route?x=1', { token: user.token }),
      ];
      for (const r of cases) assert.equal(r.headers['cache-control'], 'no-store', `${r.status} ${r.text.slice(0, 80)}`);
      assert.equal(login.status, 200);
      t().forbidSecret(tokensOf(login.body).refresh_token);
    });
  });

  describe('lists', () => {
    before(async () => {
      // Three keys, a second apart, so that "newest first" is well defined.
      for (const name of ['first', 'second', 'third']) {
        const r = await chk(as(admin.token).post('/api-keys', { body: { name } }));
        assert.equal(r.status, 201);
        t().forbidSecret(r.body.key);
        await t().services.clock.advance(1);
      }
    });

    test('limit and offset page through a bare array, newest first, with X-Total-Count', async () => {
      const c = as(admin.token);
      const all = await chk(c.get('/api-keys'));
      assert.equal(all.status, 200);
      assert.ok(Array.isArray(all.body));
      assert.deepEqual(
        all.body.map((k) => k.name),
        ['third', 'second', 'first'],
      );
      assert.equal(all.headers['x-total-count'], '3');

      const p1 = await chk(c.get('/api-keys', { query: { limit: 2 } }));
      // Not checked before the conversion to the typed client; needed to read the body, and it holds.
      assert.equal(p1.status, 200, p1.text);
      assert.deepEqual(
        p1.body.map((k) => k.name),
        ['third', 'second'],
      );
      assert.equal(p1.headers['x-total-count'], '3');
      const p2 = await chk(c.get('/api-keys', { query: { limit: 2, offset: 2 } }));
      assert.equal(p2.status, 200, p2.text);
      assert.deepEqual(
        p2.body.map((k) => k.name),
        ['first'],
      );
      assert.equal(p2.headers['x-total-count'], '3');
      const past = await chk(c.get('/api-keys', { query: { offset: 10 } }));
      assert.deepEqual(past.body, []);
      assert.equal(past.headers['x-total-count'], '3');
      for (const limit of [1, 100]) {
        const r = await chk(c.get('/api-keys', { query: { limit } }));
        assert.equal(r.status, 200);
        assert.equal(r.body.length, Math.min(limit, 3));
      }
    });

    test('out-of-range or non-integer limit and offset are 422 naming the parameter', async () => {
      for (const url of ['/api-keys', '/admin/users']) {
        // '1e1', '0x10', '+5' and ' 5' are numbers to JavaScript, not integers in a URL
        for (const limit of ['0', '101', 'abc', '1.5', '-1', '', '1e3', '1e1', '0x10', '+5', ' 5', '5 ']) {
          // Query strings spelled out by hand (odd spacing, repeated names): untyped.
          const r = await req('GET', `${url}?limit=${encodeURIComponent(limit)}`, { token: admin.token });
          assert.equal(r.status, 422, `${url} limit=${limit}: ${r.text}`);
          assert.ok(
            errorBody(r).errors?.some((e) => e.field === 'query.limit'),
            r.text,
          );
        }
        for (const offset of ['-1', 'x', '0.5', '1e2', '0b1']) {
          const r = await req('GET', `${url}?offset=${offset}`, { token: admin.token });
          assert.equal(r.status, 422, `${url} offset=${offset}: ${r.text}`);
          assert.ok(
            errorBody(r).errors?.some((e) => e.field === 'query.offset'),
            r.text,
          );
        }
        const twice = await req('GET', `${url}?limit=1&limit=2`, { token: admin.token });
        assert.equal(twice.status, 422, twice.text);
      }
    });
  });

  describe('OpenAPI document and docs', () => {
    let doc: OpenApiDoc;
    before(async () => {
      const r = await req('GET', '/openapi.json');
      assert.equal(r.status, 200);
      assert.match(String(r.headers['content-type']), /application\/json/);
      doc = r.body as OpenApiDoc;
    });

    test('is OpenAPI 3.1.0 with info.version 1.0.0', () => {
      assert.equal(doc.openapi, '3.1.0');
      assert.equal(doc.info.version, '1.0.0');
      assert.equal(typeof doc.info.title, 'string');
      assert.ok((doc.info.description?.length ?? 0) > 100, 'describes authentication, errors, lists and limits');
    });

    test('every route the app serves is documented with a summary or description', () => {
      const routes = appRoutes(t().app).filter(
        // Not API operations: the document itself, the docs UI, and the web console's pages and files.
        (r) =>
          r.method !== 'HEAD' &&
          r.method !== 'OPTIONS' &&
          r.path !== '/openapi.json' &&
          !r.path.startsWith('/docs') &&
          r.path !== '/' &&
          !r.path.startsWith('/console') &&
          // The host agents' own channel (image downloads), described in docs/agent.md.
          !r.path.startsWith('/agent/'),
      );
      assert.ok(routes.length >= 15, `found only ${routes.length} routes`);
      const missing: string[] = [];
      for (const { method, path } of routes) {
        const op = doc.paths?.[toOpenApiPath(path)]?.[method.toLowerCase()];
        if (!op) missing.push(`${method} ${path}`);
        else
          assert.ok((op.summary ?? op.description ?? '').length > 0, `${method} ${path} has no summary or description`);
      }
      assert.deepEqual(missing, [], 'routes missing from /openapi.json');
      assert.ok(!doc.paths['/openapi.json'], '/openapi.json itself is hidden');
      assert.ok(!Object.keys(doc.paths).some((p: string) => p.startsWith('/docs')), '/docs is hidden');
    });

    test('every documented operation exists in the app', async () => {
      for (const [path, item] of Object.entries(doc.paths)) {
        for (const method of Object.keys(item).filter((m) => ['get', 'post', 'put', 'patch', 'delete'].includes(m))) {
          assert.ok(
            t().app.hasRoute({ method: method.toUpperCase() as 'GET', url: path.replace(/\{(\w+)\}/g, ':$1') }),
            `${method} ${path}`,
          );
        }
      }
    });

    test('operations document their responses, and errors use ErrorResponse', () => {
      for (const [path, item] of Object.entries(doc.paths)) {
        for (const [method, op] of Object.entries(item)) {
          if (!['get', 'post', 'put', 'patch', 'delete'].includes(method)) continue;
          const where = `${method.toUpperCase()} ${path}`;
          const statuses = Object.keys(op.responses ?? {});
          assert.ok(
            statuses.some((s) => /^2\d\d$/.test(s)),
            `${where}: no 2xx response`,
          );
          for (const s of statuses) {
            // Error responses are shared: `{$ref: '#/components/responses/NAME'}`.
            const ref: string | undefined = op.responses?.[s]?.$ref;
            const r = ref ? doc.components.responses[ref.replace('#/components/responses/', '')] : op.responses?.[s];
            assert.ok(r?.description, `${where} ${s}: no description`);
            if (Number(s) >= 400) {
              assert.equal(
                r.content?.['application/json']?.schema?.$ref,
                '#/components/schemas/ErrorResponse',
                `${where} ${s}`,
              );
            }
          }
          const isPublic = Array.isArray(op.security) && op.security.length === 0;
          if (!isPublic && path !== '/metrics')
            assert.ok(statuses.includes('401'), `${where}: needs credentials but 401 is not documented`);
          if (path.startsWith('/admin'))
            assert.ok(statuses.includes('403'), `${where}: admin-only but 403 is not documented`);
          if (!['/healthz', '/readyz', '/metrics'].includes(path))
            assert.ok(statuses.includes('429'), `${where}: rate limited but 429 is not documented`);
          const takesInput =
            op.requestBody ||
            (op.parameters ?? []).some((p) => p.in === 'query' || (p.in === 'path' && p.schema?.type === 'integer'));
          if (takesInput) assert.ok(statuses.includes('422'), `${where}: validates input but 422 is not documented`);
          if (op.requestBody) {
            const schema = op.requestBody.content?.['application/json']?.schema;
            assert.ok(schema, `${where}: request body without an application/json schema`);
          }
        }
      }
    });

    test('request bodies are documented for the operations that take one', () => {
      const withBody = [
        ['post', '/auth/register'],
        ['post', '/auth/login'],
        ['post', '/auth/refresh'],
        ['post', '/auth/logout'],
        ['post', '/api-keys'],
        ['patch', '/admin/users/{user_id}'],
        ['post', '/admin/clock/advance'],
      ];
      for (const [method, path] of withBody) {
        const op = doc.paths[path!]?.[method!];
        assert.ok(op, `${method} ${path} missing`);
        const schema = op.requestBody?.content?.['application/json']?.schema;
        assert.ok(schema, `${method} ${path}: no request body`);
        assert.equal(
          schema.additionalProperties,
          false,
          `${method} ${path}: unknown fields are rejected and the doc should say so`,
        );
      }
      for (const [path, item] of Object.entries(doc.paths)) {
        for (const m of BODY_METHODS) {
          const op = item[m];
          if (op?.requestBody) assert.ok(op.requestBody.content?.['application/json'], `${m} ${path}`);
        }
      }
    });

    test('list operations document limit and offset', () => {
      for (const path of ['/api-keys', '/admin/users']) {
        const params = (doc.paths[path]?.get?.parameters ?? []).filter((p) => p.in === 'query');
        const byName = Object.fromEntries(params.map((p) => [p.name, p.schema]));
        assert.deepEqual(
          { min: byName.limit?.minimum, max: byName.limit?.maximum, def: byName.limit?.default },
          { min: 1, max: 100, def: 50 },
          path,
        );
        assert.equal(byName.offset?.minimum, 0, path);
      }
    });

    test('the ErrorResponse component is present and every $ref resolves', () => {
      const er = doc.components?.schemas?.ErrorResponse;
      assert.ok(er, 'components.schemas.ErrorResponse');
      assert.deepEqual([...(er.required ?? [])].sort(), ['code', 'detail']);
      assert.ok(er.properties?.errors, 'documents errors[]');
      const refs = collectRefs(doc);
      assert.ok(refs.length > 0);
      for (const ref of refs) assert.ok(resolvePointer(doc, ref) !== undefined, `unresolvable $ref ${ref}`);
      assert.ok(doc.components.securitySchemes?.bearer, 'bearer security scheme');
    });

    test('the security a document declares matches what the API enforces', async () => {
      for (const [path, item] of Object.entries(doc.paths)) {
        for (const [method, op] of Object.entries(item)) {
          if (!['get', 'post', 'put', 'patch', 'delete'].includes(method)) continue;
          const url = path.replace(/\{(\w+)\}/g, '1');
          // From another machine: /metrics lets loopback clients in without credentials.
          const r =
            path === '/metrics'
              ? await raw(t().app, { method: 'GET', url, remoteAddress: '203.0.113.9' })
              : await req(method.toUpperCase(), url);
          const isPublic = Array.isArray(op.security) && op.security.length === 0;
          if (isPublic) assert.notEqual(r.status, 401, `${method} ${path} is documented public but wants credentials`);
          else
            assert.equal(
              r.status,
              401,
              `${method} ${path} is documented as authenticated but answered ${r.status} without credentials`,
            );
        }
      }
    });

    test('GET /docs serves the interactive HTML documentation', async () => {
      let r = await req('GET', '/docs');
      if (r.status >= 300 && r.status < 400) r = await req('GET', String(r.headers.location));
      assert.equal(r.status, 200);
      assert.match(String(r.headers['content-type']), /text\/html/);
      assert.match(r.text, /<html/i);
    });
  });

  describe('health and metrics', () => {
    test('/healthz and /readyz answer 200 without credentials', async () => {
      const h = await chk(as().get('/healthz'));
      assert.equal(h.status, 200);
      assert.deepEqual(h.body, { status: 'ok' });
      const r = await chk(as().get('/readyz'));
      assert.equal(r.status, 200);
      assert.deepEqual(r.body, { status: 'ready' });
      assert.equal(h.headers['x-ratelimit-limit'], undefined, 'health checks are not rate limited');
    });

    test('/metrics is Prometheus text with gpucloud_http_requests_total per route and status', async () => {
      const count = (text: string) => {
        const m = /^gpucloud_http_requests_total\{([^}]*)\} (\d+)$/m;
        const line = text
          .split('\n')
          .find(
            (l) =>
              m.test(l) && l.includes('method="GET"') && l.includes('route="/healthz"') && l.includes('status="200"'),
          );
        return line ? Number(m.exec(line)![2]) : 0;
      };
      await chk(as().get('/healthz'));
      const m1 = await chk(as().get('/metrics'));
      assert.equal(m1.status, 200);
      assert.match(String(m1.headers['content-type']), /^text\/plain/);
      assert.match(m1.text, /^# HELP gpucloud_http_requests_total /m);
      assert.match(m1.text, /^# TYPE gpucloud_http_requests_total counter$/m);
      assert.match(m1.text, /^# TYPE gpucloud_http_request_duration_seconds histogram$/m);
      const before = count(m1.text);
      assert.ok(before >= 1);
      await chk(as().get('/healthz'));
      await chk(as().get('/healthz'));
      const m2 = await chk(as().get('/metrics'));
      assert.equal(count(m2.text), before + 2);
      // The latency histogram: cumulative buckets ending in +Inf, which equals the count.
      const series = 'method="GET",route="/healthz"';
      const value = (line: string) => {
        const found = m2.text.split('\n').find((l) => l.startsWith(`${line} `));
        assert.ok(found, `${line} is in /metrics`);
        return Number(found.slice(line.length + 1));
      };
      const name = 'gpucloud_http_request_duration_seconds';
      const total = value(`${name}_count{${series}}`);
      assert.ok(total >= 3, `three GET /healthz at least, counted ${total}`);
      assert.equal(value(`${name}_bucket{le="+Inf",${series}}`), total);
      const buckets = ['0.005', '0.01', '0.025', '0.05', '0.1', '0.25', '0.5', '1', '2.5', '5'].map((le) =>
        value(`${name}_bucket{le="${le}",${series}}`),
      );
      buckets.forEach((n, i) => assert.ok(n <= (buckets[i + 1] ?? total), 'buckets are cumulative'));
      assert.ok(value(`${name}_sum{${series}}`) >= 0);
    });

    test('/metrics from another machine needs the metrics token or an administrator; loopback needs nothing', async () => {
      const from = (headers: Record<string, string> = {}) =>
        raw(t().app, { method: 'GET', url: '/metrics', remoteAddress: '203.0.113.9', headers });
      const anon = await from();
      assert.equal(anon.status, 401, anon.text);
      assert.equal(anon.headers['www-authenticate'], 'Bearer realm="gpucloud"');
      assert.equal((await from({ authorization: `Bearer ${user.token}` })).status, 403, 'a user is not enough');
      const userKey = await createApiKey(t(), user.token, 'read_write');
      assert.equal((await from({ authorization: `Bearer ${userKey}` })).status, 403);
      const adminRo = await createApiKey(t(), admin.token, 'read_only');
      assert.equal(
        (await from({ authorization: `Bearer ${adminRo}` })).status,
        403,
        "an admin's read_only key is not enough",
      );
      const ok = await from({ authorization: `Bearer ${admin.token}` });
      assert.equal(ok.status, 200);
      assert.match(ok.text, /gpucloud_http_requests_total/);
      assert.equal((await from({ authorization: 'Bearer not-the-metrics-token-'.padEnd(40, 'x') })).status, 401);
      assert.equal(
        (await raw(t().app, { method: 'GET', url: '/metrics', remoteAddress: '127.0.0.1' })).status,
        200,
        'loopback',
      );
      assert.equal(
        (await raw(t().app, { method: 'GET', url: '/metrics', remoteAddress: '::1' })).status,
        200,
        'loopback (IPv6)',
      );
    });

    test('unknown paths are counted under one label, never by their raw URL', async () => {
      const junk = `/junk-${Date.now()}`;
      await req('GET', junk);
      const m = await chk(as().get('/metrics'));
      assert.ok(!m.text.includes(junk), 'raw URLs would make label cardinality unbounded');
      assert.match(m.text, /gpucloud_http_requests_total\{[^}]*status="404"[^}]*\} \d+/);
      // Parameterised routes are labelled with their pattern
      await chk(as(admin.token).get('/admin/users/{user_id}', { params: { user_id: user.id } }));
      const m2 = await chk(as().get('/metrics'));
      assert.match(m2.text, /route="\/admin\/users\/:user_id"/);
      assert.ok(!m2.text.includes(`route="/admin/users/${user.id}"`));
    });
  });
});

// ---------------------------------------------------------------------------
// 500s: the error handler alone, and the real app over a failing database.
// ---------------------------------------------------------------------------

describe('internal errors', () => {
  let app: FastifyInstance;
  before(async () => {
    app = Fastify({ logger: false, genReqId: () => 'req-fixed-500', frameworkErrors });
    app.setValidatorCompiler(validatorCompiler);
    registerErrorHandler(app);
    app.get('/boom', async () => {
      throw new Error('connect ECONNREFUSED 10.0.0.5:5432 password=hunter2');
    });
    app.get('/throw-string', async () => {
      throw 'a string, not an Error';
    });
    app.get('/status-503', async () => {
      throw Object.assign(new Error('upstream gone'), { statusCode: 503 });
    });
    app.get('/plugin-401', async () => {
      throw Object.assign(new Error('nope'), { statusCode: 401 });
    });
    app.get('/plugin-403', async () => {
      throw Object.assign(new Error('nope'), { statusCode: 403 });
    });
    app.get('/plugin-429', async () => {
      throw Object.assign(new Error('slow down'), { statusCode: 429 });
    });
    app.get('/param/:id', async () => ({ ok: true }));
    app.post(
      '/typed',
      { schema: { body: Type.Object({ n: Type.Integer() }, { additionalProperties: false }) } },
      async () => ({ ok: true }),
    );
    await app.ready();
  });
  after(() => app.close());

  const get = async (url: string) => {
    const res = await app.inject({ method: 'GET', url });
    return { status: res.statusCode, body: JSON.parse(res.body), text: res.body };
  };

  test('an unexpected error is 500 internal, names the request id and leaks nothing', async () => {
    const r = await get('/boom');
    assert.equal(r.status, 500);
    assert.equal(r.body.code, 'internal');
    assert.ok(r.body.detail.includes('req-fixed-500'), r.body.detail);
    assert.deepEqual(Object.keys(r.body).sort(), ['code', 'detail']);
    for (const leak of ['ECONNREFUSED', 'hunter2', '10.0.0.5', 'at ', 'stack', '.ts:', '.js:']) {
      assert.ok(!r.text.includes(leak), `500 leaks "${leak}": ${r.text}`);
    }
  });

  test('a thrown non-Error and a 5xx error are 500 internal too', async () => {
    for (const url of ['/throw-string', '/status-503']) {
      const r = await get(url);
      assert.equal(r.status, 500, url);
      assert.equal(r.body.code, 'internal');
      assert.ok(!r.text.includes('upstream gone') && !r.text.includes('a string'), r.text);
    }
  });

  test('4xx errors raised by plugins keep their meaning and get a code from the closed list', async () => {
    const expect: [string, number, string][] = [
      ['/plugin-401', 401, 'unauthorized'],
      ['/plugin-403', 403, 'forbidden'],
      ['/plugin-429', 429, 'rate_limited'],
    ];
    for (const [url, status, code] of expect) {
      const r = await get(url);
      assert.equal(r.status, status, `${url}: ${r.text}`);
      assert.equal(r.body.code, code);
      assert.equal(typeof r.body.detail, 'string');
    }
  });

  test('routing errors (bad percent-encoding, over-long parameters) are 404 in the error shape with the standard headers', async () => {
    for (const url of ['/%zz', '/typed/%', `/param/${'p'.repeat(200)}`]) {
      const res = await app.inject({ method: 'GET', url });
      assert.equal(res.statusCode, 404, `${url}: ${res.body}`);
      const body = JSON.parse(res.body);
      assert.equal(body.code, 'not_found');
      assert.equal(typeof body.detail, 'string');
      assert.equal(res.headers['x-request-id'], 'req-fixed-500');
      assert.equal(res.headers['api-version'], '1.0.0');
    }
  });

  test('validation errors through the handler are 422 with field errors', async () => {
    const res = await app.inject({ method: 'POST', url: '/typed', payload: { n: 'x', extra: 1 } });
    assert.equal(res.statusCode, 422);
    const body = JSON.parse(res.body);
    assert.equal(body.code, 'validation_error');
    const fields = body.errors.map((e: { field: string }) => e.field).sort();
    assert.deepEqual(fields, ['body.extra', 'body.n']);
  });
});

for (const kind of DB_KINDS) {
  describe(`a failing database [${kind}]`, () => {
    let db: Db;
    let app: FastifyInstance;
    let token: string;

    before(async () => {
      // No migrations needed: only SELECT 1 and the failure path are exercised.
      db = kind === 'pglite' ? await PgliteDb.open() : new PostgresDb(process.env.DATABASE_URL!, { max: 1 });
      const config = testConfig({ GPUCLOUD_CORS_ORIGINS: 'https://console.example.com' });
      const clock = new ClockService(db, new ManualClock(config.clockStartMs!));
      const deps = { config, db, clock, rateLimitStore: new MemoryRateLimitStore(), jwtSecret: JWT_SECRET };
      const services = createServices(deps);
      app = await buildApp(deps, services);
      token = (await services.tokens.signAccess(1, '00000000-0000-4000-8000-000000000000')).token;
    });
    after(async () => {
      await app.close();
      await db.close().catch(() => {});
    });

    test('CORS: an allowed origin gets the headers, another does not', async () => {
      const pre = await raw(app, {
        method: 'OPTIONS',
        url: '/account',
        headers: {
          origin: 'https://console.example.com',
          'access-control-request-method': 'GET',
          'access-control-request-headers': 'authorization',
        },
      });
      assert.ok(pre.status === 204 || pre.status === 200, `preflight: ${pre.status} ${pre.text}`);
      assert.equal(pre.headers['access-control-allow-origin'], 'https://console.example.com');
      const simple = await raw(app, {
        method: 'GET',
        url: '/healthz',
        headers: { origin: 'https://console.example.com' },
      });
      assert.equal(simple.headers['access-control-allow-origin'], 'https://console.example.com');
      assert.match(String(simple.headers['access-control-expose-headers']), /X-Request-Id/i);
      const other = await raw(app, { method: 'GET', url: '/healthz', headers: { origin: 'https://evil.example.com' } });
      assert.equal(other.headers['access-control-allow-origin'], undefined);
    });

    test('/readyz is 200 while the database answers, 503 once it is gone', async () => {
      const ok = await raw(app, { method: 'GET', url: '/readyz' });
      assert.equal(ok.status, 200);
      await db.close();
      const down = await raw(app, { method: 'GET', url: '/readyz' });
      assert.equal(down.status, 503);
      assert.equal(errorBody(down).code, 'internal');
      assert.equal(typeof errorBody(down).detail, 'string');
      const live = await raw(app, { method: 'GET', url: '/healthz' });
      assert.equal(live.status, 200, 'liveness does not depend on the database');
    });

    test('a database failure inside a request is 500 naming the request id, without a stack', async () => {
      const r = await app.inject({
        method: 'GET',
        url: '/account',
        headers: { authorization: `Bearer ${token}`, 'x-request-id': 'db-down-7' },
      });
      assert.equal(r.statusCode, 500, r.body);
      const body = JSON.parse(r.body);
      assert.equal(body.code, 'internal');
      assert.ok(body.detail.includes('db-down-7'), body.detail);
      assert.equal(r.headers['x-request-id'], 'db-down-7');
      assert.doesNotMatch(r.body, /\bat \S+:\d+|pool|PGlite|closed/i);
    });
  });
}
