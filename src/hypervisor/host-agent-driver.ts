/**
 * The `agent` driver: a node registered with an `agent_url` runs its VMs
 * through the host agent on that machine (see docs/agent.md). The agent
 * launches QEMU; this driver only asks and waits. A start returns once the
 * guest answers on SSH, so `running` means a customer can log in.
 */
import { randomToken } from '../ids.js';
import type { AgentDiskSource, AgentProvisionSpec } from '../host-agent/api.js';
import {
  AgentCallError,
  HostAgentClient,
  type AgentEndpoint,
  type AgentExportState,
  type AgentVmState,
} from './host-agent-client.js';
import {
  DriverError,
  type HvAction,
  type HypervisorDriver,
  type DiskExport,
  type Moved,
  type Provisioned,
  type VmRef,
  type VmSpec,
} from './driver.js';

export interface HostAgentDriverOptions {
  /** Seconds an ACPI power-down may take before the agent pulls the plug. */
  stopTimeoutS: number;
  /** Seconds from QEMU's start until the guest must answer on SSH. */
  bootTimeoutS: number;
  /** Poll interval while waiting for a boot (real time). */
  pollMs?: number;
  /** Seconds a host may stay unreachable during a move before the move fails (default 10). */
  moveUnreachableS?: number;
}

/** Finds the agent of a node: its URL and token, or null for a simulated node. */
export type AgentLookup = (node: string) => Promise<AgentEndpoint | null>;

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export class HostAgentDriver implements HypervisorDriver {
  readonly name = 'agent' as const;

  constructor(
    private readonly lookup: AgentLookup,
    private readonly opts: HostAgentDriverOptions,
  ) {}

  private async client(node: string, action: HvAction): Promise<HostAgentClient> {
    const endpoint = await this.lookup(node);
    if (!endpoint) throw new DriverError(action, `node ${node} has no agent`);
    return new HostAgentClient(endpoint);
  }

  private async wrap<T>(action: HvAction, fn: () => Promise<T>): Promise<T> {
    try {
      return await fn();
    } catch (err) {
      if (err instanceof DriverError) throw err;
      throw new DriverError(action, err instanceof Error ? err.message : String(err));
    }
  }

  async provision(spec: VmSpec): Promise<Provisioned> {
    return this.wrap('provision', async () => {
      const endpoint = await this.lookup(spec.node);
      if (!endpoint) throw new DriverError('provision', `node ${spec.node} has no agent`);
      const agent = new HostAgentClient(endpoint);
      if (!spec.image) {
        const vm = await agent.provision(spec.id, provisionBody(spec));
        return { hvRef: spec.id, ipAddress: vm.ssh.host, access: vm.ssh, gpuDevices: vm.gpus };
      }
      // From a customer image: the host downloads it from the image store with its own token.
      const image = spec.image;
      const vm = await this.poll(
        `the image's copy on ${spec.node}`,
        () =>
          agent.provision(
            spec.id,
            fromDisk(spec, {
              url: image.url,
              token: endpoint.token,
              sha256: image.sha256,
              size_bytes: image.sizeBytes,
              format: image.format,
            }),
          ),
        () => agent.vm(spec.id),
        (v: AgentVmState) => {
          if (v.state !== 'importing') return true;
          if (v.import?.error) throw new DriverError('provision', `the image did not arrive: ${v.import.error}`);
          return false;
        },
        'provision',
      );
      return { hvRef: spec.id, ipAddress: vm.ssh.host, access: vm.ssh, gpuDevices: vm.gpus };
    });
  }

  /** The export of a stopped VM's disk (docs/images.md), served to the bearer of a fresh token. */
  async exportDisk(vm: VmRef): Promise<DiskExport> {
    return this.wrap('provision', async () => {
      const agent = await this.client(vm.node, 'provision');
      const token = randomToken();
      const e = await this.poll(
        `the export on ${vm.node}`,
        () => agent.exportDisk(vm.id, token),
        () => agent.exportState(vm.id),
        (x: AgentExportState) => {
          if (x.state === 'failed') throw new DriverError('provision', `the export on ${vm.node} failed: ${x.error}`);
          return x.state === 'ready';
        },
        'provision',
      );
      return { url: agent.exportUrl(vm.id), token, sha256: e.sha256!, sizeBytes: e.size_bytes!, format: 'qcow2' };
    });
  }

  async dropExport(vm: VmRef): Promise<void> {
    await this.wrap('provision', async () => {
      try {
        await (await this.client(vm.node, 'provision')).deleteExport(vm.id);
      } catch (err) {
        if (err instanceof AgentCallError && err.status === 404) return;
        throw err;
      }
    });
  }

  /**
   * Agent to agent (docs/vms.md#start-on-another-host): the source host flattens the VM's disk
   * into one file and serves it to the bearer of a one-move token; the destination downloads it
   * (resuming after a cut), checks its SHA-256 and the image, and builds the VM from it. Only then
   * is the VM's new node recorded, and the source's copy removed after that (release()). A
   * destination that already holds a finished copy under this id (left by an earlier stay there)
   * is given the disk again.
   */
  async move(spec: VmSpec, from: string): Promise<Moved> {
    return this.wrap('move', async () => {
      const source = await this.client(from, 'move');
      const target = await this.client(spec.node, 'move');
      // Whatever the destination holds under this id and is not importing is older than the disk on
      // the source (a copy left from an earlier stay there): it goes, and the disk is copied again.
      const there = await target.vm(spec.id).catch((err) => {
        if (err instanceof AgentCallError && err.status === 404) return null;
        throw err;
      });
      if (there && there.state !== 'importing') await target.destroy(spec.id);
      const token = randomToken();
      const exported = await this.poll(
        `the export on ${from}`,
        () => source.exportDisk(spec.id, token),
        () => source.exportState(spec.id),
        (e: AgentExportState) => {
          if (e.state === 'failed') throw new DriverError('move', `the export on ${from} failed: ${e.error}`);
          return e.state === 'ready';
        },
      );
      const built = await this.poll(
        `the copy on ${spec.node}`,
        () =>
          target.provision(
            spec.id,
            fromDisk(spec, {
              url: source.exportUrl(spec.id),
              token,
              sha256: exported.sha256!,
              size_bytes: exported.size_bytes!,
              format: 'qcow2',
            }),
          ),
        () => target.vm(spec.id),
        (v: AgentVmState) => {
          if (v.state !== 'importing') return true;
          if (v.import?.error) throw new DriverError('move', `the copy to ${spec.node} failed: ${v.import.error}`);
          return false;
        },
      );
      // The source's copy stays until the VM's new node is recorded (release()), so a move that
      // fails or is overtaken at any point leaves the VM whole where it was.
      const bytes = exported.size_bytes ?? 0;
      return { hvRef: spec.id, ipAddress: built.ssh.host, access: built.ssh, gpuDevices: [], bytes };
    });
  }

  /**
   * Calls `begin`, then `check` until `done` says so. A host that cannot be reached for longer than
   * the move allows fails the move; any other error fails it at once.
   */
  private async poll<T>(
    what: string,
    begin: () => Promise<T>,
    check: () => Promise<T>,
    done: (t: T) => boolean,
    action: HvAction = 'move',
  ): Promise<T> {
    const allowMs = (this.opts.moveUnreachableS ?? 10) * 1000;
    let lastSeen = Date.now();
    let state: T | null = null;
    for (;;) {
      try {
        state = await (state === null ? begin() : check());
        lastSeen = Date.now();
        if (done(state)) return state;
      } catch (err) {
        if (!(err instanceof AgentCallError) || err.status !== 0) throw err;
        if (Date.now() - lastSeen > allowMs)
          throw new DriverError(action, `${what}: the host was unreachable for more than ${allowMs / 1000} s`);
      }
      await sleep(this.opts.pollMs ?? 250);
    }
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

  /** Removes a VM's copy from a host it left; one the host does not hold counts as removed. */
  async release(vm: VmRef): Promise<void> {
    await this.wrap('destroy', async () => (await this.client(vm.node, 'destroy')).destroy(vm.id));
  }

  async destroy(vm: VmRef): Promise<void> {
    await this.wrap('destroy', async () => (await this.client(vm.node, 'destroy')).destroy(vm.id));
  }

  /**
   * Nothing to ask: the agent's traffic counters arrive with its heartbeats
   * (all of a host's VMs in one answer, see jobs/host-monitor.ts), instead of
   * calls from the control plane.
   */
  async trafficBytes(_node: string, _vms: readonly VmRef[]): Promise<Map<string, number>> {
    return new Map();
  }
}

/** A VM spec as the agent's provision takes it. */
function provisionBody(spec: VmSpec): AgentProvisionSpec {
  return {
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
  };
}

/** The provision of a VM built from a disk (a move, a customer image): the host may not know its template's user. */
function fromDisk(spec: VmSpec, disk: AgentDiskSource): AgentProvisionSpec {
  return { ...provisionBody(spec), ...(spec.user ? { user: spec.user } : {}), disk };
}
