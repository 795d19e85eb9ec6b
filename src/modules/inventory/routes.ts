/** Public offers and prices, and the admin inventory API: nodes and prices per GPU type (docs/offers.md). */
import type { FastifyInstance } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { Type } from 'typebox';
import { Enum, errorResponses, page, PaginationQuery, paging } from '../../http/schemas.js';
import { queryString, SnapshotBodies } from '../../http/snapshot-bodies.js';
import type { InventoryService } from './service.js';
import type { OfferInputs } from './offers.js';
import {
  AgentToken,
  AgentUrl,
  GpuType,
  NodeFields,
  NodeRecordSchema,
  NodeStatus,
  OfferSchema,
  PricingRecordSchema,
  PublicPricingSchema,
} from './schemas.js';
import { toAmount } from '../../money.js';

const NodeParam = Type.Object({ node: Type.String({ maxLength: 200, description: "The node's name" }) });

/** `imagePriceGbHourMicros`: what customer images' storage costs (docs/images.md#billing), shown with the prices. */
export function inventoryRoutes(app: FastifyInstance, inv: InventoryService, imagePriceGbHourMicros = 0): void {
  const r = app.withTypeProvider<TypeBoxTypeProvider>();
  const admin = { auth: 'admin' as const, scopes: [], cache: 'no-store' as const };
  // Offers and prices are made only from the offers snapshot: each distinct answer is serialized once per snapshot.
  const bodies = new SnapshotBodies<OfferInputs>({ current: () => inv.offersNow(), load: () => inv.offerInputs() });

  r.get(
    '/search',
    {
      schema: {
        tags: ['offers'],
        operationId: 'searchOffers',
        summary: 'Search GPU offers',
        description:
          'No authentication. One offer per active node with at least one GPU rentable for the rental type; sorted by gpu_price_hourly, then node. max_price is per GPU-hour, compared with gpu_price_hourly (or interruptible_rate for rental_type=interruptible).',
        security: [],
        querystring: Type.Object(
          {
            gpu_type: Type.Optional(GpuType),
            min_gpus: Type.Optional(
              Type.Integer({
                minimum: 1,
                maximum: 64,
                description: 'Only offers with at least this many GPUs rentable',
              }),
            ),
            max_price: Type.Optional(
              Type.Number({
                minimum: 0,
                description: 'Only offers at or under this price per GPU-hour for the rental type',
              }),
            ),
            rental_type: Type.Optional(
              Enum(
                ['on_demand', 'reserved', 'interruptible'] as const,
                'Price and count GPUs for this rental type (default on_demand)',
              ),
            ),
            location: Type.Optional(Type.String({ maxLength: 128, description: 'Only nodes at this location' })),
            template_vmid: Type.Optional(
              Type.Integer({
                minimum: 100,
                maximum: 999_999,
                description: 'Only nodes whose host holds this template ready (GET /templates)',
              }),
            ),
            ...PaginationQuery,
          },
          { additionalProperties: false },
        ),
        response: { 200: Type.Array(OfferSchema), ...errorResponses(422, 429) },
      },
      config: { auth: 'public', cache: 'public' },
    },
    (req, reply) => {
      const q = req.query;
      // An answer is kept under its raw query string: one string always reads as the same filters.
      const key = `search?${queryString(req.url)}`;
      return bodies.send(reply, key, async (inputs) => {
        const r = await inv.search({ ...q, ...paging(q) }, inputs);
        return { payload: r.items, total: r.total };
      });
    },
  );

  r.get(
    '/pricing',
    {
      schema: {
        tags: ['offers'],
        operationId: 'getPricing',
        summary: 'Current prices',
        description:
          'The price list for every GPU type: on-demand and interruptible per GPU-hour, storage per GB-hour, reserved discounts per term, and how many GPUs are on active nodes and free. No authentication.',
        security: [],
        response: { 200: PublicPricingSchema, ...errorResponses(429) },
      },
      config: { auth: 'public', cache: 'public' },
    },
    (_req, reply) =>
      bodies.send(reply, 'pricing', async (inputs) => ({
        payload: { ...(await inv.publicPricing(inputs)), image_storage_gb_hourly: toAmount(imagePriceGbHourMicros) },
      })),
  );

  r.get(
    '/admin/nodes',
    {
      schema: {
        tags: ['admin'],
        operationId: 'listNodes',
        summary: 'List nodes',
        description: 'Newest first; X-Total-Count holds the total.',
        querystring: Type.Object(PaginationQuery, { additionalProperties: false }),
        response: { 200: Type.Array(NodeRecordSchema), ...errorResponses(401, 403, 422, 429) },
      },
      config: admin,
    },
    async (req, reply) => page(reply, await inv.listNodes(paging(req.query))),
  );

  r.post(
    '/admin/nodes',
    {
      schema: {
        tags: ['admin'],
        operationId: 'createNode',
        summary: 'Register a node',
        description:
          "gpu_ram_mb defaults to the GPU type's; status defaults to active. A taken node id is 400 conflict. With agent_url and agent_token the node's VMs are real, run by the agent on that host; the agent is asked about its host at once, and a node whose agent does not answer is still registered (201), shown with agent_status offline.",
        body: Type.Object(
          {
            node: Type.String({ pattern: '^[a-z0-9][a-z0-9-]{0,62}$', description: 'Node id, e.g. vm07' }),
            ...NodeFields,
            gpu_ram_mb: Type.Optional(NodeFields.gpu_ram_mb),
            status: Type.Optional(NodeStatus),
            agent_url: Type.Optional(AgentUrl),
            agent_token: Type.Optional(AgentToken),
          },
          {
            additionalProperties: false,
            examples: [
              {
                node: 'vm07',
                gpu_type: '4090',
                gpu_count: 8,
                ram_gb: 512,
                cpu_cores: 128,
                cpu_model: 'AMD EPYC 9554',
                pcie_gen: '4.0',
                max_storage_gb: 4000,
                location: 'eu-central',
                cluster_name: 'fra-1',
              },
            ],
          },
        ),
        response: { 201: NodeRecordSchema, ...errorResponses(400, 401, 403, 415, 422, 429) },
      },
      config: admin,
    },
    async (req, reply) => {
      reply.code(201);
      return inv.createNode(req.body);
    },
  );

  r.get(
    '/admin/nodes/:node',
    {
      schema: {
        tags: ['admin'],
        operationId: 'getNode',
        summary: 'Get a node',
        description:
          "One node with its hardware, status, the GPUs allocated and free and, when it runs `gpucloud agent`, the agent's status and host report. Admin role.",
        params: NodeParam,
        response: { 200: NodeRecordSchema, ...errorResponses(401, 403, 404, 429) },
      },
      config: admin,
    },
    async (req) => inv.getNode(req.params.node),
  );

  r.patch(
    '/admin/nodes/:node',
    {
      schema: {
        tags: ['admin'],
        operationId: 'updateNode',
        summary: 'Change a node',
        description:
          "Setting status offline turns its VMs offline; active (or draining) brings them back as they were. gpu_count cannot go below the GPUs in use (400 invalid_state); gpu_type cannot change while the node has VMs, and changing it resets gpu_ram_mb to the new type's unless given. agent_url and agent_token change the node's agent (a new token alone rotates it); agent_url null makes it a simulated node. A node with VMs cannot gain or lose its agent (400 invalid_state).",
        params: NodeParam,
        body: Type.Partial(
          Type.Object({ ...NodeFields, agent_url: Type.Union([AgentUrl, Type.Null()]), agent_token: AgentToken }),
          { additionalProperties: false, minProperties: 1, examples: [{ status: 'offline' }] },
        ),
        response: { 200: NodeRecordSchema, ...errorResponses(400, 401, 403, 404, 415, 422, 429) },
      },
      config: admin,
    },
    async (req) => inv.patchNode(req.params.node, req.body),
  );

  r.delete(
    '/admin/nodes/:node',
    {
      schema: {
        tags: ['admin'],
        operationId: 'deleteNode',
        summary: 'Remove a node',
        description: '204. Refused (400 invalid_state) while the node has VMs that are not destroyed or failed.',
        params: NodeParam,
        response: { 204: Type.Null(), ...errorResponses(400, 401, 403, 404, 429) },
      },
      config: admin,
    },
    async (req, reply) => {
      await inv.deleteNode(req.params.node);
      reply.code(204);
    },
  );

  r.get(
    '/admin/pricing',
    {
      schema: {
        tags: ['admin'],
        operationId: 'listGpuPrices',
        summary: 'Prices per GPU type',
        description:
          'The pricing table per GPU type: on-demand and interruptible per GPU-hour, storage per GB-hour and the reserved discounts, with when each row last changed. Admin role.',
        response: { 200: Type.Array(PricingRecordSchema), ...errorResponses(401, 403, 429) },
      },
      config: admin,
    },
    async () => inv.adminPricing(),
  );

  r.put(
    '/admin/pricing/:gpu_type',
    {
      schema: {
        tags: ['admin'],
        operationId: 'setGpuPrices',
        summary: 'Set the prices of a GPU type',
        description:
          'Fields not sent keep their value. Amounts have at most 6 decimals; discounts are percents (0-100). New prices apply to new VMs only.',
        params: Type.Object({ gpu_type: Type.String({ maxLength: 32, description: 'The GPU type, e.g. 4090' }) }),
        body: Type.Object(
          {
            gpu_ram_mb: Type.Optional(Type.Integer({ minimum: 1, maximum: 1_048_576 })),
            gpu_price_hourly: Type.Optional(Type.Number({ minimum: 0, maximum: 10_000 })),
            interruptible_rate: Type.Optional(Type.Number({ minimum: 0, maximum: 10_000 })),
            storage_price_gb_hourly: Type.Optional(Type.Number({ minimum: 0, maximum: 100 })),
            reserved_discount_1mo: Type.Optional(Type.Number({ minimum: 0, maximum: 100 })),
            reserved_discount_3mo: Type.Optional(Type.Number({ minimum: 0, maximum: 100 })),
            reserved_discount_6mo: Type.Optional(Type.Number({ minimum: 0, maximum: 100 })),
          },
          {
            additionalProperties: false,
            minProperties: 1,
            examples: [{ gpu_price_hourly: 0.49, interruptible_rate: 0.25 }],
          },
        ),
        response: { 200: PricingRecordSchema, ...errorResponses(401, 403, 404, 415, 422, 429) },
      },
      config: admin,
    },
    async (req) => inv.putPricing(req.params.gpu_type, req.body),
  );
}
