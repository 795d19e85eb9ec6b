/** /ssh-keys (see docs/authentication.md#ssh-keys). Only metadata is ever returned. */
import type { FastifyInstance } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { Type } from 'typebox';
import { errorResponses, NO_CONTROL, Nullable, page, pageArgs, PaginationQuery } from '../../http/schemas.js';
import { requirePrincipal } from '../../http/principal.js';
import { notFound } from '../../errors.js';
import { UUID_RE } from '../../ids.js';
import type { SshKeyService } from './service.js';
import { SshKeySchema } from './schemas.js';

// Any id that is not a uuid cannot exist: 404 like a missing key (or another user's), whatever its length.
const KeyId = Type.Object({ key_id: Type.String({ description: 'SSH key id (uuid)' }) });

export function sshKeyRoutes(app: FastifyInstance, keys: SshKeyService): void {
  const r = app.withTypeProvider<TypeBoxTypeProvider>();
  const read = { auth: 'user', scopes: ['read_only'], cache: 'no-store' } as const;
  const write = { auth: 'user', scopes: [], cache: 'no-store' } as const;

  r.post(
    '/ssh-keys',
    {
      schema: {
        tags: ['ssh-keys'],
        operationId: 'createSshKey',
        summary: 'Upload an SSH public key',
        description:
          'OpenSSH one-line form: ssh-ed25519, ssh-rsa (2048 bits or more), ecdsa-sha2-nistp256/384/521, sk-ssh-ed25519@openssh.com, sk-ecdsa-sha2-nistp256@openssh.com. `label` defaults to the key\'s comment, else "key-N". At most 5 keys (400 `limit_exceeded`); the same key twice is 400 `conflict`. Honours Idempotency-Key.',
        body: Type.Object(
          {
            ssh_public_key: Type.String({ minLength: 1, maxLength: 16384 }),
            label: Type.Optional(Nullable(Type.String({ minLength: 1, maxLength: 64, pattern: NO_CONTROL }))),
          },
          {
            additionalProperties: false,
            examples: [
              {
                ssh_public_key:
                  'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEXAMPLEEXAMPLEEXAMPLEEXAMPLEEXAMPLEEXAMPLE ada@laptop',
                label: 'laptop',
              },
            ],
          },
        ),
        response: { 201: SshKeySchema, ...errorResponses(400, 401, 403, 413, 415, 422, 429) },
      },
      config: { ...write, idempotent: true },
    },
    async (req, reply) => {
      reply.code(201);
      return keys.add(requirePrincipal(req.principal).userId, req.body);
    },
  );

  r.get(
    '/ssh-keys',
    {
      schema: {
        tags: ['ssh-keys'],
        operationId: 'listSshKeys',
        summary: 'List SSH keys',
        description:
          'Your SSH public keys, newest first, with label, key type and SHA256 fingerprint. The key material is never returned.',
        querystring: Type.Object(PaginationQuery, { additionalProperties: false }),
        response: { 200: Type.Array(SshKeySchema), ...errorResponses(401, 403, 422, 429) },
      },
      config: read,
    },
    async (req, reply) => page(reply, await keys.list(requirePrincipal(req.principal).userId, ...pageArgs(req.query))),
  );

  r.get(
    '/ssh-keys/:key_id',
    {
      schema: {
        tags: ['ssh-keys'],
        operationId: 'getSshKey',
        summary: 'Get an SSH key',
        description: "One of your SSH keys by id. Another user's key is 404.",
        params: KeyId,
        response: { 200: SshKeySchema, ...errorResponses(401, 403, 404, 429) },
      },
      config: read,
    },
    async (req) => {
      if (!UUID_RE.test(req.params.key_id)) throw notFound('SSH key');
      return keys.get(requirePrincipal(req.principal).userId, req.params.key_id);
    },
  );

  r.delete(
    '/ssh-keys/:key_id',
    {
      schema: {
        tags: ['ssh-keys'],
        operationId: 'deleteSshKey',
        summary: 'Delete an SSH key',
        description: '204. VMs created with the key keep it.',
        params: KeyId,
        response: { 204: Type.Null({ description: 'Deleted' }), ...errorResponses(401, 403, 404, 429) },
      },
      config: write,
    },
    async (req, reply) => {
      if (!UUID_RE.test(req.params.key_id)) throw notFound('SSH key');
      await keys.remove(requirePrincipal(req.principal).userId, req.params.key_id);
      reply.code(204);
    },
  );
}
