/**
 * Provisioning: a VM's folder built from its template (a copy-on-write
 * overlay on the template's image, grown to storage_gb) or from a downloaded
 * disk (an import, images/import.ts), with its cloud-init seed.
 *
 * Rules:
 * - Provisions of different VMs run at the same time, so whatever two VMs
 *   must not share (a vmid, an SSH port, a bridge address) is claimed
 *   synchronously, before the provision's first await, and given back if it
 *   fails.
 * - A folder is built in a temporary folder and renamed into place: a crash
 *   leaves no half VM behind (the next agent removes the temporary folder).
 * - A VM built from a downloaded disk is `importing` until the disk is
 *   verified and its folder built; it stands on no template.
 * - Nothing from a request reaches a path or QEMU's command line without
 *   passing a narrow check first (ids, numbers, keys, the template's user).
 */
import { execFile } from 'node:child_process';
import { mkdirSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { hashPassword, writeSeed } from '../images/seed.js';
import { freePortInRange } from '../network/ssh-probe.js';
import {
  ensureTap,
  gatewayOf,
  hostCount,
  macOf,
  removeTap,
  tapName,
  vmAddress,
  type Subnet,
} from '../network/bridge.js';
import type { TemplateStore } from '../templates.js';
import type { AgentProvisionSpec } from '../api.js';
import { importUser, placeDisk, type DiskImports, type ImportSpec } from '../images/import.js';
import { AgentError } from '../errors.js';
import type { GpuBinding } from './gpu-binding.js';
import type { VmRecord, VmTable } from './table.js';

const run = promisify(execFile);

export type ProvisionSpec = AgentProvisionSpec;

export class VmBuilder {
  /** vmids and bridge addresses of provisions under way (the records hold the others). */
  private readonly provisioningVmids = new Set<number>();
  private readonly provisioningAddresses = new Set<string>();

  constructor(
    private readonly table: VmTable,
    private readonly gpus: GpuBinding,
    private readonly templates: TemplateStore,
    private readonly imports: DiskImports,
  ) {}

  /**
   * Provisions the VM `id` (in its queue, the id checked): builds it on its template, or starts the import
   * of its disk. A VM that exists is left as it is (an import that failed is tried again).
   */
  async provision(id: string, spec: ProvisionSpec): Promise<void> {
    const { table } = this;
    const existing = table.records.get(id);
    if (existing) {
      if (existing.vmid !== spec.vmid) throw new AgentError(409, 'conflict', `VM ${id} exists with another vmid`);
      // An import that failed (or that an earlier agent left) is tried again; one under way goes on.
      if (table.rt(id).state === 'importing' && spec.disk) {
        existing.disk_source = { sha256: spec.disk.sha256, format: spec.disk.format };
        this.imports.start(existing, existing, spec as ImportSpec);
      }
      return;
    }
    for (const r of table.records.values()) {
      if (r.vmid === spec.vmid) throw new AgentError(409, 'conflict', `vmid ${spec.vmid} belongs to VM ${r.id}`);
    }
    if (this.provisioningVmids.has(spec.vmid))
      throw new AgentError(409, 'conflict', `vmid ${spec.vmid} is being provisioned for another VM`);
    this.gpus.checkCapacity(spec.gpu_count);
    // Claimed before the first await, given back in `finally` unless the VM was recorded.
    this.provisioningVmids.add(spec.vmid);
    const bridge = table.bridge();
    const { sshPorts, forwardHost } = table.opts;
    let address: string | null = null;
    let port: number | null = null;
    let recorded = false;
    try {
      // 409 template_unavailable unless ready; a pulled image changed on disk is verified first.
      // An import needs no template.
      const template = spec.disk ? null : await this.templates.base(spec.template_vmid, id);
      address = bridge ? this.allocateAddress(bridge.subnet) : null;
      port = await freePortInRange(sshPorts.from, sshPorts.to, table.ports, forwardHost);
      if (port === null) throw new AgentError(409, 'no_ports', `no free SSH port in ${sshPorts.from}-${sshPorts.to}`);
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
        table.records.set(id, rec);
        recorded = true;
        table.rt(id).state = 'importing';
        table.log('importing', { vm: id, vmid: rec.vmid, port });
        return;
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
      table.records.set(id, rec);
      recorded = true;
      table.rt(id).state = 'stopped';
      await table.syncForwards();
      table.log('provisioned', { vm: id, vmid: rec.vmid, port });
    } finally {
      this.templates.unlease(id);
      this.provisioningVmids.delete(spec.vmid);
      if (address) this.provisioningAddresses.delete(address);
      if (!recorded && port !== null) table.ports.delete(port);
    }
  }

  /** Claims a free bridge address (given back with `provisioningAddresses.delete` if the provision fails). */
  private allocateAddress(subnet: Subnet): string {
    const used = new Set([...this.table.records.values()].map((r) => r.net?.ip));
    for (let host = 2; host <= hostCount(subnet) + 1; host++) {
      const ip = vmAddress(subnet, host);
      if (!used.has(ip) && !this.provisioningAddresses.has(ip)) {
        this.provisioningAddresses.add(ip);
        return ip;
      }
    }
    throw new AgentError(409, 'no_addresses', 'no free address left in the VM subnet');
  }

  /**
   * Builds an imported VM from its verified disk (images/import.ts), in the VM's queue: its folder, the disk
   * (grown to storage_gb), the seed; then it is `stopped`. False when the VM went meanwhile.
   */
  installImport(id: string, spec: ImportSpec, file: string, virtualSize: number): Promise<boolean> {
    const { table } = this;
    return table.serial(id, async () => {
      const rec = table.records.get(id);
      const rt = table.rt(id);
      if (!rec || rt.state !== 'importing') return false;
      await this.build(rec, spec, (disk) => placeDisk(file, spec.disk.format, virtualSize, rec.storage_gb, disk));
      rt.state = 'stopped';
      rt.exitReason = null;
      await table.syncForwards();
      table.log('imported', { vm: id, vmid: rec.vmid, sha256: spec.disk.sha256 });
      return true;
    });
  }

  /**
   * The VM's folder: built in a temporary folder and renamed into place, so a crash leaves no half VM behind.
   * `makeDisk` writes the VM's disk.qcow2 at the path it is given, after the seed.
   */
  private async build(rec: VmRecord, spec: ProvisionSpec, makeDisk: (disk: string) => Promise<unknown>): Promise<void> {
    const bridge = this.table.bridge();
    const dir = this.table.dir(rec);
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
}
