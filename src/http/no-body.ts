import { validation } from '../errors.js';

/**
 * The route schema key that documents a body an operation takes but does not need: Fastify demands a
 * body for a route with a `body` schema, so such a body is checked in the handler (optionalBody) and
 * this key makes it an optional request body in the API document (http/openapi.ts).
 */
export const OPTIONAL_BODY = 'x-optional-body';

/** An enum field of an optional body: its allowed values, or absent. */
export type OptionalFields = Record<string, readonly string[]>;

/**
 * An optional body of enum fields: nothing, null or {} gives {}; an unknown field, a field that is
 * not one of its values, or a body that is not an object is 422 on that field.
 */
export function optionalBody<F extends OptionalFields>(fields: F, body: unknown): { [K in keyof F]?: F[K][number] } {
  if (body === undefined || body === null) return {};
  if (typeof body !== 'object' || Array.isArray(body)) throw validation('body', 'must be a JSON object');
  for (const [field, value] of Object.entries(body)) {
    const allowed = fields[field];
    if (!allowed) throw validation(`body.${field}`, 'is not an allowed field');
    if (typeof value !== 'string' || !allowed.includes(value))
      throw validation(`body.${field}`, `must be one of: ${allowed.join(', ')}`);
  }
  return body as { [K in keyof F]?: F[K][number] };
}

/**
 * For operations that take no body (start, stop, 2FA setup): nothing, null or {} is fine; any field is 422, like an
 * unknown field anywhere.
 */
export function assertNoBody(body: unknown): void {
  if (body === undefined || body === null) return;
  if (typeof body === 'object' && !Array.isArray(body)) {
    const field = Object.keys(body)[0];
    if (field === undefined) return;
    throw validation(`body.${field}`, 'is not an allowed field');
  }
  throw validation('body', 'must be empty: this operation takes no body');
}
