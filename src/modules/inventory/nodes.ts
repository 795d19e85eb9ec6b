/** A node as the API shows it, and the checks of what an operator sends about one (docs/offers.md#nodes). */
import type { CatalogueNode } from '../templates/service.js';
import { validation } from '../../errors.js';
import type { FullNodeRow, GpuUsage, NodeRow, NodeStatus } from './repository.js';
import { freeGpus } from './offers.js';
import type { NodeRecord } from './schemas.js';

/** A node as the operator registers (or, in part, changes) it. */
export type NodeInput = Omit<NodeRow, 'created_at' | 'updated_at' | 'gpu_ram_mb' | 'status'> & {
  gpu_ram_mb?: number;
  status?: NodeStatus;
  agent_url?: string | null;
  agent_token?: string;
};

export function toNodeRecord(n: FullNodeRow, u: GpuUsage | undefined): NodeRecord {
  const info = n.agent_url ? n.agent_info : null;
  return {
    node: n.node,
    gpu_type: n.gpu_type,
    gpu_count: n.gpu_count,
    gpu_ram_mb: n.gpu_ram_mb,
    ram_gb: n.ram_gb,
    cpu_cores: n.cpu_cores,
    cpu_model: n.cpu_model,
    pcie_gen: n.pcie_gen,
    max_storage_gb: n.max_storage_gb,
    location: n.location,
    cluster_name: n.cluster_name,
    status: n.status,
    gpus_allocated: u?.held ?? 0,
    gpus_free: freeGpus(n, u),
    created_at: n.created_at.toISOString(),
    updated_at: n.updated_at.toISOString(),
    agent_url: n.agent_url,
    agent_token_set: n.agent_token_sealed !== null,
    agent_status: n.agent_url ? (n.agent_status ?? 'offline') : null,
    agent_seen_at: n.agent_url && n.agent_seen_at ? n.agent_seen_at.toISOString() : null,
    agent_version: info?.agent_version ?? null,
    accel: info?.accel ?? null,
    host_cpu_model: info?.host_cpu_model ?? null,
    host_gpus: info?.host_gpus ?? (n.agent_url ? [] : null),
  };
}

/**
 * An agent URL: http or https, a host, no credentials, query or fragment (the
 * token travels in a header). Returned without a trailing slash.
 */
export function agentUrl(raw: string, field = 'body.agent_url'): string {
  let u: URL;
  try {
    u = new URL(raw);
  } catch {
    throw validation(field, 'must be a URL like http://10.0.0.7:7070');
  }
  if (u.protocol !== 'http:' && u.protocol !== 'https:') throw validation(field, 'must use http or https');
  if (!u.hostname) throw validation(field, 'must name a host');
  if (u.username || u.password) throw validation(field, 'must not carry credentials: send the token as agent_token');
  if (u.search || u.hash) throw validation(field, 'must not have a query or fragment');
  return u.toString().replace(/\/+$/, '');
}

export function catalogueNodeOf(n: FullNodeRow): CatalogueNode {
  return { node: n.node, gpu_type: n.gpu_type, status: n.status, agent_url: n.agent_url };
}
