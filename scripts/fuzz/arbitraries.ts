/**
 * fast-check arbitraries from JSON schemas (the subset TypeBox and
 * @fastify/swagger produce): values the schema accepts. The values it
 * refuses are in invalid-values.ts.
 */
import fc from 'fast-check';
import type { Schema } from './openapi.js';
import { isPlainObject } from './values.js';

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

export const noOverride: Override = () => undefined;

const MAX_SAFE = Number.MAX_SAFE_INTEGER;

export function num(v: unknown): number | undefined {
  return typeof v === 'number' && Number.isFinite(v) ? v : undefined;
}

export function schemaList(v: unknown): Schema[] {
  return Array.isArray(v) ? v.filter(isPlainObject) : [];
}

export function types(s: Schema): string[] {
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

export const smallJson: Arb<unknown> = fc.jsonValue({ maxDepth: 2 });

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

export function objectArb(s: Schema, ctx: Ctx, override: Override): Arb<Record<string, unknown>> {
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
