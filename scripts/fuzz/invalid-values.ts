/**
 * fast-check arbitraries of values a JSON schema refuses (each with a note
 * saying what is wrong with it), and of parameter texts that probe parsing.
 */
import fc from 'fast-check';
import {
  type Arb,
  type Ctx,
  type Mut,
  type Override,
  acceptedTypes,
  noOverride,
  num,
  objectArb,
  schemaList,
  smallJson,
  types,
  validArb,
} from './arbitraries.js';
import type { Schema } from './openapi.js';
import { RawJson, RawText, isPlainObject, setOwn } from './values.js';

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
