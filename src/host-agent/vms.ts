/**
 * The VMs of one host. Each VM is a folder DATA/vms/VMID holding everything
 * about it: vm.json (what it is: template, size, SSH port, GPUs), disk.qcow2
 * (a copy-on-write overlay on its template), the cloud-init seed, and while
 * QEMU runs its pid file, QMP socket and serial console log.
 *
 * Rules:
 * - QEMU runs daemonized in its own session: it outlives the agent. A new
 *   agent re-attaches to every VM whose pid is alive (checked against its
 *   command line, so a recycled pid is not taken for it) through its QMP
 *   socket, and never stops or restarts a VM because the agent restarted.
 * - One operation at a time per VM (a per-VM queue); every operation is safe
 *   to repeat: provisioning a VM that exists returns it, stopping a stopped
 *   VM or destroying a missing one does nothing.
 * - Operations on different VMs run at the same time, so whatever two VMs
 *   must not share (a vmid, an SSH port, a bridge address, a GPU) is claimed
 *   synchronously, before the operation's first await, and given back if the
 *   operation fails.
 * - GPUs are bound only while QEMU runs: a VM gets its devices when it starts
 *   and gives them back whenever it stops (asked, powered off by its guest,
 *   crashed) or is destroyed. A stopped VM holds no device, so the host agrees
 *   with the control plane, which gives a stopped VM's GPUs to the next renter
 *   (a reserved VM's stay counted there, so its start always finds them free).
 * - The serial console goes to a socket the agent reads into a capped log
 *   (qemu/console.ts): a guest cannot fill the host's disk through it.
 * - A VM is `running` once its customer can log in and stay logged in: after
 *   cloud-init's final message (the seed's boot marker) on its console and an
 *   SSH answer, or for a guest without cloud-init once SSH answers (the banner
 *   is read: user-mode networking accepts TCP before the guest listens);
 *   qemu/boot.ts.
 * - A VM whose QEMU ends without being asked is `stopped`, with the reason:
 *   `guest_powered_off` after a SHUTDOWN event from the guest, `crashed`
 *   when the process died without one.
 * - Destroy removes the VM's folder: no disk outlives its VM (nor its export).
 * - A VM can also be built from a downloaded disk instead of its template
 *   (`disk` in the provision spec, images/import.ts): it is `importing` until
 *   the disk is verified and its folder built. A stopped VM's disk can be
 *   exported for another host (images/export.ts); it cannot start meanwhile.
 * - Nothing from a request reaches a path or QEMU's command line without
 *   passing a narrow check first (ids, numbers, keys, the template's user).
 */
import { execFile } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { qemuArgs, qmpArg, vmFiles } from './qemu/command.js';
import { isAlive, launchQemu, readPid } from './qemu/process.js';
import { QmpClient } from './qemu/qmp.js';
import { ConsoleLog } from './qemu/console.js';
import { ConsoleScanner, bootedFile, isBooted, markBooted, waitForBoot } from './qemu/boot.js';
import { fakeGpus, scanGpus, type HostGpu } from './gpus/scan.js';
import { bootMarker, hashPassword, writeSeed } from './images/seed.js';
import { freePortInRange, loopbackPort, sshBanner } from './network/ssh-probe.js';
import { tapCounters } from './network/traffic.js';
import {
  applyForwards,
  ensureBridge,
  ensureTap,
  gatewayOf,
  hostCount,
  macOf,
  removeTap,
  tapName,
  vmAddress,
  type Subnet,
} from './network/bridge.js';
import type { TemplateStore } from './templates.js';
import type { AgentExportState, AgentProvisionSpec, AgentVmState } from './api.js';
import { DiskExports } from './images/export.js';
import { DiskImports, importUser, placeDisk, type ImportSpec } from './images/import.js';

const run = promisify(execFile);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

export class AgentError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
    this.name = 'AgentError';
  }
}

export type ProvisionSpec = AgentProvisionSpec;

/** What is kept in vm.json: enough to run the VM again after any restart. */
interface VmRecord {
  id: string;
  vmid: number;
  template_vmid: number;
  /** The image the disk stands on (a pulled image or a local template); absent in older records. */
  image?: { sha256: string | null; path: string; format: 'qcow2' | 'raw' };
  /** Instead of `image`: the disk was downloaded whole (an import), it stands on nothing. */
  disk_source?: { sha256: string; format: 'qcow2' | 'raw' };
  user: string;
  cpu_cores: number;
  ram_mb: number;
  storage_gb: number;
  ssh_port: number;
  /** How many GPUs the VM gets whenever it starts. */
  gpu_count: number;
  /** The devices bound to it now: set at start, emptied whenever QEMU ends. */
  gpus: string[];
  /** Guest ports the portal may reach through the tunnel. */
  web_ports?: number[];
  /** User networking: the loopback port QEMU forwards to each web port, chosen at each start. */
  web_forwards?: { guest: number; host: number }[];
  created_at: string;
  /** Bridge networking: the VM's address, MAC and tap device. */
  net?: { ip: string; mac: string; tap: string };
}

type State = AgentVmState['state'];

interface Runtime {
  state: State;
  qmp: QmpClient | null;
  pid: number | null;
  exitReason: 'guest_powered_off' | 'crashed' | null;
  /** Set while the agent itself ends the process (stop, destroy): no crash then. */
  expectingExit: boolean;
  guestShutdown: boolean;
  generation: number;
  /** The reader of the VM's serial console while QEMU runs. */
  console: ConsoleLog | null;
  /** What the current run's console has shown of cloud-init (qemu/boot.ts). */
  boot: ConsoleScanner | null;
}

/** A VM as the agent API shows it. */
export type VmView = AgentVmState;

export interface VmManagerOptions {
  dataDir: string;
  accel: 'kvm' | 'tcg';
  publicHost: string;
  /** Where QEMU's SSH port forward listens: loopback for a loopback public host, else every address. */
  forwardHost: string;
  sshPorts: { from: number; to: number };
  fakeGpus: number;
  /** user: QEMU's user-mode networking (no root, no traffic counters); bridge: taps on a bridge (root). */
  network?: { kind: 'user' } | { kind: 'bridge'; subnet: Subnet; nameservers: string[] };
  qemuBinary?: string;
  /** For tests: where to look for GPUs. */
  sysRoot?: string;
  /** The cap on imported disks' downloads in MB/s (--download-limit), or null. */
  downloadLimitMbps?: number | null;
  log?: (msg: string, data?: Record<string, unknown>) => void;
}

export class VmManager {
  private readonly vmsDir: string;
  private readonly records = new Map<string, VmRecord>();
  private readonly runtime = new Map<string, Runtime>();
  private readonly queues = new Map<string, Promise<unknown>>();
  /** SSH ports of every VM, and of provisions under way. */
  private readonly ports = new Set<number>();
  /** vmids and bridge addresses of provisions under way (the records hold the others). */
  private readonly provisioningVmids = new Set<number>();
  private readonly provisioningAddresses = new Set<string>();
  private readonly hostGpus: HostGpu[];
  private closed = false;
  readonly exports: DiskExports;
  private readonly imports: DiskImports;

  constructor(
    private readonly opts: VmManagerOptions,
    private readonly templates: TemplateStore,
  ) {
    this.vmsDir = join(opts.dataDir, 'vms');
    templates.track(() => [...this.records.values()].map((r) => r.image));
    this.hostGpus = opts.fakeGpus > 0 ? fakeGpus(opts.fakeGpus) : scanGpus(opts.sysRoot);
    this.exports = new DiskExports((msg, data) => this.log(msg, data));
    this.imports = new DiskImports({
      vmsDir: this.vmsDir,
      limitMbps: opts.downloadLimitMbps ?? null,
      install: (id, spec, file, virtualSize) => this.installImport(id, spec, file, virtualSize),
      log: (msg, data) => this.log(msg, data),
    });
    // A unix socket path is at most 107 bytes: refuse a data dir that cannot hold one.
    const probe = join(this.vmsDir, '999999999', 'qmp.sock');
    if (Buffer.byteLength(probe) > 107)
      throw new Error(`the data directory path is too long for QEMU's sockets (${probe}); use a shorter --data-dir`);
  }

  get gpus(): HostGpu[] {
    return this.hostGpus;
  }

  /** Loads every VM folder and re-attaches to the QEMU processes still running. */
  async load(): Promise<void> {
    mkdirSync(this.vmsDir, { recursive: true, mode: 0o700 });
    const bridge = this.bridge();
    if (bridge) await ensureBridge(bridge.subnet);
    for (const name of readdirSync(this.vmsDir)) {
      const file = join(this.vmsDir, name, 'vm.json');
      if (!/^\d+$/.test(name) || !existsSync(file)) {
        // A provisioning that died half-way: nothing refers to it.
        if (name.includes('.tmp-')) rmSync(join(this.vmsDir, name), { recursive: true, force: true });
        continue;
      }
      const rec = JSON.parse(readFileSync(file, 'utf8')) as VmRecord;
      // Records written before GPUs were bound at start held theirs from provisioning on.
      if (typeof rec.gpu_count !== 'number') rec.gpu_count = rec.gpus.length;
      this.records.set(rec.id, rec);
      this.ports.add(rec.ssh_port);
      // After a host reboot the taps are gone; a running VM still holds its own.
      if (bridge && rec.net) await ensureTap(rec.net.tap);
      const rt = this.rt(rec.id);
      const dir = this.dir(rec);
      const pid = readPid(vmFiles(dir).pidFile);
      if (pid !== null && isAlive(pid, qmpArg(dir))) {
        try {
          await this.attach(rec, pid);
          this.readConsole(rec);
          rt.state = isBooted(dir) ? 'running' : 'booting';
          if (rt.state === 'booting') void this.watchBoot(rec, rt.generation);
          this.log('re-attached to a running VM', { vm: rec.id, pid, state: rt.state });
        } catch (err) {
          this.log('could not re-attach; leaving the VM process alone', { vm: rec.id, pid, err: String(err) });
          rt.state = 'running';
          rt.pid = pid;
          void this.watchPid(rec, rt.generation);
        }
      } else {
        this.cleanRunFiles(dir);
        this.releaseGpus(rec); // its QEMU ended while no agent ran
      }
    }
    // Imports an earlier agent left: listed `importing` until the next provision resumes them.
    for (const r of this.imports.load((id) => this.records.has(id))) {
      const rec = r as VmRecord;
      this.records.set(rec.id, rec);
      this.ports.add(rec.ssh_port);
      this.rt(rec.id).state = 'importing';
    }
    await this.syncForwards();
  }

  private bridge(): { subnet: Subnet; nameservers: string[] } | null {
    const n = this.opts.network;
    return n && n.kind === 'bridge' ? n : null;
  }

  /** The NAT rules for every VM's SSH port (bridge networking). */
  private async syncForwards(): Promise<void> {
    const bridge = this.bridge();
    if (!bridge) return;
    const forwards = [...this.records.values()].filter((r) => r.net).map((r) => ({ port: r.ssh_port, ip: r.net!.ip }));
    await applyForwards(bridge.subnet, forwards);
  }

  /** Claims a free bridge address (given back with `provisioningAddresses.delete` if the provision fails). */
  private allocateAddress(subnet: Subnet): string {
    const used = new Set([...this.records.values()].map((r) => r.net?.ip));
    for (let host = 2; host <= hostCount(subnet) + 1; host++) {
      const ip = vmAddress(subnet, host);
      if (!used.has(ip) && !this.provisioningAddresses.has(ip)) {
        this.provisioningAddresses.add(ip);
        return ip;
      }
    }
    throw new AgentError(409, 'no_addresses', 'no free address left in the VM subnet');
  }

  private log(msg: string, data?: Record<string, unknown>): void {
    this.opts.log?.(msg, data);
  }

  private rt(id: string): Runtime {
    let r = this.runtime.get(id);
    if (!r) {
      r = {
        state: 'stopped',
        qmp: null,
        pid: null,
        exitReason: null,
        expectingExit: false,
        guestShutdown: false,
        generation: 0,
        console: null,
        boot: null,
      };
      this.runtime.set(id, r);
    }
    return r;
  }

  private dir(rec: Pick<VmRecord, 'vmid'>): string {
    return join(this.vmsDir, String(rec.vmid));
  }

  /** Where the guest's SSH answers from here: its own address on the bridge, else QEMU's forward. */
  private probe(rec: VmRecord): { host: string; port: number } {
    if (rec.net) return { host: rec.net.ip, port: 22 };
    return { host: this.opts.forwardHost === '0.0.0.0' ? '127.0.0.1' : this.opts.forwardHost, port: rec.ssh_port };
  }

  /** Runs operations on one VM one after another. */
  private serial<T>(id: string, fn: () => Promise<T>): Promise<T> {
    const prev = this.queues.get(id) ?? Promise.resolve();
    const next = prev.catch(() => undefined).then(fn);
    const tail = next.then(
      () => undefined,
      () => undefined,
    );
    this.queues.set(id, tail);
    void tail.then(() => {
      if (this.queues.get(id) === tail) this.queues.delete(id);
    });
    return next;
  }

  private mustGet(id: string): VmRecord {
    if (!UUID.test(id)) throw new AgentError(404, 'not_found', 'no such VM');
    const rec = this.records.get(id);
    if (!rec) throw new AgentError(404, 'not_found', `VM ${id} is not on this host`);
    return rec;
  }

  view(id: string): VmView {
    const rec = this.mustGet(id);
    const rt = this.rt(id);
    return {
      id,
      state: rt.state,
      ssh: { host: this.opts.publicHost, port: rec.ssh_port, user: rec.user },
      gpus: rec.gpus,
      exit_reason: rt.state === 'stopped' ? rt.exitReason : null,
      traffic: this.traffic(rec),
      ...(rt.state === 'importing'
        ? { import: this.imports.progress(id) ?? { bytes_done: 0, size_bytes: 0, error: null } }
        : {}),
    };
  }

  /** A tap's counters, named from the guest's side; user-mode networking has none (docs/agent.md). */
  private traffic(rec: VmRecord): VmView['traffic'] {
    const c = rec.net ? tapCounters(rec.net.tap) : null;
    // Host side rx is what the guest sent; tx what it received.
    return c
      ? { rx_bytes: c.txBytes, tx_bytes: c.rxBytes, counted: true }
      : { rx_bytes: 0, tx_bytes: 0, counted: false };
  }

  list(): VmView[] {
    return [...this.records.keys()].sort().map((id) => this.view(id));
  }

  templateInUse(vmid: number): boolean {
    return [...this.records.values()].some((r) => r.template_vmid === vmid && !r.disk_source);
  }

  /**
   * Where the agent connects for the portal's tunnel to a web port of a running VM: the guest's own
   * address on the bridge, else QEMU's loopback forward of that port.
   */
  tunnelTarget(id: string, port: number): { host: string; port: number } {
    const rec = this.mustGet(id);
    if (!(rec.web_ports ?? []).includes(port))
      throw new AgentError(403, 'port_not_declared', `port ${port} is not a web port of VM ${id}`);
    const state = this.rt(id).state;
    if (state !== 'running' && state !== 'booting') throw new AgentError(409, 'not_running', `VM ${id} is ${state}`);
    if (rec.net) return { host: rec.net.ip, port };
    const forward = rec.web_forwards?.find((f) => f.guest === port);
    if (!forward) throw new AgentError(409, 'not_running', `VM ${id} was started without a forward for port ${port}`);
    return { host: '127.0.0.1', port: forward.host };
  }

  /** Which VM holds each bound GPU, by PCI address. */
  gpuHolders(): Map<string, string> {
    const holders = new Map<string, string>();
    for (const r of this.records.values()) for (const g of r.gpus) holders.set(g, r.id);
    return holders;
  }

  /** The end of a VM's serial console (the capped log the agent keeps). */
  consoleTail(id: string, bytes: number): Buffer {
    return ConsoleLog.tail(vmFiles(this.dir(this.mustGet(id))).consoleLog, bytes);
  }

  /** Writes vm.json whole (a temporary file renamed into place). */
  private save(rec: VmRecord): void {
    const file = join(this.dir(rec), 'vm.json');
    writeFileSync(`${file}.tmp`, JSON.stringify(rec, null, 2) + '\n', { mode: 0o600 });
    renameSync(`${file}.tmp`, file);
  }

  provision(id: string, spec: ProvisionSpec): Promise<VmView> {
    if (!UUID.test(id)) throw new AgentError(422, 'validation_error', 'the VM id must be a UUID');
    return this.serial(id, async () => {
      const existing = this.records.get(id);
      if (existing) {
        if (existing.vmid !== spec.vmid) throw new AgentError(409, 'conflict', `VM ${id} exists with another vmid`);
        // An import that failed (or that an earlier agent left) is tried again; one under way goes on.
        if (this.rt(id).state === 'importing' && spec.disk) {
          existing.disk_source = { sha256: spec.disk.sha256, format: spec.disk.format };
          this.imports.start(existing, existing, spec as ImportSpec);
        }
        return this.view(id);
      }
      for (const r of this.records.values()) {
        if (r.vmid === spec.vmid) throw new AgentError(409, 'conflict', `vmid ${spec.vmid} belongs to VM ${r.id}`);
      }
      if (this.provisioningVmids.has(spec.vmid))
        throw new AgentError(409, 'conflict', `vmid ${spec.vmid} is being provisioned for another VM`);
      this.checkGpuCapacity(spec.gpu_count);
      // Claimed before the first await, given back in `finally` unless the VM was recorded.
      this.provisioningVmids.add(spec.vmid);
      const bridge = this.bridge();
      let address: string | null = null;
      let port: number | null = null;
      let recorded = false;
      try {
        // 409 template_unavailable unless ready; a pulled image changed on disk is verified first.
        // An import needs no template.
        const template = spec.disk ? null : await this.templates.base(spec.template_vmid, id);
        address = bridge ? this.allocateAddress(bridge.subnet) : null;
        port = await freePortInRange(this.opts.sshPorts.from, this.opts.sshPorts.to, this.ports, this.opts.forwardHost);
        if (port === null)
          throw new AgentError(
            409,
            'no_ports',
            `no free SSH port in ${this.opts.sshPorts.from}-${this.opts.sshPorts.to}`,
          );
        const rec: VmRecord = {
          id,
          vmid: spec.vmid,
          template_vmid: spec.template_vmid,
          ...(template
            ? { image: { sha256: template.sha256, path: template.path, format: template.format } }
            : { disk_source: { sha256: spec.disk!.sha256, format: spec.disk!.format } }),
          user: template?.user ?? importUser(this.templates, spec.template_vmid, spec.user),
          cpu_cores: spec.cpu_cores,
          ram_mb: spec.ram_mb,
          storage_gb: spec.storage_gb,
          ssh_port: port,
          gpu_count: spec.gpu_count,
          gpus: [],
          web_ports: [...new Set(spec.web_ports ?? [])].sort((x, y) => x - y),
          created_at: new Date().toISOString(),
          ...(address ? { net: { ip: address, mac: macOf(address), tap: tapName(spec.vmid) } } : {}),
        };
        if (!template) {
          // Listed at once as `importing`; built when its disk is downloaded and verified.
          this.imports.start(rec, rec, spec as ImportSpec);
          this.records.set(id, rec);
          recorded = true;
          this.rt(id).state = 'importing';
          this.log('importing', { vm: id, vmid: rec.vmid, port });
          return this.view(id);
        }
        await this.build(rec, spec, (disk) =>
          run('qemu-img', [
            'create',
            '-q',
            '-f',
            'qcow2',
            '-F',
            template.format,
            '-b',
            template.path,
            disk,
            `${spec.storage_gb}G`,
          ]),
        );
        this.records.set(id, rec);
        recorded = true;
        this.rt(id).state = 'stopped';
        await this.syncForwards();
        this.log('provisioned', { vm: id, vmid: rec.vmid, port });
        return this.view(id);
      } finally {
        this.templates.unlease(id);
        this.provisioningVmids.delete(spec.vmid);
        if (address) this.provisioningAddresses.delete(address);
        if (!recorded && port !== null) this.ports.delete(port);
      }
    });
  }

  /**
   * Builds an imported VM from its verified disk (images/import.ts), in the VM's queue: its folder, the disk
   * (grown to storage_gb), the seed; then it is `stopped`. False when the VM went meanwhile.
   */
  private installImport(id: string, spec: ImportSpec, file: string, virtualSize: number): Promise<boolean> {
    return this.serial(id, async () => {
      const rec = this.records.get(id);
      const rt = this.rt(id);
      if (!rec || rt.state !== 'importing') return false;
      await this.build(rec, spec, (disk) => placeDisk(file, spec.disk.format, virtualSize, rec.storage_gb, disk));
      rt.state = 'stopped';
      rt.exitReason = null;
      await this.syncForwards();
      this.log('imported', { vm: id, vmid: rec.vmid, sha256: spec.disk.sha256 });
      return true;
    });
  }

  /**
   * The VM's folder: built in a temporary folder and renamed into place, so a crash leaves no half VM behind.
   * `makeDisk` writes the VM's disk.qcow2 at the path it is given, after the seed.
   */
  private async build(rec: VmRecord, spec: ProvisionSpec, makeDisk: (disk: string) => Promise<unknown>): Promise<void> {
    const bridge = this.bridge();
    const dir = this.dir(rec);
    const tmp = `${dir}.tmp-${process.pid}`;
    rmSync(tmp, { recursive: true, force: true });
    mkdirSync(tmp, { mode: 0o700 });
    try {
      await writeSeed(tmp, {
        instanceId: rec.id,
        hostname: `gpucloud-${spec.vmid}`,
        user: rec.user,
        authMethod: spec.auth_method,
        sshPublicKeys: spec.auth_method === 'ssh_key' && spec.ssh_public_key ? [spec.ssh_public_key] : [],
        passwordHash: spec.auth_method === 'password' && spec.password ? await hashPassword(spec.password) : null,
        ...(bridge && rec.net
          ? {
              network: {
                mac: rec.net.mac,
                address: `${rec.net.ip}/${bridge.subnet.prefix}`,
                gateway: gatewayOf(bridge.subnet),
                nameservers: bridge.nameservers,
              },
            }
          : {}),
      });
      await makeDisk(join(tmp, 'disk.qcow2'));
      if (rec.net) await ensureTap(rec.net.tap);
      // The seed's source files held the hash; the ISO is all QEMU needs.
      for (const f of ['user-data', 'meta-data', 'network-config']) rmSync(join(tmp, f), { force: true });
      writeFileSync(join(tmp, 'vm.json'), JSON.stringify(rec, null, 2) + '\n', { mode: 0o600 });
      renameSync(tmp, dir);
    } catch (err) {
      rmSync(tmp, { recursive: true, force: true });
      if (rec.net) await removeTap(rec.net.tap).catch(() => undefined);
      if (err instanceof AgentError) throw err;
      const detail = (err as { stderr?: string }).stderr?.trim() || (err as Error).message;
      throw new AgentError(422, 'provision_failed', `could not build the VM's disk or seed: ${detail}`);
    }
  }

  /** GPUs that can be passed through: bound to vfio-pci, or the stand-ins of --fake-gpus. */
  private usableGpus(): HostGpu[] {
    return this.hostGpus.filter((g) => g.vfio || this.opts.fakeGpus > 0);
  }

  /** A VM that asks more GPUs than the host could ever give is refused when it is provisioned. */
  private checkGpuCapacity(count: number): void {
    const usable = this.usableGpus().length;
    if (count <= usable) return;
    const unbound = this.hostGpus.length - usable;
    throw new AgentError(
      409,
      'gpus_unavailable',
      `${count} GPU(s) asked, this host has ${usable}${unbound ? ` (${unbound} more are not bound to vfio-pci)` : ''}`,
    );
  }

  /**
   * Binds the VM's GPUs (synchronously: no other start can take the same
   * device) and records them. A VM that holds its devices already (re-attached
   * while running) keeps them.
   */
  private bindGpus(rec: VmRecord): void {
    if (rec.gpus.length === rec.gpu_count) return;
    rec.gpus = [];
    if (rec.gpu_count === 0) return this.save(rec);
    const held = this.gpuHolders();
    const free = this.usableGpus().filter((g) => !held.has(g.pci_address));
    if (free.length < rec.gpu_count) {
      const unbound = this.hostGpus.filter((g) => !held.has(g.pci_address)).length - free.length;
      throw new AgentError(
        409,
        'gpus_unavailable',
        `${rec.gpu_count} GPU(s) asked, ${free.length} free on this host${unbound ? ` (${unbound} more are not bound to vfio-pci)` : ''}`,
      );
    }
    rec.gpus = free.slice(0, rec.gpu_count).map((g) => g.pci_address);
    this.save(rec);
  }

  /** Gives the VM's devices back (its QEMU has ended). */
  private releaseGpus(rec: VmRecord): void {
    if (rec.gpus.length === 0 || !this.records.has(rec.id)) return;
    rec.gpus = [];
    this.save(rec);
  }

  start(id: string): Promise<VmView> {
    const rec = this.mustGet(id);
    return this.serial(id, async () => {
      const rt = this.rt(id);
      if (rt.state === 'importing')
        throw new AgentError(409, 'importing', `VM ${id} is importing its disk; it can start once it is stopped`);
      if (this.exports.running(id))
        throw new AgentError(409, 'exporting', `VM ${id}'s disk is being exported; it can start once that is done`);
      if (rt.state !== 'stopped') return this.view(id);
      this.bindGpus(rec); // before any await
      try {
        await this.launch(rec, rt);
      } catch (err) {
        this.releaseGpus(rec);
        throw err;
      }
      void this.watchBoot(rec, rt.generation);
      this.log('started', { vm: id, pid: rt.pid, gpus: rec.gpus });
      return this.view(id);
    });
  }

  private async launch(rec: VmRecord, rt: Runtime): Promise<void> {
    const dir = this.dir(rec);
    this.cleanRunFiles(dir);
    if (!rec.net) {
      rec.web_forwards = [];
      for (const guest of rec.web_ports ?? []) rec.web_forwards.push({ guest, host: await loopbackPort() });
      this.save(rec);
    }
    const args = qemuArgs({
      binary: this.opts.qemuBinary,
      name: `gpucloud-${rec.vmid}`,
      vmDir: dir,
      accel: this.opts.accel,
      cpuCores: rec.cpu_cores,
      ramMb: rec.ram_mb,
      diskPath: join(dir, 'disk.qcow2'),
      seedPath: join(dir, 'seed.iso'),
      // Stand-in GPUs of a host without any are never passed to QEMU.
      gpus: this.opts.fakeGpus > 0 ? [] : rec.gpus,
      net: rec.net
        ? { kind: 'tap', ifname: rec.net.tap, mac: rec.net.mac }
        : {
            kind: 'user',
            hostfwdHost: this.opts.forwardHost,
            sshPort: rec.ssh_port,
            webForwards: rec.web_forwards ?? [],
          },
    });
    if (rec.net) await ensureTap(rec.net.tap);
    try {
      await launchQemu(args, { binary: this.opts.qemuBinary });
    } catch (err) {
      throw new AgentError(500, 'start_failed', `QEMU did not start: ${(err as Error).message}`);
    }
    const pid = readPid(vmFiles(dir).pidFile);
    if (pid === null) throw new AgentError(500, 'start_failed', 'QEMU started but wrote no pid file');
    rt.exitReason = null;
    rt.guestShutdown = false;
    rt.expectingExit = false;
    rt.state = 'booting';
    try {
      await this.attach(rec, pid);
    } catch (err) {
      this.log('QMP did not answer after start', { vm: rec.id, err: String(err) });
    }
    this.readConsole(rec);
  }

  /** Reads the VM's serial console into its capped log while QEMU runs. */
  private readConsole(rec: VmRecord): void {
    const rt = this.rt(rec.id);
    rt.console?.close();
    const files = vmFiles(this.dir(rec));
    const log = new ConsoleLog(files.consoleSocket, files.consoleLog);
    rt.console = log;
    const boot = new ConsoleScanner(bootMarker(rec.id));
    rt.boot = boot;
    log.onData((chunk) => boot.feed(chunk));
    void log.open();
  }

  /** Connects to the VM's QMP socket and follows its events and its end. */
  private async attach(rec: VmRecord, pid: number): Promise<void> {
    const rt = this.rt(rec.id);
    rt.pid = pid;
    rt.generation++;
    const generation = rt.generation;
    const socket = vmFiles(this.dir(rec)).qmpSocket;
    let qmp: QmpClient | null = null;
    for (let i = 0; i < 20 && !qmp; i++) {
      try {
        qmp = await QmpClient.connect(socket, { timeoutMs: 2000 });
      } catch (err) {
        if (i === 19) throw err;
        await sleep(100);
      }
    }
    rt.qmp = qmp;
    qmp!.onEvent((ev) => {
      if (ev.event === 'SHUTDOWN' && (ev.data as { guest?: boolean } | undefined)?.guest) rt.guestShutdown = true;
    });
    qmp!.onClose(() => {
      if (rt.generation !== generation) return;
      void this.exited(rec, generation);
    });
  }

  /** QEMU's socket closed: the process is ending. Waits for it and records why it ended. */
  private async exited(rec: VmRecord, generation: number): Promise<void> {
    const rt = this.rt(rec.id);
    for (let i = 0; i < 50 && rt.pid !== null && isAlive(rt.pid); i++) await sleep(100);
    if (rt.generation !== generation) return;
    if (rt.pid !== null && isAlive(rt.pid)) {
      // The socket closed but the process lives (should not happen): keep watching it.
      this.log('QMP closed while QEMU still runs', { vm: rec.id, pid: rt.pid });
      void this.watchPid(rec, generation);
      return;
    }
    const expected = rt.expectingExit;
    rt.exitReason = expected ? null : rt.guestShutdown ? 'guest_powered_off' : 'crashed';
    rt.state = 'stopped';
    rt.qmp = null;
    rt.pid = null;
    rt.console?.close();
    rt.console = null;
    this.cleanRunFiles(this.dir(rec));
    this.releaseGpus(rec);
    if (!expected) this.log('VM ended by itself', { vm: rec.id, reason: rt.exitReason });
  }

  private async watchPid(rec: VmRecord, generation: number): Promise<void> {
    const rt = this.rt(rec.id);
    while (!this.closed && rt.generation === generation && rt.pid !== null && isAlive(rt.pid)) await sleep(1000);
    if (!this.closed && rt.generation === generation) await this.exited(rec, generation);
  }

  /** Waits until the customer can log in and stay logged in (qemu/boot.ts); then the VM is running. */
  private async watchBoot(rec: VmRecord, generation: number): Promise<void> {
    const rt = this.rt(rec.id);
    const current = () => !this.closed && rt.generation === generation && rt.state === 'booting';
    const how = await waitForBoot({
      scanner: rt.boot ?? new ConsoleScanner(bootMarker(rec.id)),
      sshAnswers: async () => (await sshBanner(this.probe(rec).host, this.probe(rec).port, 1500)) !== null,
      current,
    });
    if (how === null || !current()) return;
    rt.state = 'running';
    try {
      markBooted(this.dir(rec), how);
    } catch (err) {
      this.log('could not record the boot', { vm: rec.id, err: String(err) });
    }
    this.log(how === 'cloud-init' ? 'guest ready: cloud-init finished' : 'guest ready: SSH answers', {
      vm: rec.id,
      how,
    });
  }

  /**
   * Stops the VM: an ACPI power-down, then after `timeoutS` a hard quit (and a
   * kill if even that is not obeyed). 0 means a hard stop at once.
   */
  stop(id: string, timeoutS: number): Promise<VmView> {
    const rec = this.mustGet(id);
    return this.serial(id, async () => {
      if (this.rt(id).state !== 'importing') await this.halt(rec, timeoutS); // an import runs no QEMU
      return this.view(id);
    });
  }

  private async halt(rec: VmRecord, timeoutS: number): Promise<void> {
    const rt = this.rt(rec.id);
    const pid = rt.pid;
    if (rt.state === 'stopped' || pid === null) {
      rt.state = 'stopped';
      this.releaseGpus(rec);
      return;
    }
    rt.expectingExit = true;
    rt.state = 'stopping';
    const gone = async (ms: number) => {
      const until = Date.now() + ms;
      while (Date.now() < until) {
        if (!isAlive(pid)) return true;
        await sleep(100);
      }
      return !isAlive(pid);
    };
    if (timeoutS > 0 && rt.qmp && !rt.qmp.closed) {
      await rt.qmp.execute('system_powerdown').catch(() => undefined);
      if (await gone(timeoutS * 1000)) return this.settleStopped(rec);
      this.log('no power-down within the timeout: quitting', { vm: rec.id, timeoutS });
    }
    if (rt.qmp && !rt.qmp.closed) await rt.qmp.execute('quit').catch(() => undefined);
    if (!(await gone(5000))) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // already gone
      }
      await gone(5000);
    }
    this.settleStopped(rec);
  }

  private settleStopped(rec: VmRecord): void {
    const rt = this.rt(rec.id);
    rt.generation++; // the old process's close callback no longer applies
    rt.qmp?.close();
    rt.qmp = null;
    rt.pid = null;
    rt.console?.close();
    rt.console = null;
    rt.state = 'stopped';
    rt.exitReason = null;
    rt.expectingExit = false;
    this.cleanRunFiles(this.dir(rec));
    this.releaseGpus(rec);
  }

  /** Removes the VM and every file of it. A VM that is not here counts as destroyed. */
  destroy(id: string): Promise<void> {
    if (!UUID.test(id)) return Promise.resolve();
    return this.serial(id, async () => {
      const rec = this.records.get(id);
      if (!rec) return;
      await this.imports.cancel(id, rec.vmid); // its download stops, its part goes
      await this.exports.forget(id); // an export under way stops; its files go with the folder
      await this.halt(rec, 0);
      rmSync(this.dir(rec), { recursive: true, force: true });
      this.records.delete(id);
      this.runtime.delete(id);
      this.ports.delete(rec.ssh_port);
      this.templates.released(); // pulled images no template and no VM uses any more go
      if (rec.net) {
        await removeTap(rec.net.tap);
        await this.syncForwards();
      }
      this.log('destroyed', { vm: id });
    });
  }

  private cleanRunFiles(dir: string): void {
    const f = vmFiles(dir);
    rmSync(f.qmpSocket, { force: true });
    rmSync(f.consoleSocket, { force: true });
    rmSync(f.pidFile, { force: true });
    rmSync(bootedFile(dir), { force: true });
  }

  /**
   * Exports a stopped VM's disk for another host (`POST /v1/vms/{id}/export`), or answers the export under
   * way or ready (images/export.ts). 409 `not_stopped` unless the VM is stopped.
   */
  exportDisk(id: string, token: string): Promise<AgentExportState> {
    const rec = this.mustGet(id);
    return this.serial(id, async () => {
      const state = this.rt(id).state;
      if (state !== 'stopped' || !this.records.has(id))
        throw new AgentError(409, 'not_stopped', `VM ${id} is ${state}; only a stopped VM's disk can be exported`);
      return this.exports.begin(id, this.dir(rec), token);
    });
  }

  /** The folder of a VM this host has (404 otherwise): where its export lives. */
  folder(id: string): string {
    return this.dir(this.mustGet(id));
  }

  /** True when `authorization` carries the transfer token of the VM's export (constant time). */
  exportAccepts(id: string, authorization: string | undefined): boolean {
    const rec = this.records.get(id);
    return rec !== undefined && this.exports.accepts(id, this.dir(rec), authorization);
  }

  /** Removes a VM's export (`DELETE /v1/vms/{id}/export`); nothing to do for a VM that is not here. */
  removeExport(id: string): Promise<void> {
    const rec = UUID.test(id) ? this.records.get(id) : undefined;
    if (!rec) return Promise.resolve();
    return this.serial(id, () => this.exports.remove(id, this.dir(rec)));
  }

  /** Lets go of the QMP connections; the VMs themselves run on. Imports and exports under way stop. */
  close(): void {
    this.closed = true;
    this.imports.close();
    void this.exports.close();
    for (const rt of this.runtime.values()) {
      rt.generation++;
      rt.qmp?.close();
      rt.console?.close();
    }
  }
}
