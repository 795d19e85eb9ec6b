/**
 * The JSON of the template catalogue: the TypeBox schema is the one definition of a template's
 * shape, the OpenAPI document's and TemplateService's type alike (docs/templates.md).
 */
import { Type, type Static } from 'typebox';
import { DateTime, Enum, Nullable } from '../../http/schemas.js';

export const TemplateSchema = Type.Object(
  {
    template_vmid: Type.Integer({ description: 'The id a VM is created with (`template_vmid`)' }),
    name: Type.String({ description: 'Short name, e.g. ubuntu-24.04 (the CLI takes it for --template)' }),
    description: Type.String(),
    os: Type.String({ description: 'The operating system, e.g. Ubuntu 24.04' }),
    default_user: Type.String({ description: 'The SSH login user; it has passwordless sudo' }),
    access: Type.Object(
      {
        ssh: Type.Boolean(),
        webui_port: Nullable(Type.Integer(), { description: "The guest port of the template's WebUI, or null" }),
        jupyter_port: Nullable(Type.Integer(), { description: 'The guest port of Jupyter, or null' }),
      },
      { description: 'How a VM of this template is reached: SSH, and through the access portal its web services' },
    ),
    min_disk_gb: Type.Integer({ description: 'The smallest storage_gb a VM of this template may have' }),
    gpu_types: Nullable(Type.Array(Type.String()), {
      description: "The GPU types whose nodes hold it; null for every type's",
    }),
    image: Nullable(
      Type.Object({
        sha256: Type.String(),
        format: Type.String(),
        size_bytes: Type.Integer(),
      }),
      { description: 'The disk image the hosts download; null when hosts were given it by hand' },
    ),
    ready_on: Type.Object(
      {
        nodes: Type.Array(Type.String(), { description: 'Active nodes where a VM of it can be created now' }),
        gpu_types: Type.Array(Type.String()),
      },
      { description: 'Where the template is ready' },
    ),
    created_at: DateTime(),
    updated_at: DateTime(),
  },
  {
    description: 'A template: what a VM is built from',
    examples: [
      {
        template_vmid: 102,
        name: 'stable-diffusion',
        description: 'Stable-diffusion image-generation image, pre-configured',
        os: 'Ubuntu 22.04',
        default_user: 'ubuntu',
        access: { ssh: true, webui_port: 7860, jupyter_port: 8888 },
        min_disk_gb: 50,
        gpu_types: null,
        image: null,
        ready_on: { nodes: ['vm01', 'vm02'], gpu_types: ['4090', '5090'] },
        created_at: '2026-01-01T00:00:00.000Z',
        updated_at: '2026-01-01T00:00:00.000Z',
      },
    ],
  },
);
/** A template as the API shows it. */
export type TemplateRecord = Static<typeof TemplateSchema>;

/** A template's state on one host, for the operator's node page. */
export const NodeTemplateStateSchema = Type.Object({
  template_vmid: Type.Integer(),
  name: Nullable(Type.String()),
  state: Enum(['missing', 'queued', 'downloading', 'ready', 'failed'] as const, 'The state on the host'),
  source: Type.Unsafe<'pulled' | 'local' | null>({
    type: ['string', 'null'],
    enum: ['pulled', 'local', null],
    description: 'Downloaded from the image store (pulled), added on the host (local), or null when missing',
  }),
  sha256: Nullable(Type.String()),
  bytes_done: Type.Integer(),
  size_bytes: Type.Integer(),
  progress: Nullable(Type.Integer({ description: 'Percent downloaded' })),
  reason: Nullable(Type.String({ description: 'Why it failed' })),
  updated_at: Nullable(DateTime()),
});
export type NodeTemplateState = Static<typeof NodeTemplateStateSchema>;
