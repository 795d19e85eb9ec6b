/**
 * Idempotency-Key (docs/errors.md#idempotency-keys) for routes with config.idempotent: the first
 * request with a key claims it (a unique row); its response (< 500) is stored
 * and replayed for 24 h for the same body; another body with the same key is
 * 422 `idempotency_mismatch`. A concurrent duplicate waits for the first to
 * finish and then gets its response, so the action happens once. The body is
 * compared as the client sent it (before validation fills in defaults), with
 * object keys in any order. Requests refused before the route is reached
 * (401, 403, 429, malformed JSON, 413, 415) do not use up the key.
 *
 * Stored responses can hold secrets (POST /api-keys answers with the key
 * itself, which is only ever stored hashed), so nothing is kept in clear: the row is
 * found by a hash of the Idempotency-Key, and the response is encrypted
 * (AES-256-GCM) under a key derived from the Idempotency-Key, which only the
 * client knows. The request fingerprint is an HMAC under that key as well, so
 * it cannot be used to guess a request body (e.g. a VM password).
 */
import type { FastifyInstance, FastifyRequest, RouteOptions } from 'fastify';
import { createHash, createHmac } from 'node:crypto';
import { open, seal } from '../crypto.js';
import type { Db, Queryable } from '../db/db.js';
import type { Clock } from '../clock.js';
import { AppError } from '../errors.js';
import { realTimeMs } from '../clock.js';
import { newId } from '../ids.js';
import { afterCommit, bindToNextCommit } from '../db/commit-hook.js';
import * as store from './idempotency-repository.js';
import { addRouteHook, hookWhen, onSendWhen } from './hooks.js';

export const IDEMPOTENCY_TTL_MS = 24 * 3600 * 1000;
const WAIT_FOR_FIRST_MS = 15_000;
/**
 * How long (real time) a pending key belongs to the request that took it.
 * Longer than any request runs; past it, the owner is taken to be dead and a
 * retry takes the key over. An owner whose instance the database sees gone (a
 * crashed process) loses its keys at once.
 */
export const IDEMPOTENCY_LEASE_MS = 30_000;

declare module 'fastify' {
  interface FastifyRequest {
    idempotency?: {
      userId: number;
      lookup: string;
      enc: Buffer;
      owner: string;
      /** The answer recorded with the request's change, once that change has committed. */
      committed?: { status: number; body: string };
    };
  }
}

/** Canonical JSON: object keys sorted, so `{a,b}` and `{b,a}` are the same body. */
function canonical(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(canonical).join(',')}]`;
  if (v && typeof v === 'object') {
    return `{${Object.keys(v as object)
      .sort()
      .map((k) => `${JSON.stringify(k)}:${canonical((v as Record<string, unknown>)[k])}`)
      .join(',')}}`;
  }
  return JSON.stringify(v ?? null);
}

/** Keys derived from the client's Idempotency-Key: where the row is, what it is encrypted with. */
interface DerivedKeys {
  /** Stored in idem_key: finds the row without revealing the client's key. */
  lookup: string;
  /** Encrypts the stored response. */
  enc: Buffer;
  /** Keys the request fingerprint. */
  mac: Buffer;
}

function derive(userId: number, key: string): DerivedKeys {
  const h = (label: string) =>
    createHash('sha256').update(`gpucloud-idempotency:${label}:${userId}:`).update(key, 'utf8').digest();
  return { lookup: h('lookup').toString('hex'), enc: h('enc'), mac: h('mac') };
}

export function requestFingerprint(req: FastifyRequest, macKey: Buffer): string {
  return createHmac('sha256', macKey)
    .update(`${req.method} ${req.routeOptions.url} ${canonical(req.params)} ${canonical(req.body)}`)
    .digest('hex');
}

/** Whether the instance a pending key's owner names (`<instance>:<request>`) is certainly gone. */
async function instanceGone(db: Db, owner: string | null): Promise<boolean> {
  const colon = owner?.indexOf(':') ?? -1;
  return colon > 0 && db.presence.gone(owner!.slice(0, colon)).catch(() => false);
}

/** Records the answer of the owner of a pending key; false when the key is no longer its own. */
async function recordAnswer(
  q: Queryable,
  idem: NonNullable<FastifyRequest['idempotency']>,
  status: number,
  body: string,
): Promise<boolean> {
  return store.recordAnswer(q, idem, status, body === '' ? null : seal(idem.enc, body));
}

export function registerIdempotency(app: FastifyInstance, db: Db, clock: Clock): void {
  // preValidation: every request that got past authentication, scope and body parsing claims the key,
  // so a body that fails validation is answered (and replayed) like any other failure.
  // Route-level hooks: only the routes that honour the header run them.
  const idempotentRoute = (route: RouteOptions) => route.config?.idempotent === true;
  const claims = (req: FastifyRequest) => !!req.principal && req.headers['idempotency-key'] !== undefined;
  addRouteHook(
    app,
    'preValidation',
    idempotentRoute,
    hookWhen(claims, async (req, reply) => {
      const raw = req.headers['idempotency-key']!;
      const key = Array.isArray(raw) ? raw[0]! : raw;
      if (key.length < 1 || key.length > 255) {
        throw new AppError('validation_error', 'Idempotency-Key must be 1 to 255 characters', [
          { field: 'header.idempotency-key', message: 'must be 1 to 255 characters' },
        ]);
      }
      const userId = req.principal!.userId;
      const keys = derive(userId, key);
      const hash = requestFingerprint(req, keys.mac);
      const deadline = Date.now() + WAIT_FOR_FIRST_MS;
      // The owner names its instance, so that a retry on another instance can tell whether it is still alive.
      // Without it (the database cannot say now), the lease alone decides.
      const instance = await db.presence.id().catch(() => undefined);
      for (;;) {
        const now = clock.now();
        const owner = instance === undefined ? newId() : `${instance}:${newId()}`;
        const ref = { userId, lookup: keys.lookup, owner };
        // Records older than 24 h are forgotten, this key's too: it is then claimed afresh.
        const forgetBefore = new Date(now.getTime() - IDEMPOTENCY_TTL_MS);
        const claimed = await store.claim(db, ref, hash, now, realTimeMs() + IDEMPOTENCY_LEASE_MS, forgetBefore);
        const own = () => {
          const idem: NonNullable<FastifyRequest['idempotency']> = {
            userId,
            lookup: keys.lookup,
            enc: keys.enc,
            owner,
          };
          req.idempotency = idem;
          // The change this request makes and its answer commit together (see onSend for answers without a change).
          bindToNextCommit(async (tx, result) => {
            const serialized = reply.serialize(result);
            const body =
              typeof serialized === 'string' ? serialized : Buffer.from(serialized as ArrayBuffer).toString('utf8');
            const status = reply.statusCode;
            if (await recordAnswer(tx, idem, status, body)) {
              afterCommit(tx, () => (idem.committed = { status, body }));
            } else {
              throw new AppError(
                'conflict',
                "This request took too long and a retry with the same Idempotency-Key took it over; its answer is the retry's",
              );
            }
          });
        };
        if (claimed) return own();
        const stored = await store.find(db, userId, keys.lookup);
        if (!stored) continue; // released by a failed first request: claim again
        if (stored.request_hash !== hash) {
          throw new AppError(
            'idempotency_mismatch',
            'This Idempotency-Key was already used with a different request body; use a new key for a new request',
          );
        }
        if (stored.state === 'done') {
          const body = stored.response_body ? open(keys.enc, stored.response_body) : '';
          reply.header('Idempotent-Replayed', 'true');
          reply.code(stored.response_status!);
          if (body !== '') reply.type('application/json; charset=utf-8');
          return reply.send(body);
        }
        // A pending key whose owner's lease ran out, or whose owner's instance is gone: the owner died before its
        // change committed (a change commits with its answer, so there is none), and this retry takes the key over.
        if (
          stored.lease_until_ms === null ||
          Number(stored.lease_until_ms) < realTimeMs() ||
          (await instanceGone(db, stored.owner))
        ) {
          if (await store.takeOver(db, ref, realTimeMs() + IDEMPOTENCY_LEASE_MS, stored.owner)) return own();
          continue;
        }
        if (Date.now() > deadline) {
          throw new AppError('conflict', 'A request with this Idempotency-Key is still being processed; retry shortly');
        }
        await new Promise((r) => setTimeout(r, 25));
      }
    }),
  );

  addRouteHook(
    app,
    'onSend',
    idempotentRoute,
    onSendWhen(
      (req) => req.idempotency !== undefined,
      async (req, reply, payload) => {
        const idem = req.idempotency!;
        req.idempotency = undefined;
        const body =
          payload == null
            ? ''
            : typeof payload === 'string'
              ? payload
              : Buffer.isBuffer(payload)
                ? payload.toString('utf8')
                : undefined;
        if (reply.statusCode >= 500 || body === undefined) {
          // Not a definitive answer (or a stream we cannot keep): release the key so the client can retry.
          await store.release(db, idem);
          return payload;
        }
        // Answers without a change (a refusal) are recorded here. One with a change was recorded in its
        // transaction already; it is written again only if the bytes sent differ from those.
        const committed = idem.committed;
        if (committed && committed.status === reply.statusCode && committed.body === body) return payload;
        await recordAnswer(db, idem, reply.statusCode, body);
        return payload;
      },
    ),
  );
}

/** Forgets every stored response older than 24 h (a background job; requests also purge their own user's). */
export async function purgeExpiredIdempotencyKeys(db: Db, now: Date): Promise<number> {
  return store.purge(db, new Date(now.getTime() - IDEMPOTENCY_TTL_MS));
}
