/**
 * Rate limits (docs/security.md#rate-limits): fixed 60 s windows on real time, per user when
 * authenticated, per client IP otherwise. Logins: failed ones per email and client address, and per
 * email from all addresses together (a correct password is never held back by someone else's wrong
 * ones, while one account sprayed from many addresses stays limited); every attempt per client
 * address and in all, so that guessing across many emails is limited too. Every response
 * of a limited route carries X-RateLimit-Limit/-Remaining/-Reset (seconds);
 * past the limit: 429 `rate_limited` with Retry-After.
 */
import type { FastifyInstance, FastifyReply, FastifyRequest, RouteOptions } from 'fastify';
import { realTimeMs } from '../clock.js';
import { AppError } from '../errors.js';
import { normalizeEmail } from '../accounts.js';
import type { Db } from '../db/db.js';
import type { RateBucket } from './principal.js';
import {
  MemoryRateLimitStore,
  PostgresRateLimitStore,
  RedisRateLimitStore,
  windowOf,
  type RateLimitHit,
  type RateLimitStore,
} from './rate-limit-store.js';
import { BatchingRateLimitStore } from './rate-limit-batching.js';
import { addRouteHook, hookWhen, onSendWhen } from './hooks.js';

/** The limits of each bucket (docs/security.md#rate-limits; GPUCLOUD_RATE_LIMIT_* in config.ts). */
export interface RateLimitConfig {
  login: number;
  /** Failed logins to one email from all addresses together (`login` counts those from one address). */
  loginAccount: number;
  /** Logins per client address, whatever the email. */
  loginPerIp: number;
  /** Logins to the whole service (every instance, with Redis). */
  loginGlobal: number;
  auth: number;
  vmMutations: number;
  default: number;
  windowMs: number;
}

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
    /** The failure counters a login attempt was counted on, taken back when it turns out not to be a failure. */
    loginFailures?: CountedFailure[];
  }
}

/** A login attempt counted, in advance, as a failure on `key` at `atMs` (real time). */
interface CountedFailure {
  key: string;
  atMs: number;
  /** The limit whose X-RateLimit headers the answer carries, if this counter's. */
  headersOf?: number;
}

/**
 * Whether a login's answer is a failed attempt: anything but a sign-in (200, tokens or a two-factor
 * challenge), an answer of a rate limit (429, which checked no password) or a server error.
 */
const isFailedLogin = (status: number) => status !== 200 && status !== 429 && status < 500;

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

  // Login is limited per email, which needs the parsed body: counted before validation, so that an
  // invalid body is counted (and answered with the headers) like any other attempt. Without an email,
  // per client IP.
  //
  // An attempt is counted as a failure before the password is checked, so that attempts running at
  // once cannot all pass the limit, and taken back (onSend below) when it turns out not to be one:
  // a correct password never uses up a limit. Failures are counted per email and client address
  // (GPUCLOUD_RATE_LIMIT_LOGIN, whose headers the answer carries), so that someone else's wrong
  // passwords do not lock the owner out from another address; and per email from all addresses
  // together (GPUCLOUD_RATE_LIMIT_LOGIN_ACCOUNT), so that guessing one account's password from many
  // addresses stays limited. An attempt refused by a limit is not counted on the later ones.
  const isLogin = (req: FastifyRequest) => bucketOf(req) === 'login';
  app.addHook(
    'preValidation',
    hookWhen(isLogin, async (req, reply) => {
      const email = (req.body as { email?: unknown } | null | undefined)?.email;
      const account = typeof email === 'string' && email.trim() !== '' ? `e:${normalizeEmail(email)}` : undefined;
      if (account === undefined) {
        await consume(req, reply, 'login', `ip:${req.ip}`);
      } else {
        req.rateLimitCounted = true;
        req.loginFailures = [];
        await failure(req, reply, `login:${account}|ip:${req.ip}`, limits.login, 'for this email from this address');
      }
      // Guessing across many emails: limited per client address, and in all (each attempt costs a
      // password hash). These do not replace the per-email headers; past them the answer is 429 too.
      await extra(req, reply, `login-ip:${req.ip}`, limits.loginPerIp, 'logins from this address');
      await extra(req, reply, 'login-all', limits.loginGlobal, 'logins to this service');
      if (account !== undefined) {
        await failure(req, reply, `login-account:${account}`, limits.loginAccount, 'for this email');
      }
    }),
  );

  /**
   * Counts the login attempt as a failure on `key` (it is taken back if the attempt is not one) and,
   * past `limit`, refuses it. The first counter sets the X-RateLimit headers of the answer.
   */
  async function failure(req: FastifyRequest, reply: FastifyReply, key: string, limit: number, what: string) {
    const atMs = realTimeMs();
    let hit: RateLimitHit;
    try {
      hit = await store.hit(key, limits.windowMs, atMs);
    } catch (err) {
      return failOpen(req, err);
    }
    const headers = req.loginFailures!.length === 0;
    req.loginFailures!.push({ key, atMs, ...(headers ? { headersOf: limit } : {}) });
    const resetS = Math.max(1, Math.ceil(hit.resetMs / 1000));
    if (headers || hit.count > limit) {
      reply.header('X-RateLimit-Limit', String(limit));
      reply.header('X-RateLimit-Remaining', String(Math.max(0, limit - hit.count)));
      reply.header('X-RateLimit-Reset', String(resetS));
    }
    if (hit.count <= limit) return;
    throw new AppError(
      'rate_limited',
      `Rate limit of ${limit} failed logins per minute ${what} exceeded; retry in ${resetS} s`,
      undefined,
      { 'retry-after': String(resetS) },
    );
  }

  // A login that signed in, or that no password was checked for (a limit refused it, the service
  // failed), takes back the failures it was counted as, in the window it was counted in.
  addRouteHook(
    app,
    'onSend',
    (route: RouteOptions) => route.config?.rateLimit === 'login',
    onSendWhen(
      (req) => req.loginFailures !== undefined && req.loginFailures.length > 0,
      async (req, reply, payload) => {
        const counted = req.loginFailures!;
        req.loginFailures = [];
        if (isFailedLogin(reply.statusCode)) return payload;
        const nowMs = realTimeMs();
        for (const c of counted) {
          if (windowOf(limits.windowMs, c.atMs).windowStart !== windowOf(limits.windowMs, nowMs).windowStart) continue;
          let left: number;
          try {
            left = await store.unhit(c.key, limits.windowMs, nowMs);
          } catch (err) {
            failOpen(req, err);
            continue;
          }
          if (c.headersOf !== undefined && reply.statusCode === 200) {
            reply.header('X-RateLimit-Remaining', String(Math.max(0, c.headersOf - left)));
          }
        }
        return payload;
      },
    ),
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
