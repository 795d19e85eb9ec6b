/**
 * `gpucloud agent`: the daemon that runs a host's VMs, and its template
 * commands. See docs/agent.md.
 *
 *   gpucloud agent [--listen HOST:PORT] [--data-dir DIR] --token TOKEN [--public-host HOST]
 *                  [--ssh-ports FROM-TO] [--accel kvm|tcg|auto] [--fake-gpus N] [--tls-cert F --tls-key F]
 *   gpucloud agent template add VMID FILE [--user NAME]
 *   gpucloud agent template list
 *   gpucloud agent template remove VMID
 */
import { chmodSync, mkdirSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { AgentOptionError, parseAgentOptions, type AgentOptions } from './options.js';
import { TemplateStore, templateVmid } from './templates.js';
import { VmManager } from './vms.js';
import { buildAgentApp } from './server.js';
import { hostAccel, qemuAvailable } from './qemu/process.js';
import { hostNameservers, parseSubnet } from './network/bridge.js';

export const AGENT_USAGE = `gpucloud agent: runs this host's VMs under QEMU for the control plane

  gpucloud agent --token TOKEN [options]       Start the daemon
  gpucloud agent template add VMID FILE [--user NAME]
                                               Store a qcow2 or raw image as template VMID
                                               (NAME: the SSH login user, default root)
  gpucloud agent template list                 The templates on this host
  gpucloud agent template remove VMID          Remove a template no VM stands on

Options (each also an environment variable):
  --listen HOST:PORT     GPUCLOUD_AGENT_LISTEN      default 127.0.0.1:7070
  --data-dir DIR         GPUCLOUD_AGENT_DATA_DIR    default ./agent-data
  --token TOKEN          GPUCLOUD_AGENT_TOKEN       required, 32+ characters
  --public-host HOST     GPUCLOUD_AGENT_PUBLIC_HOST where customers SSH to (default the listen host)
  --ssh-ports FROM-TO    GPUCLOUD_AGENT_SSH_PORTS   default 22000-22999
  --accel kvm|tcg|auto   GPUCLOUD_AGENT_ACCEL       default auto (kvm when /dev/kvm can be used)
  --fake-gpus N          GPUCLOUD_AGENT_FAKE_GPUS   report N GPUs on a host without any (tests, demos)
  --network user|bridge  GPUCLOUD_AGENT_NETWORK     default user (no root, traffic not counted); bridge: taps on
                                                    bridge gcbr0 with NAT and counted traffic (root, nftables)
  --vm-subnet CIDR       GPUCLOUD_AGENT_VM_SUBNET   VM addresses with --network bridge, default 10.88.0.0/16
  --tls-cert F --tls-key F                          serve https
`;

export class AgentUsageError extends Error {}

function dataDirOf(args: string[]): string {
  const { values } = parseArgs({
    args,
    options: { 'data-dir': { type: 'string' }, user: { type: 'string' } },
    strict: false,
    allowPositionals: true,
  });
  const v = (values['data-dir'] as string | undefined) ?? process.env.GPUCLOUD_AGENT_DATA_DIR;
  return resolve(v?.trim() || './agent-data');
}

async function templateCommand(args: string[]): Promise<void> {
  const [sub, ...rest] = args;
  const { values, positionals } = parseArgs({
    args: rest,
    options: { user: { type: 'string' }, 'data-dir': { type: 'string' } },
    strict: true,
    allowPositionals: true,
  });
  const store = new TemplateStore(join(dataDirOf(rest), 'templates'));
  try {
    if (sub === 'list') {
      const all = store.list();
      if (all.length === 0)
        console.log('No templates. Add one with: gpucloud agent template add VMID FILE [--user NAME]');
      for (const t of all)
        console.log(`${t.vmid}\tuser ${t.user}\t${(t.size_bytes / 1048576).toFixed(1)} MB\tadded ${t.added_at}`);
      return;
    }
    if (sub === 'add') {
      if (positionals.length !== 2) throw new AgentUsageError('template add needs VMID and FILE');
      const t = await store.add(
        templateVmid(positionals[0]!),
        positionals[1]!,
        (values.user as string | undefined) ?? 'root',
      );
      console.log(`Template ${t.vmid} added (user ${t.user}, ${(t.size_bytes / 1048576).toFixed(1)} MB)`);
      return;
    }
    if (sub === 'remove') {
      if (positionals.length !== 1) throw new AgentUsageError('template remove needs VMID');
      const vmid = templateVmid(positionals[0]!);
      // VMs stand on their template: look at the VM folders without starting anything.
      const manager = new VmManager(
        {
          dataDir: dataDirOf(rest),
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
      return;
    }
  } catch (err) {
    if (err instanceof AgentUsageError) throw err;
    throw new AgentUsageError((err as Error).message);
  }
  throw new AgentUsageError(`unknown template command "${sub ?? ''}"`);
}

export interface RunningAgent {
  url: string;
  options: AgentOptions;
  close(): Promise<void>;
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
  const templates = new TemplateStore(join(options.dataDir, 'templates'));
  const logLine = (msg: string, data?: Record<string, unknown>) => {
    if (log) process.stderr.write(JSON.stringify({ time: new Date().toISOString(), msg, ...data }) + '\n');
  };
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
  const vms = new VmManager(
    {
      dataDir: options.dataDir,
      accel,
      publicHost: options.publicHost,
      forwardHost,
      sshPorts: options.sshPorts,
      fakeGpus: options.fakeGpus,
      network,
      log: logLine,
    },
    templates,
  );
  await vms.load();
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
      vms.close(); // the VMs run on; a new agent re-attaches to them
    },
  };
}

export async function agentCommand(args: string[]): Promise<void> {
  if (args[0] === '--help' || args[0] === '-h' || args[0] === 'help') {
    console.log(AGENT_USAGE);
    return;
  }
  if (args[0] === 'template') return templateCommand(args.slice(1));
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
