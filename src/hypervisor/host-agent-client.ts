/**
 * The control plane's side of the host agent's HTTP API (`gpucloud agent`,
 * see docs/agent.md). Every call carries the node's bearer token and a
 * timeout; every call is safe to repeat. The wire shapes, shared with the
 * agent, are in src/host-agent/api.ts.
 */

import {
  AGENT_API,
  type AgentDesiredTemplate,
  type AgentExportState,
  type AgentHostInfo,
  type AgentProvisionSpec,
  type AgentTemplateState,
  type AgentVmState,
} from '../host-agent/api.js';

export type {
  AgentExportState,
  AgentHostGpu,
  AgentHostInfo,
  AgentProvisionSpec,
  AgentTemplateState,
  AgentVmState,
} from '../host-agent/api.js';

export class AgentCallError extends Error {
  constructor(
    message: string,
    /** HTTP status, or 0 when the agent could not be reached. */
    readonly status: number,
    readonly code: string | undefined,
  ) {
    super(message);
    this.name = 'AgentCallError';
  }
}

export interface AgentEndpoint {
  url: string;
  token: string;
}

export class HostAgentClient {
  constructor(
    private readonly endpoint: AgentEndpoint,
    private readonly timeoutMs = 15_000,
  ) {}

  private async call<T>(method: string, path: string, body?: unknown, timeoutMs = this.timeoutMs): Promise<T> {
    const url = this.endpoint.url.replace(/\/+$/, '') + AGENT_API + path;
    let res: Response;
    try {
      res = await fetch(url, {
        method,
        headers: {
          authorization: `Bearer ${this.endpoint.token}`,
          ...(body === undefined ? {} : { 'content-type': 'application/json' }),
        },
        body: body === undefined ? undefined : JSON.stringify(body),
        signal: AbortSignal.timeout(timeoutMs),
        redirect: 'error',
      });
    } catch (err) {
      const why =
        (err as { name?: string }).name === 'TimeoutError'
          ? `no answer within ${Math.round(timeoutMs / 1000)} s`
          : 'unreachable';
      throw new AgentCallError(`agent at ${this.endpoint.url} ${why}`, 0, undefined);
    }
    const text = await res.text();
    let parsed: unknown = undefined;
    try {
      parsed = text ? JSON.parse(text) : undefined;
    } catch {
      parsed = undefined;
    }
    if (!res.ok) {
      const e = parsed as { detail?: unknown; code?: unknown } | undefined;
      const detail = typeof e?.detail === 'string' ? e.detail.slice(0, 500) : `HTTP ${res.status}`;
      throw new AgentCallError(`agent: ${detail}`, res.status, typeof e?.code === 'string' ? e.code : undefined);
    }
    return parsed as T;
  }

  host(timeoutMs?: number): Promise<AgentHostInfo> {
    return this.call('GET', '/host', undefined, timeoutMs);
  }

  /** Tells the agent which templates its host must hold; answers what it holds. */
  templates(templates: AgentDesiredTemplate[], timeoutMs?: number): Promise<AgentTemplateState[]> {
    return this.call('PUT', '/templates', { templates }, timeoutMs);
  }

  provision(id: string, spec: AgentProvisionSpec): Promise<AgentVmState> {
    return this.call('PUT', `/vms/${encodeURIComponent(id)}`, spec, 120_000);
  }

  start(id: string): Promise<AgentVmState> {
    return this.call('POST', `/vms/${encodeURIComponent(id)}/start`, {}, 60_000);
  }

  vm(id: string): Promise<AgentVmState> {
    return this.call('GET', `/vms/${encodeURIComponent(id)}`);
  }

  stop(id: string, timeoutS: number): Promise<AgentVmState> {
    return this.call('POST', `/vms/${encodeURIComponent(id)}/stop`, { timeout_s: timeoutS }, (timeoutS + 30) * 1000);
  }

  /** Starts (or reports) the flattened export of a stopped VM's disk, served to the bearer of `token`. */
  exportDisk(id: string, token: string): Promise<AgentExportState> {
    return this.call('POST', `/vms/${encodeURIComponent(id)}/export`, { token });
  }

  exportState(id: string): Promise<AgentExportState> {
    return this.call('GET', `/vms/${encodeURIComponent(id)}/export`);
  }

  async deleteExport(id: string): Promise<void> {
    await this.call('DELETE', `/vms/${encodeURIComponent(id)}/export`);
  }

  /** Where another host downloads the export of VM `id` from. */
  exportUrl(id: string): string {
    return `${this.endpoint.url.replace(/\/+$/, '')}${AGENT_API}/vms/${encodeURIComponent(id)}/export/disk`;
  }

  async destroy(id: string): Promise<void> {
    await this.call('DELETE', `/vms/${encodeURIComponent(id)}`, undefined, 60_000);
  }
}
