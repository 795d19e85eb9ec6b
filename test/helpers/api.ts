/**
 * A typed client over the test app, for tests:
 *
 *   const r = await api(t(), u.token).get('/ssh-keys/{key_id}', { params: { key_id: id } });
 *   assert.equal(r.status, 200, r.text);   // narrows r: from here r.body is the 200 body
 *   r.body.fingerprint;                     // typed from the OpenAPI document (src/sdk/schema.ts)
 *
 * Paths, path parameters, query and request bodies are checked against the
 * generated `paths` of the SDK; the answer is a union over the documented
 * statuses of the operation, `{ status, body, headers, text }`, so checking the
 * status (`assert.equal`, `===`, `switch`) gives the body of that status: the
 * operation's own type for a 2xx, ErrorBody (`{detail, code, errors?}`) for an
 * error. Error statuses the document does not list for the operation (a 500, a
 * 404 on a list route...) are typed ErrorBody too: every error answer has that
 * shape, and t().req asserts it.
 *
 * Requests go through t().req, so every answer is still checked for leaked
 * secrets, X-Request-Id, API-Version and the error shape. Deliberately invalid
 * input, the point of many tests, goes in `rawBody` / `rawQuery` (sent as given,
 * not type-checked); the answer is typed all the same.
 *
 * Why not the SDK (GpuCloudClient with a fetch over app.inject)? It would work
 * (the client takes a `fetch` option), but the SDK adds behaviour a test of the
 * API must not have underneath it: it sends its own Idempotency-Key on creates,
 * retries 429 and 5xx, refreshes on a 401; and openapi-fetch types `data` as
 * the union of the 2xx bodies and `error` as the union of the others, not the
 * body of each status. Tests of the SDK itself belong in test/sdk.
 */
import assert from 'node:assert/strict';
import type { components, paths } from '../../src/sdk/schema.js';
import type { ReqOpts, Res, TestApp } from './app.js';

export type Method = 'get' | 'put' | 'post' | 'delete' | 'patch';

/** The paths that have an operation for `M` (for a union of methods: every one of them). */
export type PathsFor<M extends Method> = {
  [P in keyof paths]: paths[P] extends { [K in M]: { responses: unknown } } ? P : never;
}[keyof paths];

/** The operation of `M` on `P`, from src/sdk/schema.ts. */
export type Op<P extends keyof paths, M extends Method> = paths[P][M];

/** The body of an error answer. */
export type ErrorBody = components['schemas']['ErrorResponse'];

type PathParams<O> = O extends { parameters: { path: infer X } } ? X : never;
type QueryOf<O> = O extends { parameters: { query?: infer Q } } ? NonNullable<Q> : never;
type BodyOf<O> = O extends { requestBody: { content: { 'application/json': infer B } } } ? B : never;
type JsonOf<R> = R extends { content: { 'application/json': infer B } } ? B : undefined;

/** The request body of `M` on `P`, e.g. `RequestBody<'/api-keys', 'post'>`. */
export type RequestBody<P extends PathsFor<M>, M extends Method> = BodyOf<Op<P, M>>;

export interface Reply<S extends number, B> {
  status: S;
  /** The parsed JSON body; undefined for an empty or non-JSON answer (see `text`). */
  body: B;
  headers: Res['headers'];
  /** The raw body. */
  text: string;
}

/** Error statuses typed ErrorBody on every route, even where the document does not list them. */
type ErrorStatus = 400 | 401 | 403 | 404 | 405 | 409 | 410 | 413 | 415 | 422 | 429 | 431 | 500 | 502 | 503 | 504;
type Responses<O> = O extends { responses: infer R } ? R : never;
type Documented<R> = { [S in keyof R & number]: Reply<S, JsonOf<R[S]>> }[keyof R & number];
type Undocumented<R> = [Exclude<ErrorStatus, keyof R>] extends [never]
  ? never
  : Reply<Exclude<ErrorStatus, keyof R>, ErrorBody>;

/** Every answer `O` may give, discriminated by `status`. */
export type ReplyOf<O> = O extends unknown ? Documented<Responses<O>> | Undocumented<Responses<O>> : never;

/** The body of the answer with status `S` to `M` on `P`, e.g. `BodyFor<'/ssh-keys', 'post', 201>`. */
export type BodyFor<P extends PathsFor<M>, M extends Method, S extends number> = Extract<
  ReplyOf<Op<P, M>>,
  { status: S }
>['body'];

/** Sent as given; an array value repeats the parameter (`type=a&type=b`). */
type RawQuery = Record<string, string | number | boolean | readonly (string | number | boolean)[]>;

interface CommonOpts {
  /** Sends this credential instead of the client's (a session token or an API key). */
  token?: string;
  headers?: Record<string, string>;
  /** The client's address (default 127.0.0.1). */
  remoteAddress?: string;
}
type ParamOpts<O> = [PathParams<O>] extends [never] ? { params?: never } : { params: PathParams<O> };
type BodyOpts<O> = [BodyOf<O>] extends [never]
  ? { body?: never; rawBody?: unknown }
  : | { body: BodyOf<O>; rawBody?: never }
    | {
        body?: never;
        /** Sent as given (a string as is, anything else as JSON); `undefined` sends no body. */ rawBody: unknown;
      };
type QueryOpts<O> =
  | { query?: QueryOf<O>; rawQuery?: never }
  | { query?: never; /** Sent as given, not type-checked. */ rawQuery: RawQuery };

export type CallOpts<O> = ParamOpts<O> & BodyOpts<O> & QueryOpts<O> & CommonOpts;
/** The options argument: required when the operation has path parameters or a request body. */
type Args<O> = {} extends CallOpts<O> ? [opts?: CallOpts<O>] : [opts: CallOpts<O>];

type Call<M extends Method> = <P extends PathsFor<M>>(path: P, ...args: Args<Op<P, M>>) => Promise<ReplyOf<Op<P, M>>>;

export interface Api {
  /** The credential this client sends (none: anonymous). */
  readonly token: string | undefined;
  get: Call<'get'>;
  post: Call<'post'>;
  put: Call<'put'>;
  patch: Call<'patch'>;
  delete: Call<'delete'>;
  /**
   * Any method, e.g. in a loop: `for (const m of ['get', 'delete'] as const) await c.request(m, '/ssh-keys/{key_id}',
   * ...)`.
   */
  request<M extends Method, P extends PathsFor<M>>(
    method: M,
    path: P,
    ...args: Args<Op<P, M>>
  ): Promise<ReplyOf<Op<P, M>>>;
  /** The same client with another credential (undefined: anonymous). */
  as(token: string | undefined): Api;
}

/** `/ssh-keys/{key_id}` with `{ key_id: 'x y' }` -> `/ssh-keys/x%20y`. */
export function fillPath(path: string, params: Record<string, unknown> = {}): string {
  return path.replace(/\{([^}]+)\}/g, (_, name: string) => {
    if (!(name in params)) throw new Error(`${path}: no value for {${name}}`);
    return encodeURIComponent(String(params[name]));
  });
}

interface LooseOpts extends CommonOpts {
  params?: Record<string, unknown>;
  body?: unknown;
  rawBody?: unknown;
  query?: Record<string, unknown>;
  rawQuery?: RawQuery;
}

function toQuery(q: Record<string, unknown> | undefined): RawQuery | undefined {
  if (!q) return undefined;
  const out: RawQuery = {};
  for (const [k, v] of Object.entries(q)) {
    if (v === undefined) continue;
    // Arrays as one comma-separated value, which the list routes accept.
    out[k] = Array.isArray(v) ? v.join(',') : (v as string | number | boolean);
  }
  return out;
}

/** A typed client for `t`, sending `token` (a session token or an API key; none: anonymous). */
export function api(t: TestApp, token?: string): Api {
  const send = async (method: Method, path: string, o: LooseOpts = {}): Promise<Res> => {
    const credential = o.token ?? token;
    const opts: ReqOpts = {
      ...(credential !== undefined ? { token: credential } : {}),
      ...(o.headers ? { headers: o.headers } : {}),
      ...(o.remoteAddress ? { remoteAddress: o.remoteAddress } : {}),
    };
    const body = 'rawBody' in o ? o.rawBody : o.body;
    if (body !== undefined) opts.body = body;
    const query = o.rawQuery ?? toQuery(o.query);
    if (query) opts.query = query;
    return t.req(method.toUpperCase(), fillPath(path, o.params), opts);
  };
  // The answers are typed by the schema of the route; t.req parsed the JSON.
  const call =
    <M extends Method>(method: M): Call<M> =>
    (path, ...args) =>
      send(method, path, args[0] as LooseOpts | undefined) as Promise<never>;
  return {
    token,
    get: call('get'),
    post: call('post'),
    put: call('put'),
    patch: call('patch'),
    delete: call('delete'),
    request: (method, path, ...args) => send(method, path, args[0] as LooseOpts | undefined) as Promise<never>,
    as: (other) => api(t, other),
  };
}

/** An answer of any client here (typed or t().req's). */
export interface Answer {
  status: number;
  text: string;
  body: unknown;
}

/** Whether `b` has the shape of an error answer's body (t().req checks every error answer has it). */
export function isErrorBody(b: unknown): b is ErrorBody {
  return (
    typeof b === 'object' &&
    b !== null &&
    'detail' in b &&
    typeof b.detail === 'string' &&
    'code' in b &&
    typeof b.code === 'string'
  );
}

/**
 * Asserts an error answer with this status and code (and a detail matching `detail`); from then on `r` has that
 * status and `r.body` is its ErrorBody. `what` names the request in a failure's message.
 */
export function expectError<R extends Answer, S extends number>(
  r: R,
  status: S,
  code: string,
  detail?: RegExp,
  what?: string,
): asserts r is R & { status: S; body: ErrorBody } {
  const say = what ? `${what}: ${r.text}` : r.text;
  assert.equal(r.status, status, say);
  assert.ok(isErrorBody(r.body), say);
  assert.equal(r.body.code, code, say);
  if (detail) assert.match(r.body.detail, detail, say);
}

/** The ErrorBody of an answer, asserting that it is one (whatever its status). */
export function errorBody(r: Answer): ErrorBody {
  assert.ok(isErrorBody(r.body), r.text);
  return r.body;
}

/** The `code` of a body if it has one (an error's), else undefined: for tallies, where any answer may come. */
export function codeOf(body: unknown): unknown {
  return typeof body === 'object' && body !== null && 'code' in body ? body.code : undefined;
}

/** Narrows an answer to its error statuses (400 and up), whose bodies api() types ErrorBody. */
export function isError<R extends { status: number; body: unknown }>(r: R): r is Extract<R, { body: ErrorBody }> {
  return r.status >= 400;
}

/** Asserts the status of an answer (200 unless told) and returns the body of that status. */
export function ok<R extends Answer>(r: R): Extract<R, { status: 200 }>['body'];
export function ok<R extends Answer, S extends R['status']>(r: R, status: S): Extract<R, { status: S }>['body'];
export function ok(r: Answer, status = 200): unknown {
  assert.equal(r.status, status, r.text);
  return r.body;
}

/** Narrows an answer to the one with status `s` (for a filter or an `if`). */
export function hasStatus<R extends { status: number }, S extends number>(r: R, s: S): r is Extract<R, { status: S }> {
  return r.status === s;
}
