/**
 * The JSON of offers, prices and nodes: each TypeBox schema is the one definition of its shape, the
 * OpenAPI document's and the service's type alike (docs/offers.md).
 */
import { Type, type Static } from 'typebox';
import { DateTime, Enum } from '../../http/schemas.js';
import { GPU_TYPES, NODE_STATUSES } from './repository.js';

export const GpuType = Enum(GPU_TYPES, 'GPU type');
export const NodeStatus = Enum(
  NODE_STATUSES,
  'active: rentable; draining: no new VMs; offline: its VMs are offline too',
);

export const OfferSchema = Type.Object(
  {
    node: Type.String(),
    gpu_type: GpuType,
    gpu_count: Type.Integer({ description: 'GPUs rentable now for the requested rental type' }),
    gpu_ram_mb: Type.Integer(),
    total_gpu_ram_mb: Type.Integer(),
    ram_gb: Type.Integer(),
    cpu_cores: Type.Integer(),
    cpu_model: Type.String(),
    pcie_gen: Type.String(),
    max_storage_gb: Type.Integer(),
    gpu_price_hourly: Type.Number({ description: 'On-demand price per GPU-hour' }),
    interruptible_rate: Type.Number({ description: 'Interruptible price per GPU-hour' }),
    storage_price_hourly: Type.Number({ description: 'Price per GB-hour of disk' }),
    total_price_hourly: Type.Number({ description: 'gpu_count x gpu_price_hourly + 50 GB of disk' }),
    reserved_discount_1mo: Type.Number(),
    reserved_discount_3mo: Type.Number(),
    reserved_discount_6mo: Type.Number(),
    available_ondemand: Type.Boolean(),
    available_interruptible: Type.Boolean(),
    available_reserved: Type.Boolean(),
    location: Type.String(),
    cluster_name: Type.String(),
  },
  { description: 'A GPU offer: one per active node with GPUs rentable now' },
);
export type Offer = Static<typeof OfferSchema>;

const PriceFields = {
  gpu_type: GpuType,
  gpu_ram_mb: Type.Integer(),
  gpu_price_hourly: Type.Number(),
  interruptible_rate: Type.Number(),
  storage_price_gb_hourly: Type.Number(),
  reserved_discount_1mo: Type.Number({ description: 'Percent' }),
  reserved_discount_3mo: Type.Number({ description: 'Percent' }),
  reserved_discount_6mo: Type.Number({ description: 'Percent' }),
};

export const PublicPricingSchema = Type.Object(
  {
    currency: Type.String({ examples: ['USD'] }),
    updated_at: DateTime(),
    image_storage_gb_hourly: Type.Number({
      description: 'What your private images (GET /images) cost per GB (10^9 bytes) per hour of storage',
    }),
    gpu_types: Type.Array(
      Type.Object({
        ...PriceFields,
        total_gpus: Type.Integer({ description: 'GPUs on active nodes' }),
        available_gpus: Type.Integer({ description: 'Free GPUs on active nodes' }),
      }),
    ),
  },
  { description: 'Current prices for every GPU type' },
);
export type PublicPricing = Static<typeof PublicPricingSchema>;

/** A GPU type's prices as the operator sees them (GET /admin/pricing). */
export const PricingRecordSchema = Type.Object({ ...PriceFields, updated_at: DateTime() });
export type PricingRecord = Static<typeof PricingRecordSchema>;

/** A node's hardware and placement, as registered and changed by the operator. */
export const NodeFields = {
  gpu_type: GpuType,
  gpu_count: Type.Integer({ minimum: 1, maximum: 64 }),
  gpu_ram_mb: Type.Integer({ minimum: 1, maximum: 1_048_576 }),
  ram_gb: Type.Integer({ minimum: 1, maximum: 65_536 }),
  cpu_cores: Type.Integer({ minimum: 1, maximum: 4096 }),
  cpu_model: Type.String({ minLength: 1, maxLength: 128 }),
  pcie_gen: Type.String({ minLength: 1, maxLength: 16 }),
  max_storage_gb: Type.Integer({ minimum: 50, maximum: 10_000_000 }),
  location: Type.String({ minLength: 1, maxLength: 128 }),
  cluster_name: Type.String({ minLength: 1, maxLength: 128 }),
  status: NodeStatus,
};

export const AgentUrl = Type.String({
  minLength: 1,
  maxLength: 2048,
  description:
    "Where the node's host agent (`gpucloud agent`) listens, http or https. A node without one runs on the simulator.",
});
export const AgentToken = Type.String({
  minLength: 32,
  maxLength: 512,
  writeOnly: true,
  description: "The agent's token (its --token). Write-only: never returned.",
});

export const NodeRecordSchema = Type.Object(
  {
    node: Type.String(),
    ...NodeFields,
    gpus_allocated: Type.Integer({ description: 'GPUs held by VMs now' }),
    gpus_free: Type.Integer(),
    created_at: DateTime(),
    updated_at: DateTime(),
    agent_url: Type.Union([Type.String(), Type.Null()], {
      description: "The host agent's URL; null for a simulated node",
    }),
    agent_token_set: Type.Boolean({
      description: 'Whether an agent token is stored (the token itself is never shown)',
    }),
    agent_status: Type.Union([Enum(['online', 'offline'] as const), Type.Null()], {
      description:
        'online while the agent answers its heartbeats; offline after 3 missed ones (its VMs then go offline) or when it did not answer at registration; null for a simulated node',
    }),
    agent_seen_at: Type.Union([DateTime(), Type.Null()], { description: 'When the agent last answered' }),
    agent_version: Type.Union([Type.String(), Type.Null()]),
    accel: Type.Union([Type.String(), Type.Null()], { description: 'kvm or tcg, as the agent runs its VMs' }),
    host_cpu_model: Type.Union([Type.String(), Type.Null()]),
    host_gpus: Type.Union(
      [
        Type.Array(
          Type.Object({
            pci_address: Type.String(),
            model: Type.String(),
            vfio: Type.Boolean({ description: 'Bound to vfio-pci, so it can be passed through to a VM' }),
            iommu_group: Type.Union([Type.Integer(), Type.Null()]),
          }),
        ),
        Type.Null(),
      ],
      { description: 'The GPUs the agent found on its host' },
    ),
  },
  { description: 'A GPU node' },
);
export type NodeRecord = Static<typeof NodeRecordSchema>;
