/**
 * A fake sysfs tree laid out like the kernel's, for GPU discovery tests:
 * device directories under /sys/devices, symlinked from /sys/bus/pci/devices,
 * with `iommu_group` and `driver` symlinks.
 */
import { mkdirSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

export interface FakeDev {
  addr: string;
  vendor: string;
  device: string;
  cls: string;
  group?: number;
  driver?: string;
}

export function buildSysfs(root: string, devs: FakeDev[]): void {
  mkdirSync(join(root, 'bus/pci/devices'), { recursive: true });
  for (const d of devs) {
    const real = join(root, 'devices/pci0000:00/0000:00:01.0', d.addr);
    mkdirSync(real, { recursive: true });
    writeFileSync(join(real, 'vendor'), `${d.vendor}\n`);
    writeFileSync(join(real, 'device'), `${d.device}\n`);
    writeFileSync(join(real, 'class'), `${d.cls}\n`);
    if (d.group !== undefined) {
      mkdirSync(join(root, 'kernel/iommu_groups', String(d.group)), { recursive: true });
      symlinkSync(`../../../../kernel/iommu_groups/${d.group}`, join(real, 'iommu_group'));
    }
    if (d.driver !== undefined) {
      mkdirSync(join(root, 'bus/pci/drivers', d.driver), { recursive: true });
      symlinkSync(`../../../../bus/pci/drivers/${d.driver}`, join(real, 'driver'));
    }
    symlinkSync(`../../../devices/pci0000:00/0000:00:01.0/${d.addr}`, join(root, 'bus/pci/devices', d.addr));
  }
}
