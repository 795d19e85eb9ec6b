/** /vms (see docs/vms.md) and the admin VM list. Handlers are thin: the rules live in VmService. */
import type { FastifyInstance } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { Type } from 'typebox';
import {
  DateTime,
  Enum,
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
import { MOVE_POLICIES, VM_STATUSES } from './lifecycle.js';
import type { VmRecord, VmService } from './service.js';

const lit = Enum;

const StatusSchema = lit(VM_STATUSES, 'VM status');

const StartBody = Type.Object(
  {
    move: Type.Optional(
      lit(
        MOVE_POLICIES,
        "never: start on the VM's own node only; if_needed: on another node when its own lacks the GPUs",
      ),
    ),
  },
  { additionalProperties: false, examples: [{ move: 'if_needed' }] },
);
const RentalSchema = lit(['on_demand', 'reserved', 'interruptible'] as const, 'Rental type');

export const VmSchema = Type.Object(
  {
    id: Type.String({ format: 'uuid' }),
    vmid: Type.Integer({ description: 'Numeric VM number (from 1000 up)' }),
    user_id: Type.Integer(),
    node: Type.String(),
    instance_label: Nullable(Type.String()),
    gpu_type: Type.String(),
    gpu_count: Type.Integer(),
    storage_gb: Type.Integer(),
    ram_gb: Type.Integer(),
    cpu_cores: Type.Integer(),
    ip_address: Nullable(Type.String()),
    status: StatusSchema,
    created_at: DateTime(),
    started_at: Nullable(DateTime('The last moment the VM became running')),
    stopped_at: Nullable(DateTime('The last moment the VM left running')),
    rental_type: RentalSchema,
    reservation_id: Nullable(Type.String()),
    auto_restart: Nullable(Type.Boolean({ description: 'Interruptible VMs only; null for other rental types' })),
    hourly_rate: Type.Number({ description: 'gpu_hourly_rate + storage_hourly_rate, fixed at creation' }),
    gpu_hourly_rate: Type.Number(),
    storage_hourly_rate: Type.Number(),
    cpu_percent: Type.Number(),
    ram_percent: Type.Number(),
    cpu_model: Nullable(Type.String()),
    pcie_gen: Nullable(Type.String()),
    template_vmid: Type.Integer(),
    destroyed_at: Nullable(DateTime()),
    failure_reason: Nullable(
      Type.String({
        description:
          "Why the VM failed (the host's reason, e.g. a template the host lacks); null unless status is failed",
      }),
    ),
    http_ports: Type.Array(Type.Integer(), {
      description: "Guest ports opened through the access portal at creation (docs/portal.md); fixed for the VM's life",
    }),
    image_id: Nullable(
      Type.String({ format: 'uuid', description: 'The private image (GET /images) it was created from, else null' }),
    ),
  },
  {
    description: 'A virtual machine',
    examples: [
      {
        id: '8d7c6b5a-4f3e-4d2c-9b1a-0f9e8d7c6b5a',
        vmid: 1000,
        user_id: 7,
        node: 'vm01',
        instance_label: 'training',
        gpu_type: '4090',
        gpu_count: 1,
        storage_gb: 100,
        ram_gb: 64,
        cpu_cores: 16,
        ip_address: '10.100.3.232',
        status: 'running',
        created_at: '2026-11-22T10:00:00.000Z',
        started_at: '2026-11-22T10:00:03.000Z',
        stopped_at: null,
        rental_type: 'on_demand',
        reservation_id: null,
        auto_restart: null,
        hourly_rate: 0.46,
        gpu_hourly_rate: 0.44,
        storage_hourly_rate: 0.02,
        cpu_percent: 12,
        ram_percent: 30,
        cpu_model: 'AMD EPYC 7B13',
        pcie_gen: '4.0',
        template_vmid: 101,
        destroyed_at: null,
        failure_reason: null,
        http_ports: [],
        image_id: null,
      },
    ],
  },
);

/** An operator's view of a VM: the user's record, the host devices passed through and the last hypervisor error. */
const AdminVmSchema = Type.Object(
  {
    ...VmSchema.properties,
    gpu_devices: Type.Union([Type.Array(Type.String()), Type.Null()], {
      description:
        "Host PCI devices passed through to the VM's current run (nodes with an agent; `[]` while it is not running, since a host binds devices at each start); null on simulated nodes",
    }),
    last_error: Type.Union([Type.String(), Type.Null()], {
      description: "The hypervisor's last error for this VM, if any",
    }),
  },
  { description: 'A VM as operators see it' },
);

const VmRef = Type.Object({ vm_id: Type.String({ description: "The VM's uuid `id` or its integer `vmid`" }) });

const WebAccess = Nullable(
  Type.Object({
    url: Type.String(),
    launch_token: Type.String({ description: 'Signed, names the VM and user, valid 5 minutes' }),
    expires_at: DateTime(),
  }),
);

const PortAccess = Type.Object({
  port: Type.Integer({ description: "The guest port, from the VM's http_ports" }),
  url: Nullable(Type.String({ description: 'Its portal link, signing you in once; null for a read_only key' })),
  expires_at: Nullable(DateTime('When the link stops working (5 minutes)')),
});

const AccessInfo = Type.Object(
  {
    vm_id: Type.String(),
    status: StatusSchema,
    ssh: Type.Object({ host: Type.String(), port: Type.Integer(), username: Type.String(), command: Type.String() }),
    web_ui: WebAccess,
    jupyter: WebAccess,
    ports: Type.Array(PortAccess, { description: "A portal link for each of the VM's http_ports" }),
    notice: Nullable(
      Type.String({
        description:
          'Set when the VM cannot be reached as described: on a simulated node its address is made up and nothing answers on it',
      }),
    ),
  },
  {
    description:
      'How to reach a running VM: SSH, and through the access portal the WebUI and Jupyter of templates 102-104 and the ports opened with http_ports (docs/portal.md)',
  },
);

const Interruption = Type.Object({
  id: Type.String(),
  interruptible_vm_id: Type.String(),
  preempted_by_vm_id: Type.String(),
  preempted_at: DateTime(),
  restored_at: Nullable(DateTime()),
  downtime_seconds: Nullable(Type.Integer()),
  status: lit(['interrupted', 'restored', 'abandoned'] as const),
});

const CreateBody = Type.Object(
  {
    node: Type.String({ minLength: 1, maxLength: 63, description: 'Node id from GET /search' }),
    gpu_type: lit(['5090', '4090', 'pro6000'] as const),
    gpu_count: Type.Union([Type.Literal(1), Type.Literal(2), Type.Literal(4), Type.Literal(8)], {
      description: '1, 2, 4 or 8',
    }),
    storage_gb: Type.Integer({
      minimum: 50,
      maximum: 1_000_000,
      description: "Disk size in GB, at least 50 (at most the node's max_storage_gb)",
    }),
    template_vmid: Type.Optional(
      Type.Integer({
        minimum: 100,
        maximum: 999_999,
        description:
          'A template of GET /templates: by default 100 Ubuntu 22.04, 101 Ubuntu 24.04, 102 Stable Diffusion, 103 ComfyUI, 104 desktop. An unknown one is 422; one the node does not hold ready is 400 template_unavailable. Required unless image_id is given',
      }),
    ),
    image_id: Type.Optional(
      Type.String({
        maxLength: 64,
        description:
          "One of your ready images (GET /images) instead of a template: the VM starts from a copy of its disk, on any node (the host downloads it), with the template it was taken from. storage_gb must be at least the image's disk_gb (422); another user's image is 404",
      }),
    ),
    rental_type: Type.Optional(RentalSchema),
    reservation_months: Type.Optional(
      Type.Union([Type.Literal(1), Type.Literal(3), Type.Literal(6)], { description: 'Required for reserved' }),
    ),
    auth_method: Type.Optional(lit(['ssh_key', 'password'] as const)),
    ssh_key_id: Type.Optional(Type.String({ maxLength: 64, description: 'Defaults to your oldest SSH key' })),
    password: Type.Optional(
      Type.String({ minLength: 12, maxLength: 128, description: 'Required for auth_method password' }),
    ),
    instance_label: Type.Optional(Nullable(Type.String({ minLength: 1, maxLength: 32 }))),
    http_ports: Type.Optional(
      Type.Array(Type.Integer({ minimum: 1024, maximum: 65535 }), {
        maxItems: 5,
        uniqueItems: true,
        description:
          "Up to 5 guest ports (1024-65535) to open through the access portal, each on a host name of its own behind the same one-time sign-in as the WebUI; fixed for the VM's life",
      }),
    ),
  },
  {
    additionalProperties: false,
    examples: [{ node: 'vm01', gpu_type: '4090', gpu_count: 1, storage_gb: 100, template_vmid: 101 }],
  },
);

/**
 * The JSON of the records GET /vms sends, for as long as each record lives: a listed VM's record is kept for
 * its row version (docs/architecture.md#lists-of-vms), so a page of unchanged VMs is not written out again.
 */
const recordJson = new WeakMap<VmRecord, string>();
/** The schema of one record, as Fastify's serializer compiler takes it (compiled once, kept by Fastify). */
const VM_SCHEMA = VmSchema as unknown as Record<string, unknown>;

export function vmRoutes(app: FastifyInstance, vms: VmService): void {
  const r = app.withTypeProvider<TypeBoxTypeProvider>();
  const mutation = { rateLimit: 'vm' as const };

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
      config: { ...mutation, idempotent: true },
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
      config: mutation,
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
      config: mutation,
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
      config: mutation,
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
      config: mutation,
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
      config: mutation,
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
        response: { 200: AccessInfo, ...errorResponses(400, 401, 403, 404, 429) },
      },
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
        response: { 200: Type.Array(Interruption), ...errorResponses(401, 403, 404, 422, 429) },
      },
    },
    async (req, reply) =>
      page(
        reply,
        await vms.interruptions(requirePrincipal(req.principal).userId, req.params.vm_id, ...pageArgs(req.query)),
      ),
  );

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
      config: { auth: 'admin' },
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
