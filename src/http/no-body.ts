import { validation } from '../errors.js';

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
