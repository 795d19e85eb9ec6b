/**
 * Authentication and authorization hooks. For every route whose config.auth
 * is not 'public': Bearer JWT or `gpc_` API key -> request.principal; then
 * (after the rate limiter has counted the request) 401 / 403 for missing
 * credentials, suspension, role and scope (docs/authentication.md, docs/security.md#what-each-credential-may-do).
 * A valid token or key never touches a password hash.
 */
import { wasForwarded } from './client-address.js';
import { sameSecret } from '../crypto.js';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { AppError, forbidden } from '../errors.js';
import type { Principal } from './principal.js';
import { scopePermits } from './scopes.js';

declare module 'fastify' {
  interface FastifyRequest {
    authFailure?: string;
  }
}

export function isPublic(req: FastifyRequest): boolean {
  return !req.routeOptions.url || (req.routeOptions.config.auth ?? 'user') === 'public';
}

/** Who a credential names, with the account's suspension. */
export type Identified = Principal & { suspended: boolean };

/** The caller a credential names, or why it names none (an API key, else an access token). */
export type Identify = (credential: string) => Promise<Identified | string>;

/**
 * Identify for many credentials at once, for connections that outlive their request (an event
 * stream): straight from the database, never from remembered answers. Each credential maps to who
 * it names now, or to why it stopped working: revoked (a revoked key, an ended session, a user
 * gone) or expired (by the service clock).
 */
export type Recheck = (credentials: readonly string[]) => Promise<Map<string, Identified | 'revoked' | 'expired'>>;

/** The credential of an `Authorization: Bearer <credential>` header, or undefined. */
export function bearerOf(header: string | undefined): string | undefined {
  return /^Bearer\s+(\S+)\s*$/i.exec(header ?? '')?.[1];
}

async function principalFrom(header: string, identify: Identify): Promise<Identified | string> {
  const credential = bearerOf(header);
  if (credential === undefined) return 'Authorization header must be "Bearer <token or API key>"';
  return identify(credential);
}

/** Runs first: identifies the caller, never rejects (so the rate limiter can count failures by IP). */
export function registerAuthentication(app: FastifyInstance, identify: Identify): void {
  app.addHook('onRequest', (req, reply, done) => {
    if (isPublic(req)) return done();
    const header = req.headers.authorization;
    if (!header) {
      req.authFailure = 'Missing credentials: send "Authorization: Bearer <token or API key>"';
      return done();
    }
    principalFrom(header, identify).then((p) => {
      if (typeof p === 'string') req.authFailure = p;
      else req.principal = p;
      done();
    }, done);
  });
}

/** Who may read /metrics besides an administrator. */
export interface MetricsAccess {
  /** A token for scrapers (GPUCLOUD_METRICS_TOKEN), sent as a Bearer token. */
  token: string | undefined;
  /** Clients on this machine's loopback need no credentials (GPUCLOUD_METRICS_LOOPBACK). */
  loopback: boolean;
}

const LOOPBACK = /^(127\.\d+\.\d+\.\d+|::1|::ffff:127\.\d+\.\d+\.\d+)$/;

/** Whether the metrics token or the loopback rule lets `req` read /metrics without an account. */
export function metricsAllowed(req: FastifyRequest, access: MetricsAccess): boolean {
  // Only a client on this machine itself: a proxy on this machine forwards others, and says so in a header.
  if (access.loopback && LOOPBACK.test(req.socket.remoteAddress ?? '') && !wasForwarded(req.raw)) return true;
  const credential = bearerOf(req.headers.authorization);
  if (!access.token || credential === undefined) return false;
  return sameSecret(credential, access.token);
}

/** Runs after the rate limiter: rejects what the caller may not do. */
export function registerAuthorization(
  app: FastifyInstance,
  metrics: MetricsAccess = { token: undefined, loopback: true },
): void {
  // Synchronous: a refusal is thrown, which the hook runner turns into the error answer.
  app.addHook('onRequest', (req, reply, done) => {
    if (isPublic(req)) return done();
    if (req.routeOptions.config.auth === 'metrics') {
      if (metricsAllowed(req, metrics)) return done();
      const p = req.principal;
      if (!p)
        throw new AppError('unauthorized', 'Metrics need the metrics token or an administrator', undefined, {
          'www-authenticate': 'Bearer realm="gpucloud"',
        });
      if (p.role !== 'admin' || p.scope !== 'read_write')
        throw forbidden("Metrics need the metrics token or an administrator's session or read_write key");
      return done();
    }
    const p = req.principal as (Principal & { suspended?: boolean }) | undefined;
    // RFC 6750: a 401 names the scheme the client should use.
    if (!p)
      throw new AppError('unauthorized', req.authFailure ?? 'Missing or invalid credentials', undefined, {
        'www-authenticate': 'Bearer realm="gpucloud"',
      });
    if (p.suspended) throw forbidden('This account is suspended; contact the operator');
    const route = req.routeOptions.url!;
    if (!scopePermits(p.scope, req.routeOptions.config.scopes)) {
      throw forbidden(`This API key's scope (${p.scope}) does not allow ${req.method} ${route}`);
    }
    if (req.routeOptions.config.auth === 'admin' && p.role !== 'admin') throw forbidden('Administrator role required');
    // What could lock the owner out of the account takes the owner's own session, whatever a key's scope.
    if (req.routeOptions.config.sessionOnly && p.via !== 'session') {
      throw forbidden(`${req.method} ${route} needs a signed-in session; an API key cannot do this`);
    }
    done();
  });
}
