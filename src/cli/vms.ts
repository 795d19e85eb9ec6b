/** `gpucloud vm ...`: rent, watch, control and reach VMs (docs/vms.md). */
import { spawn, spawnSync } from 'node:child_process';
import { GpuCloudError, type CreateVmRequest, type operations, type Vm, type VmStatus } from '../sdk/index.js';
import {
  call,
  confirmOrAbort,
  flag,
  gpuType,
  int,
  LIMIT_OPTS,
  page,
  printJson,
  str,
  type Command,
  type Ctx,
} from './command.js';
import { CliFailure, CliUsageError, keyValues, money, table } from './output.js';
import { quoteText } from './reservations.js';

const TEMPLATES: Record<string, number> = {
  'ubuntu-22.04': 100,
  'ubuntu-24.04': 101,
  'stable-diffusion': 102,
  comfyui: 103,
  desktop: 104,
};
const TEMPLATE_NAMES = Object.fromEntries(Object.entries(TEMPLATES).map(([k, v]) => [v, k]));
/** The template of `vm create` without --template, the API's documented default. */
const DEFAULT_TEMPLATE = 101;
/** The templates whose image serves a WebUI and Jupyter (access-info links them). */
const WEB_TEMPLATES = new Set([102, 103, 104]);

type AccessInfo = operations['getVmAccessInfo']['responses'][200]['content']['application/json'];

function templateLabel(vmid: number): string {
  return `${vmid}${TEMPLATE_NAMES[vmid] ? ` (${TEMPLATE_NAMES[vmid]})` : ''}`;
}

/**
 * access-info's notice, on stderr: set when the VM cannot be reached as described (on a simulated node nothing
 * answers on its made-up address), so nobody waits on an ssh that never connects.
 */
function printNotice(ctx: Ctx, info: Pick<AccessInfo, 'notice'>): void {
  if (info.notice) ctx.err(`Note: ${info.notice}`);
}

/** The notice of a running VM, or null (not running, or access-info refused: the notice is a courtesy). */
async function noticeOf(ctx: Ctx, vm: Vm): Promise<Pick<AccessInfo, 'notice'>> {
  if (vm.status !== 'running') return { notice: null };
  try {
    return await call(ctx.client().api.GET('/vms/{vm_id}/access-info', vmPath(vm.id)));
  } catch (err) {
    if (err instanceof GpuCloudError) return { notice: null };
    throw err;
  }
}

/**
 * `--http-port` (repeatable, or separated by commas) as whole numbers. The API judges the ports themselves
 * (1024-65535, at most 5, each once, not a port the template serves already), so its message is the one shown.
 */
function httpPorts(ctx: Ctx): number[] | undefined {
  const raw = ctx.values['http-port'];
  const parts = (Array.isArray(raw) ? raw : typeof raw === 'string' ? [raw] : [])
    .flatMap((v) => v.split(','))
    .map((v) => v.trim())
    .filter(Boolean);
  if (parts.length === 0) return undefined;
  const bad = parts.find((p) => !/^\d{1,6}$/.test(p));
  if (bad !== undefined) throw new CliUsageError(`--http-port must be a port number, got "${bad}"`);
  return parts.map(Number);
}

function onOff(raw: string | undefined): boolean {
  if (raw === 'on' || raw === 'true' || raw === 'yes') return true;
  if (raw === 'off' || raw === 'false' || raw === 'no') return false;
  throw new CliUsageError(`expected on or off, got "${raw ?? ''}"`);
}

export function vmPath(id: string) {
  return { params: { path: { vm_id: id } } };
}

/** With GPUCLOUD_POLL_MS set, waits read the VM that often instead of following its events. */
function pollMs(ctx: Ctx): number | undefined {
  const n = Number(ctx.env.GPUCLOUD_POLL_MS);
  return Number.isFinite(n) && n > 0 ? n : undefined;
}

/** Waits for `status`, with a live status line on stderr. */
async function waitWithStatus(ctx: Ctx, id: string, status: VmStatus, timeoutS: number): Promise<Vm> {
  const client = ctx.client();
  const started = Date.now();
  const tty = !!process.stderr.isTTY;
  let current = '';
  const draw = () => {
    const line = `${current} (${Math.round((Date.now() - started) / 1000)}s)`;
    if (tty) process.stderr.write(`\r\x1b[K${line}`);
  };
  const timer = tty ? setInterval(draw, 1000) : undefined;
  try {
    const interval = pollMs(ctx);
    const vm = await client.waitForVm(id, status, {
      timeoutMs: timeoutS * 1000,
      ...(interval ? { intervalMs: interval } : {}),
      onStatus: (v) => {
        current = `VM ${v.vmid}: ${v.status}`;
        if (tty) draw();
        else ctx.err(current);
      },
    });
    if (tty) process.stderr.write('\n');
    return vm;
  } catch (err) {
    if (tty) process.stderr.write('\n');
    throw err;
  } finally {
    if (timer) clearInterval(timer);
  }
}

function vmRows(vms: Vm[]): string {
  return table(
    ['ID', 'VMID', 'LABEL', 'STATUS', 'GPU', 'NODE', 'IP', 'RENTAL', '$/H'],
    vms.map((v) => [
      v.id,
      v.vmid,
      v.instance_label,
      v.status,
      `${v.gpu_count}x ${v.gpu_type}`,
      v.node,
      v.ip_address,
      v.rental_type,
      money(v.hourly_rate, 3),
    ]),
  );
}

function showVm(vm: Vm): string {
  return keyValues([
    ['ID', vm.id],
    ['VMID', vm.vmid],
    ['Label', vm.instance_label],
    ['Status', vm.status],
    ...(vm.status === 'failed' ? [['Failure reason', vm.failure_reason] as [string, string | null]] : []),
    ['Node', vm.node],
    ['GPU', `${vm.gpu_count}x ${vm.gpu_type}`],
    ['CPU', `${vm.cpu_cores} cores${vm.cpu_model ? ` (${vm.cpu_model})` : ''}`],
    ['RAM', `${vm.ram_gb} GB`],
    ['Disk', `${vm.storage_gb} GB`],
    ['Template', templateLabel(vm.template_vmid)],
    ['IP', vm.ip_address],
    ['HTTP ports', vm.http_ports.length ? vm.http_ports.join(', ') : 'none'],
    ['Rental', vm.rental_type],
    ['Reservation', vm.reservation_id],
    ['Auto-restart', vm.auto_restart],
    ['Hourly rate', money(vm.hourly_rate, 4)],
    ['Created', vm.created_at],
    ['Started', vm.started_at],
    ['Stopped', vm.stopped_at],
    ['Destroyed', vm.destroyed_at],
  ]);
}

async function message(
  ctx: Ctx,
  p: Promise<{ data?: { message: string }; error?: unknown; response: Response }>,
): Promise<void> {
  const data = await call(p);
  if (ctx.json) printJson(ctx, data);
  else ctx.out(data.message);
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

/** The service to open when none is asked: the WebUI if the VM has one, else its first HTTP port. */
function defaultService(vm: Vm): Service {
  if (WEB_TEMPLATES.has(vm.template_vmid)) return 'webui';
  const first = vm.http_ports[0];
  if (first !== undefined) return first;
  throw new CliFailure(
    `VM ${vm.vmid} has no web service: its template (${TEMPLATE_NAMES[vm.template_vmid] ?? vm.template_vmid}) serves no WebUI or Jupyter, and it was created without --http-port`,
  );
}

/** The link of one service in access-info, or why there is none. */
function linkOf(vm: Vm, info: AccessInfo, s: Service): { url: string; expires_at: string } {
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
  if (!WEB_TEMPLATES.has(vm.template_vmid))
    throw new CliFailure(
      `VM ${vm.vmid} has no ${s === 'webui' ? 'WebUI' : 'Jupyter'}: only templates 102-104 serve one (this VM is ${TEMPLATE_NAMES[vm.template_vmid] ?? vm.template_vmid})`,
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

export const VM_COMMANDS: Command[] = [
  {
    path: 'vm create',
    summary: 'Rent a VM',
    example: [
      'gpucloud vm create --node vm01 --gpu 4090 --template ubuntu-24.04 --ssh-key 6f1c... --wait',
      'gpucloud vm create --node vm02 --gpu 5090 --count 2 --reserved 3 --password "a long password" --yes',
      'gpucloud vm create --node vm01 --gpu 4090 --template ubuntu-24.04 --http-port 8000 --http-port 6006',
    ],
    options: [
      ['--node <N>', 'The node to place it on (see gpucloud search) (required)'],
      ['--gpu <TYPE>', '5090, 4090 or pro6000 (required)'],
      ['--count <N>', 'GPUs: 1, 2, 4 or 8 (default 1)'],
      ['--disk <GB>', 'Disk size (default 50)'],
      [
        '--template <T>',
        `100-104 or ubuntu-22.04, ubuntu-24.04, stable-diffusion, comfyui, desktop (default ${templateLabel(DEFAULT_TEMPLATE)})`,
      ],
      ['--interruptible', 'An interruptible (preemptible) rental at a lower rate'],
      ['--reserved <MONTHS>', 'A reservation of 1, 3 or 6 months (shows the quote and asks)'],
      ['--password <P>', 'Log in with this password'],
      ['--ssh-key <ID>', 'Log in with this uploaded SSH key'],
      ['--label <L>', 'A label for the VM'],
      [
        '--http-port <PORT>',
        'A port (1024-65535) an app in the VM serves, to open in the browser with gpucloud vm open (repeat, up to 5)',
        { repeatable: true },
      ],
      ['--wait', 'Wait until it is running, with a live status line; a VM that fails says why'],
      ['--timeout <S>', 'With --wait: give up after S seconds (default 600)'],
      ['-y, --yes', 'Do not ask before reserving'],
    ],
    async run(ctx) {
      const node = str(ctx, 'node');
      if (!node) throw new CliUsageError('--node is required');
      const gpu = gpuType(str(ctx, 'gpu'));
      if (!gpu) throw new CliUsageError('--gpu is required');
      const count = int(ctx, 'count', { def: 1 })!;
      if (![1, 2, 4, 8].includes(count)) throw new CliUsageError('--count must be 1, 2, 4 or 8');
      const disk = int(ctx, 'disk', { def: 50, min: 1 })!;
      const tRaw = str(ctx, 'template');
      const template = tRaw === undefined ? DEFAULT_TEMPLATE : /^\d+$/.test(tRaw) ? Number(tRaw) : TEMPLATES[tRaw];
      if (template === undefined || template < 100 || template > 104)
        throw new CliUsageError(
          `--template must be 100-104 or one of ${Object.keys(TEMPLATES).join(', ')} (default ${templateLabel(DEFAULT_TEMPLATE)}), got "${tRaw}"`,
        );
      const byDefault = tRaw === undefined ? ', the default' : '';
      const reserved = int(ctx, 'reserved');
      if (reserved !== undefined && ![1, 3, 6].includes(reserved))
        throw new CliUsageError('--reserved must be 1, 3 or 6 (months)');
      if (reserved !== undefined && flag(ctx, 'interruptible'))
        throw new CliUsageError('--reserved and --interruptible exclude each other');
      const password = str(ctx, 'password');
      const sshKey = str(ctx, 'ssh-key');
      if (password && sshKey) throw new CliUsageError('give --password or --ssh-key, not both');
      const timeout = int(ctx, 'timeout', { def: 600, min: 1 })!;
      const body: CreateVmRequest = {
        node,
        gpu_type: gpu,
        gpu_count: count as 1,
        storage_gb: disk,
        template_vmid: template,
      };
      if (flag(ctx, 'interruptible')) body.rental_type = 'interruptible';
      if (reserved !== undefined) {
        body.rental_type = 'reserved';
        body.reservation_months = reserved as 1;
      }
      if (sshKey) {
        body.auth_method = 'ssh_key';
        body.ssh_key_id = sshKey;
      }
      if (password) {
        body.auth_method = 'password';
        body.password = password;
      }
      if (str(ctx, 'label') !== undefined) body.instance_label = str(ctx, 'label')!;
      const ports = httpPorts(ctx);
      if (ports) body.http_ports = ports;
      const client = ctx.client();
      if (reserved !== undefined) {
        const q = await call(
          client.api.POST('/reservations/calculate', {
            body: { gpu_type: gpu, gpu_count: count as 1, storage_gb: disk, reservation_months: reserved as 1 },
          }),
        );
        if (!flag(ctx, 'yes')) {
          ctx.err(quoteText(q));
          await confirmOrAbort(
            ctx,
            `Reserve for ${reserved} month(s) and pay the deposit of ${money(q.deposit_required)} now?`,
          );
        }
      }
      let vm = await client.createVm(body);
      if (!ctx.json)
        ctx.out(
          `Created VM ${vm.vmid} (${vm.id}) on ${vm.node}, template ${templateLabel(vm.template_vmid)}${byDefault}: ${vm.status}`,
        );
      if (flag(ctx, 'wait')) {
        try {
          vm = await waitWithStatus(ctx, vm.id, 'running', timeout);
        } catch (err) {
          // A VM that will not run says why (the SDK gives its failure_reason); the template may be one the user
          // never chose.
          if (err instanceof GpuCloudError && err.code === 'invalid_state' && byDefault)
            throw new CliFailure(
              `Error: ${err.detail}\nNo --template was given, so it used the default, template ${templateLabel(DEFAULT_TEMPLATE)}; choose another with --template (see gpucloud vm create --help).`,
            );
          throw err;
        }
        if (!ctx.json)
          ctx.out(
            `VM ${vm.vmid} is running${vm.ip_address ? ` at ${vm.ip_address}` : ''}; connect with: gpucloud vm ssh ${vm.vmid}`,
          );
        printNotice(ctx, await noticeOf(ctx, vm));
      }
      if (ctx.json) printJson(ctx, vm);
    },
  },
  {
    path: 'vm list',
    summary: 'List your VMs, newest first',
    example: 'gpucloud vm list --status running',
    options: [['--all', 'Include destroyed VMs'], ['--status <S>', 'Only VMs in this status'], ...LIMIT_OPTS],
    async run(ctx) {
      const query: Record<string, unknown> = { ...page(ctx) };
      if (flag(ctx, 'all')) query.include_destroyed = true;
      if (str(ctx, 'status')) query.status = str(ctx, 'status');
      const vms = await ctx.client().listVms(query);
      if (ctx.json) return printJson(ctx, vms);
      if (vms.length === 0) return ctx.out('No VMs');
      ctx.out(vmRows(vms));
    },
  },
  {
    path: 'vm show',
    args: '<VM>',
    summary: 'Show a VM (by id or vmid); a failed one with its reason',
    example: 'gpucloud vm show 1234',
    async run(ctx) {
      const vm = await ctx.client().getVm(ctx.positionals[0]!);
      if (ctx.json) return printJson(ctx, vm);
      ctx.out(showVm(vm));
      printNotice(ctx, await noticeOf(ctx, vm));
    },
  },
  {
    path: 'vm start',
    args: '<VM>',
    summary: 'Start a stopped VM',
    example: 'gpucloud vm start 1234',
    run: (ctx) => message(ctx, ctx.client().api.POST('/vms/{vm_id}/start', vmPath(ctx.positionals[0]!))),
  },
  {
    path: 'vm stop',
    args: '<VM>',
    summary: 'Stop a running VM (its disk is still billed)',
    example: 'gpucloud vm stop 1234',
    run: (ctx) => message(ctx, ctx.client().api.POST('/vms/{vm_id}/stop', vmPath(ctx.positionals[0]!))),
  },
  {
    path: 'vm destroy',
    args: '<VM>',
    summary: 'Destroy a VM and its disk (asks first unless --yes)',
    example: 'gpucloud vm destroy 1234 --yes',
    options: [['-y, --yes', 'Do not ask']],
    async run(ctx) {
      const id = ctx.positionals[0]!;
      if (!flag(ctx, 'yes')) {
        const vm = await ctx.client().getVm(id);
        await confirmOrAbort(
          ctx,
          `Destroy VM ${vm.vmid}${vm.instance_label ? ` "${vm.instance_label}"` : ''} (${vm.gpu_count}x ${vm.gpu_type} on ${vm.node}) and its disk?`,
        );
      }
      await message(ctx, ctx.client().api.DELETE('/vms/{vm_id}', vmPath(id)));
    },
  },
  {
    path: 'vm label',
    args: '<VM> [LABEL]',
    summary: 'Set (or, without LABEL, clear) the label of a VM',
    example: 'gpucloud vm label 1234 training-run-7',
    async run(ctx) {
      const [id, label] = ctx.positionals;
      await message(
        ctx,
        ctx.client().api.POST('/vms/{vm_id}/set-label', { ...vmPath(id!), body: { instance_label: label ?? null } }),
      );
    },
  },
  {
    path: 'vm auto-restart',
    args: '<VM> <on|off>',
    summary: 'Restart an interrupted VM by itself when capacity is back',
    example: 'gpucloud vm auto-restart 1234 on',
    async run(ctx) {
      const [id, v] = ctx.positionals;
      const on = onOff(v);
      await message(
        ctx,
        ctx.client().api.POST('/vms/{vm_id}/set-auto-restart', { ...vmPath(id!), body: { auto_restart: on } }),
      );
    },
  },
  {
    path: 'vm interruptions',
    args: '<VM>',
    summary: 'The interruption history of an interruptible VM',
    example: 'gpucloud vm interruptions 1234',
    options: LIMIT_OPTS,
    async run(ctx) {
      const rows = await call(
        ctx.client().api.GET('/vms/{vm_id}/interruption-history', {
          params: { path: { vm_id: ctx.positionals[0]! }, query: page(ctx) },
        }),
      );
      if (ctx.json) return printJson(ctx, rows);
      if (rows.length === 0) return ctx.out('No interruptions');
      ctx.out(
        table(
          ['ID', 'STATUS', 'PREEMPTED AT', 'RESTORED AT', 'DOWNTIME S', 'BY VM'],
          rows.map((r) => [r.id, r.status, r.preempted_at, r.restored_at, r.downtime_seconds, r.preempted_by_vm_id]),
        ),
      );
    },
  },
  {
    path: 'vm wait',
    args: '<VM>',
    summary: 'Wait until a VM is in a status (default running); a VM that fails says why',
    example: 'gpucloud vm wait 1234 --status stopped --timeout 120',
    options: [
      ['--status <S>', 'The status to wait for (default running)'],
      ['--timeout <S>', 'Give up after S seconds (default 600)'],
    ],
    async run(ctx) {
      const status = (str(ctx, 'status') ?? 'running') as VmStatus;
      const valid = [
        'creating',
        'starting',
        'running',
        'stopping',
        'stopped',
        'interrupted',
        'destroyed',
        'failed',
        'offline',
      ];
      if (!valid.includes(status)) throw new CliUsageError(`--status must be one of ${valid.join(', ')}`);
      const vm = await waitWithStatus(ctx, ctx.positionals[0]!, status, int(ctx, 'timeout', { def: 600, min: 1 })!);
      if (ctx.json) return printJson(ctx, vm);
      ctx.out(`VM ${vm.vmid} is ${vm.status}${vm.failure_reason ? `: ${vm.failure_reason}` : ''}`);
    },
  },
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
        "webui, jupyter (templates 102-104) or one of the VM's HTTP ports (default: webui, else its first HTTP port)",
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
      const service = wanted ?? defaultService(vm);
      // Each link signs in once, so it is asked for now, for this one use.
      const info = await call(client.api.GET('/vms/{vm_id}/access-info', vmPath(vm.id)));
      const link = linkOf(vm, info, service);
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
