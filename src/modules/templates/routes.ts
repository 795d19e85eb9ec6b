/** /templates and /admin/templates (docs/templates.md). */
import type { FastifyInstance } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { Type } from 'typebox';
import { Enum, errorResponses, NO_CONTROL, Nullable } from '../../http/schemas.js';
import { notFound } from '../../errors.js';
import type { CatalogueNode, TemplateService } from './service.js';
import { TEMPLATE_VMID_MAX, TEMPLATE_VMID_MIN } from './service.js';
import { NodeTemplateStateSchema, TemplateSchema } from './schemas.js';

const GPU_TYPES = ['5090', '4090', 'pro6000'] as const;
const Port = Type.Integer({ minimum: 1, maximum: 65535 });

const Text = (max: number, description: string) =>
  Type.String({ minLength: 1, maxLength: max, pattern: NO_CONTROL, description });

const Fields = {
  name: Type.String({
    pattern: '^[a-z0-9][a-z0-9._-]{0,47}$',
    description: 'Short name: lowercase letters, digits, ".", "_" and "-", at most 48',
  }),
  description: Text(200, 'What the template is'),
  os: Text(64, 'The operating system'),
  default_user: Type.String({
    pattern: '^[a-z_][a-z0-9_-]{0,31}$',
    description: 'The login user the image has (or cloud-init creates), e.g. ubuntu or root',
  }),
  webui_port: Nullable(Port, { description: "The guest port of the template's WebUI" }),
  jupyter_port: Nullable(Port, { description: 'The guest port of Jupyter' }),
  min_disk_gb: Type.Integer({ minimum: 50, maximum: 100_000, description: 'Smallest disk of its VMs (default 50)' }),
  gpu_types: Nullable(Type.Array(Enum(GPU_TYPES, 'A GPU type'), { minItems: 1, maxItems: 3, uniqueItems: true }), {
    description: "Only these GPU types' nodes hold it (null: every type's)",
  }),
  image_sha256: Nullable(Type.String({ pattern: '^[0-9a-f]{64}$' }), {
    description: 'The image (in the image store) hosts download for it',
  }),
};

const VmidParam = Type.Object({
  template_vmid: Type.Integer({ description: 'The template id' }),
});

export function templateRoutes(
  app: FastifyInstance,
  templates: TemplateService,
  nodes: () => Promise<CatalogueNode[]>,
): void {
  const r = app.withTypeProvider<TypeBoxTypeProvider>();
  const admin = { auth: 'admin', scopes: [], cache: 'no-store' } as const;
  // The catalogue is the same for everyone.
  const catalogue = { auth: 'public', cache: 'public' } as const;

  r.get(
    '/templates',
    {
      schema: {
        tags: ['offers'],
        operationId: 'listTemplates',
        summary: 'List templates',
        description:
          'No authentication. Every template a VM can be created from, by template_vmid, with its access (SSH, the WebUI and Jupyter ports the access portal reaches), minimum disk, and the active nodes where it is ready now.',
        security: [],
        response: { 200: Type.Array(TemplateSchema), ...errorResponses(429) },
      },
      config: catalogue,
    },
    async () => templates.list(await nodes()),
  );

  r.get(
    '/templates/:template_vmid',
    {
      schema: {
        tags: ['offers'],
        operationId: 'getTemplate',
        summary: 'Get a template',
        description: 'No authentication. One template, as GET /templates lists it; 404 for an unknown id.',
        security: [],
        params: VmidParam,
        response: { 200: TemplateSchema, ...errorResponses(404, 422, 429) },
      },
      config: catalogue,
    },
    async (req) => templates.get(req.params.template_vmid, await nodes()),
  );

  r.post(
    '/admin/templates',
    {
      schema: {
        tags: ['admin'],
        operationId: 'createTemplate',
        summary: 'Add a template',
        description: `template_vmid ${TEMPLATE_VMID_MIN} to ${TEMPLATE_VMID_MAX}; a taken id or name is 400 conflict. Hosts download its image once it has one (PUT an upload with template_vmid, or image_sha256 of an image in the store).`,
        body: Type.Object(
          {
            template_vmid: Type.Integer({ minimum: TEMPLATE_VMID_MIN, maximum: TEMPLATE_VMID_MAX }),
            name: Fields.name,
            description: Fields.description,
            os: Fields.os,
            default_user: Fields.default_user,
            webui_port: Type.Optional(Fields.webui_port),
            jupyter_port: Type.Optional(Fields.jupyter_port),
            min_disk_gb: Type.Optional(Fields.min_disk_gb),
            gpu_types: Type.Optional(Fields.gpu_types),
            image_sha256: Type.Optional(Fields.image_sha256),
          },
          {
            additionalProperties: false,
            examples: [
              {
                template_vmid: 105,
                name: 'cuda-12.4',
                description: 'Ubuntu 24.04 with CUDA 12.4 and PyTorch',
                os: 'Ubuntu 24.04',
                default_user: 'ubuntu',
              },
            ],
          },
        ),
        response: { 201: TemplateSchema, ...errorResponses(400, 401, 403, 422, 429) },
      },
      config: admin,
    },
    async (req, reply) => {
      const { template_vmid, ...input } = req.body;
      return reply.code(201).send(await templates.create(template_vmid, input, await nodes()));
    },
  );

  r.patch(
    '/admin/templates/:template_vmid',
    {
      schema: {
        tags: ['admin'],
        operationId: 'updateTemplate',
        summary: 'Change a template',
        description:
          'Any of its fields. A new image_sha256 reaches the hosts at their next heartbeat; VMs built from the old image keep it.',
        params: VmidParam,
        body: Type.Object(
          {
            name: Type.Optional(Fields.name),
            description: Type.Optional(Fields.description),
            os: Type.Optional(Fields.os),
            default_user: Type.Optional(Fields.default_user),
            webui_port: Type.Optional(Fields.webui_port),
            jupyter_port: Type.Optional(Fields.jupyter_port),
            min_disk_gb: Type.Optional(Fields.min_disk_gb),
            gpu_types: Type.Optional(Fields.gpu_types),
            image_sha256: Type.Optional(Fields.image_sha256),
          },
          { additionalProperties: false, minProperties: 1 },
        ),
        response: { 200: TemplateSchema, ...errorResponses(400, 401, 403, 404, 422, 429) },
      },
      config: admin,
    },
    async (req) => templates.update(req.params.template_vmid, req.body, await nodes()),
  );

  r.delete(
    '/admin/templates/:template_vmid',
    {
      schema: {
        tags: ['admin'],
        operationId: 'deleteTemplate',
        summary: 'Delete a template',
        description:
          'Refused (400 conflict, with the reason) while a VM that is not destroyed was built from it. Hosts remove its image once no VM on them stands on it.',
        params: VmidParam,
        response: { 204: Type.Null({ description: 'Deleted' }), ...errorResponses(400, 401, 403, 404, 422, 429) },
      },
      config: admin,
    },
    async (req, reply) => {
      await templates.delete(req.params.template_vmid);
      return reply.code(204).send(null);
    },
  );

  r.get(
    '/admin/nodes/:node/templates',
    {
      schema: {
        tags: ['admin'],
        operationId: 'listNodeTemplates',
        summary: "The templates on a node's host",
        description:
          'Each template the node should hold, then any other its agent holds (added on the host): missing, queued, downloading (progress in percent), ready, or failed with the reason. A node without an agent holds every template of its GPU type.',
        params: Type.Object({ node: Type.String({ maxLength: 200, description: "The node's name" }) }),
        response: {
          200: Type.Array(NodeTemplateStateSchema),
          ...errorResponses(401, 403, 404, 429),
        },
      },
      config: admin,
    },
    async (req) => {
      const node = (await nodes()).find((n) => n.node === req.params.node);
      if (!node) throw notFound('Node');
      return templates.nodeStates(node);
    },
  );
}
