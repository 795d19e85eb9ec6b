/**
 * The client commands of `gpucloud`, built only on
 * the SDK. Each command: a path ("vm create"), its options (parsed with
 * node:util parseArgs), a help text with an example, and a run function.
 */
import { readFileSync } from 'node:fs';
import { spawnSync } from 'node:child_process';
import { GpuCloudClient, GpuCloudError, type ApiEvent, type CreateVmRequest, type FollowEventsOptions, type Vm, type VmStatus } from '../sdk/index.js';
import { call, flag, int, LIMIT_HELP, LIMIT_OPTS, num, page, printJson, str, type Command, type Ctx } from './command.js';
import { WEBHOOK_COMMANDS } from './webhooks.js';
import { configPath, readConfig, removeConfig, resolve, writeConfig, type Resolved, type SavedConfig } from './config.js';
import { CliFailure, CliUsageError, keyValues, money, table, type Cell } from './output.js';
import { ask, interactive } from './prompt.js';

export type { Command, Ctx } from './command.js';

// ---------------------------------------------------------------------------
// Helpers.

const GPU_TYPES = ['5090', '4090', 'pro6000'] as const;
type GpuType = (typeof GPU_TYPES)[number];
const TEMPLATES: Record<string, number> = { 'ubuntu-22.04': 100, 'ubuntu-24.04': 101, 'stable-diffusion': 102, comfyui: 103, desktop: 104 };
const TEMPLATE_NAMES = Object.fromEntries(Object.entries(TEMPLATES).map(([k, v]) => [v, k]));

function gpuType(raw: string | undefined, name = 'gpu'): GpuType | undefined {
  if (raw === undefined) return undefined;
  if (!(GPU_TYPES as readonly string[]).includes(raw)) throw new CliUsageError(`--${name} must be one of ${GPU_TYPES.join(', ')}, got "${raw}"`);
  return raw as GpuType;
}

function onOff(raw: string | undefined): boolean {
  if (raw === 'on' || raw === 'true' || raw === 'yes') return true;
  if (raw === 'off' || raw === 'false' || raw === 'no') return false;
  throw new CliUsageError(`expected on or off, got "${raw ?? ''}"`);
}

/** One line about an event: its VM and what its data says, most useful fields first. */
function describeEvent(e: { vm_id: string | null; data: Record<string, unknown> }): string {
  const d = e.data;
  const parts: string[] = [];
  if (d.vmid !== undefined) parts.push(`VM ${d.vmid}`);
  if (d.from !== undefined && d.to !== undefined) parts.push(`${d.from} -> ${d.to}`);
  if (d.reason !== undefined) parts.push(`(${d.reason})`);
  const shown = new Set(['vmid', 'from', 'to', 'reason']);
  const rest = Object.entries(d).filter(([k]) => !shown.has(k));
  if (rest.length) parts.push(rest.map(([k, v]) => `${k}=${typeof v === 'string' ? v : JSON.stringify(v)}`).join(' '));
  return parts.join(' ');
}

function vmPath(id: string) {
  return { params: { path: { vm_id: id } } };
}

async function confirmOrAbort(ctx: Ctx, question: string): Promise<void> {
  if (flag(ctx, 'yes')) return;
  const answer = await ask(`${question} [y/N] `);
  if (answer === undefined && !interactive()) throw new CliUsageError('no answer on stdin: pass --yes to confirm without a terminal');
  if (answer === undefined || !/^y(es)?$/i.test(answer)) throw new CliFailure('Aborted');
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
    vms.map((v) => [v.id, v.vmid, v.instance_label, v.status, `${v.gpu_count}x ${v.gpu_type}`, v.node, v.ip_address, v.rental_type, money(v.hourly_rate, 3)]),
  );
}

function showVm(vm: Vm): string {
  return keyValues([
    ['ID', vm.id],
    ['VMID', vm.vmid],
    ['Label', vm.instance_label],
    ['Status', vm.status],
    ['Node', vm.node],
    ['GPU', `${vm.gpu_count}x ${vm.gpu_type}`],
    ['CPU', `${vm.cpu_cores} cores${vm.cpu_model ? ` (${vm.cpu_model})` : ''}`],
    ['RAM', `${vm.ram_gb} GB`],
    ['Disk', `${vm.storage_gb} GB`],
    ['Template', `${vm.template_vmid}${TEMPLATE_NAMES[vm.template_vmid] ? ` (${TEMPLATE_NAMES[vm.template_vmid]})` : ''}`],
    ['IP', vm.ip_address],
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

function saveTokens(ctx: Ctx, tokens: { accessToken: string; refreshToken: string }, extra: SavedConfig = {}): void {
  const saved = readConfig(ctx.configFile);
  delete saved.api_key;
  writeConfig(ctx.configFile, { ...saved, ...extra, access_token: tokens.accessToken, refresh_token: tokens.refreshToken });
}

async function message(ctx: Ctx, p: Promise<{ data?: { message: string }; error?: unknown; response: Response }>): Promise<void> {
  const data = await call(p);
  if (ctx.json) printJson(ctx, data);
  else ctx.out(data.message);
}

// ---------------------------------------------------------------------------
// Commands.

export const COMMANDS: Command[] = [
  // --- account -------------------------------------------------------------
  {
    path: 'login',
    summary: 'Log in and save the session (or an API key) in the config file',
    example: ['gpucloud login --email me@example.com', 'gpucloud login --api-key gpc_...'],
    options: { email: { type: 'string' }, password: { type: 'string' }, code: { type: 'string' } },
    optionHelp: [
      ['--email E', 'Account email (asked for on a terminal)'],
      ['--password P', 'Password (asked for, hidden, on a terminal)'],
      ['--code C', 'TOTP or recovery code when 2FA is on (else asked for, or read from stdin)'],
      ['--api-key K', 'Save this API key instead of logging in with a password'],
    ],
    positionals: 0,
    async run(ctx) {
      const apiUrl = ctx.resolved().apiUrl;
      const key = str(ctx, 'api-key');
      if (key) {
        const client = new GpuCloudClient({ baseUrl: apiUrl, apiKey: key });
        const account = await call(client.api.GET('/account'));
        writeConfig(ctx.configFile, { api_url: apiUrl, api_key: key, email: account.email });
        if (ctx.json) printJson(ctx, account);
        else ctx.out(`Saved the API key for ${account.email} in ${ctx.configFile}`);
        return;
      }
      let email = str(ctx, 'email');
      let password = str(ctx, 'password');
      if (!email) {
        if (!interactive()) throw new CliUsageError('--email is required without a terminal');
        email = await ask('Email: ');
      }
      if (!password) {
        if (!interactive()) throw new CliUsageError('--password is required without a terminal');
        password = await ask('Password: ', { hidden: true });
      }
      if (!email || !password) throw new CliUsageError('an email and a password are required');
      let first = true;
      const client = new GpuCloudClient({
        baseUrl: apiUrl,
        onTokens: (t) => {
          // The first pair replaces whatever was saved; later ones are rotations.
          if (first) writeConfig(ctx.configFile, { api_url: apiUrl, email, access_token: t.accessToken, refresh_token: t.refreshToken });
          else saveTokens(ctx, t);
          first = false;
        },
      });
      const res = await client.login(email, password);
      if ('two_factor_required' in res) {
        let code = str(ctx, 'code');
        if (!code) code = await ask('Two-factor code: ');
        if (!code) throw new CliUsageError('two-factor authentication is on: give the code with --code (or on stdin)');
        await client.verify2fa(res.challenge_token, code);
      }
      const account = await call(client.api.GET('/account'));
      if (ctx.json) printJson(ctx, account);
      else ctx.out(`Logged in as ${account.email}${account.role === 'admin' ? ' (admin)' : ''}`);
    },
  },
  {
    path: 'logout',
    summary: 'Revoke the saved session and forget the saved credentials',
    example: 'gpucloud logout',
    positionals: 0,
    async run(ctx) {
      const saved = readConfig(ctx.configFile);
      if (saved.refresh_token) {
        const client = new GpuCloudClient({ baseUrl: ctx.resolved().apiUrl, accessToken: saved.access_token, refreshToken: saved.refresh_token });
        try {
          await client.logout();
        } catch (err) {
          // An already dead session: forgetting it locally is all that is left.
          if (!(err instanceof GpuCloudError && err.status === 401)) throw err;
        }
      }
      removeConfig(ctx.configFile);
      if (ctx.json) printJson(ctx, {});
      else ctx.out('Logged out');
    },
  },
  {
    path: 'whoami',
    summary: 'Show the account the credentials belong to',
    example: 'gpucloud whoami',
    positionals: 0,
    async run(ctx) {
      const a = await call(ctx.client().api.GET('/account'));
      if (ctx.json) return printJson(ctx, a);
      const r = ctx.resolved();
      ctx.out(
        keyValues([
          ['Email', a.email],
          ['Name', a.name],
          ['ID', a.id],
          ['Role', a.role],
          ['2FA', a.two_factor_enabled ? 'on' : 'off'],
          ['API', r.apiUrl],
          ['Credentials', r.apiKey ? `API key (${r.source})` : `login session (${r.source})`],
        ]),
      );
    },
  },
  // --- marketplace ---------------------------------------------------------
  {
    path: 'search',
    summary: 'Find GPU offers, cheapest first',
    example: 'gpucloud search --gpu 4090 --min-gpus 2 --max-price 1.5',
    options: { gpu: { type: 'string' }, 'min-gpus': { type: 'string' }, 'max-price': { type: 'string' }, interruptible: { type: 'boolean' }, location: { type: 'string' }, ...LIMIT_OPTS },
    optionHelp: [
      ['--gpu TYPE', '5090, 4090 or pro6000'],
      ['--min-gpus N', 'At least N free GPUs'],
      ['--max-price P', 'At most P dollars per hour'],
      ['--interruptible', 'Offers for interruptible rentals (priced at the interruptible rate)'],
      ['--location L', 'Only in this location'],
      ...LIMIT_HELP,
    ],
    positionals: 0,
    async run(ctx) {
      const query: Record<string, string | number> = { ...page(ctx) };
      const g = gpuType(str(ctx, 'gpu'));
      if (g) query.gpu_type = g;
      const minGpus = int(ctx, 'min-gpus', { min: 1 });
      if (minGpus !== undefined) query.min_gpus = minGpus;
      const maxPrice = num(ctx, 'max-price');
      if (maxPrice !== undefined) query.max_price = maxPrice;
      const interruptible = flag(ctx, 'interruptible');
      if (interruptible) query.rental_type = 'interruptible';
      if (str(ctx, 'location')) query.location = str(ctx, 'location')!;
      const offers = await call(ctx.client().api.GET('/search', { params: { query: query as never } }));
      if (ctx.json) return printJson(ctx, offers);
      const price = (o: (typeof offers)[number]) => (interruptible ? o.gpu_price_hourly * o.gpu_count * o.interruptible_rate + o.storage_price_hourly : o.total_price_hourly);
      const sorted = [...offers].sort((a, b) => price(a) - price(b) || a.node.localeCompare(b.node));
      if (sorted.length === 0) return ctx.out('No offers match');
      ctx.out(
        table(
          ['NODE', 'GPU', 'GPUS', 'VRAM', 'CPU', 'RAM', 'DISK', '$/GPU/H', interruptible ? '$/H (INT)' : '$/H', 'LOCATION'],
          sorted.map((o) => [o.node, o.gpu_type, o.gpu_count, `${Math.round(o.gpu_ram_mb / 1024)} GB`, o.cpu_cores, `${o.ram_gb} GB`, `${o.max_storage_gb} GB`, money(o.gpu_price_hourly * (interruptible ? o.interruptible_rate : 1), 3), money(price(o), 3), o.location]),
        ),
      );
    },
  },
  {
    path: 'pricing',
    summary: 'Show the price list',
    example: 'gpucloud pricing',
    positionals: 0,
    async run(ctx) {
      const p = await call(ctx.client().api.GET('/pricing'));
      if (ctx.json) return printJson(ctx, p);
      ctx.out(
        table(
          ['GPU', 'VRAM', '$/GPU/H', 'INTERRUPTIBLE', '$/GB/H DISK', 'RESERVED 1/3/6 MO', 'FREE'],
          p.gpu_types.map((g) => [
            g.gpu_type,
            `${Math.round(g.gpu_ram_mb / 1024)} GB`,
            money(g.gpu_price_hourly, 3),
            `${Math.round(g.interruptible_rate * 100)}%`,
            money(g.storage_price_gb_hourly, 5),
            `${g.reserved_discount_1mo}% / ${g.reserved_discount_3mo}% / ${g.reserved_discount_6mo}%`,
            `${g.available_gpus}/${g.total_gpus}`,
          ]),
        ) + `\n\nPrices in ${p.currency}, updated ${p.updated_at}`,
      );
    },
  },
  // --- ssh keys ------------------------------------------------------------
  {
    path: 'ssh-keys add',
    args: 'FILE',
    summary: 'Upload an SSH public key (e.g. ~/.ssh/id_ed25519.pub)',
    example: 'gpucloud ssh-keys add ~/.ssh/id_ed25519.pub --label laptop',
    options: { label: { type: 'string' } },
    optionHelp: [['--label L', 'A name for the key (default: the key comment)']],
    positionals: 1,
    async run(ctx) {
      const file = ctx.positionals[0]!;
      let text: string;
      try {
        text = readFileSync(file, 'utf8');
      } catch (err) {
        throw new CliUsageError(`cannot read ${file}: ${(err as Error).message}`);
      }
      const body: { ssh_public_key: string; label?: string } = { ssh_public_key: text.trim() };
      if (str(ctx, 'label')) body.label = str(ctx, 'label')!;
      const k = await call(ctx.client().api.POST('/ssh-keys', { body }));
      if (ctx.json) return printJson(ctx, k);
      ctx.out(`Added SSH key ${k.id} (${k.key_type} ${k.fingerprint}, "${k.label}")`);
    },
  },
  {
    path: 'ssh-keys list',
    summary: 'List your SSH keys',
    example: 'gpucloud ssh-keys list',
    options: LIMIT_OPTS,
    optionHelp: LIMIT_HELP,
    positionals: 0,
    async run(ctx) {
      const keys = await call(ctx.client().api.GET('/ssh-keys', { params: { query: page(ctx) } }));
      if (ctx.json) return printJson(ctx, keys);
      if (keys.length === 0) return ctx.out('No SSH keys; add one with: gpucloud ssh-keys add ~/.ssh/id_ed25519.pub');
      ctx.out(table(['ID', 'LABEL', 'TYPE', 'FINGERPRINT', 'CREATED'], keys.map((k) => [k.id, k.label, k.key_type, k.fingerprint, k.created_at])));
    },
  },
  {
    path: 'ssh-keys rm',
    args: 'ID',
    summary: 'Delete an SSH key',
    example: 'gpucloud ssh-keys rm 6f1c...',
    positionals: 1,
    async run(ctx) {
      const id = ctx.positionals[0]!;
      await call(ctx.client().api.DELETE('/ssh-keys/{key_id}', { params: { path: { key_id: id } } }));
      if (ctx.json) return printJson(ctx, {});
      ctx.out(`Deleted SSH key ${id}`);
    },
  },
  // --- api keys ------------------------------------------------------------
  {
    path: 'keys create',
    summary: 'Create an API key (shown once)',
    example: 'gpucloud keys create --name ci --scope read_only',
    options: { name: { type: 'string' }, scope: { type: 'string' }, expires: { type: 'string' } },
    optionHelp: [
      ['--name N', 'A name for the key (required)'],
      ['--scope S', 'read_write (default), read_only or billing_only'],
      ['--expires T', 'Expiry time (ISO 8601)'],
    ],
    positionals: 0,
    async run(ctx) {
      const name = str(ctx, 'name');
      if (!name) throw new CliUsageError('--name is required');
      const scope = str(ctx, 'scope');
      if (scope !== undefined && !['read_write', 'read_only', 'billing_only'].includes(scope)) throw new CliUsageError('--scope must be read_write, read_only or billing_only');
      const body: { name: string; scope?: 'read_write' | 'read_only' | 'billing_only'; expires_at?: string } = { name };
      if (scope) body.scope = scope as 'read_write';
      if (str(ctx, 'expires')) body.expires_at = str(ctx, 'expires')!;
      const k = await call(ctx.client().api.POST('/api-keys', { body }));
      if (ctx.json) return printJson(ctx, k);
      ctx.out(`Created API key ${k.id} ("${k.name}", ${k.scope}). It is shown only this once:\n\n  ${k.key}\n`);
    },
  },
  {
    path: 'keys list',
    summary: 'List your API keys',
    example: 'gpucloud keys list',
    options: LIMIT_OPTS,
    optionHelp: LIMIT_HELP,
    positionals: 0,
    async run(ctx) {
      const keys = await call(ctx.client().api.GET('/api-keys', { params: { query: page(ctx) } }));
      if (ctx.json) return printJson(ctx, keys);
      if (keys.length === 0) return ctx.out('No API keys');
      ctx.out(table(['ID', 'NAME', 'SCOPE', 'PREFIX', 'CREATED', 'EXPIRES', 'LAST USED'], keys.map((k) => [k.id, k.name, k.scope, k.prefix, k.created_at, k.expires_at, k.last_used_at])));
    },
  },
  {
    path: 'keys revoke',
    args: 'ID',
    summary: 'Revoke an API key',
    example: 'gpucloud keys revoke 2b7e...',
    positionals: 1,
    async run(ctx) {
      const id = ctx.positionals[0]!;
      await call(ctx.client().api.DELETE('/api-keys/{key_id}', { params: { path: { key_id: id } } }));
      if (ctx.json) return printJson(ctx, {});
      ctx.out(`Revoked API key ${id}`);
    },
  },
  // --- events --------------------------------------------------------------
  {
    path: 'events',
    summary: 'What happened to your VMs, money, keys and account, oldest first',
    example: ['gpucloud events --type vm.status_changed,vm.interrupted', 'gpucloud events --vm 1042 --follow'],
    options: { after: { type: 'string' }, type: { type: 'string', multiple: true }, vm: { type: 'string' }, limit: { type: 'string' }, follow: { type: 'boolean' } },
    optionHelp: [
      ['--after ID', 'Only events after this one'],
      ['--type T', 'Only these types (repeat, or separate with commas)'],
      ['--vm VM', 'Only events about this VM (id or vmid)'],
      ['--limit N', 'At most N events (1-200, default 50)'],
      ['--follow', 'Print events as they happen, after --after or from now on (Ctrl-C ends)'],
    ],
    positionals: 0,
    async run(ctx) {
      const client = ctx.client();
      const query: { after?: string; type?: string[]; vm_id?: string; limit?: number } = {};
      if (str(ctx, 'after')) query.after = str(ctx, 'after');
      const types = ctx.values.type;
      if (Array.isArray(types) && types.length) query.type = types.filter((t): t is string => typeof t === 'string');
      const vm = str(ctx, 'vm');
      if (vm) query.vm_id = (await call(client.api.GET('/vms/{vm_id}', vmPath(vm)))).id;
      const limit = int(ctx, 'limit', { min: 1, max: 200 });
      if (limit !== undefined) query.limit = limit;
      const follow = flag(ctx, 'follow');
      const print = (e: ApiEvent) => ctx.out(ctx.json ? JSON.stringify(e) : `${e.created_at}  ${e.type.padEnd(22)} ${describeEvent(e)}`);
      if (!follow) {
        const events = await call(client.api.GET('/events', { params: { query } }));
        if (ctx.json) return printJson(ctx, events);
        if (events.length === 0) return ctx.out('No events');
        return events.forEach(print);
      }
      // With --after: what came after it, then live (one JSON object a line with --json); without: from now on.
      const stop = new AbortController();
      process.once('SIGINT', () => stop.abort());
      process.once('SIGTERM', () => stop.abort());
      const opts: FollowEventsOptions = { signal: stop.signal };
      if (query.after) opts.after = query.after;
      if (query.type) opts.types = query.type;
      if (query.vm_id) opts.vmId = query.vm_id;
      for await (const e of client.followEvents(opts)) print(e);
    },
  },
  ...WEBHOOK_COMMANDS,
  // --- vms -----------------------------------------------------------------
  {
    path: 'vm create',
    summary: 'Rent a VM',
    example: ['gpucloud vm create --node vm01 --gpu 4090 --template ubuntu-24.04 --ssh-key 6f1c... --wait', 'gpucloud vm create --node vm02 --gpu 5090 --count 2 --reserved 3 --password "a long password" --yes'],
    options: {
      node: { type: 'string' },
      gpu: { type: 'string' },
      count: { type: 'string' },
      disk: { type: 'string' },
      template: { type: 'string' },
      interruptible: { type: 'boolean' },
      reserved: { type: 'string' },
      password: { type: 'string' },
      'ssh-key': { type: 'string' },
      label: { type: 'string' },
      wait: { type: 'boolean' },
      timeout: { type: 'string' },
      yes: { type: 'boolean', short: 'y' },
    },
    optionHelp: [
      ['--node N', 'The node to place it on (see gpucloud search) (required)'],
      ['--gpu TYPE', '5090, 4090 or pro6000 (required)'],
      ['--count N', 'GPUs: 1, 2, 4 or 8 (default 1)'],
      ['--disk GB', 'Disk size (default 50)'],
      ['--template T', '100-104 or ubuntu-22.04, ubuntu-24.04, stable-diffusion, comfyui, desktop (default ubuntu-24.04)'],
      ['--interruptible', 'An interruptible (preemptible) rental at a lower rate'],
      ['--reserved MONTHS', 'A reservation of 1, 3 or 6 months (shows the quote and asks)'],
      ['--password P', 'Log in with this password'],
      ['--ssh-key ID', 'Log in with this uploaded SSH key'],
      ['--label L', 'A label for the VM'],
      ['--wait', 'Wait until it is running, with a live status line'],
      ['--timeout S', 'With --wait: give up after S seconds (default 600)'],
      ['--yes, -y', 'Do not ask before reserving'],
    ],
    positionals: 0,
    async run(ctx) {
      const node = str(ctx, 'node');
      if (!node) throw new CliUsageError('--node is required');
      const gpu = gpuType(str(ctx, 'gpu'));
      if (!gpu) throw new CliUsageError('--gpu is required');
      const count = int(ctx, 'count', { def: 1 })!;
      if (![1, 2, 4, 8].includes(count)) throw new CliUsageError('--count must be 1, 2, 4 or 8');
      const disk = int(ctx, 'disk', { def: 50, min: 1 })!;
      const tRaw = str(ctx, 'template') ?? 'ubuntu-24.04';
      const template = /^\d+$/.test(tRaw) ? Number(tRaw) : TEMPLATES[tRaw];
      if (template === undefined || template < 100 || template > 104) throw new CliUsageError(`--template must be 100-104 or one of ${Object.keys(TEMPLATES).join(', ')}, got "${tRaw}"`);
      const reserved = int(ctx, 'reserved');
      if (reserved !== undefined && ![1, 3, 6].includes(reserved)) throw new CliUsageError('--reserved must be 1, 3 or 6 (months)');
      if (reserved !== undefined && flag(ctx, 'interruptible')) throw new CliUsageError('--reserved and --interruptible exclude each other');
      const password = str(ctx, 'password');
      const sshKey = str(ctx, 'ssh-key');
      if (password && sshKey) throw new CliUsageError('give --password or --ssh-key, not both');
      const timeout = int(ctx, 'timeout', { def: 600, min: 1 })!;
      const body: CreateVmRequest = { node, gpu_type: gpu, gpu_count: count as 1, storage_gb: disk, template_vmid: template };
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
      const client = ctx.client();
      if (reserved !== undefined) {
        const q = await call(client.api.POST('/reservations/calculate', { body: { gpu_type: gpu, gpu_count: count as 1, storage_gb: disk, reservation_months: reserved as 1 } }));
        if (!flag(ctx, 'yes')) {
          ctx.err(quoteText(q));
          await confirmOrAbort(ctx, `Reserve for ${reserved} month(s) and pay the deposit of ${money(q.deposit_required)} now?`);
        }
      }
      let vm = await client.createVm(body);
      if (!ctx.json) ctx.out(`Created VM ${vm.vmid} (${vm.id}) on ${vm.node}: ${vm.status}`);
      if (flag(ctx, 'wait')) {
        vm = await waitWithStatus(ctx, vm.id, 'running', timeout);
        if (!ctx.json) ctx.out(`VM ${vm.vmid} is running${vm.ip_address ? ` at ${vm.ip_address}` : ''}; connect with: gpucloud vm ssh ${vm.vmid}`);
      }
      if (ctx.json) printJson(ctx, vm);
    },
  },
  {
    path: 'vm list',
    summary: 'List your VMs, newest first',
    example: 'gpucloud vm list --status running',
    options: { all: { type: 'boolean' }, status: { type: 'string' }, ...LIMIT_OPTS },
    optionHelp: [['--all', 'Include destroyed VMs'], ['--status S', 'Only VMs in this status'], ...LIMIT_HELP],
    positionals: 0,
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
    args: 'VM',
    summary: 'Show a VM (by id or vmid)',
    example: 'gpucloud vm show 1234',
    positionals: 1,
    async run(ctx) {
      const vm = await ctx.client().getVm(ctx.positionals[0]!);
      if (ctx.json) return printJson(ctx, vm);
      ctx.out(showVm(vm));
    },
  },
  {
    path: 'vm start',
    args: 'VM',
    summary: 'Start a stopped VM',
    example: 'gpucloud vm start 1234',
    positionals: 1,
    run: (ctx) => message(ctx, ctx.client().api.POST('/vms/{vm_id}/start', vmPath(ctx.positionals[0]!))),
  },
  {
    path: 'vm stop',
    args: 'VM',
    summary: 'Stop a running VM (its disk is still billed)',
    example: 'gpucloud vm stop 1234',
    positionals: 1,
    run: (ctx) => message(ctx, ctx.client().api.POST('/vms/{vm_id}/stop', vmPath(ctx.positionals[0]!))),
  },
  {
    path: 'vm destroy',
    args: 'VM',
    summary: 'Destroy a VM and its disk (asks first unless --yes)',
    example: 'gpucloud vm destroy 1234 --yes',
    options: { yes: { type: 'boolean', short: 'y' } },
    optionHelp: [['--yes, -y', 'Do not ask']],
    positionals: 1,
    async run(ctx) {
      const id = ctx.positionals[0]!;
      if (!flag(ctx, 'yes')) {
        const vm = await ctx.client().getVm(id);
        await confirmOrAbort(ctx, `Destroy VM ${vm.vmid}${vm.instance_label ? ` "${vm.instance_label}"` : ''} (${vm.gpu_count}x ${vm.gpu_type} on ${vm.node}) and its disk?`);
      }
      await message(ctx, ctx.client().api.DELETE('/vms/{vm_id}', vmPath(id)));
    },
  },
  {
    path: 'vm label',
    args: 'VM [LABEL]',
    summary: 'Set (or, without LABEL, clear) the label of a VM',
    example: 'gpucloud vm label 1234 training-run-7',
    positionals: [1, 2],
    async run(ctx) {
      const [id, label] = ctx.positionals;
      await message(ctx, ctx.client().api.POST('/vms/{vm_id}/set-label', { ...vmPath(id!), body: { instance_label: label ?? null } }));
    },
  },
  {
    path: 'vm auto-restart',
    args: 'VM on|off',
    summary: 'Restart an interrupted VM by itself when capacity is back',
    example: 'gpucloud vm auto-restart 1234 on',
    positionals: 2,
    async run(ctx) {
      const [id, v] = ctx.positionals;
      const on = onOff(v);
      await message(ctx, ctx.client().api.POST('/vms/{vm_id}/set-auto-restart', { ...vmPath(id!), body: { auto_restart: on } }));
    },
  },
  {
    path: 'vm interruptions',
    args: 'VM',
    summary: 'The interruption history of an interruptible VM',
    example: 'gpucloud vm interruptions 1234',
    options: LIMIT_OPTS,
    optionHelp: LIMIT_HELP,
    positionals: 1,
    async run(ctx) {
      const rows = await call(ctx.client().api.GET('/vms/{vm_id}/interruption-history', { params: { path: { vm_id: ctx.positionals[0]! }, query: page(ctx) } }));
      if (ctx.json) return printJson(ctx, rows);
      if (rows.length === 0) return ctx.out('No interruptions');
      ctx.out(table(['ID', 'STATUS', 'PREEMPTED AT', 'RESTORED AT', 'DOWNTIME S', 'BY VM'], rows.map((r) => [r.id, r.status, r.preempted_at, r.restored_at, r.downtime_seconds, r.preempted_by_vm_id])));
    },
  },
  {
    path: 'vm wait',
    args: 'VM',
    summary: 'Wait until a VM is in a status (default running)',
    example: 'gpucloud vm wait 1234 --status stopped --timeout 120',
    options: { status: { type: 'string' }, timeout: { type: 'string' } },
    optionHelp: [
      ['--status S', 'The status to wait for (default running)'],
      ['--timeout S', 'Give up after S seconds (default 600)'],
    ],
    positionals: 1,
    async run(ctx) {
      const status = (str(ctx, 'status') ?? 'running') as VmStatus;
      const valid = ['creating', 'starting', 'running', 'stopping', 'stopped', 'interrupted', 'destroyed', 'failed', 'offline'];
      if (!valid.includes(status)) throw new CliUsageError(`--status must be one of ${valid.join(', ')}`);
      const vm = await waitWithStatus(ctx, ctx.positionals[0]!, status, int(ctx, 'timeout', { def: 600, min: 1 })!);
      if (ctx.json) return printJson(ctx, vm);
      ctx.out(`VM ${vm.vmid} is ${vm.status}`);
    },
  },
  {
    path: 'vm ssh',
    args: 'VM [-- SSH ARGS]',
    summary: 'Open an SSH session to a running VM',
    example: ['gpucloud vm ssh 1234', 'gpucloud vm ssh 1234 --dry-run', 'gpucloud vm ssh 1234 -- nvidia-smi'],
    options: { 'dry-run': { type: 'boolean' }, identity: { type: 'string', short: 'i' } },
    optionHelp: [
      ['--dry-run', 'Print the ssh command instead of running it'],
      ['--identity F, -i F', 'The private key file to pass to ssh'],
    ],
    positionals: [1, 1000],
    async run(ctx) {
      const [id, ...extra] = ctx.positionals;
      const info = await call(ctx.client().api.GET('/vms/{vm_id}/access-info', vmPath(id!)));
      const args = ['-p', String(info.ssh.port)];
      if (str(ctx, 'identity')) args.push('-i', str(ctx, 'identity')!);
      args.push(`${info.ssh.username}@${info.ssh.host}`, ...extra);
      if (flag(ctx, 'dry-run')) {
        if (ctx.json) return printJson(ctx, info);
        ctx.out(['ssh', ...args].map(shellQuote).join(' '));
        return;
      }
      const r = spawnSync('ssh', args, { stdio: 'inherit' });
      if (r.error) throw new CliFailure(`cannot run ssh: ${r.error.message}`);
      if (r.status !== 0) throw new CliFailure('', r.status ?? 1);
    },
  },
  // --- billing -------------------------------------------------------------
  {
    path: 'billing balance',
    summary: 'Your credit balance',
    example: 'gpucloud billing balance',
    positionals: 0,
    async run(ctx) {
      const b = await call(ctx.client().api.GET('/billing/balance'));
      if (ctx.json) return printJson(ctx, b);
      ctx.out(`Balance: ${money(b.balance)} ${b.currency}`);
    },
  },
  {
    path: 'billing usage',
    summary: 'Usage and cost over a period, per VM',
    example: 'gpucloud billing usage --from 2026-01-01 --to 2026-01-31',
    options: { from: { type: 'string' }, to: { type: 'string' } },
    optionHelp: [
      ['--from DATE', 'Start of the period'],
      ['--to DATE', 'End of the period'],
    ],
    positionals: 0,
    async run(ctx) {
      const query: { start_date?: string; end_date?: string } = {};
      if (str(ctx, 'from')) query.start_date = str(ctx, 'from')!;
      if (str(ctx, 'to')) query.end_date = str(ctx, 'to')!;
      const u = await call(ctx.client().api.GET('/billing/usage', { params: { query } }));
      if (ctx.json) return printJson(ctx, u);
      const lines = [`Period: ${u.period_start} .. ${u.period_end}`, `Total:  ${money(u.total_cost)} for ${u.total_hours.toFixed(2)} h`];
      if (u.vm_breakdown.length) lines.push('', table(['VM', 'VMID', 'GPU', 'HOURS', 'COST'], u.vm_breakdown.map((v) => [v.vm_id, v.vmid, v.gpu_model, v.hours.toFixed(2), money(v.cost)])));
      ctx.out(lines.join('\n'));
    },
  },
  {
    path: 'billing spend',
    summary: 'What your running VMs cost now',
    example: 'gpucloud billing spend',
    positionals: 0,
    async run(ctx) {
      const s = await call(ctx.client().api.GET('/billing/current-spend'));
      if (ctx.json) return printJson(ctx, s);
      const lines = [`${s.running_vms} running VM(s): ${money(s.total_per_hour, 3)}/h, ${money(s.total_per_day)}/day, ${money(s.total_per_month)}/month`];
      if (s.vms.length) lines.push('', table(['VMID', 'GPU', 'DISK', 'GPU $/H', 'DISK $/H', 'TOTAL $/H'], s.vms.map((v) => [v.vmid, `${v.gpu_count}x ${v.gpu_type}`, `${v.storage_gb} GB`, money(v.gpu_cost_per_hour, 3), money(v.storage_cost_per_hour, 4), money(v.total_cost_per_hour, 3)])));
      ctx.out(lines.join('\n'));
    },
  },
  {
    path: 'billing transactions',
    summary: 'Your ledger, newest first',
    example: 'gpucloud billing transactions --limit 20',
    options: LIMIT_OPTS,
    optionHelp: LIMIT_HELP,
    positionals: 0,
    async run(ctx) {
      const rows = await call(ctx.client().api.GET('/billing/transactions', { params: { query: page(ctx) } }));
      if (ctx.json) return printJson(ctx, rows);
      if (rows.length === 0) return ctx.out('No transactions');
      ctx.out(table(['TIME', 'TYPE', 'AMOUNT', 'BALANCE', 'DESCRIPTION'], rows.map((r) => [r.created_at, r.type, money(r.amount, 4), money(r.balance_after, 4), r.description])));
    },
  },
  // --- reservations ----------------------------------------------------------
  {
    path: 'reservations quote',
    summary: 'Price a reservation',
    example: 'gpucloud reservations quote --gpu 5090 --count 2 --disk 100 --months 3',
    options: { gpu: { type: 'string' }, count: { type: 'string' }, disk: { type: 'string' }, months: { type: 'string' } },
    optionHelp: [
      ['--gpu TYPE', '5090, 4090 or pro6000 (required)'],
      ['--count N', 'GPUs: 1, 2, 4 or 8 (default 1)'],
      ['--disk GB', 'Disk size (default 50)'],
      ['--months M', '1, 3 or 6 (default 1)'],
    ],
    positionals: 0,
    async run(ctx) {
      const gpu = gpuType(str(ctx, 'gpu'));
      if (!gpu) throw new CliUsageError('--gpu is required');
      const count = int(ctx, 'count', { def: 1 })!;
      if (![1, 2, 4, 8].includes(count)) throw new CliUsageError('--count must be 1, 2, 4 or 8');
      const months = int(ctx, 'months', { def: 1 })!;
      if (![1, 3, 6].includes(months)) throw new CliUsageError('--months must be 1, 3 or 6');
      const q = await call(ctx.client().api.POST('/reservations/calculate', { body: { gpu_type: gpu, gpu_count: count as 1, storage_gb: int(ctx, 'disk', { def: 50, min: 1 })!, reservation_months: months as 1 } }));
      if (ctx.json) return printJson(ctx, q);
      ctx.out(quoteText(q));
    },
  },
  {
    path: 'reservations list',
    summary: 'Your reservations',
    example: 'gpucloud reservations list',
    options: LIMIT_OPTS,
    optionHelp: LIMIT_HELP,
    positionals: 0,
    async run(ctx) {
      const rows = await call(ctx.client().api.GET('/reservations', { params: { query: page(ctx) } }));
      if (ctx.json) return printJson(ctx, rows);
      if (rows.length === 0) return ctx.out('No reservations');
      ctx.out(table(['ID', 'VM', 'GPU', 'MONTHS', 'DISCOUNT', 'DEPOSIT', 'REMAINING', 'STATUS', 'ENDS'], rows.map((r) => [r.id, r.vm_id, `${r.gpu_count}x ${r.gpu_type}`, r.reservation_months, `${r.discount_percent}%`, money(r.deposit_amount), money(r.remaining_balance), r.status, r.end_at])));
    },
  },
  {
    path: 'reservations cancel',
    args: 'ID',
    summary: 'Cancel a reservation (a 25% fee applies; asks unless --yes)',
    example: 'gpucloud reservations cancel 9a2d... --yes',
    options: { yes: { type: 'boolean', short: 'y' } },
    optionHelp: [['--yes, -y', 'Do not ask']],
    positionals: 1,
    async run(ctx) {
      const id = ctx.positionals[0]!;
      await confirmOrAbort(ctx, `Cancel reservation ${id}? A cancellation fee applies.`);
      const r = await call(ctx.client().api.DELETE('/reservations/{reservation_id}', { params: { path: { reservation_id: id } } }));
      if (ctx.json) return printJson(ctx, r);
      ctx.out(`Reservation ${r.id} is ${r.status}: fee ${money(r.cancellation_fee)}, refund ${money(r.refund_amount)}`);
    },
  },
  // --- admin -----------------------------------------------------------------
  {
    path: 'admin nodes',
    summary: 'List the nodes (admin)',
    example: 'gpucloud admin nodes',
    options: LIMIT_OPTS,
    optionHelp: LIMIT_HELP,
    positionals: 0,
    async run(ctx) {
      const rows = await call(ctx.client().api.GET('/admin/nodes', { params: { query: page(ctx) } }));
      if (ctx.json) return printJson(ctx, rows);
      ctx.out(table(['NODE', 'GPU', 'GPUS', 'FREE', 'STATUS', 'CPU', 'RAM', 'LOCATION', 'CLUSTER'], rows.map((n) => [n.node, n.gpu_type, n.gpu_count, n.gpus_free, n.status, n.cpu_cores, `${n.ram_gb} GB`, n.location, n.cluster_name])));
    },
  },
  {
    path: 'admin pricing',
    summary: 'The pricing table (admin)',
    example: 'gpucloud admin pricing',
    positionals: 0,
    async run(ctx) {
      const rows = await call(ctx.client().api.GET('/admin/pricing'));
      if (ctx.json) return printJson(ctx, rows);
      ctx.out(table(['GPU', '$/GPU/H', 'INTERRUPTIBLE', '$/GB/H', 'RES 1MO', 'RES 3MO', 'RES 6MO', 'UPDATED'], rows.map((p) => [p.gpu_type, money(p.gpu_price_hourly, 3), p.interruptible_rate, money(p.storage_price_gb_hourly, 5), `${p.reserved_discount_1mo}%`, `${p.reserved_discount_3mo}%`, `${p.reserved_discount_6mo}%`, p.updated_at])));
    },
  },
  {
    path: 'admin users',
    summary: 'List users (admin)',
    example: 'gpucloud admin users --email alice@example.com',
    options: { email: { type: 'string' }, ...LIMIT_OPTS },
    optionHelp: [['--email E', 'Only this email'], ...LIMIT_HELP],
    positionals: 0,
    async run(ctx) {
      const query: { email?: string; limit?: number; offset?: number } = { ...page(ctx) };
      if (str(ctx, 'email')) query.email = str(ctx, 'email')!;
      const rows = await call(ctx.client().api.GET('/admin/users', { params: { query } }));
      if (ctx.json) return printJson(ctx, rows);
      ctx.out(table(['ID', 'EMAIL', 'NAME', 'ROLE', '2FA', 'SUSPENDED', 'MAX VMS', 'MAX GPUS'], rows.map((u) => [u.id, u.email, u.name, u.role, u.two_factor_enabled, u.suspended, u.max_vms, u.max_gpus])));
    },
  },
  {
    path: 'admin credit',
    args: 'USER_ID AMOUNT',
    summary: "Add credit to a user's balance (admin)",
    example: 'gpucloud admin credit 42 25.00 --description "welcome credit"',
    options: { description: { type: 'string' } },
    optionHelp: [['--description D', 'Shown in the ledger']],
    positionals: 2,
    async run(ctx) {
      const [userRaw, amountRaw] = ctx.positionals;
      if (!/^\d+$/.test(userRaw!)) throw new CliUsageError(`USER_ID must be a number, got "${userRaw}"`);
      const amount = Number(amountRaw);
      if (!Number.isFinite(amount)) throw new CliUsageError(`AMOUNT must be a number, got "${amountRaw}"`);
      const body: { amount: number; description?: string } = { amount };
      if (str(ctx, 'description')) body.description = str(ctx, 'description')!;
      const tx = await call(ctx.client().api.POST('/admin/users/{user_id}/credits', { params: { path: { user_id: Number(userRaw) } }, body }));
      if (ctx.json) return printJson(ctx, tx);
      ctx.out(`Credited ${money(tx.amount)} to user ${userRaw}; balance now ${money(tx.balance_after)}`);
    },
  },
  {
    path: 'admin vms',
    summary: "Everyone's VMs (admin)",
    example: 'gpucloud admin vms --node vm01 --status running',
    options: { user: { type: 'string' }, node: { type: 'string' }, status: { type: 'string' }, all: { type: 'boolean' }, ...LIMIT_OPTS },
    optionHelp: [
      ['--user ID', 'Only this user'],
      ['--node N', 'Only on this node'],
      ['--status S', 'Only in this status'],
      ['--all', 'Include destroyed VMs'],
      ...LIMIT_HELP,
    ],
    positionals: 0,
    async run(ctx) {
      const query: Record<string, unknown> = { ...page(ctx) };
      const user = int(ctx, 'user', { min: 1 });
      if (user !== undefined) query.user_id = user;
      if (str(ctx, 'node')) query.node = str(ctx, 'node');
      if (str(ctx, 'status')) query.status = str(ctx, 'status');
      if (flag(ctx, 'all')) query.include_destroyed = true;
      const rows = await call(ctx.client().api.GET('/admin/vms', { params: { query: query as never } }));
      if (ctx.json) return printJson(ctx, rows);
      if (rows.length === 0) return ctx.out('No VMs');
      ctx.out(table(['ID', 'VMID', 'USER', 'STATUS', 'GPU', 'NODE', 'RENTAL', '$/H'], rows.map((v) => [v.id, v.vmid, v.user_id, v.status, `${v.gpu_count}x ${v.gpu_type}`, v.node, v.rental_type, money(v.hourly_rate, 3)])));
    },
  },
];

function quoteText(q: { reservation_months: number; gpu_count: number; gpu_type: string; storage_gb: number; discount_percent: number; hourly_rate_after_discount: number; monthly_cost: number; deposit_required: number; cancellation_fee_25_percent: number }): string {
  return keyValues([
    ['Reservation', `${q.reservation_months} month(s), ${q.gpu_count}x ${q.gpu_type}, ${q.storage_gb} GB disk`],
    ['Discount', `${q.discount_percent}%`],
    ['Hourly rate', money(q.hourly_rate_after_discount, 4)],
    ['Monthly cost', money(q.monthly_cost)],
    ['Deposit now', money(q.deposit_required)],
    ['Cancellation fee', money(q.cancellation_fee_25_percent)],
  ] as [string, Cell][]);
}

function shellQuote(s: string): string {
  return /^[\w@%+=:,./-]+$/.test(s) ? s : `'${s.replace(/'/g, `'\\''`)}'`;
}

export { saveTokens };
