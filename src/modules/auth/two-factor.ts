/**
 * Two-factor authentication (docs/authentication.md#two-factor-authentication): setting up, enabling
 * and disabling a TOTP secret, and completing a login's challenge with a code.
 */
import type { Db, Queryable } from '../../db/db.js';
import type { Clock } from '../../clock.js';
import { open, seal } from '../../crypto.js';
import { AppError, invalidState, unauthorized } from '../../errors.js';
import { newId, randomBytes, randomToken, sha256Hex } from '../../ids.js';
import { recordEvent } from '../events/service.js';
import * as repo from './repository.js';
import type { UserRow } from './repository.js';
import type { ChallengeResponse, TokenResponse } from './schemas.js';
import { suspendedError, type LoginClient, type Sessions } from './sessions.js';
import { generateRecoveryCodes, generateTotpSecret, normalizeRecoveryCode, otpauthUrl, verifyTotp } from './totp.js';

export const CHALLENGE_TTL_S = 300;
export const CHALLENGE_MAX_ATTEMPTS = 5;
/** Wrong second-factor codes in a row (across logins) that lock an account's second factor ... */
export const TOTP_MAX_FAILURES = 10;
/** ... for this long (service time). */
export const TOTP_LOCK_S = 15 * 60;

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

export class TwoFactor {
  constructor(
    private readonly db: Db,
    private readonly clock: Clock,
    /** Seals TOTP secrets at rest (AES-256-GCM): a copy of the database alone does not give them. */
    private readonly totpKey: Buffer,
    private readonly sessions: Sessions,
  ) {}

  private sealTotp(secret: string): string {
    return seal(this.totpKey, secret);
  }

  /** A sealed secret, or one stored before secrets were sealed (base32 never starts with "v1:"). */
  private openTotp(stored: string): string {
    return stored.startsWith('v1:') ? open(this.totpKey, stored) : stored;
  }

  /** A login's password was right and the account has a second factor: the challenge to complete. */
  async challenge(userId: number): Promise<ChallengeResponse> {
    const now = this.clock.now();
    const token = randomToken(32);
    await repo.insertChallenge(this.db, {
      id: newId(),
      userId,
      tokenHash: sha256Hex(token),
      now,
      expiresAt: new Date(now.getTime() + CHALLENGE_TTL_S * 1000),
    });
    return { two_factor_required: true, challenge_token: token, expires_in: CHALLENGE_TTL_S };
  }

  async setup(userId: number): Promise<{ secret: string; otpauth_url: string }> {
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

  async enable(
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
    this.sessions.forgetUser(userId);
    return enabled;
  }

  async disable(userId: number, code: string, currentSession: string | null = null): Promise<{ message: string }> {
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
    this.sessions.forgetUser(userId);
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

  /** Completes a login's challenge with a code: the session's token pair. */
  async verify(challengeToken: string, code: string, client: LoginClient = {}): Promise<TokenResponse> {
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
      await this.sessions.recordLogin(tx, u.id, client, true);
      return { tokens: await this.sessions.issue(tx, u.id, newId()) } as const;
    });
    if ('error' in outcome) throw outcome.error;
    return outcome.tokens;
  }
}
