/** /api-keys: see docs/authentication.md#api-keys. */
import type { FastifyInstance } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { Type } from 'typebox';
import { DateTime, errorResponses, NO_CONTROL, Nullable, page, pageArgs, PaginationQuery } from '../../http/schemas.js';
import { requirePrincipal } from '../../http/principal.js';
import { notFound } from '../../errors.js';
import { UUID_RE } from '../../ids.js';
import type { ApiKeyService } from './service.js';
import { ApiKeySchema, CreatedApiKeySchema, ScopeSchema } from './schemas.js';

export function apiKeyRoutes(app: FastifyInstance, keys: ApiKeyService): void {
  const r = app.withTypeProvider<TypeBoxTypeProvider>();
  // Keys are managed with a session or a read_write key only (docs/authentication.md#scopes).
  const keyRoute = { auth: 'user', scopes: [], cache: 'no-store' } as const;

  r.post(
    '/api-keys',
    {
      schema: {
        tags: ['api-keys'],
        operationId: 'createApiKey',
        summary: 'Create an API key',
        description:
          'The key starts with `gpc_` and appears in this response only; it is stored hashed. Only a login session or a read_write key may manage keys, and never for a broader scope than its own. Honours Idempotency-Key.',
        body: Type.Object(
          {
            name: Type.String({
              minLength: 1,
              maxLength: 64,
              pattern: NO_CONTROL,
              description: 'A name for you; no control or formatting characters (they would reach terminals)',
            }),
            scope: Type.Optional(ScopeSchema),
            expires_at: Type.Optional(Nullable(DateTime('Optional expiry, in the future'))),
          },
          { additionalProperties: false, examples: [{ name: 'ci', scope: 'read_only' }] },
        ),
        response: { 201: CreatedApiKeySchema, ...errorResponses(400, 401, 403, 413, 415, 422, 429) },
      },
      config: { ...keyRoute, idempotent: true },
    },
    async (req, reply) => {
      reply.code(201);
      return keys.create(requirePrincipal(req.principal), req.body);
    },
  );

  r.get(
    '/api-keys',
    {
      schema: {
        tags: ['api-keys'],
        operationId: 'listApiKeys',
        summary: 'List API keys',
        description: 'Active keys, newest first, without the key itself. X-Total-Count holds the total.',
        querystring: Type.Object(PaginationQuery, { additionalProperties: false }),
        response: { 200: Type.Array(ApiKeySchema), ...errorResponses(401, 403, 422, 429) },
      },
      config: keyRoute,
    },
    async (req, reply) => page(reply, await keys.list(requirePrincipal(req.principal).userId, ...pageArgs(req.query))),
  );

  r.delete(
    '/api-keys/:key_id',
    {
      schema: {
        tags: ['api-keys'],
        operationId: 'revokeApiKey',
        summary: 'Revoke an API key',
        description:
          "The key and every key created with it stop working: at once on the instance that answers, within a second on every other instance. 204; 404 for an unknown, revoked or another user's key.",
        // Any id that is not a uuid cannot exist: 404 like a missing key, whatever its length.
        params: Type.Object({ key_id: Type.String({ description: 'API key id (uuid)' }) }),
        response: { 204: Type.Null({ description: 'Revoked' }), ...errorResponses(401, 403, 404, 429) },
      },
      config: keyRoute,
    },
    async (req, reply) => {
      if (!UUID_RE.test(req.params.key_id)) throw notFound('API key');
      await keys.revoke(requirePrincipal(req.principal), req.params.key_id);
      reply.code(204);
    },
  );
}
