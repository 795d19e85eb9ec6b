/**
 * The agent API's wire shapes (version 1): what `gpucloud agent` answers and
 * what the control plane sends. One definition for both sides; the routes
 * are in src/agent/server.ts, the control plane's client in
 * src/hypervisor/agent-client.ts.
 */

export const AGENT_API = '/v1';

export interface AgentHostGpu {
  pci_address: string;
  model: string;
  vfio: boolean;
  iommu_group: number | null;
  /** The VM the device is bound to now (only a VM whose QEMU runs holds one), or null. */
  vm_id: string | null;
}

export interface AgentVmState {
  id: string;
  /** stopped: no QEMU process; booting: QEMU runs, SSH not up yet; running: SSH answers. */
  state: 'stopped' | 'booting' | 'running' | 'stopping';
  ssh: { host: string; port: number; user: string };
  /** The devices bound to the VM now: given at start, given back whenever it stops. */
  gpus: string[];
  /** Why the VM last stopped without being asked to: the guest powered off, or QEMU died. */
  exit_reason: 'guest_powered_off' | 'crashed' | null;
  traffic: { rx_bytes: number; tx_bytes: number; counted: boolean };
}

export interface AgentHostInfo {
  agent_version: string;
  accel: 'kvm' | 'tcg';
  host_cpu_model: string;
  host_gpus: AgentHostGpu[];
  public_host: string;
  templates: { vmid: number; user: string }[];
  vms: AgentVmState[];
}

export interface AgentProvisionSpec {
  vmid: number;
  template_vmid: number;
  cpu_cores: number;
  ram_mb: number;
  storage_gb: number;
  gpu_count: number;
  auth_method: 'ssh_key' | 'password';
  ssh_public_key: string | null;
  password: string | null;
  /**
   * The guest ports the access portal may reach through the agent's tunnel (the template's web
   * services and the customer's own HTTP ports); any other port is refused. Absent: none.
   */
  web_ports?: number[];
}

/** The HTTP upgrade that opens a tunnel to a VM's web port: `GET /v1/vms/{id}/tunnel?port=N`. */
export const TUNNEL_PROTOCOL = 'gpucloud-tunnel';
