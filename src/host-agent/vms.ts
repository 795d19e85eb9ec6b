/**
 * The VMs of one host: what the agent's routes call. Each VM is a folder
 * DATA/vms/VMID holding everything about it: vm.json (what it is: template,
 * size, SSH port, GPUs; vms/table.ts), disk.qcow2 (a copy-on-write overlay on
 * its template, or an imported disk; vms/provision.ts), the cloud-init seed,
 * and while QEMU runs its pid file, QMP socket and serial console log
 * (vms/processes.ts).
 *
 * Rules:
 * - One operation at a time per VM (a per-VM queue); every operation is safe
 *   to repeat: provisioning a VM that exists returns it, stopping a stopped
 *   VM or destroying a missing one does nothing.
 * - Operations on different VMs run at the same time, so whatever two VMs
 *   must not share (a vmid, an SSH port, a bridge address, a GPU) is claimed
 *   synchronously, before the operation's first await, and given back if the
 *   operation fails.
 * - GPUs are bound only while QEMU runs (vms/gpu-binding.ts).
 * - Destroy removes the VM's folder: no disk outlives its VM (nor its export).
 * - A VM can also be built from a downloaded disk instead of its template
 *   (`disk` in the provision spec, images/import.ts): it is `importing` until
 *   the disk is verified and its folder built. A stopped VM's disk can be
 *   exported for another host (images/export.ts); it cannot start meanwhile.
 */
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { vmFiles } from './qemu/command.js';
import { ConsoleLog } from './qemu/console.js';
import type { HostGpu } from './gpus/scan.js';
import { tapCounters } from './network/traffic.js';
import { ensureBridge, ensureTap, removeTap } from './network/bridge.js';
import type { TemplateStore } from './templates.js';
import type { AgentExportState, AgentVmState } from './api.js';
import { DiskExports } from './images/export.js';
import { DiskImports } from './images/import.js';
import { AgentError, UUID } from './errors.js';
import { GpuBinding } from './vms/gpu-binding.js';
import { VmProcesses } from './vms/processes.js';
import { VmBuilder, type ProvisionSpec } from './vms/provision.js';
import { VmTable, type VmManagerOptions, type VmRecord } from './vms/table.js';

export type { ProvisionSpec } from './vms/provision.js';
export type { VmManagerOptions } from './vms/table.js';

/** A VM as the agent API shows it. */
export type VmView = AgentVmState;

export class VmManager {
  private readonly table: VmTable;
  private readonly gpuBinding: GpuBinding;
  private readonly processes: VmProcesses;
  private readonly builder: VmBuilder;
  readonly exports: DiskExports;
  private readonly imports: DiskImports;

  constructor(
    opts: VmManagerOptions,
    private readonly templates: TemplateStore,
  ) {
    const table = new VmTable(opts);
    this.table = table;
    templates.track(() => [...table.records.values()].map((r) => r.image));
    this.gpuBinding = new GpuBinding(table);
    this.processes = new VmProcesses(table, this.gpuBinding);
    this.exports = new DiskExports((msg, data) => table.log(msg, data));
    this.imports = new DiskImports({
      vmsDir: table.vmsDir,
      limitMbps: opts.downloadLimitMbps ?? null,
      install: (id, spec, file, virtualSize) => this.builder.installImport(id, spec, file, virtualSize),
      log: (msg, data) => table.log(msg, data),
    });
    this.builder = new VmBuilder(table, this.gpuBinding, templates, this.imports);
    // A unix socket path is at most 107 bytes: refuse a data dir that cannot hold one.
    const probe = join(table.vmsDir, '999999999', 'qmp.sock');
    if (Buffer.byteLength(probe) > 107)
      throw new Error(`the data directory path is too long for QEMU's sockets (${probe}); use a shorter --data-dir`);
  }

  get gpus(): HostGpu[] {
    return this.gpuBinding.host;
  }

  /** Loads every VM folder and re-attaches to the QEMU processes still running. */
  async load(): Promise<void> {
    const { table } = this;
    mkdirSync(table.vmsDir, { recursive: true, mode: 0o700 });
    const bridge = table.bridge();
    if (bridge) await ensureBridge(bridge.subnet);
    for (const name of readdirSync(table.vmsDir)) {
      const file = join(table.vmsDir, name, 'vm.json');
      if (!/^\d+$/.test(name) || !existsSync(file)) {
        // A provisioning that died half-way: nothing refers to it.
        if (name.includes('.tmp-')) rmSync(join(table.vmsDir, name), { recursive: true, force: true });
        continue;
      }
      const rec = JSON.parse(readFileSync(file, 'utf8')) as VmRecord;
      // Records written before GPUs were bound at start held theirs from provisioning on.
      if (typeof rec.gpu_count !== 'number') rec.gpu_count = rec.gpus.length;
      table.records.set(rec.id, rec);
      table.ports.add(rec.ssh_port);
      // After a host reboot the taps are gone; a running VM still holds its own.
      if (bridge && rec.net) await ensureTap(rec.net.tap);
      await this.processes.reattach(rec);
    }
    // Imports an earlier agent left: listed `importing` until the next provision resumes them.
    for (const r of this.imports.load((id) => table.records.has(id))) {
      const rec = r as VmRecord;
      table.records.set(rec.id, rec);
      table.ports.add(rec.ssh_port);
      table.rt(rec.id).state = 'importing';
    }
    await table.syncForwards();
  }

  view(id: string): VmView {
    const rec = this.table.mustGet(id);
    const rt = this.table.rt(id);
    return {
      id,
      state: rt.state,
      ssh: { host: this.table.opts.publicHost, port: rec.ssh_port, user: rec.user },
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
    return [...this.table.records.keys()].sort().map((id) => this.view(id));
  }

  templateInUse(vmid: number): boolean {
    return [...this.table.records.values()].some((r) => r.template_vmid === vmid && !r.disk_source);
  }

  /**
   * Where the agent connects for the portal's tunnel to a web port of a running VM: the guest's own
   * address on the bridge, else QEMU's loopback forward of that port.
   */
  tunnelTarget(id: string, port: number): { host: string; port: number } {
    const rec = this.table.mustGet(id);
    if (!(rec.web_ports ?? []).includes(port))
      throw new AgentError(403, 'port_not_declared', `port ${port} is not a web port of VM ${id}`);
    const state = this.table.rt(id).state;
    if (state !== 'running' && state !== 'booting') throw new AgentError(409, 'not_running', `VM ${id} is ${state}`);
    if (rec.net) return { host: rec.net.ip, port };
    const forward = rec.web_forwards?.find((f) => f.guest === port);
    if (!forward) throw new AgentError(409, 'not_running', `VM ${id} was started without a forward for port ${port}`);
    return { host: '127.0.0.1', port: forward.host };
  }

  /** Which VM holds each bound GPU, by PCI address. */
  gpuHolders(): Map<string, string> {
    return this.gpuBinding.holders();
  }

  /** The end of a VM's serial console (the capped log the agent keeps). */
  consoleTail(id: string, bytes: number): Buffer {
    return ConsoleLog.tail(vmFiles(this.table.dir(this.table.mustGet(id))).consoleLog, bytes);
  }

  provision(id: string, spec: ProvisionSpec): Promise<VmView> {
    if (!UUID.test(id)) throw new AgentError(422, 'validation_error', 'the VM id must be a UUID');
    return this.table.serial(id, async () => {
      await this.builder.provision(id, spec);
      return this.view(id);
    });
  }

  start(id: string): Promise<VmView> {
    const rec = this.table.mustGet(id);
    return this.table.serial(id, async () => {
      const rt = this.table.rt(id);
      if (rt.state === 'importing')
        throw new AgentError(409, 'importing', `VM ${id} is importing its disk; it can start once it is stopped`);
      if (this.exports.running(id))
        throw new AgentError(409, 'exporting', `VM ${id}'s disk is being exported; it can start once that is done`);
      if (rt.state === 'stopped') await this.processes.start(rec);
      return this.view(id);
    });
  }

  /**
   * Stops the VM: an ACPI power-down, then after `timeoutS` a hard quit (and a
   * kill if even that is not obeyed). 0 means a hard stop at once.
   */
  stop(id: string, timeoutS: number): Promise<VmView> {
    const rec = this.table.mustGet(id);
    return this.table.serial(id, async () => {
      if (this.table.rt(id).state !== 'importing') await this.processes.halt(rec, timeoutS); // an import runs no QEMU
      return this.view(id);
    });
  }

  /** Removes the VM and every file of it. A VM that is not here counts as destroyed. */
  destroy(id: string): Promise<void> {
    if (!UUID.test(id)) return Promise.resolve();
    const { table } = this;
    return table.serial(id, async () => {
      const rec = table.records.get(id);
      if (!rec) return;
      await this.imports.cancel(id, rec.vmid); // its download stops, its part goes
      await this.exports.forget(id); // an export under way stops; its files go with the folder
      await this.processes.halt(rec, 0);
      rmSync(table.dir(rec), { recursive: true, force: true });
      table.forget(rec);
      this.templates.released(); // pulled images no template and no VM uses any more go
      if (rec.net) {
        await removeTap(rec.net.tap);
        await table.syncForwards();
      }
      table.log('destroyed', { vm: id });
    });
  }

  /**
   * Exports a stopped VM's disk for another host (`POST /v1/vms/{id}/export`), or answers the export under
   * way or ready (images/export.ts). 409 `not_stopped` unless the VM is stopped.
   */
  exportDisk(id: string, token: string): Promise<AgentExportState> {
    const rec = this.table.mustGet(id);
    return this.table.serial(id, async () => {
      const state = this.table.rt(id).state;
      if (state !== 'stopped' || !this.table.records.has(id))
        throw new AgentError(409, 'not_stopped', `VM ${id} is ${state}; only a stopped VM's disk can be exported`);
      return this.exports.begin(id, this.table.dir(rec), token);
    });
  }

  /** The folder of a VM this host has (404 otherwise): where its export lives. */
  folder(id: string): string {
    return this.table.dir(this.table.mustGet(id));
  }

  /** True when `authorization` carries the transfer token of the VM's export (constant time). */
  exportAccepts(id: string, authorization: string | undefined): boolean {
    const rec = this.table.records.get(id);
    return rec !== undefined && this.exports.accepts(id, this.table.dir(rec), authorization);
  }

  /** Removes a VM's export (`DELETE /v1/vms/{id}/export`); nothing to do for a VM that is not here. */
  removeExport(id: string): Promise<void> {
    const rec = UUID.test(id) ? this.table.records.get(id) : undefined;
    if (!rec) return Promise.resolve();
    return this.table.serial(id, () => this.exports.remove(id, this.table.dir(rec)));
  }

  /** Lets go of the QMP connections; the VMs themselves run on. Imports and exports under way stop. */
  close(): void {
    this.table.closed = true;
    this.imports.close();
    void this.exports.close();
    this.processes.close();
  }
}
