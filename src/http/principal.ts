/** Who is asking: set by the authentication hook on every authenticated request. */
import type { Scope } from './scopes.js';
import type { Role } from '../accounts.js';

export interface Principal {
  userId: number;
  email: string;
  role: Role;
  scope: Scope;
  via: 'session' | 'api_key';
  /** The session (refresh-token family) a JWT belongs to. */
  sessionId?: string;
  apiKeyId?: string;
}

/**
 * Route-level options, declared in each route's `config`: `auth`, `cache` and (unless public) `scopes` on
 * every route, checked when the app starts (http/route-rules.ts).
 */
/** metrics: an administrator, the metrics token, or (by default) a client on loopback. */
export type AuthMode = 'public' | 'user' | 'admin' | 'metrics';
export type RateBucket = 'login' | 'auth' | 'vm' | 'default';

declare module 'fastify' {
  interface FastifyContextConfig {
    /** Who may call the route. Required on every route. */
    auth?: AuthMode;
    /**
     * The API-key scopes besides read_write that may call the route (docs/authentication.md#scopes); [] = read_write
     * only. Required unless auth is 'public'.
     */
    scopes?: readonly ('read_only' | 'billing_only')[];
    /**
     * 'no-store': every answer of the route, errors too, carries Cache-Control: no-store (anything private or
     * per-caller). 'public': the hook adds nothing (the handler may set its own, e.g. the JWKS's max-age). Required on
     * every route.
     */
    cache?: 'no-store' | 'public';
    /**
     * false: answered without catching up with the manual clock first (health, metrics, docs, console files).
     * Default true.
     */
    readsTime?: boolean;
    /**
     * Rate-limit bucket (docs/security.md#rate-limits); false for infrastructure routes (health, metrics, docs).
     * Default 'default'.
     */
    rateLimit?: RateBucket | false;
    /** Honours the Idempotency-Key header (docs/errors.md#idempotency-keys). */
    idempotent?: boolean;
    /** Only a signed-in session may call it, never an API key (2FA, password, ending sessions). */
    sessionOnly?: boolean;
  }
  interface FastifyRequest {
    principal?: Principal;
  }
}

export function requirePrincipal(p: Principal | undefined): Principal {
  if (!p) throw new Error('route reached without authentication: its config.auth is wrong');
  return p;
}
