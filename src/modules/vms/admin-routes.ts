/** GET /admin/vms: every user's VMs as operators see them (docs/vms.md#labels-access-and-lists). */
import type { FastifyInstance } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { Type } from 'typebox';
import { errorResponses, page, PaginationQuery, paging } from '../../http/schemas.js';
import type { VmService } from './service.js';
import { AdminVmSchema, StatusSchema } from './schemas.js';

/** Registered by vmRoutes, after the /vms routes. */
export function adminVmRoutes(app: FastifyInstance, vms: VmService): void {
  const r = app.withTypeProvider<TypeBoxTypeProvider>();

  r.get(
    '/admin/vms',
    {
      schema: {
        tags: ['admin'],
        operationId: 'listAllVms',
        summary: "Every user's VMs",
        description:
          "Every user's VMs, newest first, filtered by owner, node or status; destroyed VMs only with `include_destroyed=true`. Admin role.",
        querystring: Type.Object(
          {
            user_id: Type.Optional(
              Type.Integer({ minimum: 1, maximum: Number.MAX_SAFE_INTEGER, description: "Only this user's VMs" }),
            ),
            node: Type.Optional(Type.String({ maxLength: 63, description: 'Only VMs on this node' })),
            include_destroyed: Type.Optional(Type.Boolean({ default: false, description: 'Also list destroyed VMs' })),
            status: Type.Optional(StatusSchema),
            ...PaginationQuery,
          },
          { additionalProperties: false },
        ),
        response: { 200: Type.Array(AdminVmSchema), ...errorResponses(401, 403, 422, 429) },
      },
      config: { auth: 'admin', scopes: [], cache: 'no-store' },
    },
    async (req, reply) =>
      page(
        reply,
        await vms.adminList({
          userId: req.query.user_id,
          includeDestroyed: req.query.include_destroyed ?? false,
          status: req.query.status,
          node: req.query.node,
          ...paging(req.query),
        }),
      ),
  );
}
