/**
 * The request plan: from the operations of the document, a deterministic
 * (for a seed) list of requests, each valid or broken in one place, sent as
 * one of the identities. Real ids are `Ref`s, looked up when sent.
 */
import { createHash } from 'node:crypto';
import fc from 'fast-check';
import {
  type Arb,
  type Ctx,
  type Mut,
  type Override,
  type ParamMut,
  dateTimeArb,
  emailArb,
  invalidArb,
  invalidParamText,
  validArb,
} from './arbitraries.js';
import type { Operation, Param, Schema } from './openapi.js';
import { type PoolKind, Ref, isPlainObject } from './values.js';

export const IDENTITIES = ['admin', 'user', 'other', 'key_rw', 'key_ro', 'key_billing'] as const;
export type IdentityName = (typeof IDENTITIES)[number];

export type AuthSpec =
  | { kind: 'none' }
  | { kind: 'as'; who: IdentityName }
  /** A real credential sent wrongly. */
  | {
      kind: 'tamper';
      who: IdentityName;
      how: 'lowercase-scheme' | 'append' | 'truncate' | 'double-space' | 'no-scheme' | 'basic' | 'two-tokens';
    }
  | { kind: 'raw'; header: string; note: string };

export type BodySpec =
  | { kind: 'none' }
  /**
   * JSON of `value` (Refs resolved when sent), optionally with a key written twice or invalid UTF-8 bytes in its
   * first string.
   */
  | { kind: 'json'; value: unknown; contentType: string | null; duplicateKey?: string; injectBytes?: number[] }
  | { kind: 'raw'; text: string; bytes?: number[]; contentType: string | null };

export type QuerySpec = { kind: 'params'; entries: [string, unknown][] } | { kind: 'raw'; text: string };

export interface Planned {
  seq: number;
  op: number;
  auth: AuthSpec;
  mode: 'valid' | 'invalid';
  /** What was made invalid (empty for valid requests). */
  note: string;
  path: Record<string, unknown>;
  query: QuerySpec;
  body: BodySpec;
  headers: [string, string][];
}

// ---------------------------------------------------------------- real ids and sensible values

const ref = (kind: PoolKind, field = 'id'): Arb<Ref> => fc.nat({ max: 9999 }).map((i) => new Ref(kind, i, field));

function mix(main: Arb<unknown>, weight: number, fallback: Arb<unknown>): Arb<unknown> {
  return fc.oneof({ weight, arbitrary: main }, { weight: 1, arbitrary: fallback });
}

/** base64 of an OpenSSH ed25519 public key blob made of these 32 bytes. */
export function ed25519Line(key: Uint8Array, comment: string): string {
  const type = Buffer.from('ssh-ed25519');
  const blob = Buffer.alloc(4 + type.length + 4 + 32);
  blob.writeUInt32BE(type.length, 0);
  type.copy(blob, 4);
  blob.writeUInt32BE(32, 4 + type.length);
  Buffer.from(key).copy(blob, 8 + type.length);
  return `ssh-ed25519 ${blob.toString('base64')}${comment ? ` ${comment}` : ''}`;
}

const sshKeyLine: Arb<string> = fc
  .tuple(fc.uint8Array({ minLength: 32, maxLength: 32 }), fc.string({ unit: 'grapheme-ascii', maxLength: 20 }))
  .map(([k, c]) => ed25519Line(k, c.trim()));

const dateOnly = fc
  .date({ min: new Date('2025-12-01T00:00:00Z'), max: new Date('2026-04-01T00:00:00Z'), noInvalidDate: true })
  .map((d) => d.toISOString().slice(0, 10));

/** Swaps in real ids and values that get past the handlers' own checks, most of the time. */
export function makeOverride(op: Operation): Override {
  const fromSchema = (s: Schema, ctx: Ctx) => validArb(s, ctx, () => undefined);
  return (s, ctx) => {
    const name = ctx.path[ctx.path.length - 1] ?? '';
    const top = ctx.path.length === 1;
    if (ctx.where === 'path') {
      switch (name) {
        case 'vm_id':
          return fc.oneof(
            { weight: 6, arbitrary: ref('vm') },
            { weight: 1, arbitrary: ref('vm', 'vmid').map((r) => r) },
            { weight: 1, arbitrary: fc.uuid() },
            { weight: 1, arbitrary: fromSchema(s, ctx) },
          );
        case 'key_id':
          return mix(
            ref(op.path.startsWith('/api-keys') ? 'apikey' : 'sshkey'),
            5,
            fc.oneof(fc.uuid(), fromSchema(s, ctx)),
          );
        case 'user_id':
          return mix(ref('user'), 5, fromSchema(s, ctx));
        case 'node':
          return mix(ref('node', 'node'), 5, fromSchema(s, ctx));
        case 'gpu_type':
          return mix(fc.constantFrom('5090', '4090', 'pro6000'), 5, fromSchema(s, ctx));
        case 'reservation_id':
          return mix(ref('reservation'), 5, fc.oneof(fc.uuid(), fromSchema(s, ctx)));
      }
      return undefined;
    }
    if (ctx.where === 'query' && top) {
      switch (name) {
        case 'user_id':
          return mix(ref('user'), 3, fromSchema(s, ctx));
        case 'node':
          return mix(ref('node', 'node'), 3, fromSchema(s, ctx));
        case 'email':
          return mix(
            fc.oneof(ref('user', 'email'), fc.constantFrom('fuzz', '@example.com', 'FUZZ-USER', '%', '_')),
            3,
            fromSchema(s, ctx),
          );
        case 'start_date':
        case 'end_date':
          return mix(dateOnly, 4, fromSchema(s, ctx));
      }
      return undefined;
    }
    if (ctx.where !== 'body' || !top) return undefined;
    switch (name) {
      case 'node':
        return mix(ref('node', 'node'), 4, fromSchema(s, ctx));
      case 'ssh_key_id':
        return mix(ref('sshkey'), 4, fromSchema(s, ctx));
      case 'vm_id':
        return mix(ref('vm'), 4, fromSchema(s, ctx));
      case 'refresh_token':
        return mix(ref('refresh', 'token'), 4, fromSchema(s, ctx));
      case 'ssh_public_key':
        return mix(sshKeyLine, 5, fromSchema(s, ctx));
      case 'storage_gb':
        return mix(fc.integer({ min: 50, max: 500 }), 4, fromSchema(s, ctx));
      case 'seconds':
        // The clock moves a little at a time, so that sessions and balances survive the run.
        return op.path === '/admin/clock/advance' ? fc.integer({ min: 1, max: 600 }) : undefined;
      case 'count':
        return op.path === '/admin/simulator/faults' ? fc.integer({ min: 0, max: 2 }) : undefined;
      case 'amount':
        return fc.oneof(
          { weight: 4, arbitrary: fc.integer({ min: 1, max: 1000 }) },
          { weight: 1, arbitrary: fc.integer({ min: -20, max: -1 }) },
          { weight: 1, arbitrary: fc.integer({ min: 1, max: 100000 }).map((c) => c / 100) },
          { weight: 1, arbitrary: fromSchema(s, ctx) },
        );
      case 'expires_at':
        return fc.oneof({ weight: 4, arbitrary: dateTimeArb }, { weight: 1, arbitrary: fc.constant(null) });
      case 'rental_type':
        return fc.oneof(
          { weight: 3, arbitrary: fc.constant('on_demand') },
          { weight: 2, arbitrary: fc.constant('interruptible') },
          { weight: 1, arbitrary: fc.constant('reserved') },
        );
      case 'email':
        return op.path === '/auth/register' ? mix(emailArb(254), 4, fromSchema(s, ctx)) : undefined;
      case 'instance_label':
      case 'label':
      case 'name':
        // The handlers take printable ASCII only (422 otherwise): mostly that, to get further.
        return mix(
          fc
            .oneof(
              fc.constant(null),
              fc
                .string({ unit: 'grapheme-ascii', minLength: 1, maxLength: 32 })
                .filter((x) => x.trim() === x && x.length > 0),
            )
            .filter((x) => x !== null || acceptsNull(s)),
          3,
          fromSchema(s, ctx),
        );
      case 'agent_url':
        // A port nothing listens on: the agent probe fails at once.
        return mix(fc.constantFrom('http://127.0.0.1:1', 'https://127.0.0.1:1/agent'), 3, fromSchema(s, ctx));
    }
    return undefined;
  };
}

function acceptsNull(s: Schema): boolean {
  const branches = [...(Array.isArray(s.anyOf) ? s.anyOf : []), ...(Array.isArray(s.oneOf) ? s.oneOf : [])] as Schema[];
  return (
    s.type === 'null' || (Array.isArray(s.type) && s.type.includes('null')) || branches.some((b) => b.type === 'null')
  );
}

/** Operation-wide touches on a valid body: linked node + GPU type, known logins. */
function shapeValidBody(op: Operation, body: Arb<unknown>): Arb<unknown> {
  if (op.id === 'POST /admin/nodes' || op.id === 'PATCH /admin/nodes/{node}') {
    // Mostly simulated nodes: an agent_url sends the node's VMs to an agent that is not there.
    return fc.tuple(body, fc.nat({ max: 9 })).map(([b, roll]) => {
      if (!isPlainObject(b) || roll >= 8) return b;
      const out = { ...b };
      delete out.agent_url;
      delete out.agent_token;
      return Object.keys(out).length ? out : { status: 'active' };
    });
  }
  if (op.id === 'POST /vms') {
    return fc
      .tuple(body, fc.nat({ max: 9999 }), fc.nat({ max: 9 }), fc.constantFrom(1, 3, 6))
      .map(([b, i, roll, months]) => {
        if (!isPlainObject(b) || roll >= 8) return b;
        const out: Record<string, unknown> = {
          ...b,
          node: new Ref('node', i, 'node'),
          gpu_type: new Ref('node', i, 'gpu_type'),
        };
        if (roll < 7) {
          // The rules across fields: months only for reserved, a password only with auth_method password.
          if (out.rental_type === 'reserved') out.reservation_months = months;
          else delete out.reservation_months;
          if (out.auth_method === 'password') {
            delete out.ssh_key_id;
            if (out.password === undefined) out.password = 'fuzz-vm-password-1';
          } else {
            delete out.password;
          }
        }
        return out;
      });
  }
  if (op.id === 'POST /auth/login') {
    return fc
      .tuple(body, fc.nat({ max: 9999 }), fc.nat({ max: 3 }))
      .map(([b, i, roll]) =>
        roll < 3 ? { email: new Ref('credential', i, 'email'), password: new Ref('credential', i, 'password') } : b,
      );
  }
  return body;
}

// ---------------------------------------------------------------- identities

const BOGUS_HEADERS: [string, string][] = [
  ['Bearer', 'scheme without a token'],
  ['Bearer ', 'empty token'],
  ['Bearer gpc_', 'empty API key'],
  ['Bearer gpc_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA', 'unknown API key'],
  ['Bearer a.b.c', 'three-part garbage JWT'],
  [
    `Bearer ${b64u('{"alg":"none","typ":"JWT"}')}.${b64u('{"sub":"1","role":"admin","type":"access"}')}.`,
    'unsigned alg=none JWT',
  ],
  [
    `Bearer ${b64u('{"alg":"HS256","typ":"JWT"}')}.${b64u('{"sub":"1","role":"admin","exp":99999999999}')}.c2lnbmF0dXJl`,
    'JWT with a forged signature',
  ],
  ['Basic ZnV6ejpmdXp6', 'Basic credentials'],
  ['Token abc', 'unknown scheme'],
  [`Bearer ${'x'.repeat(5000)}`, '5000-char token'],
  ['Bearer \u00ff\u00fe', 'latin-1 token'],
];

function b64u(s: string): string {
  return Buffer.from(s).toString('base64url');
}

function authArb(op: Operation): Arb<AuthSpec> {
  const as = (who: IdentityName, weight: number) => ({ weight, arbitrary: fc.constant<AuthSpec>({ kind: 'as', who }) });
  const none = (weight: number) => ({ weight, arbitrary: fc.constant<AuthSpec>({ kind: 'none' }) });
  const bogus = (weight: number) => ({
    weight,
    arbitrary: fc.oneof(
      fc.constantFrom(...BOGUS_HEADERS).map(([header, note]): AuthSpec => ({ kind: 'raw', header, note })),
      fc
        .string({ unit: 'grapheme-ascii', maxLength: 40 })
        .map((t): AuthSpec => ({ kind: 'raw', header: `Bearer ${t}`, note: 'random token' })),
      fc
        .tuple(
          fc.constantFrom(...IDENTITIES),
          fc.constantFrom(
            'lowercase-scheme',
            'append',
            'truncate',
            'double-space',
            'no-scheme',
            'basic',
            'two-tokens',
          ) as Arb<Extract<AuthSpec, { kind: 'tamper' }>['how']>,
        )
        .map(([who, how]): AuthSpec => ({ kind: 'tamper', who, how })),
    ),
  });
  if (op.public) return fc.oneof(none(6), as('user', 1), as('admin', 1), bogus(1));
  if (op.path.startsWith('/admin'))
    return fc.oneof(as('admin', 10), as('user', 1), as('key_rw', 1), as('key_ro', 1), none(1), bogus(1));
  return fc.oneof(
    as('user', 6),
    as('key_rw', 2),
    as('key_ro', 2),
    as('key_billing', 1),
    as('other', 1),
    as('admin', 1),
    none(1),
    bogus(1),
  );
}

// ---------------------------------------------------------------- parameters and bodies

function paramCtx(p: Param): Ctx {
  return { where: p.in === 'path' ? 'path' : 'query', path: [p.name] };
}

function validPath(op: Operation, ov: Override): Arb<Record<string, unknown>> {
  const model: Record<string, Arb<unknown>> = {};
  for (const p of op.pathParams) model[p.name] = validArb(p.schema, paramCtx(p), ov);
  return fc.record(model);
}

function validQuery(op: Operation, ov: Override): Arb<QuerySpec> {
  if (!op.queryParams.length) return fc.constant({ kind: 'params', entries: [] });
  const parts = op.queryParams.map((p) => {
    const v = validArb(p.schema, paramCtx(p), ov);
    // Parameters with a default are optional whatever `required` says.
    const must = p.required && !('default' in p.schema);
    return must ? v.map((x) => [x]) : fc.option(v, { freq: 2 }).map((x) => (x === null ? [] : [x]));
  });
  return fc.tuple(...parts).map((vals) => {
    const entries = vals.flatMap((xs, i) => xs.map((x) => [op.queryParams[i]!.name, x] as [string, unknown]));
    // A date range in order, most of the time (start after end is a 422 of its own).
    const start = entries.find(([n]) => n === 'start_date');
    const end = entries.find(([n]) => n === 'end_date');
    if (start && end && typeof start[1] === 'string' && typeof end[1] === 'string' && start[1] > end[1])
      [start[1], end[1]] = [end[1], start[1]];
    return { kind: 'params', entries };
  });
}

function validBody(op: Operation, ov: Override): Arb<BodySpec> {
  if (!op.body) return fc.constant({ kind: 'none' });
  const schema = op.body.schema ?? {};
  const value = shapeValidBody(op, validArb(schema, { where: 'body', path: [] }, ov));
  const json = value.map((v): BodySpec => ({ kind: 'json', value: v, contentType: 'application/json' }));
  if (op.body.required) return json;
  return fc.oneof({ weight: 4, arbitrary: json }, { weight: 1, arbitrary: fc.constant<BodySpec>({ kind: 'none' }) });
}

const IDEMPOTENT_POSTS = new Set([
  'POST /vms',
  'POST /ssh-keys',
  'POST /api-keys',
  'POST /admin/users/{user_id}/credits',
]);

function validHeaders(op: Operation): Arb<[string, string][]> {
  if (op.method !== 'POST') return fc.constant([]);
  const weight = IDEMPOTENT_POSTS.has(op.id) ? 3 : 1;
  return fc.oneof(
    { weight: 10 - weight, arbitrary: fc.constant<[string, string][]>([]) },
    {
      weight,
      arbitrary: fc
        .oneof(
          fc.constantFrom('fz-1', 'fz-2', 'fz-3', 'fz-4'),
          fc
            .string({ unit: 'grapheme-ascii', minLength: 1, maxLength: 255 })
            .filter((s) => s.trim() === s && s.length > 0),
        )
        .map((k): [string, string][] => [['Idempotency-Key', k]]),
    },
  );
}

interface Parts {
  path: Record<string, unknown>;
  query: QuerySpec;
  body: BodySpec;
  headers: [string, string][];
}

const MALFORMED_JSON = [
  '{',
  '}',
  '[',
  '{"a":',
  '{"a":1,}',
  '[1,2',
  'nul',
  'tru',
  'undefined',
  "{'a':1}",
  '{"a":1}{"b":2}',
  '{"a" 1}',
  '{a:1}',
  '\ufeff{}',
  '{"a":01}',
  '{"a":1e}',
  '{"a":.5}',
  '{"a":+1}',
  '{"a":NaN}',
  '{"a":Infinity}',
  '{"a":"\\x41"}',
  '{"a":"\\u12"}',
  '{"a":"unterminated}',
  '"\u0000"',
  '\u0000',
  ' ',
  '/* c */ {}',
  '{"a":1}//',
  'null',
  '0',
  '"a string"',
  '[]',
  'true',
  '-',
  '\u001f{}',
  '{"\\ud800":1}',
  '{"a":"\\ud800"}',
];

const OTHER_TYPES = [
  'text/plain',
  'application/x-www-form-urlencoded',
  'multipart/form-data; boundary=fz',
  'application/xml',
  'application/octet-stream',
  'text/json',
  'application/jsonx',
  'application/json-patch+json',
  'application/vnd.api+json',
  'application/json; charset=utf-16',
  'application/json; charset=latin1',
  'APPLICATION/JSON',
  'application/json;;',
  'application/',
  '*/*',
  'application/json, text/plain',
  'image/png',
  ';',
  'application/json; boundary=x; charset="utf-8"',
];

function depthText(kind: 'array' | 'object', d: number): string {
  return kind === 'array' ? '['.repeat(d) + ']'.repeat(d) : '{"a":'.repeat(d) + '1' + '}'.repeat(d);
}

/** One part of an otherwise valid request, broken. */
function invalidParts(op: Operation, ov: Override, valid: Arb<Parts>): Arb<{ parts: Parts; note: string }> {
  const variants: fc.WeightedArbitrary<{ parts: Parts; note: string }>[] = [];
  const withPart = <K extends keyof Parts>(weight: number, key: K, arb: Arb<{ value: Parts[K]; note: string }>) =>
    variants.push({
      weight,
      arbitrary: fc.tuple(valid, arb).map(([p, m]) => ({ parts: { ...p, [key]: m.value }, note: m.note })),
    });

  if (op.pathParams.length) {
    withPart(
      3,
      'path',
      fc.tuple(validPath(op, ov), fc.constantFrom(...op.pathParams)).chain(([path, p]) =>
        invalidParamText(p.schema).map((m: ParamMut) => ({
          value: { ...path, [p.name]: m.text },
          note: `path ${p.name}: ${m.note}`,
        })),
      ),
    );
  }
  if (op.queryParams.length) {
    withPart(
      3,
      'query',
      fc.tuple(validQuery(op, ov), fc.constantFrom(...op.queryParams)).chain(([q, p]) =>
        invalidParamText(p.schema).map((m) => {
          const entries = (q as Extract<QuerySpec, { kind: 'params' }>).entries.filter(([n]) => n !== p.name);
          return {
            value: { kind: 'params', entries: [...entries, [p.name, m.text]] } as QuerySpec,
            note: `query ${p.name}: ${m.note}`,
          };
        }),
      ),
    );
    withPart(
      1,
      'query',
      fc.tuple(validQuery(op, ov), fc.constantFrom(...op.queryParams)).map(([q, p]) => {
        const entries = (q as Extract<QuerySpec, { kind: 'params' }>).entries;
        return {
          value: { kind: 'params', entries: [...entries, [p.name, '1'], [p.name, '2']] } as QuerySpec,
          note: `query ${p.name} repeated`,
        };
      }),
    );
  }
  withPart(
    1,
    'query',
    fc.oneof(
      fc
        .constantFrom(
          '&&&',
          '=',
          '==1',
          'limit',
          'limit=&offset=',
          '%',
          '%zz=1',
          'a[b]=1',
          'limit[]=1',
          'unknown_param=1',
          '__proto__[x]=1',
          'constructor=1',
          'x=%00',
          '%00=1',
          'x=' + 'a'.repeat(9000),
        )
        .map((text) => ({
          value: { kind: 'raw', text } as QuerySpec,
          note: `raw query ${JSON.stringify(text.slice(0, 40))}`,
        })),
      fc
        .string({ unit: 'grapheme-ascii', minLength: 1, maxLength: 12 })
        .filter((k) => !op.queryParams.some((p) => p.name === k))
        .map((k) => ({
          value: { kind: 'params', entries: [[k, 'x']] } as QuerySpec,
          note: `unknown query parameter ${JSON.stringify(k)}`,
        })),
    ),
  );

  if (op.body) {
    const schema = op.body.schema ?? {};
    withPart(
      8,
      'body',
      invalidArb(schema, { where: 'body', path: [] }, ov).map((m: Mut) => ({
        value: { kind: 'json', value: m.value, contentType: 'application/json' } as BodySpec,
        note: `body ${m.note}`,
      })),
    );
    withPart(
      2,
      'body',
      fc.constantFrom(...MALFORMED_JSON).map((text) => ({
        value: { kind: 'raw', text, contentType: 'application/json' } as BodySpec,
        note: `malformed JSON ${JSON.stringify(text).slice(0, 40)}`,
      })),
    );
    withPart(
      2,
      'body',
      fc.tuple(validBody(op, ov), fc.oneof(fc.constantFrom(...OTHER_TYPES), fc.constant(null))).map(([b, ct]) => ({
        value:
          b.kind === 'json'
            ? ({ kind: 'json', value: b.value, contentType: ct } as BodySpec)
            : ({ kind: 'raw', text: '{}', contentType: ct } as BodySpec),
        note: ct === null ? 'body without Content-Type' : `Content-Type ${ct}`,
      })),
    );
    withPart(
      1,
      'body',
      fc
        .tuple(fc.constantFrom<'array' | 'object'>('array', 'object'), fc.constantFrom(33, 100, 1000, 5000, 20000))
        .map(([k, d]) => ({
          value: { kind: 'raw', text: depthText(k, d), contentType: 'application/json' } as BodySpec,
          note: `${k} nested ${d} deep`,
        })),
    );
    withPart(
      1,
      'body',
      fc.constantFrom(65_536 - 12, 65_537, 70_000, 200_000).map((n) => ({
        value: { kind: 'raw', text: `{"pad":"${'p'.repeat(n)}"}`, contentType: 'application/json' } as BodySpec,
        note: `body of ${n + 10} bytes`,
      })),
    );
    withPart(
      1,
      'body',
      fc
        .tuple(
          validBody(op, ov),
          fc.constantFrom<number[]>([0xff], [0xfe, 0xff], [0xc0, 0xaf], [0xed, 0xa0, 0x80], [0xe2, 0x28, 0xa1], [0x80]),
        )
        .map(([b, bytes]) => {
          // A valid body whose first string gets invalid UTF-8 bytes.
          const value: BodySpec =
            b.kind === 'json'
              ? { ...b, injectBytes: bytes }
              : { kind: 'raw', text: '{"a":"x"}', bytes, contentType: 'application/json' };
          return { value, note: `invalid UTF-8 bytes ${bytes.map((x) => x.toString(16)).join(' ')} in a string` };
        }),
    );
    withPart(
      1,
      'body',
      validBody(op, ov)
        .filter((b) => b.kind === 'json' && isPlainObject(b.value) && Object.keys(b.value).length > 0)
        .map((b) => {
          const obj = (b as Extract<BodySpec, { kind: 'json' }>).value as Record<string, unknown>;
          const k = Object.keys(obj)[0]!;
          return {
            value: { ...(b as Extract<BodySpec, { kind: 'json' }>), duplicateKey: k } as BodySpec,
            note: `duplicate key ${k}`,
          };
        }),
    );
    withPart(
      1,
      'body',
      fc
        .constantFrom<BodySpec>(
          { kind: 'none' },
          { kind: 'raw', text: '', contentType: 'application/json' },
          { kind: 'raw', text: 'null', contentType: 'application/json' },
        )
        .map((value) => ({ value, note: 'no body / empty / null body' })),
    );
  } else {
    withPart(
      1,
      'body',
      fc
        .tuple(fc.jsonValue({ maxDepth: 2 }), fc.constantFrom('application/json', 'text/plain', null))
        .map(([v, ct]) => ({
          value: { kind: 'raw', text: JSON.stringify(v) ?? '{}', contentType: ct } as BodySpec,
          note: `a body where none is expected (${ct ?? 'no Content-Type'})`,
        })),
    );
  }
  withPart(
    1,
    'headers',
    fc.oneof(
      fc.constantFrom(256, 300, 10_000, 20_000).map((n) => ({
        value: [['Idempotency-Key', 'k'.repeat(n)]] as [string, string][],
        note: `Idempotency-Key of ${n} chars`,
      })),
      fc.constantFrom('', ' ', '\t', 'a b', '\u00e9').map((k) => ({
        value: [['Idempotency-Key', k]] as [string, string][],
        note: `Idempotency-Key ${JSON.stringify(k)}`,
      })),
      fc.constantFrom('x'.repeat(129), 'bad id!', '\u00ff').map((k) => ({
        value: [['X-Request-Id', k]] as [string, string][],
        note: `X-Request-Id ${JSON.stringify(k.slice(0, 20))}`,
      })),
      fc.constant({
        value: [['X-Fuzz-Padding', 'h'.repeat(20_000)]] as [string, string][],
        note: '20 000-byte header',
      }),
      fc
        .constantFrom('gzip', 'br', 'identity;q=0', '*;q=0')
        .map((e) => ({ value: [['Accept-Encoding', e]] as [string, string][], note: `Accept-Encoding ${e}` })),
      fc
        .constantFrom('application/xml', 'text/html', 'image/png', '*/*;q=0')
        .map((a) => ({ value: [['Accept', a]] as [string, string][], note: `Accept ${a}` })),
    ),
  );
  return fc.oneof(...variants);
}

// ---------------------------------------------------------------- the plan

function opWeight(op: Operation): number {
  if (['/metrics', '/healthz', '/readyz', '/pricing', '/admin/clock', '/admin/clock/advance'].includes(op.path))
    return 1;
  if (op.id === 'POST /vms') return 6;
  if (op.path.startsWith('/vms') || op.path.startsWith('/reservations')) return 4;
  if (op.path.startsWith('/auth')) return 2;
  return 3;
}

export function planArbitrary(ops: Operation[]): Arb<Omit<Planned, 'seq'>> {
  const perOp = ops.map((op, index) => {
    const ov = makeOverride(op);
    const valid: Arb<Parts> = fc.record({
      path: validPath(op, ov),
      query: validQuery(op, ov),
      body: validBody(op, ov),
      headers: validHeaders(op),
    });
    const auth = authArb(op);
    const validReq = fc
      .tuple(auth, valid)
      .map(([a, p]): Omit<Planned, 'seq'> => ({ op: index, auth: a, mode: 'valid', note: '', ...p }));
    const invalidReq = fc
      .tuple(auth, invalidParts(op, ov, valid))
      .map(([a, { parts, note }]): Omit<Planned, 'seq'> => ({ op: index, auth: a, mode: 'invalid', note, ...parts }));
    return {
      weight: opWeight(op),
      arbitrary: fc.oneof({ weight: 13, arbitrary: validReq }, { weight: 7, arbitrary: invalidReq }),
    };
  });
  return fc.oneof(...perOp);
}

/** `count` planned requests for a seed: the same list for the same seed and document. */
export function makePlan(ops: Operation[], seed: number, count: number): Planned[] {
  if (count <= 0) return [];
  const values = fc.sample(planArbitrary(ops), { seed, numRuns: count });
  return values.map((v, seq) => ({ seq, ...v }));
}

/** A short fingerprint of the operations, so a replay can tell it runs against another document. */
export function docFingerprint(ops: Operation[]): string {
  return createHash('sha256')
    .update(JSON.stringify(ops.map((o) => [o.id, o.pathParams, o.queryParams, o.body?.schema ?? null])))
    .digest('hex')
    .slice(0, 12);
}
