/**
 * Rate limits (docs/security.md#rate-limits): fixed 60 s windows on real time, per user when
 * authenticated, per email for login (and per client address and in all, so
 * that guessing across many emails is limited too), per client IP otherwise. Every response
 * of a limited route carries X-RateLimit-Limit/-Remaining/-Reset (seconds);
 * past the limit: 429 `rate_limited` with Retry-After.
 */
import type { FastifyInstance, FastifyReply, FastifyRequest, RouteOptions } from 'fastify';
import type { RateLimitConfig } from '../config.js';
import { realTimeMs } from '../clock.js';
import { AppError } from '../errors.js';
import { normalizeEmail } from '../accounts.js';
import type { Db } from '../db/db.js';
import type { RateBucket } from './principal.js';
import {
  MemoryRateLimitStore,
  PostgresRateLimitStore,
  RedisRateLimitStore,
  type RateLimitHit,
  type RateLimitStore,
} from './rate-limit-store.js';
import { BatchingRateLimitStore } from './rate-limit-batching.js';
import { addRouteHook, hookWhen, onSendWhen } from './hooks.js';

const LIMIT_OF: Record<RateBucket, keyof RateLimitConfig> = {
  login: 'login',
  auth: 'auth',
  vm: 'vmMutations',
  default: 'default',
};

/** Logins and other /auth calls are counted where every instance sees them at once. */
const COUNTED_AT_ONCE: ReadonlySet<RateBucket> = new Set(['login', 'auth']);
/** Below this many per window a limit is counted in the shared store at every hit. */
const LOCAL_FROM_LIMIT = 100;

declare module 'fastify' {
  interface FastifyRequest {
    /** Set once the request has been counted (or the store failed): it is never counted twice. */
    rateLimitCounted?: boolean;
  }
}

export function registerRateLimit(app: FastifyInstance, store: RateLimitStore, limits: RateLimitConfig): void {
  /**
   * Counts the request against `bucket` for `subject` and sets the X-RateLimit headers; past the limit
   * (when `enforce`) throws `rate_limited`. Answers at once when the store counts in this process, and
   * returns a promise only when the hit goes to a shared store.
   */
  function consume(
    req: FastifyRequest,
    reply: FastifyReply,
    bucket: RateBucket,
    subject: string,
    enforce = true,
  ): void | Promise<void> {
    if (req.rateLimitCounted) return;
    req.rateLimitCounted = true;
    const limit = limits[LIMIT_OF[bucket]] as number;
    const key = `${bucket}:${subject}`;
    const nowMs = realTimeMs();
    const opts = {
      localBelow: COUNTED_AT_ONCE.has(bucket) || limit < LOCAL_FROM_LIMIT ? undefined : Math.floor(limit / 2),
    };
    let hit: RateLimitHit | undefined;
    try {
      hit = store.hitLocal?.(key, limits.windowMs, nowMs, opts);
    } catch (err) {
      return failOpen(req, err);
    }
    if (hit !== undefined) return answer(reply, hit, limit, enforce);
    return store.hit(key, limits.windowMs, nowMs, opts).then(
      (shared) => answer(reply, shared, limit, enforce),
      (err: unknown) => failOpen(req, err),
    );
  }

  // Fail open: an unreachable Redis must not take the API down with it.
  function failOpen(req: FastifyRequest, err: unknown): void {
    req.log.error({ err }, 'rate-limit store unavailable; request allowed');
  }

  function answer(reply: FastifyReply, hit: RateLimitHit, limit: number, enforce: boolean): void {
    const resetS = Math.max(1, Math.ceil(hit.resetMs / 1000));
    reply.header('X-RateLimit-Limit', String(limit));
    reply.header('X-RateLimit-Remaining', String(Math.max(0, limit - hit.count)));
    reply.header('X-RateLimit-Reset', String(resetS));
    if (enforce && hit.count > limit) {
      throw new AppError(
        'rate_limited',
        `Rate limit of ${limit} requests per minute exceeded; retry in ${resetS} s`,
        undefined,
        {
          'retry-after': String(resetS),
        },
      );
    }
  }

  const bucketOf = (req: FastifyRequest): RateBucket | false =>
    req.routeOptions.url ? (req.routeOptions.config.rateLimit ?? 'default') : false;

  // Callback style: most requests are counted in memory and go on at once (a throw is the 429 answer).
  app.addHook('onRequest', (req, reply, done) => {
    const bucket = bucketOf(req);
    if (bucket === false || bucket === 'login') return done();
    const counted = consume(req, reply, bucket, req.principal ? `u:${req.principal.userId}` : `ip:${req.ip}`);
    if (counted === undefined) return done();
    counted.then(() => done(), done);
  });

  // Login is limited per email, which needs the parsed body: counted
  // before validation, so that an invalid body is counted (and answered with
  // the headers) like any other attempt. Without an email, per client IP.
  const isLogin = (req: FastifyRequest) => bucketOf(req) === 'login';
  app.addHook(
    'preValidation',
    hookWhen(isLogin, async (req, reply) => {
      const email = (req.body as { email?: unknown } | null | undefined)?.email;
      const subject = typeof email === 'string' && email.trim() !== '' ? `e:${normalizeEmail(email)}` : `ip:${req.ip}`;
      await consume(req, reply, 'login', subject);
      // Guessing across many emails: limited per client address, and in all (each attempt costs a
      // password hash). These do not replace the per-email headers; past them the answer is 429 too.
      await extra(req, reply, `login-ip:${req.ip}`, limits.loginPerIp, 'logins from this address');
      await extra(req, reply, 'login-all', limits.loginGlobal, 'logins to this service');
    }),
  );

  async function extra(
    req: FastifyRequest,
    reply: FastifyReply,
    key: string,
    limit: number,
    what: string,
  ): Promise<void> {
    let hit;
    try {
      hit = await store.hit(key, limits.windowMs, realTimeMs());
    } catch (err) {
      req.log.error({ err }, 'rate-limit store unavailable; request allowed');
      return;
    }
    if (hit.count <= limit) return;
    const resetS = Math.max(1, Math.ceil(hit.resetMs / 1000));
    reply.header('X-RateLimit-Limit', String(limit));
    reply.header('X-RateLimit-Remaining', '0');
    reply.header('X-RateLimit-Reset', String(resetS));
    throw new AppError(
      'rate_limited',
      `Rate limit of ${limit} ${what} per minute exceeded; retry in ${resetS} s`,
      undefined,
      { 'retry-after': String(resetS) },
    );
  }

  // A login whose body could not even be read (malformed JSON, too large, wrong
  // media type) never reached preValidation: count it per IP so that its
  // response carries the headers too (every response of a limited route does).
  // A route-level hook: only the login route runs it.
  addRouteHook(
    app,
    'onSend',
    (route: RouteOptions) => route.config?.rateLimit === 'login',
    onSendWhen(
      (req) => !req.rateLimitCounted,
      async (req, reply, payload) => {
        await consume(req, reply, 'login', `ip:${req.ip}`, false);
        return payload;
      },
    ),
  );
}

export type RateLimitStoreKind = 'redis' | 'postgres' | 'memory';

/**
 * Redis when `redisUrl` (GPUCLOUD_REDIS_URL) is set; otherwise the database
 * when it is PostgreSQL (instances share it); otherwise this process's memory.
 * A shared store is wrapped so that busy keys far from their limit cost no
 * round trip per request (rate-limit-batching.ts).
 */
export function createRateLimitStore(
  redisUrl: string | undefined,
  opts: { prefix?: string; db?: Db } = {},
): { store: RateLimitStore; kind: RateLimitStoreKind } {
  const url = redisUrl?.trim();
  if (url) {
    const redis = new RedisRateLimitStore(url, opts.prefix === undefined ? {} : { prefix: opts.prefix });
    return { store: new BatchingRateLimitStore(redis), kind: 'redis' };
  }
  if (opts.db?.kind === 'postgres') {
    return { store: new BatchingRateLimitStore(new PostgresRateLimitStore(opts.db)), kind: 'postgres' };
  }
  return { store: new MemoryRateLimitStore(), kind: 'memory' };
}
