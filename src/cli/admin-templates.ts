/**
 * `gpucloud admin templates ...`: the operator's side of the template catalogue (add, change, delete), and
 * `admin nodes templates NODE`: each template's state on one node's host (missing, queued, downloading,
 * ready, or failed with the reason).
 */
import type { paths, Template } from '../sdk/index.js';
import { call, GPU_TYPES, int, printJson, str, type Command, type Ctx, type OptionSpec } from './command.js';
import { CliUsageError, keyValues, table } from './output.js';
import { accessText, readyText } from './templates.js';

type CreateBody = paths['/admin/templates']['post']['requestBody']['content']['application/json'];
type PatchBody = paths['/admin/templates/{template_vmid}']['patch']['requestBody']['content']['application/json'];

const NONE = ['none', 'null', ''];

const FIELD_OPTIONS: OptionSpec[] = [
  ['--name <N>', 'Short name: lowercase letters, digits, ".", "_" and "-" (vm create --template takes it)'],
  ['--description <D>', 'What the template is'],
  ['--os <OS>', 'The operating system, e.g. "Ubuntu 24.04"'],
  ['--user <U>', 'The login user the image has (or cloud-init creates), e.g. ubuntu'],
  ['--webui-port <P>', 'The guest port of its WebUI, opened through the access portal (none: no WebUI)'],
  ['--jupyter-port <P>', 'The guest port of its Jupyter (none: no Jupyter)'],
  ['--min-disk <GB>', 'The smallest disk of its VMs (default 50)'],
  ['--gpu-types <LIST>', `Only these GPU types' nodes hold it, e.g. 4090,5090 (all: every type's, the default)`],
  ['--image <SHA256>', 'The image in the image store its hosts download (none: no image; see admin images)'],
];

function vmidArg(raw: string | undefined): number {
  if (!raw || !/^\d+$/.test(raw)) throw new CliUsageError(`VMID must be a number, got "${raw ?? ''}"`);
  return Number(raw);
}

/** A port option: a number, or none (null); undefined when not given. */
function portOpt(ctx: Ctx, name: string): number | null | undefined {
  const raw = str(ctx, name);
  if (raw === undefined) return undefined;
  if (NONE.includes(raw.trim().toLowerCase())) return null;
  return int(ctx, name);
}

function gpuTypesOpt(ctx: Ctx): CreateBody['gpu_types'] | undefined {
  const raw = str(ctx, 'gpu-types');
  if (raw === undefined) return undefined;
  if (raw.trim().toLowerCase() === 'all') return null;
  const list = raw
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean);
  const bad = list.find((g) => !(GPU_TYPES as readonly string[]).includes(g));
  if (bad !== undefined)
    throw new CliUsageError(`--gpu-types takes ${GPU_TYPES.join(', ')} (or all), separated by commas; got "${bad}"`);
  return list as NonNullable<CreateBody['gpu_types']>;
}

function imageOpt(ctx: Ctx): string | null | undefined {
  const raw = str(ctx, 'image');
  if (raw === undefined) return undefined;
  return NONE.includes(raw.trim().toLowerCase()) ? null : raw.trim().toLowerCase();
}

/** The fields the options give (only those given). */
function fields(ctx: Ctx): PatchBody {
  const body: PatchBody = {};
  if (str(ctx, 'name') !== undefined) body.name = str(ctx, 'name')!;
  if (str(ctx, 'description') !== undefined) body.description = str(ctx, 'description')!;
  if (str(ctx, 'os') !== undefined) body.os = str(ctx, 'os')!;
  if (str(ctx, 'user') !== undefined) body.default_user = str(ctx, 'user')!;
  const webui = portOpt(ctx, 'webui-port');
  if (webui !== undefined) body.webui_port = webui;
  const jupyter = portOpt(ctx, 'jupyter-port');
  if (jupyter !== undefined) body.jupyter_port = jupyter;
  const minDisk = int(ctx, 'min-disk');
  if (minDisk !== undefined) body.min_disk_gb = minDisk;
  const gpus = gpuTypesOpt(ctx);
  if (gpus !== undefined) body.gpu_types = gpus;
  const image = imageOpt(ctx);
  if (image !== undefined) body.image_sha256 = image;
  return body;
}

export function showTemplate(t: Template): string {
  return keyValues([
    ['Template', t.template_vmid],
    ['Name', t.name],
    ['Description', t.description],
    ['OS', t.os],
    ['User', t.default_user],
    ['Access', accessText(t)],
    ['Min disk', `${t.min_disk_gb} GB`],
    ['GPU types', t.gpu_types ? t.gpu_types.join(', ') : 'all'],
    ['Image', t.image ? `${t.image.sha256} (${t.image.format}, ${t.image.size_bytes} bytes)` : 'none'],
    ['Ready on', t.ready_on.nodes.length ? `${t.ready_on.nodes.join(', ')}` : readyText(t)],
  ]);
}

/** "downloading 45%", "failed: the reason", "ready". */
function stateText(s: { state: string; progress: number | null; reason: string | null }): string {
  if (s.state === 'downloading') return `downloading ${s.progress ?? 0}%`;
  if (s.state === 'failed') return `failed: ${s.reason ?? 'no reason given'}`;
  return s.state;
}

export const ADMIN_TEMPLATE_COMMANDS: Command[] = [
  {
    path: 'admin templates add',
    args: '<VMID>',
    summary: 'Add a template to the catalogue (admin)',
    example: [
      'gpucloud admin templates add 105 --name cuda-12.4 --description "Ubuntu 24.04 with CUDA 12.4" --os "Ubuntu 24.04" --user ubuntu',
      'gpucloud admin templates add 106 --name sd-xl --description "SDXL WebUI" --os "Ubuntu 22.04" --user ubuntu --webui-port 7860 --gpu-types 4090,5090',
    ],
    options: FIELD_OPTIONS.map(([f, d]): OptionSpec =>
      ['--name', '--description', '--os', '--user'].includes(f.split(' ')[0]!) ? [f, `${d} (required)`] : [f, d],
    ),
    async run(ctx) {
      const vmid = vmidArg(ctx.positionals[0]);
      const f = fields(ctx);
      for (const [opt, v] of [
        ['name', f.name],
        ['description', f.description],
        ['os', f.os],
        ['user', f.default_user],
      ] as const)
        if (v === undefined) throw new CliUsageError(`--${opt} is required`);
      const body = { ...f, template_vmid: vmid } as CreateBody;
      const t = await call(ctx.client().api.POST('/admin/templates', { body }));
      if (ctx.json) return printJson(ctx, t);
      ctx.out(`Added template ${t.template_vmid} (${t.name})\n${showTemplate(t)}`);
      if (!t.image)
        ctx.out(
          `\nIt has no image yet: push one with gpucloud admin images push FILE --template ${t.template_vmid} (or add it on each host with gpucloud agent template add)`,
        );
    },
  },
  {
    path: 'admin templates set',
    args: '<VMID>',
    summary: 'Change a template: the fields given (admin)',
    example: [
      'gpucloud admin templates set 105 --description "CUDA 12.4 and PyTorch" --min-disk 80',
      'gpucloud admin templates set 102 --jupyter-port none --gpu-types all',
    ],
    options: FIELD_OPTIONS,
    async run(ctx) {
      const vmid = vmidArg(ctx.positionals[0]);
      const body = fields(ctx);
      if (Object.keys(body).length === 0)
        throw new CliUsageError('nothing to change: give at least one option (--name, --description, ...)');
      const t = await call(
        ctx.client().api.PATCH('/admin/templates/{template_vmid}', { params: { path: { template_vmid: vmid } }, body }),
      );
      if (ctx.json) return printJson(ctx, t);
      ctx.out(`Changed template ${t.template_vmid} (${t.name})\n${showTemplate(t)}`);
    },
  },
  {
    path: 'admin templates delete',
    args: '<VMID>',
    summary: 'Delete a template no VM uses (admin); hosts then remove its image',
    example: 'gpucloud admin templates delete 105',
    async run(ctx) {
      const vmid = vmidArg(ctx.positionals[0]);
      await call(
        ctx.client().api.DELETE('/admin/templates/{template_vmid}', { params: { path: { template_vmid: vmid } } }),
      );
      if (ctx.json) return printJson(ctx, {});
      ctx.out(`Deleted template ${vmid}`);
    },
  },
  {
    path: 'admin nodes templates',
    args: '<NODE>',
    summary: "Each template's state on a node's host: missing, downloading, ready or failed (admin)",
    example: 'gpucloud admin nodes templates gpu7',
    async run(ctx) {
      const node = ctx.positionals[0]!;
      const rows = await call(ctx.client().api.GET('/admin/nodes/{node}/templates', { params: { path: { node } } }));
      if (ctx.json) return printJson(ctx, rows);
      if (rows.length === 0) return ctx.out(`No template is meant for ${node}, and its host reports none`);
      ctx.out(
        table(
          ['TEMPLATE', 'NAME', 'STATE', 'SOURCE', 'IMAGE', 'UPDATED'],
          rows.map((r) => [
            r.template_vmid,
            r.name,
            stateText(r),
            r.source,
            r.sha256 ? r.sha256.slice(0, 12) : null,
            r.updated_at,
          ]),
        ),
      );
    },
  },
];
