/**
 * The served OpenAPI document, reduced to what the fuzzer needs: per
 * operation its parameters, request body and documented responses, with
 * every `$ref` to `#/components/...` resolved.
 */

export type Schema = Record<string, unknown>;

export interface OpenApiDoc {
  openapi: string;
  paths: Record<string, Record<string, unknown>>;
  components?: Record<string, Record<string, unknown>>;
}

export interface Param {
  name: string;
  in: 'path' | 'query' | 'header' | 'cookie';
  required: boolean;
  schema: Schema;
}

export interface ResponseSpec {
  /** The JSON schema of an application/json body, when the document gives one. */
  jsonSchema: Schema | undefined;
  /** Media types the document names for this status (empty: no body). */
  mediaTypes: string[];
}

export interface Operation {
  /** "POST /vms/{vm_id}/start" */
  id: string;
  method: string;
  /** The path template, like /vms/{vm_id}/start */
  path: string;
  pathParams: Param[];
  queryParams: Param[];
  body: { required: boolean; schema: Schema | undefined; mediaTypes: string[] } | undefined;
  /** Keys of `responses`: "200", "4XX", "default", ... */
  responses: Map<string, ResponseSpec>;
  /** True when the operation declares `security: []` (no credentials needed). */
  public: boolean;
}

const METHODS = ['get', 'put', 'post', 'delete', 'patch', 'head', 'options', 'trace'];

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** Follows a local JSON pointer like #/components/schemas/ErrorResponse. */
function pointer(doc: unknown, ref: string): unknown {
  if (!ref.startsWith('#/')) throw new Error(`only local $ref are supported, got ${ref}`);
  let cur: unknown = doc;
  for (const raw of ref.slice(2).split('/')) {
    const key = decodeURIComponent(raw).replace(/~1/g, '/').replace(/~0/g, '~');
    if (!isObject(cur) && !Array.isArray(cur)) throw new Error(`unresolvable $ref ${ref}`);
    cur = (cur as Record<string, unknown>)[key];
  }
  if (cur === undefined) throw new Error(`unresolvable $ref ${ref}`);
  return cur;
}

/**
 * A copy of `value` with every `$ref` replaced by what it points to. Fastify's
 * swagger also names schemas by their `$id` ("ErrorResponse"); a bare name is
 * looked up under components/schemas. Cycles are cut at depth 64.
 */
export function deref(doc: OpenApiDoc, value: unknown, depth = 0): unknown {
  if (depth > 64) return {};
  if (Array.isArray(value)) return value.map((v) => deref(doc, v, depth + 1));
  if (!isObject(value)) return value;
  if (typeof value.$ref === 'string') {
    const ref = value.$ref;
    const target = ref.startsWith('#/') ? pointer(doc, ref) : doc.components?.schemas?.[ref.replace(/#$/, '')];
    if (target === undefined) throw new Error(`unresolvable $ref ${ref}`);
    const { $ref: _ignored, ...rest } = value;
    const resolved = deref(doc, target, depth + 1) as Record<string, unknown>;
    return Object.keys(rest).length ? { ...resolved, ...(deref(doc, rest, depth + 1) as object) } : resolved;
  }
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(value)) out[k] = deref(doc, v, depth + 1);
  return out;
}

export function parseOperations(doc: OpenApiDoc): Operation[] {
  if (!isObject(doc) || !isObject(doc.paths)) throw new Error('not an OpenAPI document: no paths');
  const globalSecurity = (doc as unknown as { security?: unknown[] }).security;
  const ops: Operation[] = [];
  for (const [path, item] of Object.entries(doc.paths)) {
    if (!isObject(item)) continue;
    const shared = Array.isArray(item.parameters) ? item.parameters : [];
    for (const method of METHODS) {
      const raw = item[method];
      if (!isObject(raw)) continue;
      const op = deref(doc, raw) as Record<string, unknown>;
      const params = [...(deref(doc, shared) as unknown[]), ...(Array.isArray(op.parameters) ? op.parameters : [])]
        .filter(isObject)
        .map((p): Param => ({
          name: String(p.name),
          in: p.in as Param['in'],
          required: p.required === true || p.in === 'path',
          schema: isObject(p.schema) ? p.schema : {},
        }));
      let body: Operation['body'];
      if (isObject(op.requestBody)) {
        const content = isObject(op.requestBody.content) ? op.requestBody.content : {};
        const json = Object.entries(content).find(([mt]) => /json/i.test(mt));
        const media = json?.[1];
        body = {
          required: op.requestBody.required === true,
          schema: isObject(media) && isObject(media.schema) ? media.schema : undefined,
          mediaTypes: Object.keys(content),
        };
      }
      const responses = new Map<string, ResponseSpec>();
      for (const [status, r] of Object.entries(isObject(op.responses) ? op.responses : {})) {
        const content = isObject(r) && isObject(r.content) ? r.content : {};
        const json = Object.entries(content).find(([mt]) => /json/i.test(mt));
        const media = json?.[1];
        responses.set(status, {
          jsonSchema: isObject(media) && isObject(media.schema) ? media.schema : undefined,
          mediaTypes: Object.keys(content),
        });
      }
      // A stream (Server-Sent Events) never ends by itself, so it has no single answer to check: left to its own tests.
      if (responses.get('200')?.mediaTypes.includes('text/event-stream')) continue;
      const security = Array.isArray(op.security) ? op.security : globalSecurity;
      ops.push({
        id: `${method.toUpperCase()} ${path}`,
        method: method.toUpperCase(),
        path,
        pathParams: params.filter((p) => p.in === 'path'),
        queryParams: params.filter((p) => p.in === 'query'),
        body,
        responses,
        public: Array.isArray(security) && security.length === 0,
      });
    }
  }
  return ops;
}

/** The documented entry for a status: the exact code, then "4XX", then "default". */
export function documentedResponse(op: Operation, status: number): ResponseSpec | undefined {
  return (
    op.responses.get(String(status)) ??
    op.responses.get(`${String(status)[0]}XX`) ??
    op.responses.get(`${String(status)[0]}xx`) ??
    op.responses.get('default')
  );
}
