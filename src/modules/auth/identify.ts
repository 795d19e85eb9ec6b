/**
 * Who a bearer credential names: a `gpc_` API key (with its scope), else an
 * access token (a session, scope read_write). What the HTTP layer's
 * authentication hook is given (see docs/authentication.md#credentials), and
 * the same check for many credentials at once, for connections that outlive
 * their request (see docs/events.md#following-them-live-get-eventsstream).
 */
import type { Identified, Identify, Recheck } from '../../http/authenticate.js';
import type { ApiKeyService } from '../api-keys/service.js';
import type { ActiveKeyRow } from '../api-keys/repository.js';
import type { AuthService } from './service.js';
import type { SessionUser } from './repository.js';

const isApiKey = (credential: string) => credential.startsWith('gpc_');

const keyPrincipal = (k: ActiveKeyRow): Identified => ({
  userId: k.user_id,
  email: k.email,
  role: k.role,
  scope: k.scope,
  via: 'api_key',
  apiKeyId: k.id,
  suspended: k.suspended,
});

const sessionPrincipal = (s: { user: SessionUser; sessionId: string }): Identified => ({
  userId: s.user.id,
  email: s.user.email,
  role: s.user.role,
  scope: 'read_write',
  via: 'session',
  sessionId: s.sessionId,
  suspended: s.user.suspended,
});

export function identifier(auth: AuthService, apiKeys: ApiKeyService): Identify {
  return async (credential) => {
    if (isApiKey(credential)) {
      const k = await apiKeys.authenticate(credential);
      if (!k) return 'Invalid, revoked or expired API key';
      return keyPrincipal(k);
    }
    const s = await auth.authenticateAccessToken(credential);
    if (!s) return 'Invalid or expired access token';
    return sessionPrincipal(s);
  };
}

/** The identifier's check for many credentials: one query for the API keys, one for the sessions. */
export function rechecker(auth: AuthService, apiKeys: ApiKeyService): Recheck {
  return async (credentials) => {
    const [keys, tokens] = await Promise.all([
      apiKeys.recheck(credentials.filter(isApiKey)),
      auth.recheckAccessTokens(credentials.filter((c) => !isApiKey(c))),
    ]);
    const out = new Map<string, Identified | 'revoked' | 'expired'>();
    for (const [key, k] of keys) out.set(key, typeof k === 'string' ? k : keyPrincipal(k));
    for (const [token, s] of tokens) out.set(token, typeof s === 'string' ? s : sessionPrincipal(s));
    return out;
  };
}
