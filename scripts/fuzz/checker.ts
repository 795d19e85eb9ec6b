/**
 * Checks each response against the document: no 5xx, a status the operation
 * documents, and a JSON body that matches the documented schema.
 */
import { Ajv2020, type ErrorObject, type ValidateFunction } from 'ajv/dist/2020.js';
import addFormatsModule from 'ajv-formats';
import { documentedResponse, type Operation } from './openapi.js';
import type { RawResponse } from './http.js';
import { snippet } from './values.js';

// ajv-formats is CommonJS; its default export arrives wrapped under ESM.
const addFormats = ((addFormatsModule as unknown as { default?: typeof addFormatsModule }).default ??
  addFormatsModule) as unknown as (ajv: Ajv2020) => Ajv2020;

export const FAILURE_KINDS = ['5xx', 'undocumented', 'schema_mismatch'] as const;
export type FailureKind = (typeof FAILURE_KINDS)[number];

export interface Failure {
  kind: FailureKind;
  op: string;
  method: string;
  /** Path and query as sent (shortened). */
  url: string;
  status: number;
  identity: string;
  /** valid, or what was made invalid. */
  input: string;
  requestBody: string;
  response: string;
  /** Schema errors, for schema_mismatch. */
  detail: string;
  seq: number;
  /** Groups failures of the same cause: kind, operation, status, first schema error. */
  group: string;
}

export interface SentRequest {
  seq: number;
  op: Operation;
  method: string;
  url: string;
  identity: string;
  input: string;
  bodyText: string;
}

export class Checker {
  private readonly ajv: Ajv2020;
  private readonly cache = new Map<string, ValidateFunction | null>();
  readonly counts: Record<FailureKind, number> = { '5xx': 0, undocumented: 0, schema_mismatch: 0 };
  readonly failures: Failure[] = [];
  /** Statuses seen per operation, for the coverage line. */
  readonly seen = new Map<string, Map<number, number>>();
  checked = 0;

  constructor(private readonly maxStored = 2000) {
    this.ajv = new Ajv2020({ strict: false, allErrors: true, validateSchema: false, validateFormats: true });
    addFormats(this.ajv);
  }

  private validator(op: Operation, status: number): ValidateFunction | null {
    const key = `${op.id} ${status}`;
    if (this.cache.has(key)) return this.cache.get(key)!;
    const spec = documentedResponse(op, status);
    let fn: ValidateFunction | null = null;
    if (spec?.jsonSchema) fn = this.ajv.compile(stripIds(spec.jsonSchema) as object);
    this.cache.set(key, fn);
    return fn;
  }

  /** Checks one response; returns the failures it caused (also recorded). */
  check(req: SentRequest, res: RawResponse): Failure[] {
    this.checked++;
    const perOp = this.seen.get(req.op.id) ?? new Map<number, number>();
    perOp.set(res.status, (perOp.get(res.status) ?? 0) + 1);
    this.seen.set(req.op.id, perOp);
    const text = res.body.toString('utf8');
    const fail = (kind: FailureKind, detail: string, groupExtra = ''): Failure => ({
      kind,
      op: req.op.id,
      method: req.method,
      url: req.url.length > 200 ? `${req.url.slice(0, 200)}... (${req.url.length} chars)` : req.url,
      status: res.status,
      identity: req.identity,
      input: req.input,
      requestBody: snippet(req.bodyText, 200),
      response: res.error ? res.error : snippet(text, 300),
      detail,
      seq: req.seq,
      group: `${kind}|${req.op.id}|${res.status}|${groupExtra}`,
    });
    const out: Failure[] = [];
    if (res.status === 0 || res.status >= 500) {
      out.push(fail('5xx', res.error ? `no response: ${res.error}` : '', res.error ? 'no-response' : errorCode(text)));
    } else {
      const spec = documentedResponse(req.op, res.status);
      if (!spec) {
        out.push(fail('undocumented', `documented: ${[...req.op.responses.keys()].join(', ')}`, errorCode(text)));
      } else {
        const problem = this.schemaProblem(req.op, res, text, spec.mediaTypes);
        if (problem)
          out.push(fail('schema_mismatch', problem, problem.split('\n')[0]!.replace(/\/\d+(?=\/|$| )/g, '/N')));
      }
    }
    for (const f of out) {
      this.counts[f.kind]++;
      if (this.failures.length < this.maxStored) this.failures.push(f);
    }
    return out;
  }

  private schemaProblem(op: Operation, res: RawResponse, text: string, mediaTypes: string[]): string | undefined {
    const fn = this.validator(op, res.status);
    // No schema: an empty body is promised only by a response without content (204).
    if (!fn)
      return mediaTypes.length === 0 && res.status === 204 && text.length > 0
        ? `a body where the document promises none: ${snippet(text, 80)}`
        : undefined;
    const ct = String(res.headers['content-type'] ?? '');
    if (!/json/i.test(ct)) return `Content-Type ${JSON.stringify(ct)} where the document promises application/json`;
    let body: unknown;
    try {
      body = JSON.parse(text);
    } catch (e) {
      return `body is not JSON: ${(e as Error).message}`;
    }
    if (fn(body)) return undefined;
    return formatErrors(fn.errors ?? [], body);
  }
}

function errorCode(text: string): string {
  try {
    const v = JSON.parse(text) as { code?: unknown };
    return typeof v.code === 'string' ? v.code : '';
  } catch {
    return '';
  }
}

/** `$id`s inside the document's schemas would clash when two operations share one. */
function stripIds(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(stripIds);
  if (v && typeof v === 'object') {
    const out: Record<string, unknown> = {};
    for (const [k, x] of Object.entries(v)) if (k !== '$id') out[k] = stripIds(x);
    return out;
  }
  return v;
}

function at(body: unknown, pointer: string): unknown {
  let cur = body;
  for (const p of pointer.split('/').filter(Boolean)) {
    if (cur === null || typeof cur !== 'object') return undefined;
    cur = (cur as Record<string, unknown>)[p.replace(/~1/g, '/').replace(/~0/g, '~')];
  }
  return cur;
}

function formatErrors(errors: ErrorObject[], body: unknown): string {
  // anyOf reports every branch; the deepest, non-anyOf errors say the most.
  const useful = errors.filter((e) => e.keyword !== 'anyOf' && e.keyword !== 'oneOf');
  const list = (useful.length ? useful : errors).slice(0, 4);
  return list
    .map((e) => {
      const value = at(body, e.instancePath);
      const shown = value === undefined ? '' : ` (got ${snippet(JSON.stringify(value) ?? 'undefined', 80)})`;
      return `${e.instancePath || '/'} ${e.message ?? e.keyword}${shown}`;
    })
    .join('\n');
}
