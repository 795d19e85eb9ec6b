/**
 * API keys (docs/authentication.md#api-keys): `gpc_` prefix, stored as a SHA-256 hash (the key
 * has 256 bits of entropy, so a fast hash is right), shown once.
 */
import type { Db } from '../../db/db.js';
import type { Clock } from '../../clock.js';
import { forbidden, notFound, validation } from '../../errors.js';
import { newId, randomToken, sha256Hex } from '../../ids.js';
import { SCOPE_RANK, type Scope } from '../../http/scopes.js';
import type { Principal } from '../../http/principal.js';
import * as repo from './repository.js';
import { recordEvent } from '../events/service.js';
import type { ApiKeyRow } from './repository.js';
import type { ApiKeyRecord, CreatedApiKeyRecord } from './schemas.js';
import { CredentialCache } from '../../credential-cache.js';

/** A key stops working at its expiry, by the service clock. */
const expired = (row: Pick<ApiKeyRow, 'expires_at'>, now: Date) =>
  row.expires_at !== null && row.expires_at.getTime() <= now.getTime();

/** How often a key's last_used_at is written at most. */
const TOUCH_EVERY_MS = 60_000;

export const API_KEY_PREFIX = 'gpc_';
/** How much of the key is kept in clear to tell keys apart in lists. */
const DISPLAY_PREFIX_LEN = API_KEY_PREFIX.length + 8;

const toRecord = (k: ApiKeyRow): ApiKeyRecord => ({
  id: k.id,
  name: k.name,
  scope: k.scope,
  prefix: k.prefix,
  created_at: k.created_at.toISOString(),
  expires_at: k.expires_at?.toISOString() ?? null,
  last_used_at: k.last_used_at?.toISOString() ?? null,
});

export class ApiKeyService {
  private readonly keys = new CredentialCache<Awaited<ReturnType<typeof repo.findActiveKeyByHash>> | null>();

  constructor(
    private readonly db: Db,
    private readonly clock: Clock,
  ) {}

  async create(
    p: Principal,
    input: { name: string; scope?: Scope; expires_at?: string | null },
  ): Promise<CreatedApiKeyRecord> {
    // Only a session or a read_write key manages keys, and never above its own scope.
    if (p.via === 'api_key' && p.scope !== 'read_write')
      throw forbidden('Only a login session or a read_write API key can manage API keys');
    const scope = input.scope ?? 'read_write';
    if (SCOPE_RANK[scope] > SCOPE_RANK[p.scope]) throw forbidden(`A ${p.scope} key cannot create a ${scope} key`);
    const now = this.clock.now();
    let expiresAt: Date | null = null;
    if (input.expires_at != null) {
      expiresAt = new Date(input.expires_at);
      if (Number.isNaN(expiresAt.getTime())) throw validation('body.expires_at', 'must be a date-time');
      if (expiresAt.getTime() <= now.getTime()) throw validation('body.expires_at', 'must be in the future');
    }
    const name = input.name.trim();
    if (!name) throw validation('body.name', 'must not be blank');
    const key = API_KEY_PREFIX + randomToken(32);
    // In a transaction of its own: the key and the request's recorded answer commit together.
    return this.db.transaction(async (tx) => {
      const row = await repo.insertKey(tx, {
        id: newId(),
        userId: p.userId,
        name,
        scope,
        prefix: key.slice(0, DISPLAY_PREFIX_LEN),
        keyHash: sha256Hex(key),
        now,
        expiresAt,
        createdByKeyId: p.via === 'api_key' ? (p.apiKeyId ?? null) : null,
      });
      await recordEvent(tx, {
        type: 'api_key.created',
        userId: p.userId,
        data: { api_key_id: row.id, name: row.name, scope: row.scope, prefix: row.prefix },
        at: now,
      });
      return { ...toRecord(row), key };
    });
  }

  async list(userId: number, limit: number, offset: number): Promise<{ items: ApiKeyRecord[]; total: number }> {
    const r = await repo.listKeys(this.db, userId, limit, offset);
    return { items: r.rows.map(toRecord), total: r.total };
  }

  async revoke(p: Principal, id: string): Promise<void> {
    if (p.via === 'api_key' && p.scope !== 'read_write')
      throw forbidden('Only a login session or a read_write API key can manage API keys');
    const now = this.clock.now();
    const revoked = await this.db.transaction(async (tx) => {
      const ids = await repo.revokeKey(tx, p.userId, id, now);
      // One event per key that stopped working: this one and every key made with it.
      for (const keyId of ids)
        await recordEvent(tx, {
          type: 'api_key.revoked',
          userId: p.userId,
          data: { api_key_id: keyId, ...(keyId === id ? {} : { made_with: id }) },
          at: now,
        });
      return ids.includes(id);
    });
    // The keys made with it went too: forget every key of the user, not just this one.
    this.forgetUser(p.userId);
    if (!revoked) throw notFound('API key');
  }

  /**
   * Authenticates a presented key; null when unknown, revoked or expired.
   * The key's row is remembered for up to a second (see CredentialCache);
   * `last_used_at` is written at most once a minute per key, and only when
   * the remembered value says it is due, so a busy key costs no write.
   */
  async authenticate(key: string) {
    if (!key.startsWith(API_KEY_PREFIX) || key.length > 200) return null;
    const hash = sha256Hex(key);
    const row = await this.keys.through(
      hash,
      async () => (await repo.findActiveKeyByHash(this.db, hash)) ?? null,
      (r) => r?.user_id,
    );
    if (!row) return null;
    const now = this.clock.now();
    if (expired(row, now)) return null;
    if (!row.last_used_at || now.getTime() - row.last_used_at.getTime() > TOUCH_EVERY_MS) {
      row.last_used_at = now;
      await repo.touchKey(this.db, row.id, now, TOUCH_EVERY_MS);
    }
    return row;
  }

  /**
   * `authenticate` for many keys at once, for a connection that outlives its request (an event
   * stream): one query, straight from the database rather than the remembered answers, and no
   * last_used_at write. Each key maps to its row, or to why it no longer works: 'revoked' (or
   * unknown) or 'expired' (by the service clock).
   */
  async recheck(keys: readonly string[]): Promise<Map<string, repo.ActiveKeyRow | 'revoked' | 'expired'>> {
    const out = new Map<string, repo.ActiveKeyRow | 'revoked' | 'expired'>();
    const hashOf = new Map([...new Set(keys)].map((k) => [k, sha256Hex(k)]));
    if (hashOf.size === 0) return out;
    const rows = new Map<string, repo.ActiveKeyRow>();
    for (const { key_hash, ...row } of await repo.findActiveKeysByHash(this.db, [...hashOf.values()]))
      rows.set(key_hash, row);
    const now = this.clock.now();
    for (const [key, hash] of hashOf) {
      const row = rows.get(hash);
      out.set(key, !row ? 'revoked' : expired(row, now) ? 'expired' : row);
    }
    return out;
  }

  /** Forgets what was remembered about the user's keys (after a change to them or their owner has committed). */
  forgetUser(userId: number): void {
    this.keys.forgetUser(userId);
  }
}
