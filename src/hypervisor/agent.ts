/**
 * The `agent` driver: a node registered with an `agent_url` runs its VMs
 * through the host agent on that machine (see docs/agent.md). The agent
 * launches QEMU; this driver only asks and waits. A start returns once the
 * guest answers on SSH, so `running` means a customer can log in.
 */
import { AgentCallError, AgentClient, type AgentEndpoint, type AgentVmState } from './agent-client.js';
import { DriverError, type HypervisorDriver, type Provisioned, type VmRef, type VmSpec } from './driver.js';

export interface AgentDriverOptions {
  /** Seconds an ACPI power-down may take before the agent pulls the plug. */
  stopTimeoutS: number;
  /** Seconds from QEMU's start until the guest must answer on SSH. */
  bootTimeoutS: number;
  /** Poll interval while waiting for a boot (real time). */
  pollMs?: number;
}

/** Finds the agent of a node: its URL and token, or null for a simulated node. */
export type AgentLookup = (node: string) => Promise<AgentEndpoint | null>;

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export class AgentDriver implements HypervisorDriver {
  readonly name = 'agent' as const;

  constructor(
    private readonly lookup: AgentLookup,
    private readonly opts: AgentDriverOptions,
  ) {}

  private async client(node: string, action: 'provision' | 'start' | 'stop' | 'destroy'): Promise<AgentClient> {
    const endpoint = await this.lookup(node);
    if (!endpoint) throw new DriverError(action, `node ${node} has no agent`);
    return new AgentClient(endpoint);
  }

  private async wrap<T>(action: 'provision' | 'start' | 'stop' | 'destroy', fn: () => Promise<T>): Promise<T> {
    try {
      return await fn();
    } catch (err) {
      if (err instanceof DriverError) throw err;
      throw new DriverError(action, err instanceof Error ? err.message : String(err));
    }
  }

  async provision(spec: VmSpec): Promise<Provisioned> {
    return this.wrap('provision', async () => {
      const agent = await this.client(spec.node, 'provision');
      const vm = await agent.provision(spec.id, {
        vmid: spec.vmid,
        template_vmid: spec.templateVmid,
        cpu_cores: spec.cpuCores,
        ram_mb: spec.ramGb * 1024,
        storage_gb: spec.storageGb,
        gpu_count: spec.gpuCount,
        auth_method: spec.authMethod,
        ssh_public_key: spec.authMethod === 'ssh_key' ? spec.sshPublicKey : null,
        password: spec.authMethod === 'password' ? spec.password : null,
        web_ports: spec.webPorts,
      });
      return { hvRef: spec.id, ipAddress: vm.ssh.host, access: vm.ssh, gpuDevices: vm.gpus };
    });
  }

  async start(vm: VmRef): Promise<{ ipAddress?: string; gpuDevices?: string[] }> {
    return this.wrap('start', async () => {
      const agent = await this.client(vm.node, 'start');
      let state: AgentVmState = await agent.start(vm.id);
      const deadline = Date.now() + this.opts.bootTimeoutS * 1000;
      // Real time: a guest boots in real seconds whatever the service clock says.
      while (state.state !== 'running') {
        if (state.state === 'stopped') {
          throw new DriverError('start', `the VM stopped while booting (${state.exit_reason ?? 'no reason given'})`);
        }
        if (Date.now() > deadline) {
          // Leave nothing half-started behind: the VM goes back to stopped.
          await agent.stop(vm.id, 0).catch(() => undefined);
          throw new DriverError(
            'start',
            `the guest was not ready for logins (cloud-init finished and SSH answering) within ${this.opts.bootTimeoutS} s`,
          );
        }
        await sleep(this.opts.pollMs ?? 250);
        try {
          state = await agent.vm(vm.id);
        } catch (err) {
          // A restarting agent is not a failed boot: keep waiting until the deadline.
          if (!(err instanceof AgentCallError) || err.status !== 0) throw err;
        }
      }
      return { ipAddress: state.ssh.host, gpuDevices: state.gpus };
    });
  }

  async stop(vm: VmRef): Promise<void> {
    await this.wrap('stop', async () => {
      const agent = await this.client(vm.node, 'stop');
      try {
        await agent.stop(vm.id, this.opts.stopTimeoutS);
      } catch (err) {
        // A VM the agent does not know is not running: stopped.
        if (err instanceof AgentCallError && err.status === 404) return;
        throw err;
      }
    });
  }

  async destroy(vm: VmRef): Promise<void> {
    await this.wrap('destroy', async () => (await this.client(vm.node, 'destroy')).destroy(vm.id));
  }

  /**
   * Nothing to ask: the agent's traffic counters arrive with its heartbeats
   * (all of a host's VMs in one answer, see jobs/agent-monitor.ts), instead of
   * calls from the control plane.
   */
  async trafficBytes(_node: string, _vms: readonly VmRef[]): Promise<Map<string, number>> {
    return new Map();
  }
}

/**
 * Chooses the driver per node: a node with an agent is driven by it, any
 * other by the simulator, so a fleet can mix both.
 */
export class PerNodeDriver implements HypervisorDriver {
  readonly name = 'per-node' as const;

  constructor(
    private readonly hasAgent: (node: string) => Promise<boolean>,
    private readonly agent: HypervisorDriver,
    private readonly simulator: HypervisorDriver,
  ) {}

  private async pick(node: string): Promise<HypervisorDriver> {
    return (await this.hasAgent(node)) ? this.agent : this.simulator;
  }

  async provision(spec: VmSpec): Promise<Provisioned> {
    return (await this.pick(spec.node)).provision(spec);
  }
  async start(vm: VmRef): Promise<{ ipAddress?: string; gpuDevices?: string[] }> {
    return (await this.pick(vm.node)).start(vm);
  }
  async stop(vm: VmRef): Promise<void> {
    return (await this.pick(vm.node)).stop(vm);
  }
  async destroy(vm: VmRef): Promise<void> {
    return (await this.pick(vm.node)).destroy(vm);
  }
  async trafficBytes(node: string, vms: readonly VmRef[]): Promise<Map<string, number>> {
    return (await this.pick(node)).trafficBytes(node, vms);
  }
}
