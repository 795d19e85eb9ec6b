/**
 * The JSON of accounts and tokens: each TypeBox schema is the one definition of its shape, the
 * OpenAPI document's and AuthService's type alike (docs/authentication.md).
 */
import { Type, type Static } from 'typebox';
import { DateTime, Nullable } from '../../http/schemas.js';

export const UserRecordSchema = Type.Object(
  {
    id: Type.Integer(),
    email: Type.String({ format: 'email' }),
    name: Nullable(Type.String()),
    role: Type.Union([Type.Literal('user'), Type.Literal('admin')]),
    two_factor_enabled: Type.Boolean(),
    created_at: DateTime(),
  },
  {
    description: 'A user account',
    examples: [
      {
        id: 7,
        email: 'ada@example.com',
        name: 'Ada',
        role: 'user',
        two_factor_enabled: false,
        created_at: '2026-11-22T10:00:00.000Z',
      },
    ],
  },
);
export type UserRecord = Static<typeof UserRecordSchema>;

export const TokenResponseSchema = Type.Object(
  {
    access_token: Type.String({ description: 'JWT, valid for expires_in seconds' }),
    refresh_token: Type.String({ description: 'Opaque; single use: each refresh returns a new one' }),
    token_type: Type.Literal('bearer'),
    expires_in: Type.Integer({ examples: [3600] }),
  },
  {
    description: 'Token pair',
    examples: [
      { access_token: 'eyJhbGciOiJIUzI1NiJ9...', refresh_token: 'n3Q...', token_type: 'bearer', expires_in: 3600 },
    ],
  },
);
export type TokenResponse = Static<typeof TokenResponseSchema>;

export const ChallengeResponseSchema = Type.Object(
  {
    two_factor_required: Type.Literal(true),
    challenge_token: Type.String({ description: 'Send with a TOTP or recovery code to POST /auth/2fa/verify' }),
    expires_in: Type.Integer({ examples: [300] }),
  },
  { description: 'Returned by login instead of tokens when two-factor authentication is on' },
);
export type ChallengeResponse = Static<typeof ChallengeResponseSchema>;
