/** Customer images (docs/images.md): snapshots of stopped VMs, listed, read and deleted by their owner. */
import type { FastifyInstance } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { Type } from 'typebox';
import { errorResponses, NO_CONTROL, page, pageArgs, PaginationQuery } from '../../http/schemas.js';
import { requirePrincipal } from '../../http/principal.js';
import { IMAGE_NAME_MAX, type SnapshotService } from './service.js';
import { ImageRecordSchema } from './schemas.js';

const ImageId = Type.Object({ image_id: Type.String({ description: 'Image id (uuid)' }) });

export function snapshotRoutes(app: FastifyInstance, snapshots: SnapshotService): void {
  const r = app.withTypeProvider<TypeBoxTypeProvider>();
  const read = { auth: 'user', scopes: ['read_only'], cache: 'no-store' } as const;
  const write = { auth: 'user', scopes: [], cache: 'no-store', rateLimit: 'vm' } as const;

  r.post(
    '/vms/:vm_id/snapshots',
    {
      schema: {
        tags: ['images'],
        operationId: 'createSnapshot',
        summary: 'Save a stopped VM as a private image',
        description:
          'The VM must be stopped (or interrupted): 400 invalid_state otherwise, and it cannot start until the copy is done. Answers 202 with the image `creating`; it becomes `ready` (billed per GB-hour from then, see GET /pricing) or `failed` with the reason. Counts against your image limits (10 images and 1000 GB by default; an image being made counts at its disk size): 400 limit_exceeded. `name`: 1 to 64 characters, no control characters (422).',
        params: Type.Object({ vm_id: Type.String({ description: 'VM uuid or vmid' }) }),
        body: Type.Object(
          { name: Type.String({ minLength: 1, maxLength: IMAGE_NAME_MAX, pattern: NO_CONTROL }) },
          { additionalProperties: false, examples: [{ name: 'trained-model-v2' }] },
        ),
        response: { 202: ImageRecordSchema, ...errorResponses(400, 401, 403, 404, 413, 415, 422, 429) },
      },
      config: write,
    },
    async (req, reply) => {
      reply.code(202);
      return snapshots.take(requirePrincipal(req.principal).userId, req.params.vm_id, req.body.name);
    },
  );

  r.get(
    '/images',
    {
      schema: {
        tags: ['images'],
        operationId: 'listMyImages',
        summary: 'List your images',
        description:
          'Your images, newest first, with size, state, source VM and hourly storage cost. Deleted ones are not listed. X-Total-Count holds the total.',
        querystring: Type.Object(PaginationQuery, { additionalProperties: false }),
        response: { 200: Type.Array(ImageRecordSchema), ...errorResponses(401, 403, 422, 429) },
      },
      config: read,
    },
    async (req, reply) =>
      page(reply, await snapshots.list(requirePrincipal(req.principal).userId, ...pageArgs(req.query))),
  );

  r.get(
    '/images/:image_id',
    {
      schema: {
        tags: ['images'],
        operationId: 'getMyImage',
        summary: 'Get one of your images',
        description: "Another user's image, or a deleted one, is 404.",
        params: ImageId,
        response: { 200: ImageRecordSchema, ...errorResponses(401, 403, 404, 429) },
      },
      config: read,
    },
    async (req) => snapshots.get(requirePrincipal(req.principal).userId, req.params.image_id),
  );

  r.delete(
    '/images/:image_id',
    {
      schema: {
        tags: ['images'],
        operationId: 'deleteMyImage',
        summary: 'Delete one of your images',
        description:
          "204. Its storage is billed up to this moment. VMs started from it keep their disks. One still being made is 400 invalid_state; another user's is 404.",
        params: ImageId,
        response: { 204: Type.Null({ description: 'Deleted' }), ...errorResponses(400, 401, 403, 404, 429) },
      },
      config: write,
    },
    async (req, reply) => {
      await snapshots.delete(requirePrincipal(req.principal).userId, req.params.image_id);
      reply.code(204);
    },
  );
}
