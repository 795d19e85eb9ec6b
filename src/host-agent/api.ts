/**
 * The agent API's wire shapes (version 1): what `gpucloud agent` answers and
 * what the control plane sends. One definition for both sides; the routes
 * are in src/host-agent/server.ts, the control plane's client in
 * src/hypervisor/host-agent-client.ts.
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
  /**
   * stopped: no QEMU process; booting: QEMU runs, SSH not up yet; running: SSH answers.
   * importing: the VM is being built from a disk source (`disk` in its provision spec) and its
   * download runs or failed (`import` says which); it becomes `stopped` once its disk is verified.
   */
  state: 'stopped' | 'booting' | 'running' | 'stopping' | 'importing';
  /** While `importing`: the download's progress, and why it stopped if it failed (the next provision resumes it). */
  import?: { bytes_done: number; size_bytes: number; error: string | null };
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
  /**
   * Build the VM from this disk instead of the template (the template need not be on the host):
   * another host's export of the VM's disk (a move), or an image in the control plane's store.
   * The provision answers at once with state `importing`; the disk is downloaded (resumed from
   * what an earlier attempt left), its SHA-256 and image checked, grown to `storage_gb`, and
   * the VM becomes `stopped`. Repeating the provision while it imports changes nothing.
   */
  disk?: AgentDiskSource;
  /**
   * The template's login user, for a VM built from `disk` on a host that may not know the template
   * (a template's own user wins when the host holds it). Absent: the host's template, else root.
   */
  user?: string;
}

/** Where a VM's disk comes from when it is not a template (see AgentProvisionSpec.disk). */
export interface AgentDiskSource {
  /** `GET` answers the bytes and honours `Range: bytes=N-`. */
  url: string;
  /** Sent as `Authorization: Bearer`: another host's transfer token, or this host's own node token. */
  token: string;
  sha256: string;
  size_bytes: number;
  format: 'qcow2' | 'raw';
}

/**
 * `POST /v1/vms/{id}/export` (body AgentExportRequest): a stopped VM's disk flattened into one
 * standalone qcow2 file beside it (no backing file), hashed, and served at
 * `GET /v1/vms/{id}/export/disk` (with `Range`) to the bearer of the export's transfer token
 * or of the node's own token. Repeat-safe: a ready export is answered as it is. The VM cannot
 * start while it exports; `DELETE /v1/vms/{id}/export` removes the file (destroy does too).
 */
export interface AgentExportRequest {
  /** The transfer token the destination presents (at least 32 characters). */
  token: string;
}

export interface AgentExportState {
  state: 'exporting' | 'ready' | 'failed';
  sha256: string | null;
  size_bytes: number | null;
  format: 'qcow2';
  error: string | null;
}

/** The HTTP upgrade that opens a tunnel to a VM's web port: `GET /v1/vms/{id}/tunnel?port=N`. */
export const TUNNEL_PROTOCOL = 'gpucloud-tunnel';
