/**
 * Accounts and sessions: register, login, refresh with rotation and reuse
 * detection, logout, two-factor; see docs/authentication.md. No Fastify here.
 */
import type { Db, Queryable } from '../../db/db.js';
import { pgErrorCode, PG } from '../../db/db.js';
import type { Clock } from '../../clock.js';
import { open, seal } from '../../crypto.js';
import { AppError, invalidState, unauthorized, forbidden, validation } from '../../errors.js';
import { newId, randomBytes, randomToken, sha256Hex } from '../../ids.js';
import type { PasswordHasher } from './passwords.js';
import type { TokenService } from './tokens.js';
import * as repo from './repository.js';
import { recordEvent } from '../events/service.js';
import { CredentialCache } from '../../credential-cache.js';
import type { Role, UserRow } from './repository.js';
import { generateRecoveryCodes, generateTotpSecret, normalizeRecoveryCode, otpauthUrl, verifyTotp } from './totp.js';

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
export const CHALLENGE_TTL_S = 300;
export const CHALLENGE_MAX_ATTEMPTS = 5;
/** Wrong second-factor codes in a row (across logins) that lock an account's second factor ... */
export const TOTP_MAX_FAILURES = 10;
/** ... for this long (service time). */
export const TOTP_LOCK_S = 15 * 60;

export interface UserRecord {
  id: number;
  email: string;
  name: string | null;
  role: Role;
  two_factor_enabled: boolean;
  created_at: string;
}

export interface TokenResponse {
  access_token: string;
  refresh_token: string;
  token_type: 'bearer';
  expires_in: number;
}

export interface ChallengeResponse {
  two_factor_required: true;
  challenge_token: string;
  expires_in: number;
}

/** What an operator may change of an account. */
export interface AccountPatch {
  role?: Role;
  suspended?: boolean;
  max_vms?: number | null;
  max_gpus?: number | null;
}

export const toUserRecord = (u: UserRow): UserRecord => ({
  id: u.id,
  email: u.email,
  name: u.name,
  role: u.role,
  two_factor_enabled: u.totp_enabled,
  created_at: u.created_at.toISOString(),
});

const invalidLogin = () => unauthorized('Invalid email or password');
const invalidRefresh = () => unauthorized('Invalid or expired refresh token');
const suspendedError = () => forbidden('This account is suspended; contact the operator');
const secondFactorLocked = (until: Date, now: Date) => {
  const s = Math.max(1, Math.ceil((until.getTime() - now.getTime()) / 1000));
  return new AppError(
    'rate_limited',
    `Too many wrong two-factor codes: try again in ${Math.ceil(s / 60)} minute(s)`,
    undefined,
    { 'retry-after': String(s) },
  );
};
const recoveryHash = (code: string) => sha256Hex('recovery:' + normalizeRecoveryCode(code));

export class AuthService {
  private readonly sessions = new CredentialCache<Awaited<ReturnType<typeof repo.findUserForSession>> | null>();

  constructor(
    private readonly db: Db,
    private readonly clock: Clock,
    private readonly passwords: PasswordHasher,
    private readonly tokens: TokenService,
    /** Seals TOTP secrets at rest (AES-256-GCM): a copy of the database alone does not give them. */
    private readonly totpKey: Buffer,
    /** A session (a refresh-token family) ends this long after its login, however often it is refreshed. */
    private readonly sessionMaxMs: number = REFRESH_TTL_MS,
  ) {}

  private sealTotp(secret: string): string {
    return seal(this.totpKey, secret);
  }

  /** A sealed secret, or one stored before secrets were sealed (base32 never starts with "v1:"). */
  private openTotp(stored: string): string {
    return stored.startsWith('v1:') ? open(this.totpKey, stored) : stored;
  }

  async register(
    input: { email: string; password: string; name?: string | null },
    role: Role = 'user',
  ): Promise<UserRecord> {
    const passwordHash = await this.passwords.hash(input.password);
    try {
      const u = await repo.insertUser(this.db, {
        email: input.email,
        name: input.name?.trim() || null,
        passwordHash,
        role,
        now: this.clock.now(),
      });
      return toUserRecord(u);
    } catch (err) {
      if (pgErrorCode(err) === PG.uniqueViolation) {
        throw new AppError('conflict', 'An account with this email already exists');
      }
      throw err;
    }
  }

  /**
   * Creates or updates (password, role) an account: the env bootstrap (GPUCLOUD_ADMIN_EMAIL) and `gpucloud admin
   * create-user`.
   */
  async ensureUser(
    email: string,
    password: string,
    role: Role,
    name: string | null = null,
  ): Promise<{ user: UserRecord; created: boolean }> {
    if (!(await repo.findUserByEmail(this.db, email))) {
      try {
        return { user: await this.register({ email, password, name }, role), created: true };
      } catch (err) {
        // Another instance bootstrapping the same account at the same moment won the insert: update it instead.
        if (!(err instanceof AppError && err.code === 'conflict')) throw err;
      }
    }
    const passwordHash = await this.passwords.hash(password);
    const updated = await repo.setPasswordAndRole(this.db, email, passwordHash, role, this.clock.now());
    if (!updated) throw new Error(`account ${email} vanished while being updated`);
    return { user: toUserRecord(updated), created: false };
  }

  async login(email: string, password: string, client: LoginClient = {}): Promise<TokenResponse | ChallengeResponse> {
    const user = await repo.findUserByEmail(this.db, email);
    if (!user) {
      await this.passwords.verifyDummy(password);
      throw invalidLogin();
    }
    if (user.suspended) {
      // The same answer whatever the password, after the same work: a suspended account
      // must not become an oracle that tells a right password from a wrong one.
      await this.passwords.verify(user.password_hash, password);
      throw suspendedError();
    }
    if (!(await this.passwords.verify(user.password_hash, password))) throw invalidLogin();
    const now = this.clock.now();
    if (user.totp_enabled) {
      const token = randomToken(32);
      await repo.insertChallenge(this.db, {
        id: newId(),
        userId: user.id,
        tokenHash: sha256Hex(token),
        now,
        expiresAt: new Date(now.getTime() + CHALLENGE_TTL_S * 1000),
      });
      return { two_factor_required: true, challenge_token: token, expires_in: CHALLENGE_TTL_S };
    }
    return this.db.transaction(async (tx) => {
      await this.recordLogin(tx, user.id, client, false);
      return this.issueTokens(tx, user.id, newId());
    });
  }

  /** An `account.login` event: who signed in from where (the address and user agent the request came with). */
  private async recordLogin(tx: Queryable, userId: number, client: LoginClient, secondFactor: boolean): Promise<void> {
    const data = {
      ip: client.ip ?? null,
      user_agent: client.userAgent?.slice(0, 256) ?? null,
      second_factor: secondFactor,
    };
    await recordEvent(tx, { type: 'account.login', userId, data, at: this.clock.now() });
  }

  /** `familyStart`: when the session's login happened (now for a new login). */
  private async issueTokens(
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
      expiresAt: new Date(Math.min(now.getTime() + REFRESH_TTL_MS, familyStart.getTime() + this.sessionMaxMs)),
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
      if (now.getTime() - started.getTime() >= this.sessionMaxMs) {
        await repo.revokeFamily(tx, row.family_id, row.user_id, now, 'session_max_age');
        return {
          error: unauthorized(
            `This session began more than ${Math.round(this.sessionMaxMs / 86_400_000)} days ago: log in again`,
          ),
          revoked: row.user_id,
        } as const;
      }
      if (row.expires_at.getTime() <= now.getTime()) return { error: invalidRefresh() } as const;
      const user = await repo.findUserById(tx, row.user_id);
      if (!user) return { error: invalidRefresh() } as const;
      if (user.suspended) return { error: suspendedError() } as const;
      await repo.markRotated(tx, row.id, now);
      return { tokens: await this.issueTokens(tx, row.user_id, row.family_id, started) } as const;
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

  /** Housekeeping: forgets refresh tokens and two-factor challenges expired for longer than KEEP_EXPIRED_MS. */
  async purgeExpired(now: Date): Promise<number> {
    return repo.purgeExpired(this.db, new Date(now.getTime() - KEEP_EXPIRED_MS), PURGE_BATCH);
  }

  // ---- the operator's view of accounts (modules/admin): the users table is written here only ----

  /** Accounts, newest first; `email` filters by substring. */
  async listAccounts(f: {
    email?: string;
    limit: number;
    offset: number;
  }): Promise<{ rows: UserRow[]; total: number }> {
    return repo.listUsers(this.db, f);
  }

  /** An account's row (locked for the rest of `q`'s transaction with `forUpdate`), or undefined. */
  async accountRow(q: Queryable, id: number, forUpdate = false): Promise<UserRow | undefined> {
    return repo.findUserById(q, id, forUpdate);
  }

  /** Changes an account's role, suspension or limits inside the caller's transaction. */
  async changeAccount(q: Queryable, id: number, patch: AccountPatch, now: Date): Promise<UserRow | undefined> {
    return repo.updateUserAdmin(q, id, patch, now);
  }

  async account(userId: number): Promise<UserRecord> {
    const u = await repo.findUserById(this.db, userId);
    if (!u) throw unauthorized();
    return toUserRecord(u);
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
    const u = await this.sessions.through(
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
    this.sessions.forgetUser(userId);
  }

  // ---- two-factor (see docs/authentication.md#two-factor-authentication) ----

  async setupTwoFactor(userId: number): Promise<{ secret: string; otpauth_url: string }> {
    return this.db.transaction(async (tx) => {
      const u = await repo.findUserById(tx, userId, true);
      if (!u) throw unauthorized();
      if (u.totp_enabled)
        throw invalidState('Two-factor authentication is already enabled; disable it first to set up a new secret');
      const secret = generateTotpSecret(randomBytes);
      await repo.setPendingTotp(tx, userId, this.sealTotp(secret), this.clock.now());
      return { secret, otpauth_url: otpauthUrl(secret, u.email) };
    });
  }

  /** Ends every session of the account, the caller's own included. */
  async logoutAll(userId: number): Promise<void> {
    await this.db.transaction((tx) => repo.revokeAllFamilies(tx, userId, this.clock.now(), 'logout_all'));
    this.forgetUser(userId);
  }

  /**
   * A new password, given the current one; every other session of the account
   * ends (whoever else held one must log in with the new password).
   */
  async changePassword(
    userId: number,
    currentSession: string | null,
    current: string,
    next: string,
  ): Promise<{ message: string }> {
    const u = await repo.findUserById(this.db, userId);
    if (!u) throw unauthorized();
    if (!(await this.passwords.verify(u.password_hash, current)))
      throw validation('body.current_password', "is not the account's password");
    const hash = await this.passwords.hash(next);
    await this.db.transaction(async (tx) => {
      const now = this.clock.now();
      await repo.setPassword(tx, userId, hash, now);
      await repo.revokeAllFamilies(tx, userId, now, 'password_changed', currentSession);
    });
    this.forgetUser(userId);
    return { message: 'Password changed; every other session of this account has ended' };
  }

  async enableTwoFactor(
    userId: number,
    code: string,
    currentSession: string | null = null,
  ): Promise<{ message: string; recovery_codes: string[] }> {
    const enabled = await this.db.transaction(async (tx) => {
      const u = await repo.findUserById(tx, userId, true);
      if (!u) throw unauthorized();
      if (u.totp_enabled) throw invalidState('Two-factor authentication is already enabled');
      if (!u.totp_pending_secret)
        throw invalidState('No two-factor setup in progress: call POST /auth/2fa/setup first');
      const step = verifyTotp(this.openTotp(u.totp_pending_secret), code, this.clock.nowMs(), null);
      if (step === null)
        throw new AppError(
          'invalid_code',
          'The code is not valid for this secret; check the authenticator app and the device clock',
        );
      const now = this.clock.now();
      await repo.enableTotp(tx, userId, u.totp_pending_secret, step, now);
      const codes = generateRecoveryCodes(randomBytes, 10);
      await repo.replaceRecoveryCodes(
        tx,
        userId,
        codes.map((c) => ({ id: newId(), hash: recoveryHash(c) })),
      );
      // Sessions opened without the second factor end: from now on every login needs it.
      await repo.revokeAllFamilies(tx, userId, now, '2fa_enabled', currentSession);
      await recordEvent(tx, { type: 'account.2fa_enabled', userId, at: now });
      return {
        message:
          'Two-factor authentication enabled; every other session of this account has ended. Store the recovery codes somewhere safe: each works once and they are not shown again.',
        recovery_codes: codes,
      };
    });
    this.forgetUser(userId);
    return enabled;
  }

  async disableTwoFactor(
    userId: number,
    code: string,
    currentSession: string | null = null,
  ): Promise<{ message: string }> {
    const outcome = await this.db.transaction(async (tx) => {
      const u = await repo.findUserById(tx, userId, true);
      if (!u) throw unauthorized();
      if (!u.totp_enabled || !u.totp_secret) throw invalidState('Two-factor authentication is not enabled');
      // A wrong code is answered after the commit, so that it counts toward the account's lock.
      if (!(await this.checkSecondFactor(tx, u, code))) return { wrong: true } as const;
      const now = this.clock.now();
      await repo.disableTotp(tx, userId, now);
      await repo.revokeAllFamilies(tx, userId, now, '2fa_disabled', currentSession);
      await recordEvent(tx, { type: 'account.2fa_disabled', userId, at: now });
      return { wrong: false } as const;
    });
    if (outcome.wrong)
      throw new AppError(
        'invalid_code',
        'The code is not valid (wrong, already used, or not a recovery code of this account)',
      );
    this.forgetUser(userId);
    return { message: 'Two-factor authentication disabled; every other session of this account has ended' };
  }

  /**
   * A TOTP (never the same step twice) or an unused recovery code; consumes
   * what it accepts. Wrong codes in a row are counted per account: after
   * TOTP_MAX_FAILURES the second factor is locked for TOTP_LOCK_S (429), so
   * guessing cannot go on across new logins or challenges.
   */
  private async checkSecondFactor(tx: Queryable, u: UserRow, code: string): Promise<boolean> {
    const now = this.clock.now();
    if (u.totp_locked_until && u.totp_locked_until.getTime() > now.getTime())
      throw secondFactorLocked(u.totp_locked_until, now);
    let ok = false;
    const step = verifyTotp(this.openTotp(u.totp_secret!), code, this.clock.nowMs(), u.totp_last_step);
    if (step !== null) {
      await repo.setTotpLastStep(tx, u.id, step);
      ok = true;
    } else if (normalizeRecoveryCode(code).length >= 8) {
      ok = await repo.useRecoveryCode(tx, u.id, recoveryHash(code), now);
    }
    if (ok) {
      await repo.clearTotpFailures(tx, u.id);
      return true;
    }
    const lock = u.totp_failures + 1 >= TOTP_MAX_FAILURES ? new Date(now.getTime() + TOTP_LOCK_S * 1000) : null;
    await repo.recordTotpFailure(tx, u.id, lock);
    return false;
  }

  async verifyTwoFactor(challengeToken: string, code: string, client: LoginClient = {}): Promise<TokenResponse> {
    const outcome = await this.db.transaction(async (tx) => {
      const ch = await repo.findChallengeForUpdate(tx, sha256Hex(challengeToken));
      const now = this.clock.now();
      const expired = unauthorized('Unknown or expired challenge token: log in again');
      if (!ch || ch.used_at || ch.expires_at.getTime() <= now.getTime()) return { error: expired } as const;
      const u = await repo.findUserById(tx, ch.user_id, true);
      if (!u || !u.totp_enabled) return { error: expired } as const;
      if (u.suspended) return { error: suspendedError() } as const;
      if (!(await this.checkSecondFactor(tx, u, code))) {
        const attempts = ch.attempts + 1;
        // Too many wrong codes burn the challenge: a new login (rate limited) is needed.
        await repo.updateChallenge(tx, ch.id, attempts, attempts >= CHALLENGE_MAX_ATTEMPTS ? now : null);
        return { error: unauthorized('Invalid or already used two-factor code') } as const;
      }
      await repo.updateChallenge(tx, ch.id, ch.attempts, now);
      await this.recordLogin(tx, u.id, client, true);
      return { tokens: await this.issueTokens(tx, u.id, newId()) } as const;
    });
    if ('error' in outcome) throw outcome.error;
    return outcome.tokens;
  }
}
