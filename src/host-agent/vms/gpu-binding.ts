/**
 * Which VM holds which GPU. GPUs are bound only while QEMU runs: a VM gets
 * its devices when it starts and gives them back whenever it stops (asked,
 * powered off by its guest, crashed) or is destroyed. A stopped VM holds no
 * device, so the host agrees with the control plane, which gives a stopped
 * VM's GPUs to the next renter (a reserved VM's stay counted there, so its
 * start always finds them free). The devices a VM holds are in its record
 * (vm.json), so an agent that restarts knows them.
 */
import { fakeGpus, scanGpus, type HostGpu } from '../gpus/scan.js';
import { AgentError } from '../errors.js';
import type { VmRecord, VmTable } from './table.js';

export class GpuBinding {
  readonly host: HostGpu[];

  constructor(private readonly table: VmTable) {
    const { opts } = table;
    this.host = opts.fakeGpus > 0 ? fakeGpus(opts.fakeGpus) : scanGpus(opts.sysRoot);
  }

  /** GPUs that can be passed through: bound to vfio-pci, or the stand-ins of --fake-gpus. */
  private usable(): HostGpu[] {
    return this.host.filter((g) => g.vfio || this.table.opts.fakeGpus > 0);
  }

  /** Which VM holds each bound GPU, by PCI address. */
  holders(): Map<string, string> {
    const holders = new Map<string, string>();
    for (const r of this.table.records.values()) for (const g of r.gpus) holders.set(g, r.id);
    return holders;
  }

  /** A VM that asks more GPUs than the host could ever give is refused when it is provisioned. */
  checkCapacity(count: number): void {
    const usable = this.usable().length;
    if (count <= usable) return;
    const unbound = this.host.length - usable;
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
  bind(rec: VmRecord): void {
    if (rec.gpus.length === rec.gpu_count) return;
    rec.gpus = [];
    if (rec.gpu_count === 0) return this.table.save(rec);
    const held = this.holders();
    const free = this.usable().filter((g) => !held.has(g.pci_address));
    if (free.length < rec.gpu_count) {
      const unbound = this.host.filter((g) => !held.has(g.pci_address)).length - free.length;
      throw new AgentError(
        409,
        'gpus_unavailable',
        `${rec.gpu_count} GPU(s) asked, ${free.length} free on this host${unbound ? ` (${unbound} more are not bound to vfio-pci)` : ''}`,
      );
    }
    rec.gpus = free.slice(0, rec.gpu_count).map((g) => g.pci_address);
    this.table.save(rec);
  }

  /** Gives the VM's devices back (its QEMU has ended). */
  release(rec: VmRecord): void {
    if (rec.gpus.length === 0 || !this.table.records.has(rec.id)) return;
    rec.gpus = [];
    this.table.save(rec);
  }
}
