/**
 * Guards every request's input before validation, so that no value a client
 * can send reaches the database or a recursive walk in a shape they cannot
 * take:
 * - no NUL character anywhere in a body, query string or path parameter
 *   (PostgreSQL text cannot hold one), and no byte-order mark U+FEFF (the
 *   embedded database drops a leading one, so what is stored would differ
 *   from what was sent), passwords aside: 422 naming the field;
 * - JSON bodies nest at most MAX_DEPTH levels (the API's deepest body has 3):
 *   422, instead of a stack overflow in code that walks the body.
 */
import type { FastifyInstance } from 'fastify';
import { validation } from '../errors.js';

export const MAX_DEPTH = 32;

/** Passwords and tokens are only hashed, never stored as text: any character is just a wrong one. */
const HASHED_ONLY = new Set(['password', 'current_password', 'new_password', 'refresh_token', 'challenge_token']);

/** The path of the first string holding a NUL, or null. Iterative: the input may be deep. */
export function findNul(value: unknown, root: string): string | null {
  const stack: [unknown, string][] = [[value, root]];
  while (stack.length) {
    const [v, path] = stack.pop()!;
    if (typeof v === 'string') {
      if ((v.includes('\u0000') || v.includes('\ufeff')) && !HASHED_ONLY.has(path.slice(path.lastIndexOf('.') + 1)))
        return path;
    } else if (Array.isArray(v)) {
      v.forEach((x, i) => stack.push([x, `${path}[${i}]`]));
    } else if (v && typeof v === 'object') {
      for (const [k, x] of Object.entries(v)) {
        if (k.includes('\u0000') || k.includes('\ufeff'))
          // eslint-disable-next-line no-control-regex -- control characters are what this looks for
          return `${path}.${k.replace(/\u0000/g, '\\0').replace(/\ufeff/g, '')}`;
        stack.push([x, `${path}.${k}`]);
      }
    }
  }
  return null;
}

/** How deep a parsed JSON value nests (a scalar is 0). Iterative. */
export function depthOf(value: unknown, limit = Infinity): number {
  let max = 0;
  const stack: [unknown, number][] = [[value, 0]];
  while (stack.length) {
    const [v, d] = stack.pop()!;
    if (v && typeof v === 'object') {
      const next = d + 1;
      if (next > max) max = next;
      if (max > limit) return max;
      for (const x of Array.isArray(v) ? v : Object.values(v)) stack.push([x, next]);
    }
  }
  return max;
}

export function registerInputGuards(app: FastifyInstance): void {
  // Synchronous: a refusal is thrown, which the hook runner turns into the error answer.
  app.addHook('preValidation', (req, reply, done) => {
    // A streamed body (an image upload's range: the request itself, whose object graph has no end) is bytes
    // its route reads: nothing to walk.
    const body = typeof (req.body as { pipe?: unknown } | undefined)?.pipe === 'function' ? undefined : req.body;
    for (const [where, value] of [
      ['path', req.params],
      ['query', req.query],
      ['body', body],
    ] as const) {
      const at = findNul(value, where);
      if (at) throw validation(at, 'must not contain NUL characters or a byte-order mark (U+FEFF)');
    }
    if (body !== undefined && depthOf(body, MAX_DEPTH) > MAX_DEPTH) {
      throw validation('body', `nests deeper than ${MAX_DEPTH} levels`);
    }
    done();
  });
}
