/**
 * The hypervisor behind one small interface. Drivers are called only by the
 * hypervisor-actions job, never inside an HTTP request, and every call must be safe to
 * repeat (the job retries after crashes). A call may take long (a real
 * VM boots for tens of seconds): the job runs calls concurrently.
 */
export type HvAction = 'provision' | 'start' | 'stop' | 'destroy' | 'move';
export const HV_ACTIONS: readonly HvAction[] = ['provision', 'start', 'stop', 'destroy', 'move'];

export interface VmSpec {
  id: string;
  vmid: number;
  node: string;
  gpuType: string;
  gpuCount: number;
  storageGb: number;
  ramGb: number;
  cpuCores: number;
  templateVmid: number;
  /** The template's login user (a host that builds the VM from a disk may not know the template). */
  user?: string;
  /**
   * Build the VM from this customer image instead of its template: where its content is in the
   * control plane's image store (the driver adds the node's credentials).
   */
  image?: { url: string; sha256: string; sizeBytes: number; format: 'qcow2' | 'raw' };
  /** Guest ports the access portal may reach (the template's web services and the customer's HTTP ports). */
  webPorts: number[];
  authMethod: 'ssh_key' | 'password';
  sshPublicKey: string | null;
  password: string | null;
}

export interface VmRef {
  id: string;
  vmid: number;
  node: string;
  hvRef: string | null;
}

/** A stopped VM's disk as one standalone image another party may download (a snapshot's source). */
export interface DiskExport {
  /** `GET` with `Authorization: Bearer <token>` answers the bytes (and `Range`). */
  url: string;
  token: string;
  sha256: string;
  sizeBytes: number;
  format: 'qcow2';
}

/** What a move gives back: the VM as built on its new node, and the bytes its disk took on the way. */
export interface Moved extends Provisioned {
  bytes: number;
}

/** What building a VM gives back. */
export interface Provisioned {
  hvRef: string;
  ipAddress: string;
  /** How to reach the VM over SSH, when the driver knows (a host agent does). */
  access?: { host: string; port: number; user: string };
  /** Host devices (PCI addresses) passed through to the VM. */
  gpuDevices?: string[];
}

export interface HypervisorDriver {
  /** The name it is registered under, which nodes name (docs/architecture.md#hypervisor-drivers). */
  readonly name: string;
  /** Clones the template, sets resources, keys or password; does not start it. */
  provision(spec: VmSpec): Promise<Provisioned>;
  /** Starts the VM; `gpuDevices` are the host devices bound to it for this run, when the driver knows. */
  start(vm: VmRef): Promise<{ ipAddress?: string; gpuDevices?: string[] }>;
  stop(vm: VmRef): Promise<void>;
  /**
   * Moves a stopped VM's disk from the node `from` to `spec.node` and builds the VM there from it
   * (docs/vms.md#start-on-another-host): the copy on `spec.node` is verified before the one on
   * `from` is released (release(), once the VM's new node is recorded), and a failure leaves the
   * copy on `from` as it was. Safe to repeat.
   */
  move(spec: VmSpec, from: string): Promise<Moved>;
  /**
   * Makes a stopped VM's disk one standalone image and says where to download it from; null for a
   * hypervisor whose VMs have no disk to copy (the simulator). Safe to repeat.
   */
  exportDisk(vm: VmRef): Promise<DiskExport | null>;
  /** Removes an export once it was copied; safe to repeat. */
  dropExport(vm: VmRef): Promise<void>;
  /** Removes what is left of a VM on a node it moved away from (`vm.node` is that node); safe to repeat. */
  release(vm: VmRef): Promise<void>;
  /** Removes the VM and its disks; a VM that does not exist counts as destroyed. */
  destroy(vm: VmRef): Promise<void>;
  /**
   * Cumulative network bytes of some VMs of one node (for metering), by VM
   * id: one call per node, however many VMs it runs. A VM left out has no
   * new reading.
   */
  trafficBytes(node: string, vms: readonly VmRef[]): Promise<Map<string, number>>;
}

export class DriverError extends Error {
  constructor(
    readonly action: HvAction,
    message: string,
  ) {
    super(message);
    this.name = 'DriverError';
  }
}
