/**
 * The served OpenAPI document: stable operation ids (the table in
 * docs/api.md is the snapshot), declared tags, a summary and a description
 * everywhere, `info` and `servers`, the shared error responses, and patterns
 * every validator reads the same way.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { buildTestApp, type TestApp } from '../helpers/app.js';
import { createUser } from '../helpers/factories.js';
import { NO_CONTROL, NO_CONTROL_CC } from '../../src/http/schemas.js';
import { TAGS } from '../../src/http/openapi.js';
import { ERROR_CODES } from '../../src/errors.js';

/**
 * The parts of the served document these tests read. GET /openapi.json is not itself an operation of the
 * document (so not in src/sdk/schema.ts): its body is read through this local shape.
 */
interface Parameter {
  name: string;
  description?: string;
  required?: boolean;
  schema?: { description?: string; default?: unknown };
}
interface ResponseObject {
  $ref?: string;
  content?: Record<string, { schema: { $ref?: string } }>;
  headers?: Record<string, unknown>;
}
interface Operation {
  operationId?: string;
  tags?: string[];
  summary?: string;
  description?: string;
  parameters?: Parameter[];
  responses: Record<string, ResponseObject>;
}
type Method = 'get' | 'post' | 'put' | 'patch' | 'delete';
interface OpenApiDoc {
  paths: Record<string, Partial<Record<Method, Operation>>>;
  tags: { name: string; description?: string }[];
  info: { license: { identifier?: string; name?: string }; contact: { name?: string; url?: string; email?: string } };
  servers: { url: string }[];
  components: {
    responses: Record<string, ResponseObject>;
    schemas: { ErrorResponse: { properties: { code: { enum: string[] } } } };
  };
}
const METHODS: Method[] = ['get', 'post', 'put', 'patch', 'delete'];

function operations(doc: OpenApiDoc): { method: string; path: string; op: Operation }[] {
  const out: { method: string; path: string; op: Operation }[] = [];
  for (const [path, item] of Object.entries(doc.paths)) {
    for (const method of METHODS) {
      const op = item[method];
      if (op) out.push({ method, path, op });
    }
  }
  return out;
}

/** The operation table of docs/api.md: `| \`id\` | METHOD | \`/path\` | summary |`. */
function documentedOperations(): Map<string, string> {
  const text = readFileSync(new URL('../../docs/api.md', import.meta.url), 'utf8');
  const rows = new Map<string, string>();
  for (const m of text.matchAll(/^\| `(\w+)` \| (GET|POST|PUT|PATCH|DELETE) \| `([^`]+)` \|/gm)) {
    assert.ok(!rows.has(m[1]!), `docs/api.md lists ${m[1]} twice`);
    rows.set(m[1]!, `${m[2]} ${m[3]}`);
  }
  return rows;
}

describe('the OpenAPI document', () => {
  let t: TestApp;
  let doc: OpenApiDoc;
  before(async () => {
    t = await buildTestApp('pglite');
    doc = (await t.req('GET', '/openapi.json')).body as OpenApiDoc;
  });
  after(async () => {
    await t?.close();
  });

  test('every operation has a camelCase operationId, unique, and exactly those docs/api.md lists', () => {
    const served = new Map<string, string>();
    for (const { method, path, op } of operations(doc)) {
      assert.match(String(op.operationId), /^[a-z][a-zA-Z0-9]*$/, `${method} ${path}`);
      const id = String(op.operationId);
      assert.ok(!served.has(id), `operationId ${id} is used twice`);
      served.set(id, `${method.toUpperCase()} ${path}`);
    }
    // Renaming, removing or moving an operation id is a breaking change: the docs table changes with it, on purpose.
    assert.deepEqual(Object.fromEntries([...served].sort()), Object.fromEntries([...documentedOperations()].sort()));
    for (const id of ['createVm', 'listVms', 'getVmAccessInfo', 'advanceClock']) assert.ok(served.has(id), id);
  });

  test('tags are declared, described and in the documented order; every operation has one', () => {
    assert.deepEqual(
      doc.tags.map((x) => x.name),
      TAGS.map((x) => x.name),
    );
    assert.deepEqual(
      doc.tags.map((x) => x.name),
      [
        'auth',
        'account',
        'ssh-keys',
        'api-keys',
        'events',
        'webhooks',
        'offers',
        'vms',
        'images',
        'billing',
        'reservations',
        'admin',
        'system',
      ],
    );
    const declared = new Set(doc.tags.map((x) => x.name));
    const used = new Set<string>();
    for (const x of doc.tags) assert.ok((x.description?.length ?? 0) > 10, `tag ${x.name} has a description`);
    for (const { method, path, op } of operations(doc)) {
      assert.equal(op.tags?.length, 1, `${method} ${path} has one tag`);
      const tag = String(op.tags?.[0]);
      assert.ok(declared.has(tag), `${method} ${path}: tag ${tag} is declared`);
      used.add(tag);
    }
    assert.deepEqual(
      [...declared].filter((x) => !used.has(x)),
      [],
      'every declared tag is used',
    );
  });

  test('every operation has a summary and a description, every parameter a description', () => {
    for (const { method, path, op } of operations(doc)) {
      assert.ok((op.summary?.length ?? 0) > 3, `${method} ${path} has a summary`);
      assert.ok((op.description?.length ?? 0) > 10, `${method} ${path} has a description`);
      for (const p of op.parameters ?? []) {
        assert.ok(
          ((p.description ?? p.schema?.description)?.length ?? 0) > 3,
          `${method} ${path}: parameter ${p.name} is described`,
        );
        // A parameter with a default need not be sent.
        if (p.schema?.default !== undefined)
          assert.notEqual(p.required, true, `${method} ${path}: ${p.name} has a default, so it is optional`);
      }
    }
  });

  test('no description points outside the project: no decision or issue numbers, no external documents', () => {
    const text = JSON.stringify(doc);
    assert.doesNotMatch(text, /\bD\d{1,2}\b/);
    assert.doesNotMatch(text, /contract|shared\/|issue #\d/i);
  });

  test('info names the licence and a contact; servers defaults to the origin', () => {
    const pkg = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8'));
    assert.equal(doc.info.license.identifier, pkg.license);
    assert.equal(doc.info.license.name, pkg.license);
    assert.equal(typeof doc.info.contact.name, 'string');
    assert.equal(doc.info.contact.url, undefined, 'no URL to name without GPUCLOUD_PUBLIC_URL');
    assert.deepEqual(
      doc.servers.map((s) => s.url),
      ['/'],
    );
  });

  test('GPUCLOUD_PUBLIC_URL and GPUCLOUD_SUPPORT_EMAIL reach servers and contact', async () => {
    const other = await buildTestApp('pglite', {
      env: { GPUCLOUD_PUBLIC_URL: 'https://api.gpucloud.test/', GPUCLOUD_SUPPORT_EMAIL: 'help@gpucloud.test' },
    });
    try {
      // Untyped route (see OpenApiDoc above).
      const d = (await other.req('GET', '/openapi.json')).body as OpenApiDoc;
      assert.deepEqual(
        d.servers.map((s) => s.url),
        ['https://api.gpucloud.test'],
      );
      assert.equal(d.info.contact.url, 'https://api.gpucloud.test');
      assert.equal(d.info.contact.email, 'help@gpucloud.test');
    } finally {
      await other.close();
    }
  });

  test('error responses are described once and referenced; the framework answers are on every operation they can affect', () => {
    const shared = doc.components.responses;
    for (const name of [
      'BadRequest',
      'MalformedRequest',
      'Unauthorized',
      'Forbidden',
      'NotFound',
      'PayloadTooLarge',
      'UnsupportedMediaType',
      'ValidationFailed',
      'RateLimited',
      'HeadersTooLarge',
      'NotReady',
    ]) {
      assert.equal(
        shared[name]?.content?.['application/json']?.schema.$ref,
        '#/components/schemas/ErrorResponse',
        name,
      );
    }
    assert.ok(shared.RateLimited?.headers?.['Retry-After'], 'a 429 documents Retry-After');
    assert.deepEqual(doc.components.schemas.ErrorResponse.properties.code.enum, ERROR_CODES);
    for (const { method, path, op } of operations(doc)) {
      const where = `${method.toUpperCase()} ${path}`;
      for (const [status, r] of Object.entries(op.responses)) {
        if (Number(status) >= 400)
          assert.ok(typeof r.$ref === 'string', `${where} ${status} refers to a shared response`);
      }
      const expect =
        method === 'get'
          ? { 422: 'ValidationFailed', 431: 'HeadersTooLarge' }
          : { 413: 'PayloadTooLarge', 415: 'UnsupportedMediaType', 422: 'ValidationFailed', 431: 'HeadersTooLarge' };
      for (const [status, name] of Object.entries(expect)) {
        assert.equal(op.responses[status]?.$ref, `#/components/responses/${name}`, `${where} documents ${status}`);
      }
      if (method !== 'get') {
        assert.match(
          op.responses['400']?.$ref ?? '',
          /#\/components\/responses\/(BadRequest|MalformedRequest)$/,
          `${where} documents 400`,
        );
      }
    }
  });

  test('the framework answers (400, 413, 415) come in the error shape with the request id', async () => {
    const u = await createUser(t);
    const codes = new Set(doc.components.schemas.ErrorResponse.properties.code.enum);
    const cases: [payload: string, headers: Record<string, string>, status: number, code: string][] = [
      ['{"label": ', { 'content-type': 'application/json' }, 400, 'malformed_json'],
      ['x'.repeat(70 * 1024), { 'content-type': 'application/json' }, 413, 'payload_too_large'],
      ['label=x', { 'content-type': 'application/x-www-form-urlencoded' }, 415, 'unsupported_media_type'],
      ['hello', { 'content-type': 'text/plain' }, 415, 'unsupported_media_type'],
    ];
    for (const [payload, headers, status, code] of cases) {
      const res = await t.app.inject({
        method: 'POST',
        url: '/ssh-keys',
        headers: { ...headers, authorization: `Bearer ${u.token}`, 'x-request-id': `req-${status}-${code}` },
        payload,
      });
      assert.equal(res.statusCode, status, res.body);
      assert.equal(res.headers['x-request-id'], `req-${status}-${code}`);
      assert.match(String(res.headers['content-type']), /^application\/json/);
      const body = res.json();
      assert.equal(body.code, code);
      assert.ok(codes.has(body.code));
      assert.equal(typeof body.detail, 'string');
      assert.deepEqual(Object.keys(body).sort(), ['code', 'detail']);
    }
  });

  test('patterns use only syntax every ECMA-262 engine reads without the u flag', () => {
    const patterns: string[] = [];
    const walk = (v: unknown): void => {
      if (Array.isArray(v)) v.forEach(walk);
      else if (v && typeof v === 'object') {
        for (const [k, x] of Object.entries(v)) {
          if (k === 'pattern' && typeof x === 'string') patterns.push(x);
          else walk(x);
        }
      }
    };
    walk(doc);
    assert.ok(patterns.length >= 3);
    for (const p of patterns) {
      assert.doesNotMatch(p, /\\[pP]\{/, `no Unicode property escapes: ${p}`);
      assert.doesNotThrow(() => new RegExp(p), p);
    }
  });

  test('the no-control pattern still covers every control and formatting character of the BMP', () => {
    const noControl = [new RegExp(NO_CONTROL), new RegExp(NO_CONTROL, 'u')];
    const noCc = [new RegExp(NO_CONTROL_CC), new RegExp(NO_CONTROL_CC, 'u')];
    for (let c = 0; c <= 0xffff; c++) {
      if (c >= 0xd800 && c <= 0xdfff) continue;
      const ch = String.fromCharCode(c);
      const control = /\p{Cc}/u.test(ch);
      const format = /\p{Cf}/u.test(ch);
      for (const re of noControl) assert.equal(re.test(`a${ch}b`), !(control || format), `U+${c.toString(16)}`);
      for (const re of noCc) assert.equal(re.test(`a${ch}b`), !control, `U+${c.toString(16)}`);
    }
    for (const re of [...noControl, ...noCc]) assert.ok(re.test('Ada Lovelace 🚀 ünïcödé 東京'));
  });
});
