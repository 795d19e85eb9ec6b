/**
 * /admin/images and their uploads, and the download route host agents use
 * (docs/templates.md#pushing-an-image). An upload's bytes arrive in ranges of
 * at most 64 MiB, each an application/octet-stream body streamed to the store.
 */
import type { Readable } from 'node:stream';
import type { FastifyInstance } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { Type } from 'typebox';
import { errorResponses, page, paging, PaginationQuery } from '../../http/schemas.js';
import { AppError } from '../../errors.js';
import type { ImageService } from './service.js';
import { UPLOAD_RANGE_MAX } from './service.js';
import { ImageSchema, UploadSchema } from './schemas.js';

const Sha256 = Type.String({ pattern: '^[0-9a-f]{64}$', description: 'SHA-256, lowercase hex' });

const UploadId = Type.Object({ upload_id: Type.String({ maxLength: 64, description: 'Upload id (uuid)' }) });

export function imageRoutes(app: FastifyInstance, images: ImageService): void {
  const r = app.withTypeProvider<TypeBoxTypeProvider>();
  const admin = { auth: 'admin', scopes: [], cache: 'no-store' } as const;

  r.post(
    '/admin/images/uploads',
    {
      schema: {
        tags: ['admin'],
        operationId: 'createImageUpload',
        summary: 'Start an image upload',
        description: `Then PUT its bytes in ranges of at most ${UPLOAD_RANGE_MAX / 1024 / 1024} MiB (/admin/images/uploads/{upload_id}?offset=N) and complete it. With sha256, completing refuses other bytes; with template_vmid, the image becomes that template's. An upload not completed within a day is forgotten.`,
        body: Type.Object(
          {
            size_bytes: Type.Integer({ minimum: 1, maximum: Number.MAX_SAFE_INTEGER }),
            sha256: Type.Optional(Sha256),
            template_vmid: Type.Optional(Type.Integer({ minimum: 100, maximum: 999_999 })),
          },
          { additionalProperties: false },
        ),
        response: { 201: UploadSchema, ...errorResponses(400, 401, 403, 422, 429) },
      },
      config: admin,
    },
    async (req, reply) => reply.code(201).send(await images.createUpload(req.body)),
  );

  r.get(
    '/admin/images/uploads/:upload_id',
    {
      schema: {
        tags: ['admin'],
        operationId: 'getImageUpload',
        summary: 'An upload in progress (where to resume it)',
        description: 'received_bytes is where the next range starts; 404 once completed, cancelled or expired.',
        params: UploadId,
        response: { 200: UploadSchema, ...errorResponses(401, 403, 404, 429) },
      },
      config: admin,
    },
    async (req) => images.upload(req.params.upload_id),
  );

  // Ranges are raw bytes: this scope alone reads application/octet-stream bodies, as a stream.
  void app.register(async (scope) => {
    scope.addContentTypeParser('application/octet-stream', (_req, payload, done) => done(null, payload));
    scope.withTypeProvider<TypeBoxTypeProvider>().put(
      '/admin/images/uploads/:upload_id',
      {
        schema: {
          tags: ['admin'],
          operationId: 'putImageUploadRange',
          summary: 'Send a range of an upload',
          description: `Content-Type application/octet-stream, at most ${UPLOAD_RANGE_MAX / 1024 / 1024} MiB, starting at the upload's received_bytes (\`offset\`; another offset is 400 conflict and names the right one). A range that does not arrive whole is dropped: send it again from the same offset.`,
          params: UploadId,
          querystring: Type.Object(
            {
              offset: Type.Integer({
                minimum: 0,
                maximum: Number.MAX_SAFE_INTEGER,
                description: "Where this range starts: the upload's received_bytes",
              }),
            },
            { additionalProperties: false },
          ),
          response: { 200: UploadSchema, ...errorResponses(400, 401, 403, 404, 413, 415, 422, 429) },
        },
        config: admin,
      },
      async (req) => {
        const body = req.body as Readable | undefined;
        if (!body || typeof body.pipe !== 'function')
          throw new AppError('unsupported_media_type', 'A range is sent as Content-Type: application/octet-stream');
        return images.appendRange(req.params.upload_id, req.query.offset, body);
      },
    );
  });

  r.post(
    '/admin/images/uploads/:upload_id/complete',
    {
      schema: {
        tags: ['admin'],
        operationId: 'completeImageUpload',
        summary: 'Complete an upload: check it and store the image',
        description:
          "Checks the whole file: its SHA-256 (against the upload's, when given), then qcow2 or raw as qemu-img reads it, no backing file, no external data file, a consistent qcow2, a disk within GPUCLOUD_IMAGE_MAX_GB. A refused upload is discarded (422, with the reason). The image is named by its SHA-256; the same image twice is stored once.",
        params: UploadId,
        response: { 201: ImageSchema, ...errorResponses(400, 401, 403, 404, 422, 429) },
      },
      config: admin,
    },
    async (req, reply) => reply.code(201).send(await images.complete(req.params.upload_id)),
  );

  r.delete(
    '/admin/images/uploads/:upload_id',
    {
      schema: {
        tags: ['admin'],
        operationId: 'cancelImageUpload',
        summary: 'Cancel an upload',
        description: 'Its bytes are removed.',
        params: UploadId,
        response: { 204: Type.Null({ description: 'Cancelled' }), ...errorResponses(401, 403, 404, 429) },
      },
      config: admin,
    },
    async (req, reply) => {
      await images.cancelUpload(req.params.upload_id);
      return reply.code(204).send(null);
    },
  );

  r.get(
    '/admin/images',
    {
      schema: {
        tags: ['admin'],
        operationId: 'listImages',
        summary: 'List images',
        description: 'Newest first; X-Total-Count holds the total.',
        querystring: Type.Object(PaginationQuery, { additionalProperties: false }),
        response: { 200: Type.Array(ImageSchema), ...errorResponses(401, 403, 422, 429) },
      },
      config: admin,
    },
    async (req, reply) => {
      const p = paging(req.query);
      return page(reply, await images.list(p.limit, p.offset));
    },
  );

  r.delete(
    '/admin/images/:sha256',
    {
      schema: {
        tags: ['admin'],
        operationId: 'deleteImage',
        summary: 'Delete an image',
        description: "Refused (400 conflict) while it is a template's image.",
        params: Type.Object({ sha256: Type.String({ maxLength: 64, description: "The image's SHA-256" }) }),
        response: { 204: Type.Null({ description: 'Deleted' }), ...errorResponses(400, 401, 403, 404, 429) },
      },
      config: admin,
    },
    async (req, reply) => {
      await images.delete(req.params.sha256);
      return reply.code(204).send(null);
    },
  );

  r.get(
    '/agent/v1/nodes/:node/images/:sha256',
    {
      schema: {
        hide: true,
        params: Type.Object({ node: Type.String({ maxLength: 200 }), sha256: Type.String({ maxLength: 64 }) }),
      },
      // The node's agent token, checked in the handler; agents resume with Range requests.
      config: { auth: 'public', rateLimit: false, cache: 'no-store' },
    },
    async (req, reply) => {
      const { node, sha256 } = req.params;
      const size = await images.forAgent(node, sha256, req.headers.authorization);
      reply.header('Accept-Ranges', 'bytes').header('ETag', `"${sha256}"`);
      reply.type('application/octet-stream');
      const range = parseRange(req.headers.range, size);
      if (range === 'unsatisfiable')
        return reply
          .code(416)
          .type('application/json; charset=utf-8')
          .header('Content-Range', `bytes */${size}`)
          .send({ detail: `The range starts past the image's ${size} bytes`, code: 'validation_error' });
      const [start, end] = range ?? [0, size - 1];
      if (range) reply.code(206).header('Content-Range', `bytes ${start}-${end}/${size}`);
      reply.header('Content-Length', String(end - start + 1));
      return reply.send(images.store.readImage(sha256, start, end));
    },
  );
}

/** `bytes=N-` or `bytes=N-M` (one range); undefined for none or a form it does not take (the whole image). */
function parseRange(header: string | undefined, size: number): [number, number] | 'unsatisfiable' | undefined {
  const m = header === undefined ? null : /^bytes=(\d{1,16})-(\d{0,16})$/.exec(header.trim());
  if (!m) return undefined;
  const start = Number(m[1]);
  const end = m[2] ? Math.min(Number(m[2]), size - 1) : size - 1;
  if (start >= size || end < start) return 'unsatisfiable';
  return [start, end];
}
