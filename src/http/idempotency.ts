/**
 * Idempotency-Key (CONTRACT D41) for routes with config.idempotent: the first
 * request with a key claims it (a unique row); its response (< 500) is stored
 * and replayed for 24 h for the same body; another body with the same key is
 * 422 `idempotency_mismatch`. A concurrent duplicate waits for the first to
 * finish and then gets its response, so the action happens once.
 */
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { createHash } from 'node:crypto';
import type { Db } from '../db/db.js';
import type { Clock } from '../clock.js';
import { AppError } from '../errors.js';

export const IDEMPOTENCY_TTL_MS = 24 * 3600 * 1000;
const WAIT_FOR_FIRST_MS = 15_000;

declare module 'fastify' {
  interface FastifyRequest {
    idempotency?: { userId: number; key: string };
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

export function requestFingerprint(req: FastifyRequest): string {
  return createHash('sha256')
    .update(`${req.method} ${req.routeOptions.url} ${canonical(req.params)} ${canonical(req.body)}`)
    .digest('hex');
}

interface Stored {
  request_hash: string;
  state: 'pending' | 'done';
  response_status: number | null;
  response_body: string | null;
  created_at: Date;
}

export function registerIdempotency(app: FastifyInstance, db: Db, clock: Clock): void {
  app.addHook('preHandler', async (req, reply) => {
    if (!req.routeOptions.config.idempotent || !req.principal) return;
    const raw = req.headers['idempotency-key'];
    if (raw === undefined) return;
    const key = Array.isArray(raw) ? raw[0]! : raw;
    if (key.length < 1 || key.length > 255) {
      throw new AppError('validation_error', 'Idempotency-Key must be 1 to 255 characters', [
        { field: 'header.idempotency-key', message: 'must be 1 to 255 characters' },
      ]);
    }
    const userId = req.principal.userId;
    const hash = requestFingerprint(req);
    const deadline = Date.now() + WAIT_FOR_FIRST_MS;
    for (;;) {
      const now = clock.now();
      // Expired keys (older than 24 h) are forgotten, then the key is claimed afresh.
      await db.query(`DELETE FROM idempotency_keys WHERE user_id = $1 AND idem_key = $2 AND created_at <= $3`, [
        userId,
        key,
        new Date(now.getTime() - IDEMPOTENCY_TTL_MS),
      ]);
      const claimed = await db.query(
        `INSERT INTO idempotency_keys (user_id, idem_key, request_hash, state, created_at)
         VALUES ($1, $2, $3, 'pending', $4) ON CONFLICT (user_id, idem_key) DO NOTHING`,
        [userId, key, hash, now],
      );
      if (claimed.rowCount === 1) {
        req.idempotency = { userId, key };
        return;
      }
      const stored = (
        await db.query<Stored>(
          'SELECT request_hash, state, response_status, response_body, created_at FROM idempotency_keys WHERE user_id = $1 AND idem_key = $2',
          [userId, key],
        )
      ).rows[0];
      if (!stored) continue; // released by a failed first request: claim again
      if (stored.request_hash !== hash) {
        throw new AppError(
          'idempotency_mismatch',
          'This Idempotency-Key was already used with a different request body; use a new key for a new request',
        );
      }
      if (stored.state === 'done') {
        reply.header('Idempotent-Replayed', 'true');
        reply.code(stored.response_status!).type('application/json; charset=utf-8');
        return reply.send(stored.response_body);
      }
      if (Date.now() > deadline) {
        throw new AppError('conflict', 'A request with this Idempotency-Key is still being processed; retry shortly');
      }
      await new Promise((r) => setTimeout(r, 25));
    }
  });

  app.addHook('onSend', async (req, reply, payload) => {
    const idem = req.idempotency;
    if (!idem) return payload;
    req.idempotency = undefined;
    if (reply.statusCode >= 500 || typeof payload !== 'string') {
      // Not a definitive answer: release the key so the client can retry.
      await db.query('DELETE FROM idempotency_keys WHERE user_id = $1 AND idem_key = $2', [idem.userId, idem.key]);
      return payload;
    }
    await db.query(
      `UPDATE idempotency_keys SET state = 'done', response_status = $3, response_body = $4
        WHERE user_id = $1 AND idem_key = $2`,
      [idem.userId, idem.key, reply.statusCode, payload],
    );
    return payload;
  });
}
