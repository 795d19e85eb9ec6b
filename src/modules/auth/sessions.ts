/**
 * Sessions (docs/authentication.md#refresh-tokens): a login opens a refresh-token family; refresh
 * rotates its token with reuse detection; logout ends it. Access tokens are checked against it here.
 */
import type { Db, Queryable } from '../../db/db.js';
import type { Clock } from '../../clock.js';
import { forbidden, unauthorized } from '../../errors.js';
import { newId, randomToken, sha256Hex } from '../../ids.js';
import { CredentialCache } from '../../credential-cache.js';
import { recordEvent } from '../events/service.js';
import * as repo from './repository.js';
import type { TokenService } from './tokens.js';
import type { TokenResponse } from './schemas.js';

/** Where a login came from, for the account.login event. */
export interface LoginClient {
  ip?: string;
  userAgent?: string;
}

export const REFRESH_TTL_MS = 30 * 24 * 3600 * 1000;
/**
 * How long the records of a session whose refresh tokens all expired, or of an expired two-factor challenge, are
 * kept: until then, logging out with an expired refresh token still ends its session
 * (docs/authentication.md#refresh-tokens).
 */
export const KEEP_EXPIRED_MS = 30 * 24 * 3600 * 1000;
/** At most this many of each are forgotten per housekeeping pass, so that a backlog goes in short statements. */
const PURGE_BATCH = 5_000;

const invalidRefresh = () => unauthorized('Invalid or expired refresh token');
export const suspendedError = () => forbidden('This account is suspended; contact the operator');

export class Sessions {
  private readonly remembered = new CredentialCache<Awaited<ReturnType<typeof repo.findUserForSession>> | null>();

  constructor(
    private readonly db: Db,
    private readonly clock: Clock,
    private readonly tokens: TokenService,
    /** A session (a refresh-token family) ends this long after its login, however often it is refreshed. */
    private readonly maxMs: number = REFRESH_TTL_MS,
  ) {}

  /** An `account.login` event: who signed in from where (the address and user agent the request came with). */
  async recordLogin(tx: Queryable, userId: number, client: LoginClient, secondFactor: boolean): Promise<void> {
    const data = {
      ip: client.ip ?? null,
      user_agent: client.userAgent?.slice(0, 256) ?? null,
      second_factor: secondFactor,
    };
    await recordEvent(tx, { type: 'account.login', userId, data, at: this.clock.now() });
  }

  /** A token pair of the session `familyId`; `familyStart`: when the session's login happened (now for a new login). */
  async issue(
    q: Queryable,
    userId: number,
    familyId: string,
    familyStart: Date = this.clock.now(),
  ): Promise<TokenResponse> {
    const now = this.clock.now();
    const refresh = randomToken(32);
    await repo.insertRefreshToken(q, {
      id: newId(),
      userId,
      familyId,
      tokenHash: sha256Hex(refresh),
      now,
      expiresAt: new Date(Math.min(now.getTime() + REFRESH_TTL_MS, familyStart.getTime() + this.maxMs)),
    });
    const access = await this.tokens.signAccess(userId, familyId);
    return { access_token: access.token, refresh_token: refresh, token_type: 'bearer', expires_in: access.expiresIn };
  }

  /**
   * Rotation: a refresh token works once; a rotated token used again revokes its whole family. See
   * docs/authentication.md#refresh-tokens
   */
  async refresh(refreshToken: string): Promise<TokenResponse> {
    const outcome = await this.db.transaction(async (tx) => {
      const row = await repo.findRefreshTokenForUpdate(tx, sha256Hex(refreshToken));
      if (!row) return { error: invalidRefresh() } as const;
      const now = this.clock.now();
      if (row.revoked_at || (await repo.isFamilyRevoked(tx, row.family_id)))
        return { error: invalidRefresh() } as const;
      if (row.rotated_at) {
        // Reuse of a rotated token: someone holds a copy. Kill the family; commit that, then refuse.
        await repo.revokeFamily(tx, row.family_id, row.user_id, now, 'refresh_token_reuse');
        return {
          error: unauthorized('Refresh token was already used; this session has been revoked, log in again'),
          revoked: row.user_id,
        } as const;
      }
      const started = await repo.familyStartedAt(tx, row.family_id);
      if (now.getTime() - started.getTime() >= this.maxMs) {
        await repo.revokeFamily(tx, row.family_id, row.user_id, now, 'session_max_age');
        return {
          error: unauthorized(
            `This session began more than ${Math.round(this.maxMs / 86_400_000)} days ago: log in again`,
          ),
          revoked: row.user_id,
        } as const;
      }
      if (row.expires_at.getTime() <= now.getTime()) return { error: invalidRefresh() } as const;
      const user = await repo.findUserById(tx, row.user_id);
      if (!user) return { error: invalidRefresh() } as const;
      if (user.suspended) return { error: suspendedError() } as const;
      await repo.markRotated(tx, row.id, now);
      return { tokens: await this.issue(tx, row.user_id, row.family_id, started) } as const;
    });
    if ('error' in outcome) {
      const revoked = (outcome as { revoked?: number }).revoked;
      if (revoked !== undefined) this.forgetUser(revoked);
      throw outcome.error;
    }
    return outcome.tokens;
  }

  /** Logout: revokes the family of `refreshToken`, which must belong to the caller. Idempotent for the owner. */
  async logout(userId: number, refreshToken: string): Promise<void> {
    await this.db.transaction(async (tx) => {
      const row = await repo.findRefreshTokenForUpdate(tx, sha256Hex(refreshToken));
      if (!row || row.user_id !== userId) throw invalidRefresh();
      await repo.revokeFamily(tx, row.family_id, userId, this.clock.now(), 'logout');
    });
    this.forgetUser(userId);
  }

  /** Ends every session of the account, the caller's own included. */
  async logoutAll(userId: number): Promise<void> {
    await this.db.transaction((tx) => repo.revokeAllFamilies(tx, userId, this.clock.now(), 'logout_all'));
    this.forgetUser(userId);
  }

  /** Housekeeping: forgets refresh tokens and two-factor challenges expired for longer than KEEP_EXPIRED_MS. */
  async purgeExpired(now: Date): Promise<number> {
    return repo.purgeExpired(this.db, new Date(now.getTime() - KEEP_EXPIRED_MS), PURGE_BATCH);
  }

  /**
   * Authenticates an access token: claims, user, suspension and session
   * revocation. The session's state is remembered for up to a second (see
   * CredentialCache): revocations through this instance apply at once,
   * through another within that second.
   */
  async authenticateAccessToken(token: string) {
    const claims = await this.tokens.verifyAccess(token);
    if (!claims) return null;
    const u = await this.remembered.through(
      `${claims.userId}:${claims.sid}`,
      async () => (await repo.findUserForSession(this.db, claims.userId, claims.sid)) ?? null,
      () => claims.userId,
    );
    if (!u || u.family_revoked) return null;
    return { user: u, sessionId: claims.sid };
  }

  /**
   * `authenticateAccessToken` for many tokens at once, for a connection that outlives its request
   * (an event stream): one query, straight from the database rather than the remembered answers.
   * Each token maps to its user and session, or to why it no longer works: 'expired' (its `exp`,
   * by the service clock) or 'revoked' (its session ended, or its user is gone).
   */
  async recheckAccessTokens(
    tokens: readonly string[],
  ): Promise<Map<string, { user: repo.SessionUser; sessionId: string } | 'expired' | 'revoked'>> {
    const out = new Map<string, { user: repo.SessionUser; sessionId: string } | 'expired' | 'revoked'>();
    const live: { token: string; userId: number; sid: string }[] = [];
    for (const token of new Set(tokens)) {
      const claims = await this.tokens.verifyAccess(token);
      if (claims) live.push({ token, userId: claims.userId, sid: claims.sid });
      else out.set(token, 'expired');
    }
    if (live.length === 0) return out;
    // Family ids come back from the uuid column in lower case.
    const pair = (userId: number, sid: string) => `${userId}:${sid.toLowerCase()}`;
    const sessions = new Map(live.map((l) => [pair(l.userId, l.sid), { userId: l.userId, familyId: l.sid }]));
    const found = new Map<string, repo.SessionUser>();
    for (const { family_id, ...u } of await repo.findUsersForSessions(this.db, [...sessions.values()]))
      found.set(pair(Number(u.id), family_id), u);
    for (const l of live) {
      const u = found.get(pair(l.userId, l.sid));
      out.set(l.token, !u || u.family_revoked ? 'revoked' : { user: u, sessionId: l.sid });
    }
    return out;
  }

  /** Forgets what was remembered about the user's sessions (after a change to them has committed). */
  forgetUser(userId: number): void {
    this.remembered.forgetUser(userId);
  }
}
