/**
 * The shapes of the VM API, written once: the routes validate and serialize with them (the OpenAPI document
 * is made from them), and the records the service returns are their static types (records.ts).
 */
import { Type } from 'typebox';
import { DateTime, Enum, Nullable } from '../../http/schemas.js';
import { INTERRUPTION_STATUSES, MOVE_POLICIES, RENTAL_TYPES, VM_STATUSES } from './lifecycle.js';

export const StatusSchema = Enum(VM_STATUSES, 'VM status');
export const RentalSchema = Enum(RENTAL_TYPES, 'Rental type');

/** The optional body of POST /vms/{vm_id}/start. */
export const StartBody = Type.Object(
  {
    move: Type.Optional(
      Enum(
        MOVE_POLICIES,
        "never: start on the VM's own node only; if_needed: on another node when its own lacks the GPUs",
      ),
    ),
  },
  { additionalProperties: false, examples: [{ move: 'if_needed' }] },
);

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
export const AdminVmSchema = Type.Object(
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

/** The `{vm_id}` of a VM's routes. */
export const VmRef = Type.Object({ vm_id: Type.String({ description: "The VM's uuid `id` or its integer `vmid`" }) });

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

export const AccessInfoSchema = Type.Object(
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

/** A preemption of an interruptible VM. */
export const InterruptionSchema = Type.Object({
  id: Type.String(),
  interruptible_vm_id: Type.String(),
  preempted_by_vm_id: Type.String(),
  preempted_at: DateTime(),
  restored_at: Nullable(DateTime()),
  downtime_seconds: Nullable(Type.Integer()),
  status: Enum(INTERRUPTION_STATUSES),
});

/** The body of POST /vms (create.ts checks what the schema cannot say). */
export const CreateBody = Type.Object(
  {
    node: Type.String({ minLength: 1, maxLength: 63, description: 'Node id from GET /search' }),
    gpu_type: Enum(['5090', '4090', 'pro6000'] as const),
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
    auth_method: Type.Optional(Enum(['ssh_key', 'password'] as const)),
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
