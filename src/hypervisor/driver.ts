/**
 * The hypervisor behind one small interface. Drivers are called only by the
 * reconcilers, never inside an HTTP request, and every call must be safe to
 * repeat (the reconciler retries after crashes). A call may take long (a real
 * VM boots for tens of seconds): the reconciler runs calls concurrently.
 */
export type HvAction = 'provision' | 'start' | 'stop' | 'destroy';
export const HV_ACTIONS: readonly HvAction[] = ['provision', 'start', 'stop', 'destroy'];

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
  readonly name: 'simulator' | 'agent' | 'per-node';
  /** Clones the template, sets resources, keys or password; does not start it. */
  provision(spec: VmSpec): Promise<Provisioned>;
  /** Starts the VM; `gpuDevices` are the host devices bound to it for this run, when the driver knows. */
  start(vm: VmRef): Promise<{ ipAddress?: string; gpuDevices?: string[] }>;
  stop(vm: VmRef): Promise<void>;
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
