/**
 * `gpucloud templates`: the template catalogue (GET /templates, no login needed), and the helpers the VM
 * commands use to name templates: a template by id or name, its label ("101 (ubuntu-24.04)"), its web services.
 */
import { GpuCloudError, type Template } from '../sdk/index.js';
import { call, printJson, type Command, type Ctx } from './command.js';
import { CliUsageError, table } from './output.js';

/** The template of `vm create` without --template (the API's default), and its name on a fresh install. */
export const DEFAULT_TEMPLATE = 101;
export const DEFAULT_TEMPLATE_NAME = 'ubuntu-24.04';

/** The catalogue, or undefined when the API does not answer it (a service from before the catalogue). */
export async function catalogue(ctx: Ctx): Promise<Template[] | undefined> {
  try {
    return await call(ctx.client().api.GET('/templates'));
  } catch (err) {
    if (err instanceof GpuCloudError && err.status === 404) return undefined;
    throw err;
  }
}

/** One template, or undefined when there is none by that id (or the API has no catalogue). */
export async function templateOf(ctx: Ctx, vmid: number): Promise<Template | undefined> {
  try {
    return await call(
      ctx.client().api.GET('/templates/{template_vmid}', { params: { path: { template_vmid: vmid } } }),
    );
  } catch (err) {
    if (err instanceof GpuCloudError && err.status === 404) return undefined;
    throw err;
  }
}

/** "101 (ubuntu-24.04)", or "101" for a template the catalogue does not name. */
export function templateLabel(vmid: number, known?: Pick<Template, 'template_vmid' | 'name'>[]): string {
  const t = known?.find((x) => x.template_vmid === vmid);
  return t ? `${vmid} (${t.name})` : String(vmid);
}

/**
 * --template as a template id: a number as it is (the API judges it), a name looked up in the catalogue. An
 * unknown name is bad usage, with the names there are.
 */
export function resolveTemplate(raw: string, known: Template[] | undefined, option = 'template'): number {
  const v = raw.trim();
  if (/^\d+$/.test(v)) return Number(v);
  const t = known?.find((x) => x.name === v);
  if (t) return t.template_vmid;
  const names = (known ?? []).map((x) => `${x.name} (${x.template_vmid})`).join(', ');
  throw new CliUsageError(
    known
      ? `--${option}: there is no template named "${raw}"; the templates are ${names || 'none'} (see gpucloud templates)`
      : `--${option}: this API has no template catalogue to look "${raw}" up in; give the template's number`,
  );
}

/** "ssh, webui:7860, jupyter:8888". */
export function accessText(t: Pick<Template, 'access'>): string {
  return [
    ...(t.access.ssh ? ['ssh'] : []),
    ...(t.access.webui_port !== null ? [`webui:${t.access.webui_port}`] : []),
    ...(t.access.jupyter_port !== null ? [`jupyter:${t.access.jupyter_port}`] : []),
  ].join(', ');
}

/** "2 nodes (4090, 5090)", or "nowhere yet". */
export function readyText(t: Pick<Template, 'ready_on'>): string {
  const n = t.ready_on.nodes.length;
  if (n === 0) return 'nowhere yet';
  return `${n} node${n === 1 ? '' : 's'} (${t.ready_on.gpu_types.join(', ')})`;
}

export const TEMPLATE_COMMANDS: Command[] = [
  {
    path: 'templates',
    summary: 'The templates a VM can be created from, and where each is ready (no login needed)',
    example: ['gpucloud templates', 'gpucloud templates --json'],
    async run(ctx) {
      const rows = await call(ctx.client().api.GET('/templates'));
      if (ctx.json) return printJson(ctx, rows);
      if (rows.length === 0) return ctx.out('No templates');
      ctx.out(
        table(
          ['ID', 'NAME', 'OS', 'USER', 'ACCESS', 'MIN DISK', 'READY ON'],
          rows.map((t) => [
            t.template_vmid,
            t.name,
            t.os,
            t.default_user,
            accessText(t),
            `${t.min_disk_gb} GB`,
            readyText(t),
          ]),
        ),
      );
      ctx.out(
        `\nCreate a VM from one with: gpucloud vm create --node NODE --gpu GPU --template NAME (default ${DEFAULT_TEMPLATE}, ${DEFAULT_TEMPLATE_NAME})`,
      );
    },
  },
];
