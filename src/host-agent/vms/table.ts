/**
 * What the agent knows of its VMs, shared by the VM manager's parts: each
 * VM's record (vm.json in its folder DATA/vms/VMID), its runtime state (the
 * QEMU process, QMP, console while it runs), the per-VM queue that runs one
 * operation at a time, and the SSH ports taken.
 */
import { renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { vmFiles } from '../qemu/command.js';
import type { QmpClient } from '../qemu/qmp.js';
import type { ConsoleLog } from '../qemu/console.js';
import { bootedFile, type ConsoleScanner } from '../qemu/boot.js';
import { applyForwards, type Subnet } from '../network/bridge.js';
import type { AgentVmState } from '../api.js';
import { AgentError, UUID } from '../errors.js';

/** What is kept in vm.json: enough to run the VM again after any restart. */
export interface VmRecord {
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

export type State = AgentVmState['state'];

/** What the agent holds of a VM while it runs (nothing of it is on disk). */
export interface Runtime {
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

export class VmTable {
  readonly vmsDir: string;
  readonly records = new Map<string, VmRecord>();
  private readonly runtime = new Map<string, Runtime>();
  private readonly queues = new Map<string, Promise<unknown>>();
  /** SSH ports of every VM, and of provisions under way. */
  readonly ports = new Set<number>();
  /** Set when the agent stops: watchers of VM processes end. */
  closed = false;

  constructor(readonly opts: VmManagerOptions) {
    this.vmsDir = join(opts.dataDir, 'vms');
  }

  log(msg: string, data?: Record<string, unknown>): void {
    this.opts.log?.(msg, data);
  }

  bridge(): { subnet: Subnet; nameservers: string[] } | null {
    const n = this.opts.network;
    return n && n.kind === 'bridge' ? n : null;
  }

  /** The NAT rules for every VM's SSH port (bridge networking). */
  async syncForwards(): Promise<void> {
    const bridge = this.bridge();
    if (!bridge) return;
    const forwards = [...this.records.values()].filter((r) => r.net).map((r) => ({ port: r.ssh_port, ip: r.net!.ip }));
    await applyForwards(bridge.subnet, forwards);
  }

  rt(id: string): Runtime {
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

  runtimes(): Iterable<Runtime> {
    return this.runtime.values();
  }

  /** The VM is gone: its record, runtime and SSH port go. */
  forget(rec: VmRecord): void {
    this.records.delete(rec.id);
    this.runtime.delete(rec.id);
    this.ports.delete(rec.ssh_port);
  }

  dir(rec: Pick<VmRecord, 'vmid'>): string {
    return join(this.vmsDir, String(rec.vmid));
  }

  /** Runs operations on one VM one after another. */
  serial<T>(id: string, fn: () => Promise<T>): Promise<T> {
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

  mustGet(id: string): VmRecord {
    if (!UUID.test(id)) throw new AgentError(404, 'not_found', 'no such VM');
    const rec = this.records.get(id);
    if (!rec) throw new AgentError(404, 'not_found', `VM ${id} is not on this host`);
    return rec;
  }

  /** Writes vm.json whole (a temporary file renamed into place). */
  save(rec: VmRecord): void {
    const file = join(this.dir(rec), 'vm.json');
    writeFileSync(`${file}.tmp`, JSON.stringify(rec, null, 2) + '\n', { mode: 0o600 });
    renameSync(`${file}.tmp`, file);
  }

  /** Removes what only a running QEMU uses: its sockets, pid file and boot record. */
  cleanRunFiles(dir: string): void {
    const f = vmFiles(dir);
    rmSync(f.qmpSocket, { force: true });
    rmSync(f.consoleSocket, { force: true });
    rmSync(f.pidFile, { force: true });
    rmSync(bootedFile(dir), { force: true });
  }
}
