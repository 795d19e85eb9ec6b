/**
 * Who a bearer credential names: a `gpc_` API key (with its scope), else an
 * access token (a session, scope read_write). What the HTTP layer's
 * authentication hook is given (see docs/authentication.md#credentials).
 */
import type { Identify } from '../../http/authenticate.js';
import type { Principal } from '../../http/principal.js';
import type { ApiKeyService } from '../api-keys/service.js';
import type { AuthService } from './service.js';

export function identifier(auth: AuthService, apiKeys: ApiKeyService): Identify {
  return async (credential) => {
    if (credential.startsWith('gpc_')) {
      const k = await apiKeys.authenticate(credential);
      if (!k) return 'Invalid, revoked or expired API key';
      return {
        userId: k.user_id,
        email: k.email,
        role: k.role,
        scope: k.scope,
        via: 'api_key',
        apiKeyId: k.id,
        suspended: k.suspended,
      } as Principal & { suspended: boolean };
    }
    const s = await auth.authenticateAccessToken(credential);
    if (!s) return 'Invalid or expired access token';
    return {
      userId: s.user.id,
      email: s.user.email,
      role: s.user.role,
      scope: 'read_write',
      via: 'session',
      sessionId: s.sessionId,
      suspended: s.user.suspended,
    } as Principal & { suspended: boolean };
  };
}
