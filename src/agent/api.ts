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
  /** Every template the host holds or was asked to hold, with its state (agents before 1.2 send only vmid and user). */
  templates: AgentTemplateState[];
  vms: AgentVmState[];
}

/**
 * One template on a host. `pulled`: downloaded from the control plane's image store because the
 * control plane asked for it (`PUT /v1/templates`); `local`: added on the host with
 * `gpucloud agent template add` (air-gapped hosts), kept until removed there.
 */
export interface AgentTemplateState {
  vmid: number;
  user: string;
  /** The image's SHA-256 (lowercase hex); null for a local template added before images had checksums. */
  sha256?: string | null;
  source?: 'pulled' | 'local';
  /** queued: waiting for the one download at a time; ready: VMs can be built from it. */
  state?: 'queued' | 'downloading' | 'ready' | 'failed';
  bytes_done?: number;
  size_bytes?: number;
  /** Why it failed (checksum mismatch, disk full, the download refused...), else null. */
  reason?: string | null;
}

/**
 * `PUT /v1/templates`: the templates this host must hold, the whole set each time (the control
 * plane sends it with every heartbeat). The agent queues downloads of what it lacks, and removes
 * pulled images that no template in the set uses once no VM on the host is built from them.
 * Local templates are never removed by it. Answers the states, as `GET /v1/host` does.
 */
export interface AgentDesiredTemplates {
  templates: AgentDesiredTemplate[];
}

export interface AgentDesiredTemplate {
  vmid: number;
  /** The login user the seed creates (with passwordless sudo). */
  user: string;
  sha256: string;
  size_bytes: number;
  format: 'qcow2' | 'raw';
  /**
   * Where to download it: the control plane's `GET /agent/v1/nodes/{node}/images/{sha256}`, which
   * takes this agent's own token as `Authorization: Bearer` and answers `Range` requests.
   */
  url: string;
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
