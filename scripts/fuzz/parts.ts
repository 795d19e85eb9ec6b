/**
 * The path, query, body and headers of a planned request: valid ones, and
 * ones broken in one place (each with a note saying what is broken).
 */
import fc from 'fast-check';
import { type Arb, type Ctx, type Mut, type Override, validArb } from './arbitraries.js';
import { type ParamMut, invalidArb, invalidParamText } from './invalid-values.js';
import type { Operation, Param } from './openapi.js';
import { shapeValidBody } from './overrides.js';
import type { BodySpec, Parts, QuerySpec } from './planned.js';
import { isPlainObject } from './values.js';

function paramCtx(p: Param): Ctx {
  return { where: p.in === 'path' ? 'path' : 'query', path: [p.name] };
}

export function validPath(op: Operation, ov: Override): Arb<Record<string, unknown>> {
  const model: Record<string, Arb<unknown>> = {};
  for (const p of op.pathParams) model[p.name] = validArb(p.schema, paramCtx(p), ov);
  return fc.record(model);
}

export function validQuery(op: Operation, ov: Override): Arb<QuerySpec> {
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

export function validBody(op: Operation, ov: Override): Arb<BodySpec> {
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

export function validHeaders(op: Operation): Arb<[string, string][]> {
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
export function invalidParts(op: Operation, ov: Override, valid: Arb<Parts>): Arb<{ parts: Parts; note: string }> {
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
