/**
 * `gpucloud vm ...`: rent, watch and control VMs (docs/vms.md); following a VM's status is vm-wait.ts, reaching
 * them is vm-access.ts.
 */
import { GpuCloudError, type CreateVmRequest, type Template, type Vm } from '../sdk/index.js';
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
import { imageForCreate } from './my-images.js';
import { CliFailure, CliUsageError, keyValues, money, table } from './output.js';
import { quoteText } from './reservations.js';
import { noticeOf, printNotice, vmPath, VM_ACCESS_COMMANDS } from './vm-access.js';
import { VM_WAIT_COMMAND, waitWithStatus, whyStopped } from './vm-wait.js';
import {
  catalogue,
  DEFAULT_TEMPLATE,
  DEFAULT_TEMPLATE_NAME,
  resolveTemplate,
  templateLabel,
  templateOf,
} from './templates.js';

export { vmPath } from './vm-access.js';

const DEFAULT_LABEL = `${DEFAULT_TEMPLATE} (${DEFAULT_TEMPLATE_NAME})`;

/**
 * Why a create was refused for its template (the API's detail), with what the user can do: the default they
 * may not have chosen, and the templates ready on that node.
 */
function templateUnavailable(
  err: GpuCloudError,
  template: number,
  node: string,
  known: Template[] | undefined,
  byDefault: boolean,
) {
  const lines = [`Error: ${err.detail}`];
  if (byDefault)
    lines.push(
      `No --template was given, so it used the default, template ${templateLabel(DEFAULT_TEMPLATE, known)}; choose another with --template (see gpucloud templates).`,
    );
  if (known) {
    const ready = known.filter((t) => t.ready_on.nodes.includes(node));
    lines.push(
      ready.length
        ? `Ready on ${node}: ${ready.map((t) => templateLabel(t.template_vmid, [t])).join(', ')}.`
        : `No template is ready on ${node} yet.`,
    );
  }
  lines.push(`The nodes where template ${template} is ready: gpucloud search --template ${template}`);
  return new CliFailure(lines.join('\n'));
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

function showVm(vm: Vm, known?: Template[]): string {
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
    ['Template', templateLabel(vm.template_vmid, known)],
    ...(vm.image_id ? [['Image', vm.image_id] as [string, string]] : []),
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

export const VM_COMMANDS: Command[] = [
  {
    path: 'vm create',
    summary: 'Rent a VM',
    example: [
      'gpucloud vm create --node vm01 --gpu 4090 --template ubuntu-24.04 --ssh-key 6f1c... --wait',
      'gpucloud vm create --node vm02 --gpu 5090 --count 2 --reserved 3 --password "a long password" --yes',
      'gpucloud vm create --node vm01 --gpu 4090 --template ubuntu-24.04 --http-port 8000 --http-port 6006',
      'gpucloud vm create --node vm03 --gpu 4090 --image 0b7e5d4c-3a2f-4e1d-9c8b-7a6f5e4d3c2b --wait',
    ],
    options: [
      ['--node <N>', 'The node to place it on (see gpucloud search) (required)'],
      ['--gpu <TYPE>', '5090, 4090 or pro6000 (required)'],
      ['--count <N>', 'GPUs: 1, 2, 4 or 8 (default 1)'],
      ['--disk <GB>', "Disk size (default 50, or the template's minimum when it is more)"],
      ['--template <T>', `A template by number or name (see gpucloud templates) (default ${DEFAULT_LABEL})`],
      ['--image <ID>', 'Start from one of your images (see gpucloud images) instead of a template'],
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
      const diskGiven = int(ctx, 'disk', { min: 1 });
      const tRaw = str(ctx, 'template');
      const imageId = str(ctx, 'image');
      if (imageId !== undefined && tRaw !== undefined)
        throw new CliUsageError('give --template or --image, not both (a VM from an image has its template)');
      const reserved = int(ctx, 'reserved');
      if (reserved !== undefined && ![1, 3, 6].includes(reserved))
        throw new CliUsageError('--reserved must be 1, 3 or 6 (months)');
      if (reserved !== undefined && flag(ctx, 'interruptible'))
        throw new CliUsageError('--reserved and --interruptible exclude each other');
      const password = str(ctx, 'password');
      const sshKey = str(ctx, 'ssh-key');
      if (password && sshKey) throw new CliUsageError('give --password or --ssh-key, not both');
      const timeout = int(ctx, 'timeout', { def: 600, min: 1 })!;
      // The catalogue names the templates (a name given, and the one the VM gets).
      const known = await catalogue(ctx);
      // An image brings its template and the smallest disk it fits on.
      const image = imageId === undefined ? undefined : await imageForCreate(ctx, imageId);
      const template = image
        ? image.template_vmid
        : tRaw === undefined
          ? DEFAULT_TEMPLATE
          : resolveTemplate(tRaw, known);
      const minDisk = image ? image.disk_gb : known?.find((t) => t.template_vmid === template)?.min_disk_gb;
      const disk = diskGiven ?? Math.max(50, minDisk ?? 50);
      const body: CreateVmRequest = {
        node,
        gpu_type: gpu,
        gpu_count: count as 1,
        storage_gb: disk,
        ...(image ? { image_id: image.id } : { template_vmid: template }),
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
      let vm: Vm;
      try {
        vm = await client.createVm(body);
      } catch (err) {
        // Refused before any VM was made: the node's host does not hold the template ready.
        if (err instanceof GpuCloudError && err.code === 'template_unavailable' && !image)
          throw templateUnavailable(err, template, node, known, tRaw === undefined);
        throw err;
      }
      if (!ctx.json)
        ctx.out(
          `Created VM ${vm.vmid} (${vm.id}) on ${vm.node}, ${image ? `from image "${image.name}" (template ${templateLabel(vm.template_vmid, known)})` : `template ${templateLabel(vm.template_vmid, known)}${tRaw === undefined ? ', the default' : ''}`}: ${vm.status}`,
        );
      if (flag(ctx, 'wait')) {
        // A VM that will not run says why: the SDK's error gives its failure_reason.
        vm = await waitWithStatus(ctx, vm.id, 'running', timeout);
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
      const t = await templateOf(ctx, vm.template_vmid).catch(() => undefined);
      ctx.out(showVm(vm, t ? [t] : undefined));
      printNotice(ctx, await noticeOf(ctx, vm));
    },
  },
  {
    path: 'vm start',
    args: '<VM>',
    summary: 'Start a stopped VM; with --move on another node when its own has no free GPUs',
    example: ['gpucloud vm start 1234', 'gpucloud vm start 1234 --move --wait'],
    options: [
      ['--move', "If the VM's node has no free GPUs, move its disk to another node that has them and start it there"],
      ['--wait', 'Wait until it runs, showing each step (moving, starting)'],
      ['--timeout <S>', 'With --wait: give up after S seconds (default 1800)'],
    ],
    async run(ctx) {
      const id = ctx.positionals[0]!;
      const move = flag(ctx, 'move');
      const timeout = int(ctx, 'timeout', { def: 1800, min: 1 })!;
      let data: { message: string };
      try {
        data = await call(
          ctx.client().api.POST('/vms/{vm_id}/start', {
            ...vmPath(id),
            ...(move ? { body: { move: 'if_needed' as const } } : {}),
          }),
        );
      } catch (err) {
        // Its node's GPUs were rented out while it was stopped: another node may have them.
        if (!move && err instanceof GpuCloudError && err.code === 'gpu_unavailable' && /free GPU/.test(err.detail))
          throw new CliFailure(
            `${err.detail}\nStart it on another node that has the GPUs (its disk moves there): gpucloud vm start ${id} --move`,
          );
        throw err;
      }
      if (!flag(ctx, 'wait')) {
        if (ctx.json) printJson(ctx, data);
        else ctx.out(data.message);
        return;
      }
      if (!ctx.json) ctx.out(data.message);
      const vm = await waitWithStatus(ctx, id, ['running', 'stopped'], timeout);
      if (vm.status === 'stopped') throw new CliFailure(`VM ${vm.vmid} did not start: ${await whyStopped(ctx, vm)}`);
      if (ctx.json) return printJson(ctx, vm);
      ctx.out(`VM ${vm.vmid} is running on ${vm.node}; connect with: gpucloud vm ssh ${vm.vmid}`);
    },
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
  VM_WAIT_COMMAND,
  ...VM_ACCESS_COMMANDS,
];
