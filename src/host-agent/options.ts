/**
 * `gpucloud agent` options: each flag also reads an environment variable, a
 * flag wins over the variable. Checked once at start; a bad value stops the
 * agent with a message naming the option.
 */
import { existsSync, readFileSync } from 'node:fs';
import { isIP } from 'node:net';
import { resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { parseSubnet } from './network/bridge.js';

export interface AgentOptions {
  listenHost: string;
  listenPort: number;
  dataDir: string;
  token: string;
  publicHost: string;
  sshPorts: { from: number; to: number };
  accel: 'kvm' | 'tcg' | 'auto';
  fakeGpus: number;
  tls: { cert: Buffer; key: Buffer } | null;
  /** user: QEMU's user-mode networking; bridge: taps on a bridge with counted traffic (root). */
  network: 'user' | 'bridge';
  vmSubnet: string;
  /** The cap on image downloads in MB/s (1 MB = 1,000,000 bytes), or null: unlimited. */
  downloadLimitMbps: number | null;
}

export class AgentOptionError extends Error {
  constructor(
    readonly option: string,
    message: string,
  ) {
    super(`${option}: ${message}`);
    this.name = 'AgentOptionError';
  }
}

export const AGENT_OPTION_SPEC = {
  listen: { type: 'string' },
  'data-dir': { type: 'string' },
  token: { type: 'string' },
  'public-host': { type: 'string' },
  'ssh-ports': { type: 'string' },
  accel: { type: 'string' },
  'fake-gpus': { type: 'string' },
  'tls-cert': { type: 'string' },
  'tls-key': { type: 'string' },
  network: { type: 'string' },
  'vm-subnet': { type: 'string' },
  'download-limit': { type: 'string' },
} as const;

export type AgentFlag = keyof typeof AGENT_OPTION_SPEC;

/** An option as its help shows it: the value it takes, the variable it also reads, and what it does. */
export interface AgentOptionDoc {
  value: string;
  variable: string;
  /** Its help, one line per entry. */
  help: string[];
}

/** Each option's value, variable and help, in the order the helps of `agent` and `serve --local-agent` list them. */
export const AGENT_OPTION_DOCS: Record<AgentFlag, AgentOptionDoc> = {
  listen: { value: 'HOST:PORT', variable: 'GPUCLOUD_AGENT_LISTEN', help: ['default 127.0.0.1:7070'] },
  'data-dir': { value: 'DIR', variable: 'GPUCLOUD_AGENT_DATA_DIR', help: ['default ./agent-data'] },
  token: { value: 'TOKEN', variable: 'GPUCLOUD_AGENT_TOKEN', help: ['required, 32+ characters'] },
  'public-host': {
    value: 'HOST',
    variable: 'GPUCLOUD_AGENT_PUBLIC_HOST',
    help: ['where customers SSH to (default the listen host)'],
  },
  'ssh-ports': { value: 'FROM-TO', variable: 'GPUCLOUD_AGENT_SSH_PORTS', help: ['default 22000-22999'] },
  accel: {
    value: 'kvm|tcg|auto',
    variable: 'GPUCLOUD_AGENT_ACCEL',
    help: ['default auto (kvm when /dev/kvm can be used)'],
  },
  'fake-gpus': {
    value: 'N',
    variable: 'GPUCLOUD_AGENT_FAKE_GPUS',
    help: ['report N GPUs on a host without any (tests, demos)'],
  },
  network: {
    value: 'user|bridge',
    variable: 'GPUCLOUD_AGENT_NETWORK',
    help: [
      'default user (no root, traffic not counted); bridge: taps on',
      'bridge gcbr0 with NAT and counted traffic (root, nftables)',
    ],
  },
  'vm-subnet': {
    value: 'CIDR',
    variable: 'GPUCLOUD_AGENT_VM_SUBNET',
    help: ['VM addresses with --network bridge, default 10.88.0.0/16'],
  },
  'download-limit': {
    value: 'MBPS',
    variable: 'GPUCLOUD_AGENT_DOWNLOAD_LIMIT_MBPS',
    help: ['cap image downloads at MBPS megabytes a second', '(default unlimited)'],
  },
  'tls-cert': { value: 'FILE', variable: 'GPUCLOUD_AGENT_TLS_CERT', help: ['serve https with this certificate...'] },
  'tls-key': { value: 'FILE', variable: 'GPUCLOUD_AGENT_TLS_KEY', help: ['...and its key'] },
};

/**
 * The options' lines of a help: flag, variable, help. `except` leaves some out; `help` replaces the help of some
 * (a default that differs where the agent runs).
 */
export function agentOptionLines(
  opts: { except?: AgentFlag[]; help?: Partial<Record<AgentFlag, string[]>> } = {},
): string {
  const lines: string[] = [];
  for (const [flag, doc] of Object.entries(AGENT_OPTION_DOCS) as [AgentFlag, AgentOptionDoc][]) {
    if (opts.except?.includes(flag)) continue;
    const help = opts.help?.[flag] ?? doc.help;
    // A variable too long for its column has its help on the lines below.
    const [first, ...more] = doc.variable.length < 28 ? help : ['', ...help];
    lines.push(`  ${`--${flag} ${doc.value}`.padEnd(23)}${doc.variable.padEnd(28)}${first ?? ''}`.trimEnd());
    for (const m of more) lines.push(`${' '.repeat(2 + 23 + 28)}${m}`);
  }
  return lines.join('\n');
}

const HOSTNAME =
  /^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$/;

function host(option: string, v: string): string {
  const bare = v.startsWith('[') && v.endsWith(']') ? v.slice(1, -1) : v;
  if (isIP(bare) || HOSTNAME.test(bare)) return bare;
  throw new AgentOptionError(option, `"${v}" is not a host name or IP address`);
}

function port(option: string, v: string, min = 1): number {
  if (!/^\d{1,5}$/.test(v) || Number(v) < min || Number(v) > 65535)
    throw new AgentOptionError(option, `"${v}" is not a port (${min}-65535)`);
  return Number(v);
}

export function parseAgentOptions(args: string[], env: Record<string, string | undefined> = process.env): AgentOptions {
  const { values, positionals } = parseArgs({ args, options: AGENT_OPTION_SPEC, strict: true, allowPositionals: true });
  if (positionals.length) throw new AgentOptionError('gpucloud agent', `unexpected argument "${positionals[0]}"`);
  /** A flag, else its variable: the value, and the name a refusal gives. */
  const pick = (flag: AgentFlag): { name: string; value: string | undefined } => {
    const fromFlag = values[flag];
    if (fromFlag !== undefined) return { name: `--${flag}`, value: fromFlag.trim() };
    const variable = AGENT_OPTION_DOCS[flag].variable;
    const fromEnv = env[variable]?.trim();
    return { name: variable, value: fromEnv === '' ? undefined : fromEnv };
  };

  const listen = pick('listen');
  const raw = listen.value ?? '127.0.0.1:7070';
  const m = /^(\[[^\]]+\]|[^:]+):(\d+)$/.exec(raw);
  if (!m) throw new AgentOptionError(listen.name, `"${raw}" must be HOST:PORT, like 127.0.0.1:7070`);
  const listenHost = host(listen.name, m[1]!);
  const listenPort = port(listen.name, m[2]!, 0);

  const token = pick('token');
  if (!token.value)
    throw new AgentOptionError(
      '--token',
      'is required (or GPUCLOUD_AGENT_TOKEN): the control plane authenticates with it',
    );
  if (token.value.length < 32) throw new AgentOptionError(token.name, 'must be at least 32 characters');
  if (!/^[\x21-\x7e]+$/.test(token.value))
    throw new AgentOptionError(token.name, 'must be printable ASCII without spaces');

  const pub = pick('public-host');
  const publicHost = pub.value
    ? host(pub.name, pub.value)
    : listenHost === '0.0.0.0' || listenHost === '::'
      ? '127.0.0.1'
      : listenHost;

  const ports = pick('ssh-ports');
  const pm = /^(\d+)-(\d+)$/.exec(ports.value ?? '22000-22999');
  if (!pm) throw new AgentOptionError(ports.name, `"${ports.value}" must be a range FROM-TO, like 22000-22999`);
  const sshPorts = { from: port(ports.name, pm[1]!, 1024), to: port(ports.name, pm[2]!, 1024) };
  if (sshPorts.to < sshPorts.from) throw new AgentOptionError(ports.name, 'the range ends before it starts');
  if (listenPort >= sshPorts.from && listenPort <= sshPorts.to)
    throw new AgentOptionError(ports.name, `includes the agent's own port ${listenPort}`);

  const accel = pick('accel');
  const accelValue = accel.value ?? 'auto';
  if (accelValue !== 'kvm' && accelValue !== 'tcg' && accelValue !== 'auto')
    throw new AgentOptionError(accel.name, `must be kvm, tcg or auto, got "${accelValue}"`);

  const fake = pick('fake-gpus');
  const fv = fake.value ?? '0';
  if (!/^\d{1,2}$/.test(fv) || Number(fv) > 64)
    throw new AgentOptionError(fake.name, `must be a number of GPUs from 0 to 64, got "${fv}"`);

  const cert = pick('tls-cert');
  const key = pick('tls-key');
  if (!!cert.value !== !!key.value)
    throw new AgentOptionError(cert.value ? '--tls-key' : '--tls-cert', 'TLS needs both --tls-cert and --tls-key');
  let tls: AgentOptions['tls'] = null;
  if (cert.value && key.value) {
    for (const f of [cert, key])
      if (!existsSync(f.value!)) throw new AgentOptionError(f.name, `${f.value} does not exist`);
    tls = { cert: readFileSync(cert.value), key: readFileSync(key.value) };
  }

  const net = pick('network');
  const network = net.value ?? 'user';
  if (network !== 'user' && network !== 'bridge')
    throw new AgentOptionError(net.name, `must be user or bridge, got "${network}"`);
  const sub = pick('vm-subnet');
  const vmSubnet = sub.value ?? '10.88.0.0/16';
  try {
    parseSubnet(vmSubnet);
  } catch (err) {
    throw new AgentOptionError(sub.name, (err as Error).message);
  }

  const limit = pick('download-limit');
  let downloadLimitMbps: number | null = null;
  if (limit.value !== undefined) {
    if (!/^\d{1,6}(\.\d{1,3})?$/.test(limit.value) || Number(limit.value) <= 0)
      throw new AgentOptionError(
        limit.name,
        `must be megabytes a second, a number above 0 like 50 or 2.5, got "${limit.value}"`,
      );
    downloadLimitMbps = Number(limit.value);
  }

  const dir = pick('data-dir');
  return {
    listenHost,
    listenPort,
    dataDir: resolve(dir.value ?? './agent-data'),
    token: token.value,
    publicHost,
    sshPorts,
    accel: accelValue,
    fakeGpus: Number(fv),
    tls,
    network,
    vmSubnet,
    downloadLimitMbps,
  };
}
