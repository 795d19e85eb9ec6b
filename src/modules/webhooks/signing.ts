/**
 * Standard Webhooks signatures (https://www.standardwebhooks.com): a secret
 * is `whsec_` and the base64 of 32 random bytes; a signature is `v1,` and
 * the base64 of HMAC-SHA256 over `<webhook-id>.<webhook-timestamp>.<body>`,
 * keyed with the secret's decoded bytes. Several signatures (while a
 * rotated secret still signs) go in one header, separated by spaces.
 */
import { createHmac } from 'node:crypto';
import { randomBytes } from '../../ids.js';

export const SECRET_PREFIX = 'whsec_';

export function newSecret(): string {
  return SECRET_PREFIX + randomBytes(32).toString('base64');
}

export function sign(secret: string, msgId: string, timestampS: number, body: string): string {
  const key = Buffer.from(secret.slice(SECRET_PREFIX.length), 'base64');
  return 'v1,' + createHmac('sha256', key).update(`${msgId}.${timestampS}.${body}`).digest('base64');
}

/** The three headers of one delivery, signed with every secret given (newest first). */
export function signedHeaders(
  secrets: string[],
  msgId: string,
  timestampS: number,
  body: string,
): Record<string, string> {
  return {
    'webhook-id': msgId,
    'webhook-timestamp': String(timestampS),
    'webhook-signature': secrets.map((s) => sign(s, msgId, timestampS, body)).join(' '),
  };
}
