/**
 * Request validation with Ajv: bodies are validated strictly (no type coercion,
 * unknown fields rejected); query strings and path parameters coerce
 * strings to the declared types. Errors become the 422 answer's `errors` list.
 */
import { Ajv, type ErrorObject, type ValidateFunction } from 'ajv';
import addFormatsModule from 'ajv-formats';
import type { FastifySchemaCompiler } from 'fastify';
import type { FieldError } from '../errors.js';
import { NO_CONTROL, NO_CONTROL_CC } from './schemas.js';

// ajv-formats is CommonJS; its default export arrives wrapped under ESM.
const addFormats = ((addFormatsModule as unknown as { default?: typeof addFormatsModule }).default ??
  addFormatsModule) as unknown as (ajv: Ajv) => Ajv;

function makeAjv(coerce: boolean): Ajv {
  const ajv = new Ajv({
    allErrors: true,
    coerceTypes: coerce ? 'array' : false,
    useDefaults: true,
    removeAdditional: false,
    strict: false,
  });
  addFormats(ajv);
  return ajv;
}

const bodyAjv = makeAjv(false);
const queryAjv = makeAjv(true);

/** The plain decimal forms a query or path value may take for Ajv to coerce it to a number. */
const STRICT_FORM: Record<string, RegExp> = {
  integer: /^-?\d+$/,
  number: /^-?\d+(\.\d+)?$/,
};

/** A top-level integer or number property of a query string or path, and the form its value must have. */
interface NumberProperty {
  name: string;
  type: 'integer' | 'number';
  form: RegExp;
}

/** The integer and number properties of a query or path schema, found once when the route is compiled. */
function numberProperties(schema: { properties?: Record<string, { type?: unknown }> }): NumberProperty[] {
  const out: NumberProperty[] = [];
  for (const [name, prop] of Object.entries(schema.properties ?? {})) {
    const type = prop?.type;
    if (type === 'integer' || type === 'number') out.push({ name, type, form: STRICT_FORM[type]! });
  }
  return out;
}

/**
 * Ajv coerces any string JavaScript reads as a number (`1e3`, `0x10`, ` 5 `),
 * so `?limit=1e1` or `/users/0x1` would pass. Top-level integer and number
 * properties of a query string or path must be written in plain decimal; this
 * finds the ones that are not, before Ajv coerces them.
 */
function looseNumbers(props: NumberProperty[], data: unknown): ErrorObject[] {
  if (props.length === 0 || data === null || typeof data !== 'object') return [];
  let out: ErrorObject[] | undefined;
  for (const { name, type, form } of props) {
    const value = (data as Record<string, unknown>)[name];
    if (typeof value !== 'string' || form.test(value)) continue;
    (out ??= []).push({
      instancePath: `/${name.replace(/~/g, '~0').replace(/\//g, '~1')}`,
      schemaPath: `#/properties/${name}/type`,
      keyword: 'type',
      params: { type },
      message: `must be ${type === 'integer' ? 'an integer' : 'a number'} in plain decimal digits`,
    });
  }
  return out ?? [];
}

export const validatorCompiler: FastifySchemaCompiler<unknown> = ({ schema, httpPart }) => {
  if (httpPart === 'body') return bodyAjv.compile(schema as object) as ValidateFunction;
  const validate = queryAjv.compile(schema as object);
  const props = numberProperties(schema as { properties?: Record<string, { type?: unknown }> });
  const strict = (data: unknown): boolean => {
    const loose = looseNumbers(props, data);
    const ok = validate(data);
    strict.errors = loose.length ? [...loose, ...(validate.errors ?? [])] : validate.errors;
    return ok && loose.length === 0;
  };
  strict.errors = null as ErrorObject[] | null | undefined;
  return strict;
};

/** Patterns whose regular expression would mean nothing to a person, said in words. */
const PATTERN_MESSAGES: Record<string, string> = {
  [NO_CONTROL]: 'must not contain control characters or invisible formatting characters',
  [NO_CONTROL_CC]: 'must not contain control characters',
};

const PART_NAME: Record<string, string> = { body: 'body', querystring: 'query', params: 'path', headers: 'header' };

/** Turns Ajv errors into field errors such as `{field: "body.gpu_count", message: "..."}`. */
export function fieldErrors(errors: ErrorObject[], httpPart: string | undefined): FieldError[] {
  const part = PART_NAME[httpPart ?? 'body'] ?? httpPart ?? 'body';
  const out: FieldError[] = [];
  const seen = new Set<string>();
  for (const e of errors) {
    let path = e.instancePath
      .split('/')
      .filter(Boolean)
      .map((s) => s.replace(/~1/g, '/').replace(/~0/g, '~'))
      .join('.');
    let message = e.message ?? 'is invalid';
    if (e.keyword === 'required') {
      path = [path, (e.params as { missingProperty: string }).missingProperty].filter(Boolean).join('.');
      message = 'is required';
    } else if (e.keyword === 'additionalProperties') {
      path = [path, (e.params as { additionalProperty: string }).additionalProperty].filter(Boolean).join('.');
      message = 'is not an allowed field';
    } else if (e.keyword === 'enum') {
      message = `must be one of ${(e.params as { allowedValues: unknown[] }).allowedValues.map((v) => JSON.stringify(v)).join(', ')}`;
    } else if (e.keyword === 'pattern' && PATTERN_MESSAGES[(e.params as { pattern: string }).pattern]) {
      message = PATTERN_MESSAGES[(e.params as { pattern: string }).pattern]!;
    } else if (e.keyword === 'type' && Array.isArray((e.params as { type: unknown }).type)) {
      message = `must be ${(e.params as { type: string[] }).type.join(' or ')}`;
    } else if (e.keyword === 'const') {
      message = `must be ${JSON.stringify((e.params as { allowedValue: unknown }).allowedValue)}`;
    } else if (e.keyword === 'anyOf' || e.keyword === 'oneOf') {
      // the branch errors say more; keep this one only if nothing else names the field
      if (errors.some((o) => o !== e && o.instancePath === e.instancePath && o.keyword !== e.keyword)) continue;
      message = 'does not match any allowed form';
    }
    const field = path ? `${part}.${path}` : part;
    const key = `${field}|${message}`;
    if (seen.has(key)) continue;
    seen.add(key);
    out.push({ field, message });
  }
  // Several branch errors for one field (from anyOf) read best joined.
  const byField = new Map<string, string[]>();
  for (const f of out) byField.set(f.field, [...(byField.get(f.field) ?? []), f.message]);
  return [...byField.entries()].map(([field, msgs]) => ({ field, message: msgs.join(' or ') }));
}
