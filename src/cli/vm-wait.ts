/**
 * Following a VM's status from the CLI: the live status line of `--wait` (vm create, vm start), why a start
 * ended stopped, and `gpucloud vm wait`.
 */
import type { Vm, VmStatus } from '../sdk/index.js';
import { VM_STATUSES } from '../sdk/schema.js';
import { call, int, printJson, str, type Command, type Ctx } from './command.js';
import { CliUsageError } from './output.js';

/** A status the API knows (its enum, generated into the SDK). */
function isVmStatus(s: string): s is VmStatus {
  return (VM_STATUSES as readonly string[]).includes(s);
}

/** With GPUCLOUD_POLL_MS set, waits read the VM that often instead of following its events. */
function pollMs(ctx: Ctx): number | undefined {
  const n = Number(ctx.env.GPUCLOUD_POLL_MS);
  return Number.isFinite(n) && n > 0 ? n : undefined;
}

/** Why a VM that was starting (or moving) ended stopped: the error of its last status change. */
export async function whyStopped(ctx: Ctx, vm: Vm): Promise<string> {
  let after: string | undefined;
  let error: string | null = null;
  for (;;) {
    const page = await call(
      ctx.client().api.GET('/events', {
        params: { query: { vm_id: vm.id, type: ['vm.status_changed'], limit: 200, ...(after ? { after } : {}) } },
      }),
    );
    const last = page.at(-1);
    if (!last) break;
    error = typeof last.data.error === 'string' ? last.data.error : null;
    if (page.length < 200) break;
    after = last.id;
  }
  return error ?? `it is ${vm.status}`;
}

/** Waits for `status`, with a live status line on stderr. */
export async function waitWithStatus(
  ctx: Ctx,
  id: string,
  status: VmStatus | VmStatus[],
  timeoutS: number,
): Promise<Vm> {
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

export const VM_WAIT_COMMAND: Command = {
  path: 'vm wait',
  args: '<VM>',
  summary: 'Wait until a VM is in a status (default running); a VM that fails says why',
  example: 'gpucloud vm wait 1234 --status stopped --timeout 120',
  options: [
    ['--status <S>', 'The status to wait for (default running)'],
    ['--timeout <S>', 'Give up after S seconds (default 600)'],
  ],
  async run(ctx) {
    const status = str(ctx, 'status') ?? 'running';
    if (!isVmStatus(status)) throw new CliUsageError(`--status must be one of ${VM_STATUSES.join(', ')}`);
    const vm = await waitWithStatus(ctx, ctx.positionals[0]!, status, int(ctx, 'timeout', { def: 600, min: 1 })!);
    if (ctx.json) return printJson(ctx, vm);
    ctx.out(`VM ${vm.vmid} is ${vm.status}${vm.failure_reason ? `: ${vm.failure_reason}` : ''}`);
  },
};
