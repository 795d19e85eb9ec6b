/**
 * API key scopes (docs/authentication.md#scopes). Each route declares the scopes besides read_write
 * that may call it (`config.scopes`); a route that declares none does not start (http/route-rules.ts).
 */
export type Scope = 'read_write' | 'read_only' | 'billing_only';
export const SCOPES: readonly Scope[] = ['read_write', 'read_only', 'billing_only'];

/** Broader scopes rank higher; a key may never mint a key above its own rank. */
export const SCOPE_RANK: Record<Scope, number> = { billing_only: 0, read_only: 1, read_write: 2 };

/** Whether a caller of `scope` may call a route that declared `allowed`: read_write may call every route. */
export function scopePermits(scope: Scope, allowed: readonly Scope[] | undefined): boolean {
  return scope === 'read_write' || (allowed ?? []).includes(scope);
}
