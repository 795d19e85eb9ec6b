/** Shared TypeBox schemas: the error body, messages, pagination. */
import { Type, type Static, type TSchema, type TSchemaOptions, type TUnsafe } from 'typebox';
import { ERROR_CODES, type ErrorCode } from '../errors.js';

export const ErrorResponse = Type.Object(
  {
    detail: Type.String({ description: 'Human-readable message' }),
    code: Type.Unsafe<ErrorCode>({
      type: 'string',
      enum: [...ERROR_CODES],
      description:
        'Stable machine-readable code. A later version may add codes: treat an unknown one by its HTTP status',
      examples: ['not_found'],
    }),
    errors: Type.Optional(
      Type.Array(Type.Object({ field: Type.String(), message: Type.String() }), {
        description: 'Present on 422 validation errors: one entry per offending field',
      }),
    ),
  },
  { $id: 'ErrorResponse', description: 'The body of every error response' },
);

export const MessageResponse = Type.Object(
  { message: Type.String() },
  { description: 'A message response', examples: [{ message: 'VM stop requested' }] },
);

/** Schema types that take null as `type: [T, 'null']`. */
const NULLABLE_BY_TYPE = new Set(['string', 'integer', 'number', 'boolean', 'array']);

/**
 * `t` or null. A string, number, boolean or array schema says so in its
 * `type` (`["string", "null"]`, as JSON Schema 2020-12 and OpenAPI 3.1 write
 * it): the response serializer then checks the value's type directly, where
 * with `anyOf` it ran a validator on every value to choose a branch (a VM
 * record has nine such fields), and a request's error names the field's own
 * rule ("must NOT have more than 32 characters", not "... or must be null").
 * An object keeps `anyOf [t, null]`.
 */
export const Nullable = <T extends TSchema>(t: T, opts: TSchemaOptions = {}): TUnsafe<Static<T> | null> => {
  const type = (t as { type?: unknown }).type;
  return typeof type === 'string' && NULLABLE_BY_TYPE.has(type)
    ? Type.Unsafe<Static<T> | null>({ ...t, ...opts, type: [type, 'null'] })
    : Type.Unsafe<Static<T> | null>(Type.Union([t, Type.Null()], opts));
};

export const DateTime = (description?: string) =>
  Type.String({ format: 'date-time', ...(description ? { description } : {}) });

/**
 * The control (Cc) and formatting (Cf) characters of the Basic Multilingual
 * Plane, written as `\uXXXX` ranges rather than `\p{Cc}\p{Cf}`: property
 * escapes need the regular expression `u` flag, which many validators and
 * client generators do not use, while `\uXXXX` reads the same in every
 * ECMA-262 engine. Written out (Unicode 15.1) so the document does not change
 * with the Node.js version; a test checks it still covers every such character.
 */
export const CONTROL_CHARS = '\\u0000-\\u001F\\u007F-\\u009F';
export const FORMAT_CHARS =
  '\\u00AD\\u0600-\\u0605\\u061C\\u06DD\\u070F\\u0890-\\u0891\\u08E2\\u180E\\u200B-\\u200F\\u202A-\\u202E\\u2060-\\u2064\\u2066-\\u206F\\uFEFF\\uFFF9-\\uFFFB';
/**
 * Text a person names things with: no control characters (an escape sequence
 * in a key's name would reach the CLI's terminal) and no invisible formatting
 * ones (a right-to-left override would disguise it).
 */
export const NO_CONTROL = `^[^${CONTROL_CHARS}${FORMAT_CHARS}]*$`;

/** Text without control characters (a person's name may hold emoji joiners and other formatting characters). */
export const NO_CONTROL_CC = `^[^${CONTROL_CHARS}]*$`;

/** Lists take `limit` 1..100 (default 50) and `offset` >= 0 (default 0). */
export const PaginationQuery = {
  limit: Type.Optional(
    Type.Integer({ minimum: 1, maximum: 100, default: 50, description: 'Page size, 1..100 (default 50)' }),
  ),
  offset: Type.Optional(
    Type.Integer({
      minimum: 0,
      maximum: Number.MAX_SAFE_INTEGER,
      default: 0,
      description: 'Items to skip (default 0)',
    }),
  ),
};

export interface Page {
  limit: number;
  offset: number;
}

/**
 * The page a query asks for. The validator fills in the defaults, but the
 * parameters are optional in the document (a client need not send them), so
 * their types are too.
 */
export function paging(q: { limit?: number; offset?: number }): Page {
  return { limit: q.limit ?? 50, offset: q.offset ?? 0 };
}

/** `paging` as positional arguments: `list(userId, ...pageArgs(req.query))`. */
export function pageArgs(q: { limit?: number; offset?: number }): [limit: number, offset: number] {
  const p = paging(q);
  return [p.limit, p.offset];
}

/**
 * The error responses every operation shares, documented once under
 * `components.responses` and referenced by name. A route lists the statuses
 * it can answer with `errorResponses(...)`; the document then points each at
 * its shared response (see `sharedResponseRefs` in openapi.ts).
 */
export const SHARED_ERROR_RESPONSES = {
  BadRequest: {
    status: 400,
    description:
      'Not possible in the current state, or a malformed body (codes: invalid_state, conflict, limit_exceeded, insufficient_balance, gpu_unavailable, malformed_json, ...)',
  },
  MalformedRequest: {
    status: 400,
    description:
      'The body is not valid JSON, or Content-Length does not match it (code: malformed_json). A request that is not valid HTTP (a raw byte outside ASCII in the path, a body that cannot be framed) is 400 too, with code validation_error, and its connection is closed',
  },
  Unauthorized: { status: 401, description: 'Missing, expired or invalid credentials (code: unauthorized)' },
  Forbidden: {
    status: 403,
    description: 'Authenticated but not allowed: key scope, role or suspended account (code: forbidden)',
  },
  NotFound: { status: 404, description: 'Not found, or not yours (code: not_found)' },
  PayloadTooLarge: { status: 413, description: 'The body is over 64 KiB (code: payload_too_large)' },
  UnsupportedMediaType: {
    status: 415,
    description: 'A body sent with a Content-Type other than application/json (code: unsupported_media_type)',
  },
  ValidationFailed: {
    status: 422,
    description:
      'Validation error; `errors` names each offending field (codes: validation_error, idempotency_mismatch)',
  },
  RateLimited: {
    status: 429,
    description: "Rate limit exceeded: retry after the Retry-After header's seconds (code: rate_limited)",
  },
  HeadersTooLarge: {
    status: 431,
    description: 'The request headers are over 16 KiB (code: validation_error); the connection is closed',
  },
  NotReady: { status: 503, description: 'Not ready to serve: the database cannot be reached or is not migrated' },
} as const;

export type SharedErrorResponse = keyof typeof SHARED_ERROR_RESPONSES;

/** The shared response a route's status stands for (a route's own 400 means more than a malformed body). */
const BY_STATUS: Record<number, SharedErrorResponse> = {
  400: 'BadRequest',
  401: 'Unauthorized',
  403: 'Forbidden',
  404: 'NotFound',
  413: 'PayloadTooLarge',
  415: 'UnsupportedMediaType',
  422: 'ValidationFailed',
  429: 'RateLimited',
  431: 'HeadersTooLarge',
  503: 'NotReady',
};

function errorRef(name: SharedErrorResponse): TSchema {
  return Type.Ref('ErrorResponse', { description: SHARED_ERROR_RESPONSES[name].description }) as TSchema;
}

/** Response schemas for the error statuses a route can return. */
export function errorResponses(...statuses: number[]): Record<number, TSchema> {
  const out: Record<number, TSchema> = {};
  for (const s of statuses) {
    const name = BY_STATUS[s];
    if (!name) throw new Error(`No shared error response for status ${s}`);
    out[s] = errorRef(name);
  }
  return out;
}

/**
 * Answers the framework gives before a handler runs, which any operation can
 * get: 422 (a NUL in the query or path, a body where none belongs), 431
 * (headers too large), and for methods that carry a body 400 (malformed
 * JSON), 413 (over 64 KiB) and 415 (not JSON). Added to every documented
 * operation that does not list them already.
 */
export function frameworkResponses(method: string): Record<number, TSchema> {
  const withBody = ['POST', 'PUT', 'PATCH', 'DELETE'].includes(method.toUpperCase());
  const names: SharedErrorResponse[] = withBody
    ? ['MalformedRequest', 'PayloadTooLarge', 'UnsupportedMediaType', 'ValidationFailed', 'HeadersTooLarge']
    : ['ValidationFailed', 'HeadersTooLarge'];
  return Object.fromEntries(names.map((n) => [SHARED_ERROR_RESPONSES[n].status, errorRef(n)]));
}

/** A list answer: a bare array, with the total in X-Total-Count. */
export function page<T>(reply: { header(k: string, v: string): unknown }, r: { items: T[]; total: number }): T[] {
  reply.header('X-Total-Count', String(r.total));
  return r.items;
}

/** Path ids that are not UUIDs can never exist: 404 without asking the database. */
export const UuidParam = (name: string) => Type.Object({ [name]: Type.String({ description: 'Resource id (uuid)' }) });

/** A closed set of string or integer values, typed as their union (and a plain `enum` in the OpenAPI document). */
export const Enum = <T extends string | number>(values: readonly T[], description?: string) =>
  Type.Unsafe<T>({
    type: typeof values[0] === 'number' ? 'integer' : 'string',
    enum: [...values],
    ...(description ? { description } : {}),
  });
