/** The only SQL of accounts, sessions, challenges and recovery codes. */
import type { Queryable } from '../../db/db.js';
import type { Row } from '../../db/rows.js';

import { normalizeEmail, type Role } from '../../accounts.js';

export { normalizeEmail, type Role };

export type UserRow = Row<'users'>;

export type RefreshRow = Omit<Row<'refresh_tokens'>, 'token_hash'>;

export type ChallengeRow = Pick<Row<'auth_challenges'>, 'id' | 'user_id' | 'expires_at' | 'attempts' | 'used_at'>;

/** PostgreSQL text cannot hold U+0000: a lookup by such a string fails the query (a 500), yet can match nothing. */
const holdsNul = (s: string) => s.includes('\u0000');

export async function insertUser(
  q: Queryable,
  u: { email: string; name: string | null; passwordHash: string; role: Role; now: Date },
): Promise<UserRow> {
  const r = await q.query<UserRow>(
    `INSERT INTO users (email, email_normalized, name, password_hash, role, created_at, updated_at)
     VALUES ($1, $2, $3, $4, $5, $6, $6) RETURNING *`,
    [u.email.trim(), normalizeEmail(u.email), u.name, u.passwordHash, u.role, u.now],
  );
  return r.rows[0]!;
}

export async function findUserByEmail(q: Queryable, email: string): Promise<UserRow | undefined> {
  if (holdsNul(email)) return undefined;
  return (await q.query<UserRow>('SELECT * FROM users WHERE email_normalized = $1', [normalizeEmail(email)])).rows[0];
}

export async function findUserById(q: Queryable, id: number, forUpdate = false): Promise<UserRow | undefined> {
  return (await q.query<UserRow>(`SELECT * FROM users WHERE id = $1${forUpdate ? ' FOR NO KEY UPDATE' : ''}`, [id]))
    .rows[0];
}

export async function setPasswordAndRole(
  q: Queryable,
  email: string,
  passwordHash: string,
  role: Role,
  now: Date,
): Promise<UserRow | undefined> {
  const r = await q.query<UserRow>(
    'UPDATE users SET password_hash = $2, role = $3, updated_at = $4 WHERE email_normalized = $1 RETURNING *',
    [normalizeEmail(email), passwordHash, role, now],
  );
  return r.rows[0];
}

/** A session's user, and whether the session can no longer be used. */
export type SessionUser = Pick<UserRow, 'id' | 'email' | 'role' | 'suspended'> & { family_revoked: boolean };

/** Whether the session family `family` (an SQL expression) is unusable for the user `u` (see findUserForSession). */
const familyRevoked = (family: string) =>
  `(EXISTS (SELECT 1 FROM revoked_families f WHERE f.family_id = ${family})
    OR NOT EXISTS (SELECT 1 FROM refresh_tokens r
                    WHERE r.family_id = ${family} AND r.user_id = u.id AND r.revoked_at IS NULL))`;

const USER_FOR_SESSION = `SELECT u.id, u.email, u.role, u.suspended, ${familyRevoked('$2')} AS family_revoked
                            FROM users u WHERE u.id = $1`;

/**
 * For authentication of a JWT: the user plus whether its session family is
 * unusable, in one round trip. A family is live while it is not revoked and
 * still holds an unrevoked refresh token of this very user: a well-signed
 * token naming a family that was never issued, or another user's, is refused.
 */
export async function findUserForSession(q: Queryable, id: number, familyId: string): Promise<SessionUser | undefined> {
  return (await q.query<SessionUser>(USER_FOR_SESSION, [id, familyId])).rows[0];
}

/** findUserForSession for many (user, family) pairs in one round trip; a pair whose user is gone has no row. */
export async function findUsersForSessions(
  q: Queryable,
  sessions: readonly { userId: number; familyId: string }[],
): Promise<(SessionUser & { family_id: string })[]> {
  if (sessions.length === 0) return [];
  const r = await q.query<SessionUser & { family_id: string }>(
    `SELECT s.family_id, u.id, u.email, u.role, u.suspended, ${familyRevoked('s.family_id')} AS family_revoked
       FROM unnest($1::int8[], $2::uuid[]) AS s(user_id, family_id) JOIN users u ON u.id = s.user_id`,
    [sessions.map((s) => s.userId), sessions.map((s) => s.familyId)],
  );
  return r.rows;
}

// ---- refresh tokens ----

export async function insertRefreshToken(
  q: Queryable,
  t: { id: string; userId: number; familyId: string; tokenHash: string; now: Date; expiresAt: Date },
): Promise<void> {
  await q.query(
    `INSERT INTO refresh_tokens (id, user_id, family_id, token_hash, created_at, expires_at)
     VALUES ($1, $2, $3, $4, $5, $6)`,
    [t.id, t.userId, t.familyId, t.tokenHash, t.now, t.expiresAt],
  );
}

export async function findRefreshTokenForUpdate(q: Queryable, tokenHash: string): Promise<RefreshRow | undefined> {
  return (
    await q.query<RefreshRow>(
      `SELECT id, user_id, family_id, created_at, expires_at, rotated_at, revoked_at
         FROM refresh_tokens WHERE token_hash = $1 FOR UPDATE`,
      [tokenHash],
    )
  ).rows[0];
}

export async function markRotated(q: Queryable, id: string, now: Date): Promise<boolean> {
  const r = await q.query('UPDATE refresh_tokens SET rotated_at = $2 WHERE id = $1 AND rotated_at IS NULL', [id, now]);
  return r.rowCount === 1;
}

/** When a session began: its first refresh token. */
export async function familyStartedAt(q: Queryable, familyId: string): Promise<Date> {
  const r = await q.query<{ started: Date }>(
    'SELECT min(created_at) AS started FROM refresh_tokens WHERE family_id = $1',
    [familyId],
  );
  return r.rows[0]!.started;
}

export async function isFamilyRevoked(q: Queryable, familyId: string): Promise<boolean> {
  return (await q.query('SELECT 1 FROM revoked_families WHERE family_id = $1', [familyId])).rows.length > 0;
}

export async function revokeFamily(
  q: Queryable,
  familyId: string,
  userId: number,
  now: Date,
  reason: string,
): Promise<void> {
  await q.query(
    `INSERT INTO revoked_families (family_id, user_id, revoked_at, reason) VALUES ($1, $2, $3, $4)
     ON CONFLICT (family_id) DO NOTHING`,
    [familyId, userId, now, reason],
  );
  await q.query('UPDATE refresh_tokens SET revoked_at = $2 WHERE family_id = $1 AND revoked_at IS NULL', [
    familyId,
    now,
  ]);
}

/** Every open session of a user but `keep` (the caller's own, if any): 2FA and password changes, logout-all. */
export async function revokeAllFamilies(
  q: Queryable,
  userId: number,
  now: Date,
  reason: string,
  keep: string | null = null,
): Promise<void> {
  await q.query(
    `INSERT INTO revoked_families (family_id, user_id, revoked_at, reason)
     SELECT DISTINCT family_id, user_id, $2::timestamptz, $3 FROM refresh_tokens
      WHERE user_id = $1 AND revoked_at IS NULL AND family_id IS DISTINCT FROM $4::uuid
     ON CONFLICT (family_id) DO NOTHING`,
    [userId, now, reason, keep],
  );
  await q.query(
    'UPDATE refresh_tokens SET revoked_at = $2 WHERE user_id = $1 AND revoked_at IS NULL AND family_id IS DISTINCT FROM $3::uuid',
    [userId, now, keep],
  );
}

export async function setPassword(q: Queryable, userId: number, passwordHash: string, now: Date): Promise<void> {
  await q.query('UPDATE users SET password_hash = $2, updated_at = $3 WHERE id = $1', [userId, passwordHash, now]);
}

// ---- two-factor ----

export async function setPendingTotp(q: Queryable, userId: number, secret: string, now: Date): Promise<void> {
  await q.query('UPDATE users SET totp_pending_secret = $2, updated_at = $3 WHERE id = $1', [userId, secret, now]);
}

export async function enableTotp(q: Queryable, userId: number, secret: string, step: number, now: Date): Promise<void> {
  await q.query(
    `UPDATE users SET totp_secret = $2, totp_pending_secret = NULL, totp_enabled = true, totp_last_step = $3, updated_at = $4
      WHERE id = $1`,
    [userId, secret, step, now],
  );
}

export async function disableTotp(q: Queryable, userId: number, now: Date): Promise<void> {
  await q.query(
    `UPDATE users SET totp_secret = NULL, totp_pending_secret = NULL, totp_enabled = false, totp_last_step = NULL, updated_at = $2
      WHERE id = $1`,
    [userId, now],
  );
  await q.query('DELETE FROM recovery_codes WHERE user_id = $1', [userId]);
}

/** A wrong second-factor code; locks the second factor until `lockUntil` when given (and starts the count again). */
export async function recordTotpFailure(q: Queryable, userId: number, lockUntil: Date | null): Promise<void> {
  await q.query(
    lockUntil
      ? 'UPDATE users SET totp_failures = 0, totp_locked_until = $2 WHERE id = $1'
      : 'UPDATE users SET totp_failures = totp_failures + 1 WHERE id = $1 AND $2::timestamptz IS NULL',
    [userId, lockUntil],
  );
}

export async function clearTotpFailures(q: Queryable, userId: number): Promise<void> {
  await q.query(
    'UPDATE users SET totp_failures = 0, totp_locked_until = NULL WHERE id = $1 AND (totp_failures <> 0 OR totp_locked_until IS NOT NULL)',
    [userId],
  );
}

export async function setTotpLastStep(q: Queryable, userId: number, step: number): Promise<void> {
  await q.query('UPDATE users SET totp_last_step = $2 WHERE id = $1', [userId, step]);
}

export async function replaceRecoveryCodes(
  q: Queryable,
  userId: number,
  codes: { id: string; hash: string }[],
): Promise<void> {
  await q.query('DELETE FROM recovery_codes WHERE user_id = $1', [userId]);
  for (const c of codes) {
    await q.query('INSERT INTO recovery_codes (id, user_id, code_hash) VALUES ($1, $2, $3)', [c.id, userId, c.hash]);
  }
}

/** Marks an unused recovery code used; true when it existed and was unused. */
export async function useRecoveryCode(q: Queryable, userId: number, hash: string, now: Date): Promise<boolean> {
  const r = await q.query(
    'UPDATE recovery_codes SET used_at = $3 WHERE user_id = $1 AND code_hash = $2 AND used_at IS NULL',
    [userId, hash, now],
  );
  return r.rowCount === 1;
}

export async function insertChallenge(
  q: Queryable,
  c: { id: string; userId: number; tokenHash: string; now: Date; expiresAt: Date },
): Promise<void> {
  await q.query(
    'INSERT INTO auth_challenges (id, user_id, token_hash, created_at, expires_at) VALUES ($1, $2, $3, $4, $5)',
    [c.id, c.userId, c.tokenHash, c.now, c.expiresAt],
  );
}

export async function findChallengeForUpdate(q: Queryable, tokenHash: string): Promise<ChallengeRow | undefined> {
  return (
    await q.query<ChallengeRow>(
      'SELECT id, user_id, expires_at, attempts, used_at FROM auth_challenges WHERE token_hash = $1 FOR UPDATE',
      [tokenHash],
    )
  ).rows[0];
}

export async function updateChallenge(q: Queryable, id: string, attempts: number, usedAt: Date | null): Promise<void> {
  await q.query('UPDATE auth_challenges SET attempts = $2, used_at = $3 WHERE id = $1', [id, attempts, usedAt]);
}

// ---- admin ----

export async function listUsers(
  q: Queryable,
  f: { email?: string; limit: number; offset: number },
): Promise<{ rows: UserRow[]; total: number }> {
  // `email` filters by substring, case-insensitively; LIKE wildcards in it are literal.
  if (f.email && holdsNul(f.email)) return { rows: [], total: 0 };
  const pattern = f.email ? '%' + normalizeEmail(f.email).replace(/[\\%_]/g, (c) => '\\' + c) + '%' : null;
  const where = pattern ? 'WHERE email_normalized LIKE $1' : '';
  const filter = pattern ? [pattern] : [];
  const rows = await q.query<UserRow>(
    `SELECT * FROM users ${where} ORDER BY created_at DESC, id DESC LIMIT $${filter.length + 1} OFFSET $${filter.length + 2}`,
    [...filter, f.limit, f.offset],
  );
  const total = await q.query<{ n: number }>(`SELECT count(*)::int8 AS n FROM users ${where}`, filter);
  return { rows: rows.rows, total: total.rows[0]!.n };
}

export async function updateUserAdmin(
  q: Queryable,
  id: number,
  p: { role?: Role; suspended?: boolean; max_vms?: number | null; max_gpus?: number | null },
  now: Date,
): Promise<UserRow | undefined> {
  const sets: string[] = [];
  const params: unknown[] = [id, now];
  for (const k of ['role', 'suspended', 'max_vms', 'max_gpus'] as const) {
    const v = p[k];
    if (v === undefined) continue;
    params.push(v);
    sets.push(`${k} = $${params.length}`);
  }
  const r = await q.query<UserRow>(
    `UPDATE users SET ${[...sets, 'updated_at = $2'].join(', ')} WHERE id = $1 RETURNING *`,
    params,
  );
  return r.rows[0];
}

// ---- housekeeping ----

/**
 * Forgets up to `limit` refresh tokens and up to `limit` two-factor challenges that expired before `before`;
 * returns how many. A session's tokens go only together, once the last of them expired before `before`: its
 * first token says when it began, which bounds its length.
 */
export async function purgeExpired(q: Queryable, before: Date, limit: number): Promise<number> {
  const tokens = await q.query(
    `DELETE FROM refresh_tokens WHERE id IN (
       SELECT r.id FROM refresh_tokens r
        WHERE r.expires_at < $1
          AND NOT EXISTS (SELECT 1 FROM refresh_tokens n WHERE n.family_id = r.family_id AND n.expires_at >= $1)
        LIMIT $2)`,
    [before, limit],
  );
  const challenges = await q.query(
    'DELETE FROM auth_challenges WHERE id IN (SELECT id FROM auth_challenges WHERE expires_at < $1 LIMIT $2)',
    [before, limit],
  );
  return tokens.rowCount + challenges.rowCount;
}
