/**
 * The host's NVIDIA GPUs, read from sysfs. Rules:
 *
 * - A GPU is a PCI function under `SYSROOT/bus/pci/devices` with vendor
 *   0x10de and a display class (0x03xxxx: VGA or 3D controller). The other
 *   functions of the same card (HDMI audio 0x0403, USB-C, ...) are not GPUs.
 * - `iommu_group` is the number the `iommu_group` symlink points at, null
 *   without an IOMMU (such a GPU cannot be passed through). `driver` is the
 *   basename of the `driver` symlink, null when unbound; only a GPU bound to
 *   vfio-pci (`vfio`) can be handed to QEMU.
 * - Ids are 4 lower-case hex digits without `0x`; `model` comes from a small
 *   table of common data-center and workstation cards, else
 *   `NVIDIA [10de:xxxx]`. The list is sorted by PCI address.
 * - `fakeGpus(n)` stands in on hosts without GPUs: addresses `fake:N` that
 *   never match a PCI address, so they must never reach QEMU.
 */
import { readdirSync, readFileSync, readlinkSync } from 'node:fs';
import { basename, join } from 'node:path';

export interface HostGpu {
  pci_address: string;
  vendor_id: string;
  device_id: string;
  model: string;
  iommu_group: number | null;
  driver: string | null;
  vfio: boolean;
}

export const NVIDIA_VENDOR_ID = '10de';

const PCI_ADDRESS = /^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$/;

const MODELS: Readonly<Record<string, string>> = {
  '1eb8': 'NVIDIA Tesla T4',
  '20b0': 'NVIDIA A100 SXM4 40GB',
  '20b2': 'NVIDIA A100 SXM4 80GB',
  '20b5': 'NVIDIA A100 PCIe 80GB',
  '20f1': 'NVIDIA A100 PCIe 40GB',
  '2204': 'NVIDIA GeForce RTX 3090',
  '2230': 'NVIDIA RTX A6000',
  '2330': 'NVIDIA H100 SXM5 80GB',
  '2331': 'NVIDIA H100 PCIe',
  '2335': 'NVIDIA H200',
  '2684': 'NVIDIA GeForce RTX 4090',
  '26b1': 'NVIDIA RTX 6000 Ada Generation',
  '26b5': 'NVIDIA L40',
  '26b9': 'NVIDIA L40S',
  '27b8': 'NVIDIA L4',
  '2b85': 'NVIDIA GeForce RTX 5090',
  '2bb1': 'NVIDIA RTX PRO 6000 Blackwell',
};

export function gpuModelName(deviceId: string): string {
  return MODELS[deviceId] ?? `NVIDIA [${NVIDIA_VENDOR_ID}:${deviceId}]`;
}

export function scanGpus(sysRoot = '/sys'): HostGpu[] {
  const dir = join(sysRoot, 'bus/pci/devices');
  let entries: string[];
  try {
    entries = readdirSync(dir);
  } catch {
    return [];
  }
  const gpus: HostGpu[] = [];
  for (const addr of entries) {
    if (!PCI_ADDRESS.test(addr)) continue;
    const dev = join(dir, addr);
    const vendor = hexId(readAttr(dev, 'vendor'), 4);
    const device = hexId(readAttr(dev, 'device'), 4);
    const cls = hexId(readAttr(dev, 'class'), 6);
    if (vendor !== NVIDIA_VENDOR_ID || !device || !cls?.startsWith('03')) continue;
    const group = linkName(dev, 'iommu_group');
    const driver = linkName(dev, 'driver');
    gpus.push({
      pci_address: addr,
      vendor_id: vendor,
      device_id: device,
      model: gpuModelName(device),
      iommu_group: group !== null && /^[0-9]{1,9}$/.test(group) ? Number(group) : null,
      driver,
      vfio: driver === 'vfio-pci',
    });
  }
  return gpus.sort((a, b) => (a.pci_address < b.pci_address ? -1 : a.pci_address > b.pci_address ? 1 : 0));
}

export function fakeGpus(n: number): HostGpu[] {
  if (!Number.isInteger(n) || n < 0 || n > 64) throw new RangeError(`fake GPU count must be an integer 0..64: ${n}`);
  return Array.from({ length: n }, (_, i) => ({
    pci_address: `fake:${i}`,
    vendor_id: NVIDIA_VENDOR_ID,
    device_id: '0000',
    model: 'fake',
    iommu_group: null,
    driver: null,
    vfio: false,
  }));
}

/** True for addresses produced by fakeGpus. */
export function isFakeGpu(pciAddress: string): boolean {
  return pciAddress.startsWith('fake:');
}

function readAttr(dev: string, name: string): string | null {
  try {
    return readFileSync(join(dev, name), 'utf8').trim();
  } catch {
    return null;
  }
}

/** "0x10de" -> "10de" when it has exactly `digits` hex digits, else null. */
function hexId(v: string | null, digits: number): string | null {
  if (v === null) return null;
  const m = /^0x([0-9a-fA-F]+)$/.exec(v);
  return m && m[1]!.length === digits ? m[1]!.toLowerCase() : null;
}

function linkName(dev: string, name: string): string | null {
  try {
    return basename(readlinkSync(join(dev, name)));
  } catch {
    return null;
  }
}
