/**
 * Rate limits (docs/security.md#rate-limits): fixed 60 s windows on real time, per user when
 * authenticated, per email for login (and per client address and in all, so
 * that guessing across many emails is limited too), per client IP otherwise. Every response
 * of a limited route carries X-RateLimit-Limit/-Remaining/-Reset (seconds);
 * past the limit: 429 `rate_limited` with Retry-After.
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
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
  type RateLimitStore,
} from './rate-limit-store.js';
import { BatchingRateLimitStore } from './rate-limit-batching.js';
import { hookWhen, onSendWhen } from './hooks.js';

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
  async function consume(
    req: FastifyRequest,
    reply: FastifyReply,
    bucket: RateBucket,
    subject: string,
    enforce = true,
  ) {
    if (req.rateLimitCounted) return;
    req.rateLimitCounted = true;
    const limit = limits[LIMIT_OF[bucket]] as number;
    let hit;
    try {
      hit = await store.hit(`${bucket}:${subject}`, limits.windowMs, realTimeMs(), {
        localBelow: COUNTED_AT_ONCE.has(bucket) || limit < LOCAL_FROM_LIMIT ? undefined : Math.floor(limit / 2),
      });
    } catch (err) {
      // Fail open: an unreachable Redis must not take the API down with it.
      req.log.error({ err }, 'rate-limit store unavailable; request allowed');
      return;
    }
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

  app.addHook(
    'onRequest',
    hookWhen(
      (req) => {
        const bucket = bucketOf(req);
        return bucket !== false && bucket !== 'login';
      },
      (req, reply) =>
        consume(req, reply, bucketOf(req) as RateBucket, req.principal ? `u:${req.principal.userId}` : `ip:${req.ip}`),
    ),
  );

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
  app.addHook(
    'onSend',
    onSendWhen(
      (req) => !req.rateLimitCounted && isLogin(req),
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
