/**
 * `gpucloud agent`: the daemon that runs a host's VMs, and its template
 * commands (their help: src/local-commands.ts). See docs/agent.md.
 *
 *   gpucloud agent [--listen HOST:PORT] [--data-dir DIR] --token TOKEN [--public-host HOST]
 *                  [--ssh-ports FROM-TO] [--accel kvm|tcg|auto] [--fake-gpus N] [--tls-cert F --tls-key F]
 *                  [--download-limit MBPS]
 *   gpucloud agent template add VMID FILE [--user NAME] [--data-dir DIR]
 *   gpucloud agent template list [--data-dir DIR]
 *   gpucloud agent template remove VMID [--data-dir DIR]
 */
import { chmodSync, mkdirSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { AgentOptionError, parseAgentOptions, type AgentOptions } from './options.js';
import { TemplateStore, templateVmid } from './templates.js';
import { ImagePuller } from './images/pull.js';
import { VmManager } from './vms.js';
import { buildAgentApp } from './server.js';
import { hostAccel, qemuAvailable } from './qemu/process.js';
import { hostNameservers, parseSubnet } from './network/bridge.js';
import { createLogger, type LogFormat } from '../log.js';

export class AgentUsageError extends Error {}

/** A template command's words: its options (--data-dir, and `user` when it takes --user) and `count` positionals. */
function templateArgs(
  args: string[],
  name: string,
  count: number,
  withUser = false,
): { dataDir: string; user: string | undefined; positionals: string[] } {
  const { values, positionals } = parseArgs({
    args,
    options: withUser
      ? { 'data-dir': { type: 'string' }, user: { type: 'string' } }
      : { 'data-dir': { type: 'string' } },
    strict: true,
    allowPositionals: true,
  });
  if (positionals.length !== count)
    throw new AgentUsageError(
      count === 0
        ? `template ${name} takes no argument, got "${positionals[0]}"`
        : `template ${name} needs ${count === 1 ? 'VMID' : 'VMID and FILE'}`,
    );
  const v = (values['data-dir'] as string | undefined) ?? process.env.GPUCLOUD_AGENT_DATA_DIR;
  return {
    dataDir: resolve(v?.trim() || './agent-data'),
    user: (values as { user?: string }).user,
    positionals,
  };
}

/** The store's refusals (a bad VMID, a missing file) are the user's mistakes: bad usage. */
async function asUsage<T>(work: () => Promise<T> | T): Promise<T> {
  try {
    return await work();
  } catch (err) {
    if (err instanceof AgentUsageError) throw err;
    throw new AgentUsageError((err as Error).message);
  }
}

const mb = (bytes: number) => `${(bytes / 1048576).toFixed(1)} MB`;

/**
 * `gpucloud agent template list`: local templates and the images the control plane asked for, with their
 * source and state as the files show them (a running agent's `GET /v1/host` has the live progress).
 */
export async function templateList(args: string[]): Promise<void> {
  const { dataDir } = templateArgs(args, 'list', 0);
  const images = new ImagePuller({ dir: join(dataDir, 'images'), token: '' });
  const store = new TemplateStore(join(dataDir, 'templates'), images);
  const all = await asUsage(() => {
    images.load();
    return store.states();
  });
  if (all.length === 0) console.log('No templates. Add one with: gpucloud agent template add VMID FILE [--user NAME]');
  for (const t of all) {
    const added = t.source === 'local' ? store.get(t.vmid)?.added_at : undefined;
    const state =
      t.state === 'ready' || !t.size_bytes ? t.state : `${t.state} (${mb(t.bytes_done ?? 0)} of ${mb(t.size_bytes)})`;
    console.log(
      [
        t.vmid,
        `user ${t.user}`,
        mb(t.size_bytes ?? 0),
        t.source,
        state + (t.reason ? `: ${t.reason}` : ''),
        `sha256 ${t.sha256 ?? 'unknown'}`,
        ...(added ? [`added ${added}`] : []),
      ].join('\t'),
    );
  }
}

/** `gpucloud agent template add VMID FILE`. */
export async function templateAdd(args: string[]): Promise<void> {
  const { dataDir, user, positionals } = templateArgs(args, 'add', 2, true);
  const t = await asUsage(() =>
    new TemplateStore(join(dataDir, 'templates')).add(templateVmid(positionals[0]!), positionals[1]!, user ?? 'root'),
  );
  console.log(`Template ${t.vmid} added (user ${t.user}, ${(t.size_bytes / 1048576).toFixed(1)} MB)`);
}

/** `gpucloud agent template remove VMID`: refused while VMs stand on it. */
export async function templateRemove(args: string[]): Promise<void> {
  const { dataDir, positionals } = templateArgs(args, 'remove', 1);
  await asUsage(async () => {
    const vmid = templateVmid(positionals[0]!);
    const store = new TemplateStore(join(dataDir, 'templates'));
    // VMs stand on their template: look at the VM folders without starting anything.
    const manager = new VmManager(
      {
        dataDir,
        accel: 'tcg',
        publicHost: '127.0.0.1',
        forwardHost: '127.0.0.1',
        sshPorts: { from: 22000, to: 22999 },
        fakeGpus: 1,
      },
      store,
    );
    await manager.load();
    const inUse = manager.templateInUse(vmid);
    manager.close();
    store.remove(vmid, inUse);
    console.log(`Template ${vmid} removed`);
  });
}

export interface RunningAgent {
  url: string;
  options: AgentOptions;
  close(): Promise<void>;
}

/** LOG_LEVEL as the control plane reads it (info when unset or unknown). */
function logLevel(): string {
  const l = process.env.LOG_LEVEL;
  return l && ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'].includes(l) ? l : 'info';
}

/** GPUCLOUD_LOG_FORMAT as the control plane reads it (auto when unset or unknown). */
function logFormat(): LogFormat {
  const f = process.env.GPUCLOUD_LOG_FORMAT;
  return f === 'json' || f === 'pretty' ? f : 'auto';
}

/** Starts the daemon; resolves once it listens. */
export async function startAgent(options: AgentOptions, log = true): Promise<RunningAgent> {
  if (!qemuAvailable())
    throw new AgentOptionError(
      'qemu-system-x86_64',
      'is not installed (Debian: apt-get install qemu-system-x86 qemu-utils genisoimage)',
    );
  mkdirSync(options.dataDir, { recursive: true, mode: 0o700 });
  chmodSync(options.dataDir, 0o700); // VM disks and seeds are the customers'
  const accel = options.accel === 'auto' ? hostAccel() : options.accel;
  const forwardHost = /^(127\.|::1$|localhost$)/.test(options.publicHost) ? '127.0.0.1' : '0.0.0.0';
  // The same log as the control plane's (src/log.ts), on stderr: stdout carries the "listening on" line.
  const logger = log ? createLogger({ level: logLevel(), format: logFormat(), fd: 2, name: 'agent' }) : null;
  const logLine = (msg: string, data?: Record<string, unknown>) => logger?.info(data ?? {}, msg);
  if (options.network === 'bridge' && process.getuid?.() !== 0) {
    throw new AgentOptionError(
      '--network',
      'bridge needs root (it makes a bridge, tap devices and NAT rules); use --network user otherwise',
    );
  }
  const network =
    options.network === 'bridge'
      ? { kind: 'bridge' as const, subnet: parseSubnet(options.vmSubnet), nameservers: hostNameservers() }
      : { kind: 'user' as const };
  const images = new ImagePuller({
    dir: join(options.dataDir, 'images'),
    token: options.token,
    limitMbps: options.downloadLimitMbps,
    log: logLine,
  });
  images.load();
  const templates = new TemplateStore(join(options.dataDir, 'templates'), images);
  const vms = new VmManager(
    {
      dataDir: options.dataDir,
      accel,
      publicHost: options.publicHost,
      forwardHost,
      sshPorts: options.sshPorts,
      fakeGpus: options.fakeGpus,
      network,
      downloadLimitMbps: options.downloadLimitMbps,
      log: logLine,
    },
    templates,
  );
  await vms.load();
  images.start(); // resumes what the last run was downloading
  const app = await buildAgentApp(vms, templates, {
    token: options.token,
    accel,
    publicHost: options.publicHost,
    https: options.tls,
  });
  await app.listen({ host: options.listenHost, port: options.listenPort });
  const addr = app.server.address();
  const port = typeof addr === 'object' && addr ? addr.port : options.listenPort;
  const host = options.listenHost.includes(':') ? `[${options.listenHost}]` : options.listenHost;
  const url = `${options.tls ? 'https' : 'http'}://${host}:${port}`;
  return {
    url,
    options,
    close: async () => {
      await app.close();
      await images.close(); // a download under way stays a .part: the next start resumes it
      vms.close(); // the VMs run on; a new agent re-attaches to them
    },
  };
}

/** `gpucloud agent [options]`: starts the daemon and runs until SIGINT or SIGTERM. */
export async function agentCommand(args: string[]): Promise<void> {
  const options = parseAgentOptions(args);
  const agent = await startAgent(options);
  console.log(`gpucloud agent listening on ${agent.url}`);
  const stop = async (signal: string) => {
    process.stderr.write(`${signal}: the agent stops; its VMs keep running\n`);
    await agent.close();
    process.exit(0);
  };
  process.on('SIGINT', () => void stop('SIGINT'));
  process.on('SIGTERM', () => void stop('SIGTERM'));
}
