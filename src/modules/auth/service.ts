/**
 * Accounts (docs/authentication.md): register, log in, the account and its password, and the
 * operator's view of accounts; the users table is written here only. This class is what the rest of
 * the code calls: sessions.ts holds sessions (refresh with rotation and reuse detection, logout,
 * access-token checks), two-factor.ts two-factor authentication. No Fastify here.
 */
import type { Db, Queryable } from '../../db/db.js';
import { pgErrorCode, PG } from '../../db/db.js';
import type { Clock } from '../../clock.js';
import { AppError, unauthorized, validation } from '../../errors.js';
import { newId } from '../../ids.js';
import type { PasswordHasher } from './passwords.js';
import type { TokenService } from './tokens.js';
import * as repo from './repository.js';
import type { Role, UserRow } from './repository.js';
import type { ChallengeResponse, TokenResponse, UserRecord } from './schemas.js';
import { REFRESH_TTL_MS, Sessions, suspendedError, type LoginClient } from './sessions.js';
import { TwoFactor } from './two-factor.js';

export type { UserRecord } from './schemas.js';

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

export class AuthService {
  private readonly sessions: Sessions;
  private readonly twoFactor: TwoFactor;

  constructor(
    private readonly db: Db,
    private readonly clock: Clock,
    private readonly passwords: PasswordHasher,
    tokens: TokenService,
    /** Seals TOTP secrets at rest (AES-256-GCM): a copy of the database alone does not give them. */
    totpKey: Buffer,
    /** A session (a refresh-token family) ends this long after its login, however often it is refreshed. */
    sessionMaxMs: number = REFRESH_TTL_MS,
  ) {
    this.sessions = new Sessions(db, clock, tokens, sessionMaxMs);
    this.twoFactor = new TwoFactor(db, clock, totpKey, this.sessions);
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
    if (user.totp_enabled) return this.twoFactor.challenge(user.id);
    return this.db.transaction(async (tx) => {
      await this.sessions.recordLogin(tx, user.id, client, false);
      return this.sessions.issue(tx, user.id, newId());
    });
  }

  async account(userId: number): Promise<UserRecord> {
    const u = await repo.findUserById(this.db, userId);
    if (!u) throw unauthorized();
    return toUserRecord(u);
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

  // ---- the operator's view of accounts (modules/admin) ----

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

  // ---- sessions (sessions.ts, docs/authentication.md#refresh-tokens) ----

  /** Rotates the refresh token; a rotated token used again revokes its whole session. */
  async refresh(refreshToken: string): Promise<TokenResponse> {
    return this.sessions.refresh(refreshToken);
  }

  /** Revokes the session of `refreshToken`, which must belong to the caller. */
  async logout(userId: number, refreshToken: string): Promise<void> {
    return this.sessions.logout(userId, refreshToken);
  }

  /** Ends every session of the account, the caller's own included. */
  async logoutAll(userId: number): Promise<void> {
    return this.sessions.logoutAll(userId);
  }

  /** Housekeeping: forgets refresh tokens and two-factor challenges expired for longer than KEEP_EXPIRED_MS. */
  async purgeExpired(now: Date): Promise<number> {
    return this.sessions.purgeExpired(now);
  }

  /** An access token's user and session, or null (remembered for up to a second). */
  async authenticateAccessToken(token: string) {
    return this.sessions.authenticateAccessToken(token);
  }

  /** Many access tokens at once, straight from the database (an event stream's recheck). */
  async recheckAccessTokens(tokens: readonly string[]) {
    return this.sessions.recheckAccessTokens(tokens);
  }

  /** Forgets what was remembered about the user's sessions (after a change to them has committed). */
  forgetUser(userId: number): void {
    this.sessions.forgetUser(userId);
  }

  // ---- two-factor (two-factor.ts, docs/authentication.md#two-factor-authentication) ----

  async setupTwoFactor(userId: number): Promise<{ secret: string; otpauth_url: string }> {
    return this.twoFactor.setup(userId);
  }

  async enableTwoFactor(
    userId: number,
    code: string,
    currentSession: string | null = null,
  ): Promise<{ message: string; recovery_codes: string[] }> {
    return this.twoFactor.enable(userId, code, currentSession);
  }

  async disableTwoFactor(
    userId: number,
    code: string,
    currentSession: string | null = null,
  ): Promise<{ message: string }> {
    return this.twoFactor.disable(userId, code, currentSession);
  }

  async verifyTwoFactor(challengeToken: string, code: string, client: LoginClient = {}): Promise<TokenResponse> {
    return this.twoFactor.verify(challengeToken, code, client);
  }
}
