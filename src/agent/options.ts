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
} as const;

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
  const pick = (
    flag: keyof typeof AGENT_OPTION_SPEC,
    variable: string,
  ): { name: string; value: string | undefined } => {
    const fromFlag = values[flag];
    if (fromFlag !== undefined) return { name: `--${flag}`, value: fromFlag.trim() };
    const fromEnv = env[variable]?.trim();
    return { name: variable, value: fromEnv === '' ? undefined : fromEnv };
  };

  const listen = pick('listen', 'GPUCLOUD_AGENT_LISTEN');
  const raw = listen.value ?? '127.0.0.1:7070';
  const m = /^(\[[^\]]+\]|[^:]+):(\d+)$/.exec(raw);
  if (!m) throw new AgentOptionError(listen.name, `"${raw}" must be HOST:PORT, like 127.0.0.1:7070`);
  const listenHost = host(listen.name, m[1]!);
  const listenPort = port(listen.name, m[2]!, 0);

  const token = pick('token', 'GPUCLOUD_AGENT_TOKEN');
  if (!token.value)
    throw new AgentOptionError(
      '--token',
      'is required (or GPUCLOUD_AGENT_TOKEN): the control plane authenticates with it',
    );
  if (token.value.length < 32) throw new AgentOptionError(token.name, 'must be at least 32 characters');
  if (!/^[\x21-\x7e]+$/.test(token.value))
    throw new AgentOptionError(token.name, 'must be printable ASCII without spaces');

  const pub = pick('public-host', 'GPUCLOUD_AGENT_PUBLIC_HOST');
  const publicHost = pub.value
    ? host(pub.name, pub.value)
    : listenHost === '0.0.0.0' || listenHost === '::'
      ? '127.0.0.1'
      : listenHost;

  const ports = pick('ssh-ports', 'GPUCLOUD_AGENT_SSH_PORTS');
  const pm = /^(\d+)-(\d+)$/.exec(ports.value ?? '22000-22999');
  if (!pm) throw new AgentOptionError(ports.name, `"${ports.value}" must be a range FROM-TO, like 22000-22999`);
  const sshPorts = { from: port(ports.name, pm[1]!, 1024), to: port(ports.name, pm[2]!, 1024) };
  if (sshPorts.to < sshPorts.from) throw new AgentOptionError(ports.name, 'the range ends before it starts');
  if (listenPort >= sshPorts.from && listenPort <= sshPorts.to)
    throw new AgentOptionError(ports.name, `includes the agent's own port ${listenPort}`);

  const accel = pick('accel', 'GPUCLOUD_AGENT_ACCEL');
  const accelValue = accel.value ?? 'auto';
  if (accelValue !== 'kvm' && accelValue !== 'tcg' && accelValue !== 'auto')
    throw new AgentOptionError(accel.name, `must be kvm, tcg or auto, got "${accelValue}"`);

  const fake = pick('fake-gpus', 'GPUCLOUD_AGENT_FAKE_GPUS');
  const fv = fake.value ?? '0';
  if (!/^\d{1,2}$/.test(fv) || Number(fv) > 64)
    throw new AgentOptionError(fake.name, `must be a number of GPUs from 0 to 64, got "${fv}"`);

  const cert = pick('tls-cert', 'GPUCLOUD_AGENT_TLS_CERT');
  const key = pick('tls-key', 'GPUCLOUD_AGENT_TLS_KEY');
  if (!!cert.value !== !!key.value)
    throw new AgentOptionError(cert.value ? '--tls-key' : '--tls-cert', 'TLS needs both --tls-cert and --tls-key');
  let tls: AgentOptions['tls'] = null;
  if (cert.value && key.value) {
    for (const f of [cert, key])
      if (!existsSync(f.value!)) throw new AgentOptionError(f.name, `${f.value} does not exist`);
    tls = { cert: readFileSync(cert.value), key: readFileSync(key.value) };
  }

  const net = pick('network', 'GPUCLOUD_AGENT_NETWORK');
  const network = net.value ?? 'user';
  if (network !== 'user' && network !== 'bridge')
    throw new AgentOptionError(net.name, `must be user or bridge, got "${network}"`);
  const sub = pick('vm-subnet', 'GPUCLOUD_AGENT_VM_SUBNET');
  const vmSubnet = sub.value ?? '10.88.0.0/16';
  try {
    parseSubnet(vmSubnet);
  } catch (err) {
    throw new AgentOptionError(sub.name, (err as Error).message);
  }

  const dir = pick('data-dir', 'GPUCLOUD_AGENT_DATA_DIR');
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
  };
}
