/**
 * The hypervisor drivers by name (docs/architecture.md#hypervisor-drivers). Each node is driven by the
 * driver it names, so a fleet can mix hosts run by their host agent, simulated nodes and, with a
 * driver registered for it, hosts of another hypervisor; the rest of the service sees one driver.
 */
import {
  DriverError,
  type DiskExport,
  type HypervisorDriver,
  type Moved,
  type Provisioned,
  type VmRef,
  type VmSpec,
} from './driver.js';

export class DriverRegistry implements HypervisorDriver {
  readonly name = 'registry';
  private readonly drivers = new Map<string, HypervisorDriver>();

  /** `driverOf` names the driver of a node. */
  constructor(private readonly driverOf: (node: string) => Promise<string>) {}

  /** Registers a driver under its name; nodes that name it are driven by it. */
  register(driver: HypervisorDriver): void {
    if (this.drivers.has(driver.name)) throw new Error(`a driver named ${driver.name} is already registered`);
    this.drivers.set(driver.name, driver);
  }

  /** The names registered, in the order they were. */
  names(): string[] {
    return [...this.drivers.keys()];
  }

  private async pick(node: string): Promise<HypervisorDriver> {
    const name = await this.driverOf(node);
    const driver = this.drivers.get(name);
    if (!driver) throw new Error(`node ${node} names the driver ${name}, which this version does not have`);
    return driver;
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
  /** A disk moves between two nodes of the same driver, never from one kind to another. */
  async move(spec: VmSpec, from: string): Promise<Moved> {
    const [to, source] = [await this.pick(spec.node), await this.pick(from)];
    if (to !== source) throw new DriverError('move', `${from} and ${spec.node} are not run by the same kind of driver`);
    return to.move(spec, from);
  }
  async destroy(vm: VmRef): Promise<void> {
    return (await this.pick(vm.node)).destroy(vm);
  }
  async release(vm: VmRef): Promise<void> {
    return (await this.pick(vm.node)).release(vm);
  }
  async exportDisk(vm: VmRef): Promise<DiskExport | null> {
    return (await this.pick(vm.node)).exportDisk(vm);
  }
  async dropExport(vm: VmRef): Promise<void> {
    return (await this.pick(vm.node)).dropExport(vm);
  }
  async trafficBytes(node: string, vms: readonly VmRef[]): Promise<Map<string, number>> {
    return (await this.pick(node)).trafficBytes(node, vms);
  }
}
