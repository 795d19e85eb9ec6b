/**
 * API key scopes (docs/authentication.md#scopes), decided from the method and the route path
 * alone, so that every route, present and future, is covered by one rule.
 */
export type Scope = 'read_write' | 'read_only' | 'billing_only';
export const SCOPES: readonly Scope[] = ['read_write', 'read_only', 'billing_only'];

/** Broader scopes rank higher; a key may never mint a key above its own rank. */
export const SCOPE_RANK: Record<Scope, number> = { billing_only: 0, read_only: 1, read_write: 2 };

/**
 * read_only: every GET of /vms, /images, /ssh-keys, /reservations, /billing, /account, /events, plus
 * search and pricing.
 */
const READ_ONLY_PREFIXES = ['/vms', '/images', '/ssh-keys', '/reservations', '/billing', '/account', '/events'];
const READ_ONLY_EXACT = ['/search', '/pricing'];

const under = (path: string, prefix: string) => path === prefix || path.startsWith(prefix + '/');

/** `routePath` is the route's pattern (e.g. `/vms/:vm_id`), never the raw URL. */
export function scopeAllows(scope: Scope, method: string, routePath: string): boolean {
  const m = method.toUpperCase();
  const isRead = m === 'GET' || m === 'HEAD';
  switch (scope) {
    case 'read_write':
      return true;
    case 'read_only':
      return isRead && (READ_ONLY_EXACT.includes(routePath) || READ_ONLY_PREFIXES.some((p) => under(routePath, p)));
    case 'billing_only':
      return (
        (isRead && (under(routePath, '/billing') || routePath === '/account')) ||
        (m === 'POST' && routePath === '/reservations/calculate')
      );
  }
}
