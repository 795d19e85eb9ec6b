/**
 * The JSON of API keys: each TypeBox schema is the one definition of its shape, the OpenAPI
 * document's and ApiKeyService's type alike (docs/authentication.md#api-keys).
 */
import { Type, type Static } from 'typebox';
import { DateTime, Nullable } from '../../http/schemas.js';

export const ScopeSchema = Type.Union(
  [Type.Literal('read_write'), Type.Literal('read_only'), Type.Literal('billing_only')],
  {
    description:
      'read_write: everything; read_only: GETs of VMs, SSH keys, reservations, billing, account, events; billing_only: GET /billing/*, GET /account, POST /reservations/calculate',
  },
);

const ApiKeyFields = {
  id: Type.String({ format: 'uuid' }),
  name: Type.String(),
  scope: ScopeSchema,
  prefix: Type.String({ description: 'The first characters of the key, to tell keys apart' }),
  created_at: DateTime(),
  expires_at: Nullable(DateTime()),
  last_used_at: Nullable(DateTime()),
};

export const ApiKeySchema = Type.Object(ApiKeyFields, {
  description: 'An API key (never includes the key itself)',
  examples: [
    {
      id: '0b8f3c2e-3f1a-4c55-9d0e-6f1e2a3b4c5d',
      name: 'ci',
      scope: 'read_only',
      prefix: 'gpc_Zk3x9QaB',
      created_at: '2026-11-22T10:00:00.000Z',
      expires_at: null,
      last_used_at: null,
    },
  ],
});
export type ApiKeyRecord = Static<typeof ApiKeySchema>;

export const CreatedApiKeySchema = Type.Object(
  { ...ApiKeyFields, key: Type.String({ description: 'The key: shown in this response only, store it now' }) },
  { description: 'The new key, including `key` (shown once)' },
);
export type CreatedApiKeyRecord = Static<typeof CreatedApiKeySchema>;
