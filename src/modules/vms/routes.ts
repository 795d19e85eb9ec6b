/** /vms (see docs/vms.md); the admin VM list is admin-routes.ts. Handlers are thin: the rules live in VmService. */
import type { FastifyInstance } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { Type } from 'typebox';
import {
  errorResponses,
  MessageResponse,
  Nullable,
  page,
  pageArgs,
  PaginationQuery,
  paging,
} from '../../http/schemas.js';
import { requirePrincipal } from '../../http/principal.js';
import { assertNoBody, OPTIONAL_BODY, optionalBody } from '../../http/no-body.js';
import { MOVE_POLICIES } from './lifecycle.js';
import type { VmRecord, VmService } from './service.js';
import {
  AccessInfoSchema,
  CreateBody,
  InterruptionSchema,
  StartBody,
  StatusSchema,
  VmRef,
  VmSchema,
} from './schemas.js';
import { adminVmRoutes } from './admin-routes.js';

/**
 * The JSON of the records GET /vms sends, for as long as each record lives: a listed VM's record is kept for
 * its row version (docs/architecture.md#lists-of-vms), so a page of unchanged VMs is not written out again.
 */
const recordJson = new WeakMap<VmRecord, string>();
/** The schema of one record, as Fastify's serializer compiler takes it (compiled once, kept by Fastify). */
const VM_SCHEMA = VmSchema as unknown as Record<string, unknown>;

export function vmRoutes(app: FastifyInstance, vms: VmService): void {
  const r = app.withTypeProvider<TypeBoxTypeProvider>();

  r.post(
    '/vms',
    {
      schema: {
        tags: ['vms'],
        operationId: 'createVm',
        summary: 'Create a VM',
        description: `Checks, in this order: validation (422, including an unknown template_vmid or a storage_gb under the template's min_disk_gb); the node exists and is active (400 gpu_unavailable); GPUs on the node (interruptible: free GPUs only; on-demand and reserved may also take GPUs held by interruptible VMs, which are then preempted, most recently started first); the node's host holds the template ready (400 template_unavailable, GET /search?template_vmid=N lists the nodes that do); storage_gb within the node's max_storage_gb (400 limit_exceeded); your limits (10 VMs, 16 GPUs by default: 400 limit_exceeded); your balance (400 insufficient_balance: one hour of this VM plus one hour of your other VMs' committed spend); your SSH key (404 for an unknown one, 400 invalid_state if you have none). The VM starts \`creating\` (201); provisioning runs in the background. Honours Idempotency-Key.`,
        body: CreateBody,
        response: { 201: VmSchema, ...errorResponses(400, 401, 403, 404, 413, 415, 422, 429) },
      },
      config: { auth: 'user', scopes: [], cache: 'no-store', rateLimit: 'vm', idempotent: true },
    },
    async (req, reply) => {
      reply.code(201);
      return vms.create(requirePrincipal(req.principal).userId, req.body);
    },
  );

  r.get(
    '/vms',
    {
      schema: {
        tags: ['vms'],
        operationId: 'listVms',
        summary: 'List your VMs',
        description:
          'Newest first; destroyed VMs only with include_destroyed=true (or status=destroyed). X-Total-Count holds the total.',
        querystring: Type.Object(
          {
            include_destroyed: Type.Optional(Type.Boolean({ default: false, description: 'Also list destroyed VMs' })),
            status: Type.Optional(StatusSchema),
            ...PaginationQuery,
          },
          { additionalProperties: false },
        ),
        response: { 200: Type.Array(VmSchema), ...errorResponses(401, 403, 422, 429) },
      },
      config: { auth: 'user', scopes: ['read_only'], cache: 'no-store' },
    },
    async (req, reply) => {
      const listed = await vms.list(requirePrincipal(req.principal).userId, {
        includeDestroyed: req.query.include_destroyed ?? false,
        status: req.query.status,
        ...paging(req.query),
      });
      // The array as the response schema would write it, from each record's JSON, made once per record.
      const serialize = reply.compileSerializationSchema(VM_SCHEMA);
      const json = (v: VmRecord) => {
        let j = recordJson.get(v);
        // Copied into one piece: the serializer's string is a tree of the pieces it was joined from, which
        // every page's join would walk again.
        if (j === undefined) {
          recordJson.set(v, (j = Buffer.from(serialize(v as unknown as Record<string, unknown>)).toString()));
        }
        return j;
      };
      reply.type('application/json; charset=utf-8').serializer((items: VmRecord[]) => `[${items.map(json).join(',')}]`);
      return page(reply, listed);
    },
  );

  r.get(
    '/vms/:vm_id',
    {
      schema: {
        tags: ['vms'],
        operationId: 'getVm',
        summary: 'Get a VM',
        description:
          "One of your VMs by its uuid `id` or its integer `vmid`: status, node, resources, rental type and the hourly rates fixed at creation. Another user's VM is 404.",
        params: VmRef,
        response: { 200: VmSchema, ...errorResponses(401, 403, 404, 429) },
      },
      config: { auth: 'user', scopes: ['read_only'], cache: 'no-store' },
    },
    async (req) => vms.get(requirePrincipal(req.principal).userId, req.params.vm_id),
  );

  r.delete(
    '/vms/:vm_id',
    {
      schema: {
        tags: ['vms'],
        operationId: 'destroyVm',
        summary: 'Destroy a VM',
        description:
          'Permanent: the VM and its data are gone. Billing ends now and its GPUs are freed at once; the hypervisor cleanup runs in the background. 400 invalid_state when already destroyed.',
        params: VmRef,
        response: { 200: MessageResponse, ...errorResponses(400, 401, 403, 404, 429) },
      },
      config: { auth: 'user', scopes: [], cache: 'no-store', rateLimit: 'vm' },
    },
    async (req) => vms.destroy(requirePrincipal(req.principal).userId, req.params.vm_id),
  );

  r.post(
    '/vms/:vm_id/start',
    {
      schema: {
        tags: ['vms'],
        operationId: 'startVm',
        summary: 'Start a stopped or interrupted VM',
        description:
          "Needs free GPUs on the VM's node (400 gpu_unavailable otherwise) and the same balance as a create. 400 invalid_state in any other state. " +
          'With `{"move": "if_needed"}` a VM whose node lacks free GPUs starts on another active node with the same GPU type, enough free GPUs and disk: it is `moving` while its disk travels (billed as stopped), then `starting` on the new node (new SSH host and port, same id, vmid, rates and label). A failed move leaves it `stopped` where it was, with the reason. Reserved VMs are never moved. 400 gpu_unavailable with the reason when no node qualifies. The body is optional; `move` defaults to `never`.',
        params: VmRef,
        [OPTIONAL_BODY]: StartBody,
        response: { 200: MessageResponse, ...errorResponses(400, 401, 403, 404, 422, 429) },
      },
      config: { auth: 'user', scopes: [], cache: 'no-store', rateLimit: 'vm' },
    },
    async (req) => {
      const body = optionalBody({ move: MOVE_POLICIES }, req.body);
      return vms.start(requirePrincipal(req.principal).userId, req.params.vm_id, { move: body.move ?? 'never' });
    },
  );

  r.post(
    '/vms/:vm_id/stop',
    {
      schema: {
        tags: ['vms'],
        operationId: 'stopVm',
        summary: 'Stop a running VM',
        description:
          'GPU billing pauses, storage continues; the GPUs are released (a reserved VM keeps them). 400 invalid_state unless running.',
        params: VmRef,
        response: { 200: MessageResponse, ...errorResponses(400, 401, 403, 404, 422, 429) },
      },
      config: { auth: 'user', scopes: [], cache: 'no-store', rateLimit: 'vm' },
    },
    async (req) => {
      assertNoBody(req.body);
      return vms.stop(requirePrincipal(req.principal).userId, req.params.vm_id);
    },
  );

  r.post(
    '/vms/:vm_id/set-label',
    {
      schema: {
        tags: ['vms'],
        operationId: 'setVmLabel',
        summary: 'Set or clear the label',
        description: '1 to 32 printable ASCII characters; null clears it.',
        params: VmRef,
        body: Type.Object(
          { instance_label: Nullable(Type.String()) },
          { additionalProperties: false, examples: [{ instance_label: 'training-run-3' }] },
        ),
        response: { 200: MessageResponse, ...errorResponses(401, 403, 404, 415, 422, 429) },
      },
      config: { auth: 'user', scopes: [], cache: 'no-store', rateLimit: 'vm' },
    },
    async (req) => vms.setLabel(requirePrincipal(req.principal).userId, req.params.vm_id, req.body.instance_label),
  );

  r.post(
    '/vms/:vm_id/set-auto-restart',
    {
      schema: {
        tags: ['vms'],
        operationId: 'setVmAutoRestart',
        summary: 'Turn auto-restart of an interruptible VM on or off',
        description:
          'With auto-restart an interrupted VM starts again as soon as its node has the GPUs free. 400 invalid_state for other rental types.',
        params: VmRef,
        body: Type.Object(
          { auto_restart: Type.Boolean() },
          { additionalProperties: false, examples: [{ auto_restart: false }] },
        ),
        response: { 200: MessageResponse, ...errorResponses(400, 401, 403, 404, 415, 422, 429) },
      },
      config: { auth: 'user', scopes: [], cache: 'no-store', rateLimit: 'vm' },
    },
    async (req) => vms.setAutoRestart(requirePrincipal(req.principal).userId, req.params.vm_id, req.body.auto_restart),
  );

  r.get(
    '/vms/:vm_id/access-info',
    {
      schema: {
        tags: ['vms'],
        operationId: 'getVmAccessInfo',
        summary: 'SSH command and web links of a running VM',
        description:
          "web_ui and jupyter (templates 102-104) and each of the VM's http_ports get a link to the access portal (docs/portal.md) carrying a signed launch token valid 5 minutes, which opens the service once: interactive access to the VM, so links are given only to a session or a read_write key (null for narrower scopes). 400 invalid_state unless running.",
        params: VmRef,
        response: { 200: AccessInfoSchema, ...errorResponses(400, 401, 403, 404, 429) },
      },
      config: { auth: 'user', scopes: ['read_only'], cache: 'no-store' },
    },
    async (req) => {
      const p = requirePrincipal(req.principal);
      return vms.accessInfo(p.userId, req.params.vm_id, { launchTokens: p.scope === 'read_write' });
    },
  );

  r.get(
    '/vms/:vm_id/interruption-history',
    {
      schema: {
        tags: ['vms'],
        operationId: 'getVmInterruptionHistory',
        summary: 'Preemptions of an interruptible VM',
        description:
          'Newest first. status: interrupted (still down), restored (with restored_at and downtime_seconds) or abandoned (destroyed while interrupted).',
        params: VmRef,
        querystring: Type.Object(PaginationQuery, { additionalProperties: false }),
        response: { 200: Type.Array(InterruptionSchema), ...errorResponses(401, 403, 404, 422, 429) },
      },
      config: { auth: 'user', scopes: ['read_only'], cache: 'no-store' },
    },
    async (req, reply) =>
      page(
        reply,
        await vms.interruptions(requirePrincipal(req.principal).userId, req.params.vm_id, ...pageArgs(req.query)),
      ),
  );

  adminVmRoutes(app, vms);
}
