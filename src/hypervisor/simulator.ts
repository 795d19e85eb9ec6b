/**
 * The simulated hypervisor (see docs/vms.md#simulated-and-real-vms): instant calls, deterministic IP
 * addresses, faults switched on per node or per VM through the database (so
 * every service instance sees them), and a record of calls for tests.
 * The provisioning delay is applied by the reconciler on the service clock.
 */
import type { Db } from '../db/db.js';
import {
  DriverError,
  type HvAction,
  type HypervisorDriver,
  type Provisioned,
  type VmRef,
  type VmSpec,
} from './driver.js';

export interface SimCall {
  action: HvAction;
  vmId: string;
  node: string;
  ok: boolean;
}

export class SimulatorDriver implements HypervisorDriver {
  readonly name = 'simulator' as const;
  /** Every driver call this instance made, in order (tests count them). */
  readonly calls: SimCall[] = [];

  constructor(private readonly db: Db) {}

  /** Arms `count` failures of `action` on a node, or on one VM when vmId is given. */
  async injectFault(target: { node: string; vmId?: string }, action: HvAction, count: number): Promise<void> {
    const key = target.vmId ? `vm:${target.vmId}` : target.node;
    await this.db.query(
      `INSERT INTO sim_faults (target, action, remaining) VALUES ($1, $2, $3)
       ON CONFLICT (target, action) DO UPDATE SET remaining = EXCLUDED.remaining`,
      [key, action, count],
    );
  }

  async addTraffic(vmId: string, bytes: number): Promise<void> {
    await this.db.query(
      'INSERT INTO sim_traffic (vm_id, bytes) VALUES ($1, $2) ON CONFLICT (vm_id) DO UPDATE SET bytes = sim_traffic.bytes + EXCLUDED.bytes',
      [vmId, bytes],
    );
  }

  /** Consumes one armed fault for this VM or its node, if any. */
  private async fails(action: HvAction, vm: { id: string; node: string }): Promise<boolean> {
    const r = await this.db.query(
      `UPDATE sim_faults SET remaining = remaining - 1
        WHERE (target, action) = (
          SELECT target, action FROM sim_faults
           WHERE action = $1 AND remaining > 0 AND target IN ($2, $3)
           ORDER BY target LIKE 'vm:%' DESC LIMIT 1 FOR UPDATE)
        RETURNING target`,
      [action, `vm:${vm.id}`, vm.node],
    );
    return r.rowCount === 1;
  }

  private async call(action: HvAction, vm: { id: string; node: string }): Promise<void> {
    const fail = await this.fails(action, vm);
    this.calls.push({ action, vmId: vm.id, node: vm.node, ok: !fail });
    if (fail) throw new DriverError(action, `simulated ${action} failure on ${vm.node}`);
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

  async stop(vm: VmRef): Promise<void> {
    await this.call('stop', vm);
  }

  async destroy(vm: VmRef): Promise<void> {
    await this.call('destroy', vm);
    await this.db.query('DELETE FROM sim_traffic WHERE vm_id = $1', [vm.id]);
  }

  async trafficBytes(_node: string, vms: readonly VmRef[]): Promise<Map<string, number>> {
    const r = await this.db.query<{ vm_id: string; bytes: number }>(
      'SELECT vm_id, bytes FROM sim_traffic WHERE vm_id = ANY($1::uuid[])',
      [vms.map((vm) => vm.id)],
    );
    return new Map(r.rows.map((row) => [row.vm_id, row.bytes]));
  }
}
