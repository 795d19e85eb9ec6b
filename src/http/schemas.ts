/** Shared TypeBox schemas: errors, messages, pagination (D1, D3). */
import { Type, type TSchema, type TSchemaOptions } from 'typebox';

export const ErrorResponse = Type.Object(
  {
    detail: Type.String({ description: 'Human-readable message' }),
    code: Type.String({
      description: 'Stable machine-readable code (CONTRACT D1)',
      examples: ['not_found'],
    }),
    errors: Type.Optional(
      Type.Array(Type.Object({ field: Type.String(), message: Type.String() }), {
        description: 'Present on 422 validation errors: one entry per offending field',
      }),
    ),
  },
  { $id: 'ErrorResponse', description: 'Every error response (CONTRACT D1)' },
);

export const MessageResponse = Type.Object(
  { message: Type.String() },
  { description: 'A message response', examples: [{ message: 'VM stop requested' }] },
);

export const Nullable = <T extends TSchema>(t: T, opts: TSchemaOptions = {}) => Type.Union([t, Type.Null()], opts);

export const DateTime = (description?: string) => Type.String({ format: 'date-time', ...(description ? { description } : {}) });

/** D3: `limit` 1..100 (default 50), `offset` >= 0 (default 0). */
/**
 * Text a person names things with: no control characters (an escape sequence
 * in a key's name would reach the CLI's terminal) and no invisible formatting
 * ones (a right-to-left override would disguise it).
 */
export const NO_CONTROL = '^[^\\p{Cc}\\p{Cf}]*$';

export const PaginationQuery = {
  limit: Type.Integer({ minimum: 1, maximum: 100, default: 50, description: 'Page size, 1..100 (default 50)' }),
  offset: Type.Integer({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER, default: 0, description: 'Items to skip (default 0)' }),
};

export interface Page {
  limit: number;
  offset: number;
}

const ERROR_DESCRIPTIONS: Record<number, string> = {
  400: 'Invalid request for the current state (codes: invalid_state, conflict, limit_exceeded, malformed_json, ...)',
  401: 'Missing or invalid credentials (code: unauthorized)',
  403: 'Authenticated but not allowed: scope, role or suspended account (code: forbidden)',
  404: 'Not found, or not yours (code: not_found)',
  413: 'Body over 64 KiB (code: payload_too_large)',
  415: 'Body sent with a Content-Type other than application/json (code: unsupported_media_type)',
  422: 'Validation error; `errors` names each field (codes: validation_error, idempotency_mismatch)',
  429: 'Rate limit exceeded; see Retry-After (code: rate_limited)',
  431: 'Request headers too large (code: validation_error); the connection is closed',
  503: 'Not ready',
};

/** Response schemas for the error statuses a route can return. */
export function errorResponses(...statuses: number[]): Record<number, TSchema> {
  const out: Record<number, TSchema> = {};
  for (const s of statuses) out[s] = Type.Ref('ErrorResponse', { description: ERROR_DESCRIPTIONS[s] ?? 'Error' }) as TSchema;
  return out;
}

/**
 * Answers the framework gives before a handler runs, which any operation can
 * get: 422 (a NUL in the query or path, a body where none belongs), 431
 * (headers too large), and for methods that carry a body 400 (malformed
 * JSON), 413 (over 64 KiB) and 415 (not JSON). Added to every documented
 * operation that does not list them already.
 */
export function frameworkResponses(method: string): number[] {
  const withBody = ['POST', 'PUT', 'PATCH', 'DELETE'].includes(method.toUpperCase());
  return withBody ? [400, 413, 415, 422, 431] : [422, 431];
}

/** D3: a bare array with the total in X-Total-Count. */
export function page<T>(reply: { header(k: string, v: string): unknown }, r: { items: T[]; total: number }): T[] {
  reply.header('X-Total-Count', String(r.total));
  return r.items;
}

/** Path ids that are not UUIDs can never exist: 404 without asking the database. */
export const UuidParam = (name: string) => Type.Object({ [name]: Type.String({ description: 'Resource id (uuid)' }) });

/** A closed set of string or integer values, typed as their union (and a plain `enum` in the OpenAPI document). */
export const Enum = <T extends string | number>(values: readonly T[], description?: string) =>
  Type.Unsafe<T>({ type: typeof values[0] === 'number' ? 'integer' : 'string', enum: [...values], ...(description ? { description } : {}) });
