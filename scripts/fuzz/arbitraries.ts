/**
 * fast-check arbitraries from JSON schemas (the subset TypeBox and
 * @fastify/swagger produce): values the schema accepts, and values it
 * refuses (each with a note saying what is wrong with it).
 */
import fc from 'fast-check';
import type { Schema } from './openapi.js';
import { RawJson, RawText, isPlainObject, setOwn } from './values.js';

export type Arb<T> = fc.Arbitrary<T>;

/** A deliberately invalid value and what makes it invalid. */
export interface Mut {
  value: unknown;
  note: string;
}

/** Where a value goes: lets the caller swap in real ids and sensible values. */
export interface Ctx {
  where: 'path' | 'query' | 'body';
  /** Property names from the top of the body / the parameter name. */
  path: string[];
}

export type Override = (schema: Schema, ctx: Ctx) => Arb<unknown> | undefined;

const noOverride: Override = () => undefined;

const MAX_SAFE = Number.MAX_SAFE_INTEGER;

function num(v: unknown): number | undefined {
  return typeof v === 'number' && Number.isFinite(v) ? v : undefined;
}

function schemaList(v: unknown): Schema[] {
  return Array.isArray(v) ? v.filter(isPlainObject) : [];
}

function types(s: Schema): string[] {
  if (typeof s.type === 'string') return [s.type];
  if (Array.isArray(s.type)) return s.type.filter((t): t is string => typeof t === 'string');
  return [];
}

/** The JSON types a schema accepts (undefined: anything). */
export function acceptedTypes(s: Schema): Set<string> | undefined {
  const branches = [...schemaList(s.anyOf), ...schemaList(s.oneOf)];
  if (branches.length) {
    const out = new Set<string>();
    for (const b of branches) {
      const t = acceptedTypes(b);
      if (!t) return undefined;
      t.forEach((x) => out.add(x));
    }
    return out;
  }
  const t = types(s);
  if (t.length) return new Set(t.includes('integer') && !t.includes('number') ? t : t);
  if (Array.isArray(s.enum)) return new Set(s.enum.map(jsonType));
  if ('const' in s) return new Set([jsonType(s.const)]);
  if (s.properties || s.required) return new Set(['object']);
  if (s.items) return new Set(['array']);
  return undefined;
}

export function jsonType(v: unknown): string {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'array';
  if (typeof v === 'number') return Number.isInteger(v) ? 'integer' : 'number';
  return typeof v;
}

// ---------------------------------------------------------------- strings

const ALNUM = 'abcdefghijklmnopqrstuvwxyz0123456789';
const alnumChar = fc.constantFrom(...ALNUM.split(''));

/** Strings that stress text handling without breaking any length rule. */
const SPICY_CHARS = [
  '\u00e9',
  '\u00df',
  '\u4e2d',
  '\u0645',
  '\u05d0',
  '\u200b',
  '\u200d',
  '\u202e',
  '\ufeff',
  '\u0301',
  '\u{1F600}',
  '\u{1F468}\u200d\u{1F469}',
  '\ud835\udc00',
  "'",
  '"',
  '\\',
  '%',
  '_',
  '*',
  '<',
  '>',
  '&',
  ';',
  '--',
  '$1',
  '{{',
  '`',
  '\u2028',
  ' ',
];

function stringUnits(min: number, max: number): Arb<string> {
  return fc.oneof(
    { weight: 5, arbitrary: fc.string({ unit: 'grapheme-ascii', minLength: min, maxLength: max }) },
    { weight: 3, arbitrary: fc.string({ unit: alnumChar, minLength: min, maxLength: max }) },
    { weight: 1, arbitrary: fc.string({ unit: 'binary', minLength: min, maxLength: max }) },
    {
      weight: 1,
      arbitrary: fc
        .string({ unit: fc.constantFrom(...SPICY_CHARS), minLength: min, maxLength: max })
        .filter((s) => cpLen(s) <= max),
    },
  );
}

/** Length in code points, the way JSON Schema (and Ajv) counts. */
export function cpLen(s: string): number {
  let n = 0;
  for (const _ of s) n++;
  return n;
}

function cpSlice(s: string, max: number): string {
  return Array.from(s).slice(0, max).join('');
}

const isoDate = (min: string, max: string) =>
  fc.date({ min: new Date(min), max: new Date(max), noInvalidDate: true }).map((d) => d.toISOString());

export const dateTimeArb: Arb<string> = fc.oneof(
  { weight: 4, arbitrary: isoDate('2026-01-01T00:00:00Z', '2031-12-31T00:00:00Z') },
  { weight: 1, arbitrary: isoDate('2020-01-01T00:00:00Z', '2026-01-01T00:00:00Z') },
  { weight: 1, arbitrary: isoDate('2026-01-01T00:00:00Z', '2031-12-31T00:00:00Z').map((s) => s.replace('.000Z', 'Z')) },
  {
    weight: 1,
    arbitrary: isoDate('2026-01-01T00:00:00Z', '2031-12-31T00:00:00Z').map((s) => s.replace(/\.\d{3}Z$/, '+02:00')),
  },
);

export function emailArb(max = 254): Arb<string> {
  return fc
    .oneof(
      {
        weight: 4,
        arbitrary: fc
          .tuple(fc.string({ unit: alnumChar, minLength: 1, maxLength: 16 }), fc.nat())
          .map(([a, n]) => `fz-${a}${n}@example.com`),
      },
      { weight: 1, arbitrary: fc.emailAddress() },
    )
    .filter((e) => e.length <= max);
}

function stringArb(s: Schema): Arb<string> {
  const min = num(s.minLength) ?? 0;
  const max = num(s.maxLength) ?? Infinity;
  if (s.format === 'uuid') return fc.uuid();
  if (s.format === 'date-time') return dateTimeArb;
  if (s.format === 'date') return isoDate('2025-01-01T00:00:00Z', '2031-12-31T00:00:00Z').map((d) => d.slice(0, 10));
  if (s.format === 'email') return emailArb(max === Infinity ? 254 : max);
  if (typeof s.pattern === 'string') {
    let re: RegExp;
    try {
      re = new RegExp(s.pattern, 'u');
    } catch {
      re = new RegExp(s.pattern);
    }
    const ok = (x: string) => re.test(x) && cpLen(x) >= min && cpLen(x) <= max;
    try {
      const gen = fc.stringMatching(re).map((x) => (max === Infinity ? x : cpSlice(x, max)));
      const seen = fc.sample(gen, { numRuns: 40, seed: 1 });
      if (seen.filter(ok).length >= 20) return gen.filter(ok);
    } catch {
      // fall through
    }
    const base = stringUnits(min, Math.min(max, min + 32));
    return base.filter((x) => re.test(x));
  }
  const cap = Math.min(max, min + 40);
  const parts: fc.WeightedArbitrary<string>[] = [{ weight: 12, arbitrary: stringUnits(min, cap) }];
  if (max !== Infinity && max > cap)
    parts.push({ weight: 1, arbitrary: fc.string({ unit: 'grapheme-ascii', minLength: max, maxLength: max }) });
  if (min > 0)
    parts.push({ weight: 1, arbitrary: fc.string({ unit: 'grapheme-ascii', minLength: min, maxLength: min }) });
  return fc.oneof(...parts);
}

// ---------------------------------------------------------------- numbers

function bounds(s: Schema, integer: boolean): { min: number; max: number } {
  let min =
    num(s.minimum) ?? (num(s.exclusiveMinimum) !== undefined ? num(s.exclusiveMinimum)! + (integer ? 1 : 1e-6) : -1e9);
  let max =
    num(s.maximum) ?? (num(s.exclusiveMaximum) !== undefined ? num(s.exclusiveMaximum)! - (integer ? 1 : 1e-6) : 1e9);
  if (integer) {
    min = Math.max(Math.ceil(min), -MAX_SAFE);
    max = Math.min(Math.floor(max), MAX_SAFE);
  }
  return { min, max };
}

function integerArb(s: Schema): Arb<number> {
  const { min, max } = bounds(s, true);
  const mult = num(s.multipleOf);
  if (mult && Number.isInteger(mult)) {
    return fc
      .integer({ min: Math.ceil(min / mult), max: Math.min(Math.floor(max / mult), Math.ceil(min / mult) + 1000) })
      .map((k) => k * mult);
  }
  const small = Math.min(max, min + 1000);
  return fc.oneof(
    { weight: 6, arbitrary: fc.integer({ min, max: small }) },
    { weight: 3, arbitrary: fc.integer({ min, max }) },
    { weight: 1, arbitrary: fc.constantFrom(min, max) },
  );
}

function numberArb(s: Schema): Arb<number> {
  const { min, max } = bounds(s, false);
  const imin = Math.ceil(min);
  const imax = Math.floor(max);
  const parts: fc.WeightedArbitrary<number>[] = [
    {
      weight: 3,
      arbitrary: fc.double({ min, max, noNaN: true, noDefaultInfinity: true }).map((x) => (Object.is(x, -0) ? 0 : x)),
    },
    { weight: 1, arbitrary: fc.constantFrom(min, max) },
  ];
  if (imin <= imax)
    parts.push({
      weight: 4,
      arbitrary: fc.integer({ min: Math.max(imin, -MAX_SAFE), max: Math.min(imax, imin + 1000, MAX_SAFE) }),
    });
  if (imin <= imax)
    parts.push({
      weight: 2,
      arbitrary: fc
        .integer({ min: Math.max(imin * 100, -1e12), max: Math.min(imax * 100, imin * 100 + 100000, 1e12) })
        .map((c) => c / 100)
        .filter((x) => x >= min && x <= max),
    });
  return fc.oneof(...parts);
}

// ---------------------------------------------------------------- valid values

const smallJson: Arb<unknown> = fc.jsonValue({ maxDepth: 2 });

export function validArb(s: Schema | boolean, ctx: Ctx, override: Override = noOverride): Arb<unknown> {
  if (s === true) return smallJson;
  if (s === false) return fc.constant(null);
  const o = override(s, ctx);
  if (o) return o;
  if ('const' in s) return fc.constant(s.const);
  if (Array.isArray(s.enum) && s.enum.length) return fc.constantFrom(...s.enum);
  const branches = [...schemaList(s.anyOf), ...schemaList(s.oneOf)];
  if (branches.length) return fc.oneof(...branches.map((b) => validArb(b, ctx, override)));
  const all = schemaList(s.allOf);
  if (all.length) return validArb(mergeAll(s, all), ctx, override);
  const t = types(s);
  if (t.length > 1) return fc.oneof(...t.map((x) => validArb({ ...s, type: x }, ctx, override)));
  switch (t[0]) {
    case 'string':
      return stringArb(s);
    case 'integer':
      return integerArb(s);
    case 'number':
      return numberArb(s);
    case 'boolean':
      return fc.boolean();
    case 'null':
      return fc.constant(null);
    case 'array':
      return arrayArb(s, ctx, override);
    case 'object':
      return objectArb(s, ctx, override);
    default:
      if (s.properties) return objectArb(s, ctx, override);
      return smallJson;
  }
}

function mergeAll(s: Schema, all: Schema[]): Schema {
  const out: Schema = { ...s };
  delete out.allOf;
  const props: Record<string, unknown> = { ...(isPlainObject(s.properties) ? s.properties : {}) };
  const required = new Set<string>(Array.isArray(s.required) ? (s.required as string[]) : []);
  for (const a of all) {
    Object.assign(out, a);
    if (isPlainObject(a.properties)) Object.assign(props, a.properties);
    if (Array.isArray(a.required)) (a.required as string[]).forEach((r) => required.add(r));
  }
  out.properties = props;
  out.required = [...required];
  return out;
}

function arrayArb(s: Schema, ctx: Ctx, override: Override): Arb<unknown[]> {
  const min = num(s.minItems) ?? 0;
  const max = Math.min(num(s.maxItems) ?? min + 5, min + 5);
  const items = isPlainObject(s.items) ? s.items : true;
  return fc.array(validArb(items, { ...ctx, path: [...ctx.path, '0'] }, override), { minLength: min, maxLength: max });
}

function objectArb(s: Schema, ctx: Ctx, override: Override): Arb<Record<string, unknown>> {
  const props = isPlainObject(s.properties) ? s.properties : {};
  const required = Array.isArray(s.required) ? (s.required as string[]) : [];
  const keys = Object.keys(props);
  const model: Record<string, Arb<unknown>> = {};
  for (const k of keys) model[k] = validArb(props[k] as Schema, { ...ctx, path: [...ctx.path, k] }, override);
  for (const r of required) if (!(r in model)) model[r] = smallJson;
  const minProps = num(s.minProperties) ?? 0;
  const optional = keys.filter((k) => !required.includes(k));
  if (minProps > required.length && optional.length < 3) {
    return fc.record(model) as Arb<Record<string, unknown>>;
  }
  const rec = fc.record(model, { requiredKeys: required }) as Arb<Record<string, unknown>>;
  return minProps > 0 ? rec.filter((o) => Object.keys(o).length >= minProps) : rec;
}

// ---------------------------------------------------------------- invalid values

const HUGE_NUMBERS = [
  '1e300',
  '-1e300',
  '1e400',
  '-1e400',
  '18446744073709551616',
  '9223372036854775808',
  '9223372036854775807',
  '-9223372036854775809',
  '9007199254740993',
  '4294967296',
  '2147483648',
  '-2147483649',
  '1e-400',
  '123456789012345678901234567890',
  '0.0000001',
  '-0',
];

/** Strings that are never OK: NULs, controls, lone surrogates, oddities. */
const NASTY_STRINGS = [
  '\u0000',
  'a\u0000b',
  '\u0000'.repeat(8),
  '\u0001\u0002\u0003',
  '\u001b[31mred',
  '\r\n',
  '\t',
  '\u007f',
  '\u0085',
  '\ud800',
  'x\udfffy',
  '\ufffe',
  '\uffff',
  '%00',
  '\\u0000',
  '../../etc/passwd',
  '<script>alert(1)</script>',
  "' OR 1=1 --",
  '${jndi:ldap://x}',
  '{{7*7}}',
  ' ',
  '',
  'null',
  'undefined',
  'NaN',
];

function nastyString(): Arb<string> {
  return fc.oneof(
    { weight: 3, arbitrary: fc.constantFrom(...NASTY_STRINGS) },
    {
      weight: 2,
      arbitrary: fc
        .tuple(
          fc.string({ unit: 'grapheme-ascii', maxLength: 10 }),
          fc.constantFrom(...NASTY_STRINGS),
          fc.string({ unit: 'grapheme-ascii', maxLength: 10 }),
        )
        .map(([a, b, c]) => a + b + c),
    },
    {
      weight: 2,
      arbitrary: fc.string({
        unit: fc.integer({ min: 0, max: 0x1f }).map((c) => String.fromCharCode(c)),
        minLength: 1,
        maxLength: 8,
      }),
    },
  );
}

/** A value of a JSON type the schema does not accept. */
function wrongTypeArb(s: Schema): Arb<Mut> {
  const accepted = acceptedTypes(s);
  const candidates: [string, unknown][] = [
    ['string', 'abc'],
    ['string', ''],
    ['string', '1'],
    ['string', 'true'],
    ['integer', 7],
    ['integer', 0],
    ['integer', -1],
    ['number', 1.5],
    ['boolean', true],
    ['boolean', false],
    ['null', null],
    ['array', []],
    ['array', [1, 'a']],
    ['object', {}],
    ['object', { a: 1 }],
  ];
  const ok = (t: string) => !accepted || accepted.has(t) || (t === 'integer' && accepted.has('number'));
  const wrong = candidates.filter(([t]) => !ok(t));
  if (!wrong.length) return fc.constant({ value: { $wrong: true }, note: 'wrong shape' });
  return fc
    .constantFrom(...wrong)
    .map(([t, v]) => ({ value: structuredClone(v), note: `wrong type (${t} ${JSON.stringify(v)})` }));
}

function invalidString(s: Schema, ctx: Ctx, override: Override): Arb<Mut>[] {
  const min = num(s.minLength) ?? 0;
  const max = num(s.maxLength);
  const out: Arb<Mut>[] = [
    nastyString().map((v) => ({
      value: v,
      note: `string with control/odd characters ${JSON.stringify(v).slice(0, 40)}`,
    })),
  ];
  if (max !== undefined) {
    out.push(
      fc
        .integer({ min: max + 1, max: max + 3 })
        .map((n) => ({ value: 'x'.repeat(n), note: `string of ${n} chars (maxLength ${max})` })),
    );
    out.push(
      fc
        .constantFrom(4096, 70_000)
        .map((n) => ({ value: 'y'.repeat(n), note: `string of ${n} chars (maxLength ${max})` })),
    );
    out.push(
      fc
        .integer({ min: max + 1, max: max + 3 })
        .map((n) => ({ value: '\u{1F600}'.repeat(n), note: `emoji string of ${n} code points (maxLength ${max})` })),
    );
  } else {
    out.push(fc.constantFrom(10_000, 70_000).map((n) => ({ value: 'z'.repeat(n), note: `string of ${n} chars` })));
  }
  if (min > 0)
    out.push(fc.constant({ value: 'a'.repeat(min - 1), note: `string of ${min - 1} chars (minLength ${min})` }));
  if (typeof s.format === 'string') {
    out.push(
      fc
        .constantFrom(
          'not-a-' + s.format,
          '2026-13-45T25:61:61Z',
          '00000000-0000-0000-0000-00000000000g',
          'a@',
          '@b',
          'a@b@c',
          '2026-02-30T00:00:00Z',
          '9999999-01-01T00:00:00Z',
          '2026-01-01',
          '1e3',
        )
        .map((v) => ({ value: v, note: `bad ${String(s.format)} ${JSON.stringify(v)}` })),
    );
  }
  if (Array.isArray(s.enum)) out.push(enumMiss(s.enum));
  if (typeof s.pattern === 'string') {
    out.push(
      fc
        .constantFrom('-leading-dash', 'UPPER', 'has space', 'a\u0000', '\u0007bell', 'ä')
        .map((v) => ({ value: v, note: `breaks pattern ${String(s.pattern)}: ${JSON.stringify(v)}` })),
    );
  }
  // A valid value with a NUL inside: valid length, invalid content.
  out.push(
    validArb(s, ctx, override).map((v) => ({
      value: typeof v === 'string' && v.length ? v.slice(0, -1) + '\u0000' : '\u0000',
      note: 'NUL byte inside an otherwise valid string',
    })),
  );
  return out;
}

function enumMiss(values: unknown[]): Arb<Mut> {
  const strs = values.filter((v): v is string => typeof v === 'string');
  const near = strs
    .flatMap((v) => [v.toUpperCase(), ` ${v}`, `${v} `, `${v}\u0000`, v.slice(0, -1)])
    .filter((v) => !values.includes(v));
  const nums = values.filter((v): v is number => typeof v === 'number').flatMap((n) => [n + 1, n - 1, n + 0.5, -n]);
  const cands = [...near, ...nums.filter((v) => !values.includes(v)), 'definitely-not-a-member', 3, '1'].filter(
    (v) => !values.includes(v),
  );
  return fc
    .constantFrom(...cands)
    .map((v) => ({ value: v, note: `not in enum ${JSON.stringify(values)}: ${JSON.stringify(v)}` }));
}

function invalidNumber(s: Schema, integer: boolean): Arb<Mut>[] {
  const out: Arb<Mut>[] = [
    fc.constantFrom(...HUGE_NUMBERS).map((t) => ({ value: new RawJson(t), note: `number ${t}` })),
  ];
  const min = num(s.minimum);
  const max = num(s.maximum);
  if (min !== undefined)
    out.push(fc.constantFrom(min - 1, min - 1e9, -1e300).map((v) => ({ value: v, note: `${v} below minimum ${min}` })));
  if (max !== undefined)
    out.push(
      fc
        .constantFrom(max + 1, max * 2 + 1, 2 ** 64, 1e300)
        .map((v) => ({ value: v, note: `${v} above maximum ${max}` })),
    );
  if (integer)
    out.push(
      fc.constantFrom(0.5, 1.5, 100.25, 1e-7).map((v) => ({ value: v, note: `fractional ${v} for an integer` })),
    );
  if (Array.isArray(s.enum)) out.push(enumMiss(s.enum));
  return out;
}

function invalidObject(s: Schema, ctx: Ctx, override: Override): Arb<Mut>[] {
  const props = isPlainObject(s.properties) ? s.properties : {};
  const required = Array.isArray(s.required) ? (s.required as string[]) : [];
  const base = objectArb(s, ctx, override);
  const out: Arb<Mut>[] = [];
  if (required.length) {
    out.push(
      fc.tuple(base, fc.constantFrom(...required)).map(([o, k]) => {
        const c = { ...o };
        delete c[k];
        return { value: c, note: `missing required ${k}` };
      }),
    );
  }
  if (s.additionalProperties === false) {
    const names = fc.oneof(
      fc.constantFrom(
        '__proto__',
        'constructor',
        'prototype',
        'id',
        'user_id',
        'role',
        'balance',
        'admin',
        'x\u0000y',
        '',
        ' ',
        '\u{1F600}',
        'a'.repeat(300),
      ),
      fc.string({ unit: 'grapheme-ascii', minLength: 1, maxLength: 12 }).filter((k) => !(k in props)),
    );
    out.push(
      fc.tuple(base, names, smallJson).map(([o, k, v]) => ({
        value: setOwn({ ...o }, k, k === '__proto__' || k === 'constructor' ? { polluted: true, role: 'admin' } : v),
        note: `extra property ${JSON.stringify(k).slice(0, 40)}`,
      })),
    );
  }
  const keys = Object.keys(props);
  if (keys.length) {
    out.push(
      fc.tuple(base, fc.constantFrom(...keys)).chain(([o, k]) =>
        invalidArb(props[k] as Schema, { ...ctx, path: [...ctx.path, k] }, override).map((m) => ({
          value: setOwn({ ...o }, k, m.value),
          note: `${k}: ${m.note}`,
        })),
      ),
    );
    out.push(
      fc.tuple(base, fc.constantFrom(...keys), fc.constantFrom(40, 100, 1000)).map(([o, k, d]) => ({
        value: setOwn({ ...o }, k, new RawJson('['.repeat(d) + ']'.repeat(d))),
        note: `${k}: nested ${d} deep`,
      })),
    );
  }
  const minProps = num(s.minProperties);
  if (minProps) out.push(fc.constant({ value: {}, note: `empty object (minProperties ${minProps})` }));
  return out;
}

/** A value the schema refuses (most of the time: a few probes are merely odd). */
export function invalidArb(s: Schema | boolean, ctx: Ctx, override: Override = noOverride): Arb<Mut> {
  if (typeof s === 'boolean') return fc.constant({ value: { unexpected: true }, note: 'value where none is expected' });
  const parts: Arb<Mut>[] = [wrongTypeArb(s)];
  const branches = [...schemaList(s.anyOf), ...schemaList(s.oneOf)];
  if (branches.length) {
    // Break every branch the same way only when they share a type; else a wrong type is enough.
    const only = branches.filter((b) => types(b).length === 1 && types(b)[0] !== 'null');
    if (only.length === 1) parts.push(...componentInvalid(only[0]!, ctx, override));
  } else {
    parts.push(...componentInvalid(s, ctx, override));
  }
  return fc.oneof(...parts);
}

function componentInvalid(s: Schema, ctx: Ctx, override: Override): Arb<Mut>[] {
  if (Array.isArray(s.enum) && s.enum.length) return [enumMiss(s.enum)];
  const t = types(s)[0] ?? (s.properties ? 'object' : undefined);
  switch (t) {
    case 'string':
      return invalidString(s, ctx, override);
    case 'integer':
      return invalidNumber(s, true);
    case 'number':
      return invalidNumber(s, false);
    case 'boolean':
      return [
        fc
          .constantFrom('true', 'false', 0, 1, 'yes')
          .map((v) => ({ value: v, note: `boolean as ${JSON.stringify(v)}` })),
      ];
    case 'object':
      return invalidObject(s, ctx, override);
    case 'array': {
      const out: Arb<Mut>[] = [];
      const maxItems = num(s.maxItems);
      if (maxItems !== undefined)
        out.push(
          fc.constant({
            value: Array.from({ length: maxItems + 1 }, () => 1),
            note: `${maxItems + 1} items (maxItems ${maxItems})`,
          }),
        );
      if (isPlainObject(s.items))
        out.push(invalidArb(s.items, ctx, override).map((m) => ({ value: [m.value], note: `item: ${m.note}` })));
      return out;
    }
    default:
      return [];
  }
}

// ---------------------------------------------------------------- parameters (text)

/** A parameter text: a string (percent-encoded when sent) or RawText (sent as is). */
export interface ParamMut {
  text: string | RawText;
  note: string;
}

/** Query/path parameter texts that the parameter's schema refuses (or that probe parsing). */
export function invalidParamText(s: Schema): Arb<ParamMut> {
  const t = acceptedTypes(s);
  const isNum = t?.has('integer') || t?.has('number');
  const parts: Arb<ParamMut>[] = [
    nastyString()
      .filter((x) => !x.includes('\ud800') && !x.includes('\udfff'))
      .map((x) => ({ text: x, note: `text ${JSON.stringify(x).slice(0, 40)}` })),
    fc
      .constantFrom('%00', '%', '%zz', '%E0%A4%A', '%ED%A0%80', '%C0%AF', '%FF%FE', '%2F..%2F', '%0A%0D')
      .map((raw) => ({ text: new RawText(raw), note: `raw encoding ${raw}` })),
    fc.constantFrom(201, 4000, 9000).map((n) => ({ text: 'q'.repeat(n), note: `${n}-char value` })),
  ];
  if (isNum) {
    parts.push(
      fc
        .constantFrom(
          'abc',
          '1.5',
          '-1',
          '0',
          '1e3',
          '0x10',
          ' 5',
          '+5',
          '5 ',
          '1_000',
          '\u0663',
          'Infinity',
          'NaN',
          '-0',
          '00000000000000000001',
          ...HUGE_NUMBERS,
        )
        .map((x) => ({ text: x, note: `number text ${JSON.stringify(x)}` })),
    );
    const max = num(s.maximum);
    if (max !== undefined) parts.push(fc.constant({ text: String(max + 1), note: `${max + 1} above maximum ${max}` }));
  }
  if (t?.has('boolean'))
    parts.push(
      fc
        .constantFrom('yes', 'TRUE', '2', 'null', 'on', '')
        .map((x) => ({ text: x, note: `boolean text ${JSON.stringify(x)}` })),
    );
  if (Array.isArray(s.enum)) parts.push(enumMiss(s.enum).map((m) => ({ text: String(m.value), note: m.note })));
  const max = num(s.maxLength);
  if (max !== undefined)
    parts.push(fc.constant({ text: 'm'.repeat(max + 1), note: `${max + 1} chars (maxLength ${max})` }));
  return fc.oneof(...parts);
}
