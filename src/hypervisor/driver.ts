/**
 * The hypervisor behind one small interface (CONTRACT D29). Drivers are
 * called only by the reconcilers, never inside an HTTP request, and every
 * call must be safe to repeat (the reconciler retries after crashes).
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

export interface HypervisorDriver {
  readonly name: 'simulator' | 'proxmox';
  /** Clones the template, sets resources, keys or password; does not start it. */
  provision(spec: VmSpec): Promise<{ hvRef: string; ipAddress: string }>;
  start(vm: VmRef): Promise<{ ipAddress?: string }>;
  stop(vm: VmRef): Promise<void>;
  /** Removes the VM and its disks; a VM that does not exist counts as destroyed. */
  destroy(vm: VmRef): Promise<void>;
  /** Cumulative network bytes of the VM (for metering). */
  trafficBytes(vm: VmRef): Promise<number>;
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
