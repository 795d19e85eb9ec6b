/**
 * `gpucloud vm ssh` and `vm open`: reaching a running VM, by SSH or through the access portal (its template's
 * WebUI and Jupyter, as the template catalogue says it serves them, and its own HTTP ports).
 */
import { spawn, spawnSync } from 'node:child_process';
import { GpuCloudError, type operations, type Vm } from '../sdk/index.js';
import { call, flag, printJson, str, type Command, type Ctx } from './command.js';
import { CliFailure, CliUsageError } from './output.js';
import { templateLabel, templateOf } from './templates.js';

type AccessInfo = operations['getVmAccessInfo']['responses'][200]['content']['application/json'];

export function vmPath(id: string) {
  return { params: { path: { vm_id: id } } };
}

/**
 * access-info's notice, on stderr: set when the VM cannot be reached as described (on a simulated node nothing
 * answers on its made-up address), so nobody waits on an ssh that never connects.
 */
export function printNotice(ctx: Ctx, info: Pick<AccessInfo, 'notice'>): void {
  if (info.notice) ctx.err(`Note: ${info.notice}`);
}

/** The notice of a running VM, or null (not running, or access-info refused: the notice is a courtesy). */
export async function noticeOf(ctx: Ctx, vm: Vm): Promise<Pick<AccessInfo, 'notice'>> {
  if (vm.status !== 'running') return { notice: null };
  try {
    return await call(ctx.client().api.GET('/vms/{vm_id}/access-info', vmPath(vm.id)));
  } catch (err) {
    if (err instanceof GpuCloudError) return { notice: null };
    throw err;
  }
}

function shellQuote(s: string): string {
  return /^[\w@%+=:,./-]+$/.test(s) ? s : `'${s.replace(/'/g, `'\\''`)}'`;
}

/** A web service of a VM, as `vm open --service` names it. */
type Service = 'webui' | 'jupyter' | number;

function serviceLabel(s: Service): string {
  return s === 'webui' ? 'the WebUI' : s === 'jupyter' ? 'Jupyter' : `port ${s}`;
}

function parseService(raw: string): Service {
  const v = raw.trim().toLowerCase();
  if (v === 'webui' || v === 'jupyter') return v;
  if (/^\d{1,5}$/.test(v) && Number(v) >= 1024 && Number(v) <= 65535) return Number(v);
  throw new CliUsageError(`--service must be webui, jupyter or a port number (1024-65535), got "${raw}"`);
}

/** What the VM's template serves: from the catalogue, or (a template it does not know) from access-info. */
interface Web {
  label: string;
  webui: boolean;
  jupyter: boolean;
}

async function webOf(ctx: Ctx, vm: Vm, info: AccessInfo): Promise<Web> {
  const t = await templateOf(ctx, vm.template_vmid);
  if (t)
    return {
      label: templateLabel(t.template_vmid, [t]),
      webui: t.access.webui_port !== null,
      jupyter: t.access.jupyter_port !== null,
    };
  return { label: String(vm.template_vmid), webui: info.web_ui !== null, jupyter: info.jupyter !== null };
}

/** The service to open when none is asked: the WebUI if the VM has one, else its first HTTP port. */
function defaultService(vm: Vm, web: Web): Service {
  if (web.webui) return 'webui';
  const first = vm.http_ports[0];
  if (first !== undefined) return first;
  throw new CliFailure(
    `VM ${vm.vmid} has no web service: its template, ${web.label}, serves no WebUI or Jupyter, and it was created without --http-port`,
  );
}

/** The link of one service in access-info, or why there is none. */
function linkOf(vm: Vm, info: AccessInfo, web: Web, s: Service): { url: string; expires_at: string } {
  const noLink = `No link for ${serviceLabel(s)} of VM ${vm.vmid}: links are given to a login session or a read_write API key only (see gpucloud login)`;
  if (typeof s === 'number') {
    const p = info.ports.find((x) => x.port === s);
    if (!p)
      throw new CliFailure(
        `VM ${vm.vmid} has no HTTP port ${s}; ${vm.http_ports.length ? `its ports: ${vm.http_ports.join(', ')}` : 'it has none'} (they are set at creation with --http-port)`,
      );
    if (p.url === null || p.expires_at === null) throw new CliFailure(noLink);
    return { url: p.url, expires_at: p.expires_at };
  }
  const link = s === 'webui' ? info.web_ui : info.jupyter;
  if (link) return link;
  if (!(s === 'webui' ? web.webui : web.jupyter))
    throw new CliFailure(
      `VM ${vm.vmid} has no ${s === 'webui' ? 'WebUI' : 'Jupyter'}: its template, ${web.label}, serves none (gpucloud templates shows which do)`,
    );
  throw new CliFailure(noLink);
}

/**
 * The program that opens a URL in the default browser, by platform, run without a shell: `start` is a
 * built-in of cmd.exe, which would read the URL as a command line, so Windows gets rundll32's URL handler.
 */
function browserCommand(url: string): [string, string[]] {
  if (process.platform === 'darwin') return ['open', [url]];
  if (process.platform === 'win32') return ['rundll32', ['url.dll,FileProtocolHandler', url]];
  return ['xdg-open', [url]];
}

/**
 * Opens the URL in a browser; resolves to why that failed, or undefined. An opener that has not exited
 * after a few seconds (a browser in the foreground) is taken to have worked and left to run.
 */
function openInBrowser(url: string): Promise<string | undefined> {
  const [cmd, args] = browserCommand(url);
  return new Promise((resolve) => {
    let child: ReturnType<typeof spawn>;
    try {
      child = spawn(cmd, args, { stdio: 'ignore', detached: true, shell: false });
    } catch (err) {
      return resolve(`${cmd}: ${(err as Error).message}`);
    }
    const timer = setTimeout(() => {
      child.unref();
      resolve(undefined);
    }, 3000);
    child.on('error', (err) => {
      clearTimeout(timer);
      resolve(`${cmd}: ${(err as NodeJS.ErrnoException).code ?? err.message}`);
    });
    child.on('exit', (code, signal) => {
      clearTimeout(timer);
      resolve(code === 0 ? undefined : `${cmd} exited with ${signal ?? `code ${code}`}`);
    });
  });
}

export const VM_ACCESS_COMMANDS: Command[] = [
  {
    path: 'vm ssh',
    args: '<VM> [SSH_ARGS...]',
    summary: 'Open an SSH session to a running VM (not to one on a simulated node: nothing answers there)',
    example: ['gpucloud vm ssh 1234', 'gpucloud vm ssh 1234 --dry-run', 'gpucloud vm ssh 1234 -- nvidia-smi'],
    options: [
      ['--dry-run', 'Print the ssh command instead of running it (a simulated VM too)'],
      ['-i, --identity <F>', 'The private key file to pass to ssh'],
    ],
    async run(ctx) {
      const [id, ...extra] = ctx.positionals;
      const info = await call(ctx.client().api.GET('/vms/{vm_id}/access-info', vmPath(id!)));
      const args = ['-p', String(info.ssh.port)];
      if (str(ctx, 'identity')) args.push('-i', str(ctx, 'identity')!);
      args.push(`${info.ssh.username}@${info.ssh.host}`, ...extra);
      if (flag(ctx, 'dry-run')) {
        if (ctx.json) return printJson(ctx, info);
        ctx.out(['ssh', ...args].map(shellQuote).join(' '));
        printNotice(ctx, info);
        return;
      }
      // Nothing answers on a simulated VM's address: ssh would only hang until it times out.
      if (info.notice) throw new CliFailure(`Note: ${info.notice}\nNot running ssh (--dry-run prints the command).`);
      const r = spawnSync('ssh', args, { stdio: 'inherit' });
      if (r.error) throw new CliFailure(`cannot run ssh: ${r.error.message}`);
      if (r.status !== 0) throw new CliFailure('', r.status ?? 1);
    },
  },
  {
    path: 'vm open',
    args: '<VM>',
    summary: "A one-time sign-in link to a running VM's WebUI, Jupyter or HTTP port",
    example: [
      'gpucloud vm open 1234',
      'gpucloud vm open 1234 --service jupyter --browser',
      'gpucloud vm open 1234 --service 8000',
    ],
    options: [
      [
        '--service <S>',
        "webui, jupyter (templates that serve them: see gpucloud templates) or one of the VM's HTTP ports (default: webui, else its first HTTP port)",
      ],
      ['--browser', 'Also open the link in the default browser'],
    ],
    async run(ctx) {
      const id = ctx.positionals[0]!;
      const asked = str(ctx, 'service');
      const wanted = asked === undefined ? undefined : parseService(asked);
      const client = ctx.client();
      const vm = await client.getVm(id);
      if (vm.status !== 'running')
        throw new CliFailure(
          `VM ${vm.vmid} is ${vm.status}: its web services open only while it runs${vm.status === 'stopped' || vm.status === 'interrupted' ? ` (start it with: gpucloud vm start ${vm.vmid})` : ''}`,
        );
      // Each link signs in once, so it is asked for now, for this one use.
      const info = await call(client.api.GET('/vms/{vm_id}/access-info', vmPath(vm.id)));
      const web = await webOf(ctx, vm, info);
      const service = wanted ?? defaultService(vm, web);
      const link = linkOf(vm, info, web, service);
      if (ctx.json)
        printJson(ctx, {
          vm_id: vm.id,
          service: typeof service === 'number' ? String(service) : service,
          url: link.url,
          expires_at: link.expires_at,
        });
      else ctx.out(link.url);
      ctx.err(
        `This link opens ${serviceLabel(service)} of VM ${vm.vmid} once, within 5 minutes (until ${link.expires_at}); run gpucloud vm open again for another.`,
      );
      printNotice(ctx, info);
      if (flag(ctx, 'browser')) {
        const failed = await openInBrowser(link.url);
        if (failed) ctx.err(`Could not open a browser (${failed}); open the link above yourself.`);
      }
    },
  },
];
