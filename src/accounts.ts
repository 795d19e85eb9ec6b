/**
 * What every layer knows of an account: its role, and the one form of an
 * email address that accounts, logins and their rate limits are keyed by
 * (see docs/authentication.md#accounts).
 */
export type Role = 'user' | 'admin';

/** Emails are compared without surrounding spaces and without case. */
export const normalizeEmail = (email: string) => email.trim().toLowerCase();
