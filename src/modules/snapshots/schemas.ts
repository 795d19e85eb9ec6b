/**
 * The JSON of customer images: the TypeBox schema is the one definition of an image's shape, the
 * OpenAPI document's and SnapshotService's type alike (docs/images.md).
 */
import { Type, type Static } from 'typebox';
import { DateTime, Nullable } from '../../http/schemas.js';

export const ImageRecordSchema = Type.Object(
  {
    id: Type.String({ format: 'uuid' }),
    name: Type.String(),
    state: Type.Union([Type.Literal('creating'), Type.Literal('ready'), Type.Literal('failed')], {
      description: 'creating: its disk is being copied; ready: VMs can start from it (billed); failed: see error',
    }),
    size_bytes: Nullable(Type.Integer({ description: 'What the image holds in the store; null while creating' })),
    size_gb: Nullable(Type.Number({ description: 'size_bytes in GB (10^9 bytes), what storage is billed on' })),
    disk_gb: Type.Integer({ description: 'The disk it was taken of: a VM from it needs storage_gb at least this' }),
    template_vmid: Type.Integer({ description: 'The template the source VM was built from (login user, web ports)' }),
    source_vm_id: Nullable(Type.String({ format: 'uuid' })),
    source_vmid: Type.Integer(),
    hourly_cost: Nullable(Type.Number({ description: 'What its storage costs per hour (ready images only)' })),
    error: Nullable(Type.String({ description: 'Why it failed' })),
    created_at: DateTime(),
    ready_at: Nullable(DateTime()),
  },
  {
    description: 'A private image of a VM disk',
    examples: [
      {
        id: '0b7e5d4c-3a2f-4e1d-9c8b-7a6f5e4d3c2b',
        name: 'trained-model-v2',
        state: 'ready',
        size_bytes: 12_400_000_000,
        size_gb: 12.4,
        disk_gb: 100,
        template_vmid: 101,
        source_vm_id: '5c1d2e3f-4a5b-4c6d-8e7f-9a0b1c2d3e4f',
        source_vmid: 1042,
        hourly_cost: 0.00124,
        error: null,
        created_at: '2026-11-29T10:00:00.000Z',
        ready_at: '2026-11-29T10:03:12.000Z',
      },
    ],
  },
);
/** An image as the API shows it. */
export type ImageRecord = Static<typeof ImageRecordSchema>;
