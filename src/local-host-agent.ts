/**
 * One machine, one command: `gpucloud serve --local-agent` also runs a host
 * agent in this process, with a token made for this start, and registers
 * this host as a node (its id from the hostname, its hardware from what the
 * agent found), so an operator with a single GPU server needs nothing else.
 * The agent takes the options of `gpucloud agent` (but its token), given to
 * serve (`serve --local-agent --fake-gpus 2`) or in the same GPUCLOUD_AGENT_*
 * variables, a flag winning; its data lives in --data-dir or
 * GPUCLOUD_AGENT_DATA_DIR, by default DATA_DIR/agent.
 */
import { statfsSync } from 'node:fs';
import { cpus, hostname, totalmem } from 'node:os';
import { join, resolve } from 'node:path';
import type { Config } from './config.js';
import type { Services } from './app.js';
import { randomToken } from './ids.js';
import { HostAgentClient } from './hypervisor/host-agent-client.js';
import { parseAgentOptions, type AgentOptions } from './host-agent/options.js';
import { GPU_TYPES, type GpuType } from './modules/inventory/repository.js';

export interface LocalAgent {
  node: string;
  url: string;
  /** The agent's data directory (its templates are in templates/ below it). */
  dataDir: string;
  close(): Promise<void>;
}

/** A node id from the host name: lower case, [a-z0-9-], at most 63 characters. */
export function nodeIdFromHostname(name: string): string {
  const id = name
    .toLowerCase()
    .split('.')[0]!
    .replace(/[^a-z0-9-]+/g, '-')
    .replace(/^-+/, '')
    .slice(0, 63)
    .replace(/-+$/, '');
  return /^[a-z0-9][a-z0-9-]{0,62}$/.test(id) ? id : 'local';
}

/** The GPU type of a model name, when it is one of the types sold; else the setting or 4090. */
export function gpuTypeOf(models: string[], fallback: string | undefined): GpuType {
  const m = models[0] ?? '';
  if (/5090/.test(m)) return '5090';
  if (/4090/.test(m)) return '4090';
  if (/PRO 6000/i.test(m)) return 'pro6000';
  return fallback && (GPU_TYPES as readonly string[]).includes(fallback) ? (fallback as GpuType) : '4090';
}

/**
 * The local agent's options: serve's agent options over the GPUCLOUD_AGENT_* variables, with this start's token
 * and the data directory defaulting to DATA_DIR/agent. Throws AgentOptionError naming a bad option.
 */
export function localAgentOptions(
  config: Pick<Config, 'dataDir' | 'localAgentArgs'>,
  env: Record<string, string | undefined>,
  token: string,
): AgentOptions {
  return parseAgentOptions(config.localAgentArgs ?? [], {
    ...env,
    GPUCLOUD_AGENT_TOKEN: token,
    GPUCLOUD_AGENT_DATA_DIR: env.GPUCLOUD_AGENT_DATA_DIR?.trim() || join(resolve(config.dataDir), 'agent'),
  });
}

export async function startLocalAgent(
  config: Config,
  services: Services,
  env: Record<string, string | undefined> = process.env,
): Promise<LocalAgent> {
  const { startAgent } = await import('./host-agent/main.js');
  const token = randomToken(32);
  const options = localAgentOptions(config, env, token);
  const agent = await startAgent(options);
  try {
    const host = await new HostAgentClient({ url: agent.url, token }, 10_000).host();
    const gpus = host.host_gpus.filter((g) => g.vfio || options.fakeGpus > 0);
    if (gpus.length === 0) {
      throw new Error(
        `the local agent found no GPU it can pass through (${host.host_gpus.length} found, none bound to vfio-pci); bind them (docs/agent.md) or pass --fake-gpus N (GPUCLOUD_AGENT_FAKE_GPUS=N) to try it without`,
      );
    }
    const node = env.GPUCLOUD_LOCAL_NODE?.trim() || nodeIdFromHostname(hostname());
    let freeGb = 50;
    try {
      const fs = statfsSync(options.dataDir);
      freeGb = Math.max(50, Math.floor((fs.bavail * fs.bsize) / 1024 ** 3));
    } catch {
      // keep the minimum
    }
    const inv = services.inventory;
    const existing = await inv.getNode(node).catch(() => null);
    if (existing) {
      // A new start has a new token (and maybe a new address): the node follows.
      await inv.patchNode(node, {
        agent_url: agent.url,
        agent_token: token,
        gpu_count: Math.max(gpus.length, existing.gpus_allocated),
      });
    } else {
      await inv.createNode({
        node,
        gpu_type: gpuTypeOf(
          gpus.map((g) => g.model),
          env.GPUCLOUD_LOCAL_GPU_TYPE,
        ),
        gpu_count: gpus.length,
        ram_gb: Math.max(1, Math.floor(totalmem() / 1024 ** 3)),
        cpu_cores: cpus().length,
        cpu_model: (host.host_cpu_model || 'unknown').slice(0, 128),
        pcie_gen: '4.0',
        max_storage_gb: Math.min(freeGb, 10_000_000),
        location: 'local',
        cluster_name: 'local',
        agent_url: agent.url,
        agent_token: token,
      });
    }
    return { node, url: agent.url, dataDir: options.dataDir, close: () => agent.close() };
  } catch (err) {
    await agent.close();
    throw err;
  }
}
