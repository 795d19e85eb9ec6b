/**
 * Heartbeats to the host agents. Every GPUCLOUD_AGENT_HEARTBEAT_S (real
 * time: agents are real processes, whatever the service clock says) each
 * node with an agent is asked about its host and its VMs, by exactly one
 * service instance (the check is claimed in the database). An agent that
 * misses three heartbeats in a row is offline and its node's VMs go offline;
 * when it answers again they come back as they were. A running VM whose QEMU
 * is gone (the guest powered off, or the process died) becomes stopped.
 */
import type { FastifyBaseLogger } from 'fastify';
import { realTimeMs } from '../clock.js';
import {
  AgentCallError,
  HostAgentClient,
  type AgentHostInfo,
  type AgentTemplateState,
} from '../hypervisor/host-agent-client.js';
import type { TemplateService } from '../modules/templates/service.js';
import type { AgentInfo } from '../modules/inventory/repository.js';
import type { InventoryService } from '../modules/inventory/service.js';
import type { VmService } from '../modules/vms/service.js';
import { JobMetrics } from '../background/metrics.js';

export function agentInfoOf(host: AgentHostInfo): AgentInfo {
  return {
    agent_version: String(host.agent_version).slice(0, 64),
    accel: String(host.accel).slice(0, 16),
    host_cpu_model: String(host.host_cpu_model).slice(0, 256),
    host_gpus: (Array.isArray(host.host_gpus) ? host.host_gpus : []).slice(0, 64).map((g) => ({
      pci_address: String(g.pci_address).slice(0, 32),
      model: String(g.model).slice(0, 128),
      vfio: g.vfio === true,
      iommu_group: Number.isInteger(g.iommu_group) ? g.iommu_group : null,
    })),
  };
}

export class HostMonitor {
  constructor(
    private readonly inventory: InventoryService,
    private readonly vms: VmService,
    private readonly templates: TemplateService,
    private readonly heartbeatS: number,
    private readonly log?: FastifyBaseLogger,
    private readonly metrics: JobMetrics = new JobMetrics(),
  ) {}

  /** Checks every agent due for a heartbeat now; returns how many were checked. */
  async checkDue(): Promise<number> {
    // A little slack so that a 1 s loop does not skip a beat by a few milliseconds.
    const due = await this.inventory.claimAgentChecks(
      new Date(realTimeMs()),
      Math.max(0, this.heartbeatS * 1000 - 500),
    );
    await Promise.all(due.map((row) => this.check(row.node, this.inventory.endpointOf(row))));
    return due.length;
  }

  /** A heartbeat to one node now (its agent was just registered). */
  async checkNode(node: string): Promise<void> {
    await this.check(node, await this.inventory.agentEndpoint(node));
  }

  private async check(node: string, endpoint: ReturnType<InventoryService['endpointOf']>): Promise<void> {
    if (!endpoint) return;
    let host: AgentHostInfo;
    const client = new HostAgentClient(endpoint, Math.min(5_000, this.heartbeatS * 1000));
    try {
      host = await client.host();
    } catch (err) {
      this.metrics.agentMisses.inc({ node });
      const { misses, tookOffline } = await this.inventory.agentMissed(node);
      this.log?.warn(
        { node, misses, err: err instanceof Error ? err.message : String(err) },
        tookOffline ? 'agent offline: node set offline' : 'agent missed a heartbeat',
      );
      return;
    }
    await this.inventory.agentAnswered(node, agentInfoOf(host));
    await this.syncTemplates(node, client, host);
    const reported = Array.isArray(host.vms) ? host.vms : [];
    const stopped = await this.vms.agentReport(node, reported);
    if (stopped.length) this.log?.info({ node, vms: stopped }, 'VMs stopped on their host');
    await this.removeLeftCopies(node, client, reported);
  }

  /**
   * Copies a move left on this host (the VM lives elsewhere now and the move's own removal did not
   * reach the host) are removed (docs/vms.md#start-on-another-host).
   */
  private async removeLeftCopies(node: string, client: HostAgentClient, reported: { id: string; state: string }[]) {
    for (const id of await this.vms.leftCopies(node, reported)) {
      try {
        await client.destroy(id);
        this.log?.info({ node, vm: id }, 'removed the copy a move left on this host');
      } catch (err) {
        this.log?.warn({ node, vm: id, err: err instanceof Error ? err.message : String(err) }, 'copy not removed');
      }
    }
  }

  /**
   * Tells the host which templates it must hold and records what it holds (docs/templates.md). An agent
   * older than the image store has no such call: what it reported in its host answer is recorded.
   */
  private async syncTemplates(node: string, client: HostAgentClient, host: AgentHostInfo): Promise<void> {
    let states: AgentTemplateState[] = Array.isArray(host.templates) ? host.templates : [];
    try {
      const row = await this.inventory.catalogueNode(node);
      if (!row) return;
      states = await client.templates(await this.templates.desiredFor(row));
    } catch (err) {
      if (!(err instanceof AgentCallError && err.status === 404))
        this.log?.warn({ node, err: err instanceof Error ? err.message : String(err) }, 'templates not synced');
      if (!(err instanceof AgentCallError)) return;
    }
    await this.templates.recordStates(node, states);
  }
}
