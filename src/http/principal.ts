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

/** Route-level options, declared in each route's `config`. */
/** metrics: an administrator, the metrics token, or (by default) a client on loopback. */
export type AuthMode = 'public' | 'user' | 'admin' | 'metrics';
export type RateBucket = 'login' | 'auth' | 'vm' | 'default';

declare module 'fastify' {
  interface FastifyContextConfig {
    /** Who may call the route (default 'user'). */
    auth?: AuthMode;
    /**
     * Rate-limit bucket (docs/security.md#rate-limits); false for infrastructure routes (health, metrics, docs).
     * Default 'default'.
     */
    rateLimit?: RateBucket | false;
    /** Honours the Idempotency-Key header (docs/errors.md#idempotency-keys). */
    idempotent?: boolean;
    /** Only a signed-in session may call it, never an API key (2FA, password, ending sessions). */
    sessionOnly?: boolean;
    /** Answered with Cache-Control: no-store (set for every route under a private prefix). */
    noStore?: boolean;
  }
  interface FastifyRequest {
    principal?: Principal;
  }
}

export function requirePrincipal(p: Principal | undefined): Principal {
  if (!p) throw new Error('route reached without authentication: its config.auth is wrong');
  return p;
}
