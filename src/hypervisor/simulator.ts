/**
 * The simulated hypervisor (see docs/vms.md#simulated-and-real-vms): instant calls, deterministic IP
 * addresses, faults switched on per node or per VM through the database (so
 * every service instance sees them), and a record of calls for tests.
 * The provisioning delay is applied on the service clock, before the action comes due.
 */
import type { Db } from '../db/db.js';
import * as repo from './simulator-repository.js';
import type { SimAction } from './simulator-repository.js';
import {
  DriverError,
  HV_ACTIONS,
  type HypervisorDriver,
  type Moved,
  type Provisioned,
  type VmRef,
  type VmSpec,
} from './driver.js';

/** What the simulator can be made to fail: every driver action, and the export a snapshot takes. */
export type { SimAction };
export const SIM_ACTIONS: readonly SimAction[] = [...HV_ACTIONS, 'snapshot'];

export interface SimCall {
  action: SimAction;
  vmId: string;
  node: string;
  ok: boolean;
}

export class SimulatorDriver implements HypervisorDriver {
  /** Every driver call this instance made, in order (tests count them). */
  readonly calls: SimCall[] = [];

  /** `name`: the one it registers under (a test can register a second simulator under another). */
  constructor(
    private readonly db: Db,
    readonly name: string = 'simulator',
  ) {}

  /** Arms `count` failures of `action` on a node, or on one VM when vmId is given. */
  async injectFault(target: { node: string; vmId?: string }, action: SimAction, count: number): Promise<void> {
    await repo.armFault(this.db, target.vmId ? `vm:${target.vmId}` : target.node, action, count);
  }

  async addTraffic(vmId: string, bytes: number): Promise<void> {
    await repo.addTraffic(this.db, vmId, bytes);
  }

  private async call(action: SimAction, vm: { id: string; node: string }): Promise<void> {
    const fail = await repo.takeFault(this.db, action, vm.id, vm.node);
    this.calls.push({ action, vmId: vm.id, node: vm.node, ok: !fail });
    if (fail)
      throw new DriverError(action === 'snapshot' ? 'provision' : action, `simulated ${action} failure on ${vm.node}`);
  }

  static ipFor(vmid: number): string {
    return `10.${100 + ((vmid >> 16) & 63)}.${(vmid >> 8) & 255}.${vmid & 255}`;
  }

  async provision(spec: VmSpec): Promise<Provisioned> {
    await this.call('provision', spec);
    return { hvRef: `sim-${spec.vmid}`, ipAddress: SimulatorDriver.ipFor(spec.vmid) };
  }

  async start(vm: VmRef): Promise<{ ipAddress?: string }> {
    await this.call('start', vm);
    return { ipAddress: SimulatorDriver.ipFor(vm.vmid) };
  }

  /** A simulated disk travels at once; its bytes are the disk's size. */
  async move(spec: VmSpec, _from: string): Promise<Moved> {
    await this.call('move', spec);
    return { hvRef: `sim-${spec.vmid}`, ipAddress: SimulatorDriver.ipFor(spec.vmid), bytes: spec.storageGb * 2 ** 30 };
  }

  async release(_vm: VmRef): Promise<void> {}

  /** A simulated VM has no disk to copy: a snapshot of it holds no content. */
  async exportDisk(vm: VmRef): Promise<null> {
    await this.call('snapshot', vm);
    return null;
  }

  async dropExport(_vm: VmRef): Promise<void> {}

  async stop(vm: VmRef): Promise<void> {
    await this.call('stop', vm);
  }

  async destroy(vm: VmRef): Promise<void> {
    await this.call('destroy', vm);
    await repo.forgetTraffic(this.db, vm.id);
  }

  async trafficBytes(_node: string, vms: readonly VmRef[]): Promise<Map<string, number>> {
    return repo.trafficOf(
      this.db,
      vms.map((vm) => vm.id),
    );
  }
}
