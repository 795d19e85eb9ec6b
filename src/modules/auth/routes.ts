/**
 * /auth/*, /account and the launch tokens' public keys (see docs/authentication.md). Handlers are thin:
 * the rules live in AuthService.
 */
import type { FastifyInstance } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { Type } from 'typebox';
import { errorResponses, MessageResponse, NO_CONTROL_CC, Nullable } from '../../http/schemas.js';
import { requirePrincipal } from '../../http/principal.js';
import { assertNoBody } from '../../http/no-body.js';
import type { AuthService } from './service.js';
import type { TokenService } from './tokens.js';
import { ChallengeResponseSchema, TokenResponseSchema, UserRecordSchema } from './schemas.js';

const Password = Type.String({ minLength: 12, maxLength: 1024, description: 'At least 12 characters' });
const Code = Type.String({
  minLength: 1,
  maxLength: 64,
  description: 'A 6-digit TOTP code (or, where allowed, a recovery code)',
  examples: ['123456'],
});

/**
 * For operations that take no body: none, `null` or `{}` is fine; any field is
 * refused like every unknown field (no silent ignore).
 */
export function authRoutes(app: FastifyInstance, auth: AuthService, tokens: TokenService): void {
  const r = app.withTypeProvider<TypeBoxTypeProvider>();

  r.post(
    '/auth/register',
    {
      schema: {
        tags: ['auth'],
        operationId: 'register',
        summary: 'Create an account',
        description:
          'Email must be unique (case-insensitively); a taken email is 400 `conflict`. Password: 12 characters or more.',
        security: [],
        body: Type.Object(
          {
            email: Type.String({ format: 'email', maxLength: 254 }),
            password: Password,
            // No control characters: a display name is one line of text (and PostgreSQL text cannot hold U+0000).
            name: Type.Optional(Nullable(Type.String({ maxLength: 100, pattern: NO_CONTROL_CC }))),
          },
          {
            additionalProperties: false,
            examples: [{ email: 'ada@example.com', password: 'correct horse battery', name: 'Ada' }],
          },
        ),
        response: { 201: UserRecordSchema, ...errorResponses(400, 413, 415, 422, 429) },
      },
      config: { auth: 'public', cache: 'no-store', rateLimit: 'auth' },
    },
    async (req, reply) => {
      reply.code(201);
      return auth.register(req.body);
    },
  );

  r.post(
    '/auth/login',
    {
      schema: {
        tags: ['auth'],
        operationId: 'login',
        summary: 'Log in with email and password',
        description:
          'Returns a token pair, or, when two-factor authentication is on, `{two_factor_required, challenge_token, expires_in}` to complete with POST /auth/2fa/verify. Failed attempts are limited per email: 5 a minute from one client address and 20 from all addresses together (the defaults); a successful login uses up nothing. Every attempt also counts towards a limit per client address. Past a limit: 429 with Retry-After.',
        security: [],
        body: Type.Object(
          {
            email: Type.String({ minLength: 1, maxLength: 254 }),
            password: Type.String({ minLength: 1, maxLength: 1024 }),
          },
          { additionalProperties: false, examples: [{ email: 'ada@example.com', password: 'correct horse battery' }] },
        ),
        response: {
          200: Type.Union([TokenResponseSchema, ChallengeResponseSchema]),
          ...errorResponses(401, 403, 413, 415, 422, 429),
        },
      },
      config: { auth: 'public', cache: 'no-store', rateLimit: 'login' },
    },
    async (req) => auth.login(req.body.email, req.body.password, { ip: req.ip, userAgent: req.headers['user-agent'] }),
  );

  r.post(
    '/auth/refresh',
    {
      schema: {
        tags: ['auth'],
        operationId: 'refreshTokens',
        summary: 'Exchange a refresh token for a new token pair',
        description:
          'The refresh token is rotated: the one sent stops working at once. Sending an already-rotated token revokes the whole session (every token from the same login) and answers 401.',
        security: [],
        body: Type.Object(
          { refresh_token: Type.String({ minLength: 1, maxLength: 512 }) },
          { additionalProperties: false },
        ),
        response: { 200: TokenResponseSchema, ...errorResponses(401, 403, 422, 429) },
      },
      config: { auth: 'public', cache: 'no-store', rateLimit: 'auth' },
    },
    async (req) => auth.refresh(req.body.refresh_token),
  );

  r.post(
    '/auth/logout',
    {
      schema: {
        tags: ['auth'],
        operationId: 'logout',
        summary: 'Revoke a session',
        description: "Revokes the refresh token's whole family and the access tokens issued with it. 204.",
        body: Type.Object(
          { refresh_token: Type.String({ minLength: 1, maxLength: 512 }) },
          { additionalProperties: false },
        ),
        response: { 204: Type.Null({ description: 'Logged out' }), ...errorResponses(401, 403, 422, 429) },
      },
      config: { auth: 'user', scopes: [], cache: 'no-store', rateLimit: 'auth' },
    },
    async (req, reply) => {
      await auth.logout(requirePrincipal(req.principal).userId, req.body.refresh_token);
      reply.code(204);
    },
  );

  r.post(
    '/auth/logout-all',
    {
      schema: {
        tags: ['auth'],
        operationId: 'logoutAll',
        summary: 'End every session',
        description:
          'Revokes every refresh token of the account and the access tokens issued with them, this session included: everywhere the account is signed in, it is signed out. API keys are not affected (revoke them with DELETE /api-keys/{id}). 204. Needs a signed-in session.',
        response: { 204: Type.Null({ description: 'Every session ended' }), ...errorResponses(401, 403, 429) },
      },
      config: { auth: 'user', scopes: [], cache: 'no-store', rateLimit: 'auth', sessionOnly: true },
    },
    async (req, reply) => {
      assertNoBody(req.body);
      await auth.logoutAll(requirePrincipal(req.principal).userId);
      reply.code(204);
    },
  );

  r.post(
    '/account/password',
    {
      schema: {
        tags: ['account'],
        operationId: 'changePassword',
        summary: 'Change the password',
        description:
          'Needs the current password (422 on body.current_password when it is wrong) and a new one of at least 12 characters. Every other session of the account ends; this one goes on. Needs a signed-in session: an API key gets 403.',
        body: Type.Object(
          { current_password: Type.String({ minLength: 1, maxLength: 1024 }), new_password: Password },
          { additionalProperties: false },
        ),
        response: { 200: MessageResponse, ...errorResponses(401, 403, 415, 422, 429) },
      },
      config: { auth: 'user', scopes: [], cache: 'no-store', rateLimit: 'auth', sessionOnly: true },
    },
    async (req) => {
      const p = requirePrincipal(req.principal);
      return auth.changePassword(p.userId, p.sessionId ?? null, req.body.current_password, req.body.new_password);
    },
  );

  r.post(
    '/auth/2fa/setup',
    {
      schema: {
        tags: ['auth'],
        operationId: 'setupTwoFactor',
        summary: 'Start two-factor setup',
        description:
          'Returns a new TOTP secret and its otpauth:// URL (for a QR code). Not active until POST /auth/2fa/enable with a code. Needs a signed-in session: an API key gets 403.',
        response: {
          200: Type.Object(
            { secret: Type.String(), otpauth_url: Type.String() },
            {
              examples: [
                {
                  secret: 'JBSWY3DPEHPK3PXPJBSWY3DPEHPK3PXP',
                  otpauth_url: 'otpauth://totp/gpucloud:ada%40example.com?secret=...',
                },
              ],
            },
          ),
          ...errorResponses(400, 401, 403, 429),
        },
      },
      config: { auth: 'user', scopes: [], cache: 'no-store', rateLimit: 'auth', sessionOnly: true },
    },
    async (req) => {
      assertNoBody(req.body);
      return auth.setupTwoFactor(requirePrincipal(req.principal).userId);
    },
  );

  r.post(
    '/auth/2fa/enable',
    {
      schema: {
        tags: ['auth'],
        operationId: 'enableTwoFactor',
        summary: 'Enable two-factor authentication',
        description:
          'Confirms setup with a current code and returns 10 single-use recovery codes (shown once). A wrong code is 400 `invalid_code`. Ends every other session of the account. Needs a signed-in session: an API key gets 403.',
        body: Type.Object({ code: Code }, { additionalProperties: false }),
        response: {
          200: Type.Object({
            message: Type.String(),
            recovery_codes: Type.Array(Type.String(), { minItems: 10, maxItems: 10 }),
          }),
          ...errorResponses(400, 401, 403, 422, 429),
        },
      },
      config: { auth: 'user', scopes: [], cache: 'no-store', rateLimit: 'auth', sessionOnly: true },
    },
    async (req) => {
      const p = requirePrincipal(req.principal);
      return auth.enableTwoFactor(p.userId, req.body.code, p.sessionId ?? null);
    },
  );

  r.post(
    '/auth/2fa/disable',
    {
      schema: {
        tags: ['auth'],
        operationId: 'disableTwoFactor',
        summary: 'Disable two-factor authentication',
        description:
          'Needs a current TOTP code or an unused recovery code. A wrong code is 400 `invalid_code`. Ends every other session of the account. Needs a signed-in session: an API key gets 403.',
        body: Type.Object({ code: Code }, { additionalProperties: false }),
        response: { 200: MessageResponse, ...errorResponses(400, 401, 403, 422, 429) },
      },
      config: { auth: 'user', scopes: [], cache: 'no-store', rateLimit: 'auth', sessionOnly: true },
    },
    async (req) => {
      const p = requirePrincipal(req.principal);
      return auth.disableTwoFactor(p.userId, req.body.code, p.sessionId ?? null);
    },
  );

  r.post(
    '/auth/2fa/verify',
    {
      schema: {
        tags: ['auth'],
        operationId: 'verifyTwoFactor',
        summary: 'Complete a two-factor login',
        description:
          "Exchanges the challenge token from login plus a TOTP code (one 30 s step of drift accepted, each code once) or an unused recovery code for a token pair. Wrong, replayed or used-up codes and unknown or expired challenges are 401. Ten wrong codes in a row (across logins, and through disable) lock the account's second factor for 15 minutes: 429 with Retry-After.",
        security: [],
        body: Type.Object(
          { challenge_token: Type.String({ minLength: 1, maxLength: 512 }), code: Code },
          { additionalProperties: false },
        ),
        response: { 200: TokenResponseSchema, ...errorResponses(401, 403, 422, 429) },
      },
      config: { auth: 'public', cache: 'no-store', rateLimit: 'auth' },
    },
    async (req) => {
      return auth.verifyTwoFactor(req.body.challenge_token, req.body.code, {
        ip: req.ip,
        userAgent: req.headers['user-agent'],
      });
    },
  );

  r.get(
    '/account',
    {
      schema: {
        tags: ['account'],
        operationId: 'getAccount',
        summary: "The caller's account",
        description:
          'The account the access token or API key belongs to: email, name, role and whether two-factor authentication is on. Every key scope can read it.',
        response: { 200: UserRecordSchema, ...errorResponses(401, 403, 429) },
      },
      config: { auth: 'user', scopes: ['read_only', 'billing_only'], cache: 'no-store' },
    },
    async (req) => auth.account(requirePrincipal(req.principal).userId),
  );

  // Through `app`: jose's JWK type leaves every member optional, where the schema lists those the key has.
  app.get(
    '/.well-known/jwks.json',
    {
      schema: {
        tags: ['auth'],
        operationId: 'getLaunchTokenKeys',
        summary: 'Public keys of launch tokens',
        description:
          'The JSON Web Key Set that verifies the WebUI/Jupyter launch tokens of access-info (EdDSA, Ed25519): a portal checks them with this public key alone and cannot mint any token. Access tokens are signed otherwise and never verify against it.',
        security: [],
        response: {
          200: Type.Object({
            keys: Type.Array(
              Type.Object({
                kty: Type.String(),
                crv: Type.String(),
                x: Type.String(),
                kid: Type.String(),
                alg: Type.String(),
                use: Type.String(),
              }),
            ),
          }),
          ...errorResponses(429),
        },
      },
      config: { auth: 'public', cache: 'public' },
    },
    async (_req, reply) => {
      reply.header('Cache-Control', 'public, max-age=300');
      return tokens.jwks();
    },
  );
}
