/**
 * GPU discovery from a fake sysfs tree laid out like the kernel's: device
 * directories under /sys/devices, symlinked from /sys/bus/pci/devices, with
 * `iommu_group` and `driver` symlinks.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fakeGpus, gpuModelName, isFakeGpu, scanGpus } from '../../src/host-agent/gpus/scan.js';
import { buildSysfs } from './fake-sysfs.js';

describe('scanGpus', () => {
  let root: string;
  before(() => {
    root = mkdtempSync(join(tmpdir(), 'gc-sysfs-'));
    buildSysfs(root, [
      // Listed out of order on purpose.
      { addr: '0000:81:00.0', vendor: '0x10de', device: '0x2b85', cls: '0x030000', group: 40, driver: 'nvidia' },
      { addr: '0000:01:00.0', vendor: '0x10de', device: '0x2684', cls: '0x030000', group: 12, driver: 'vfio-pci' },
      { addr: '0000:01:00.1', vendor: '0x10de', device: '0x22ba', cls: '0x040300', group: 12, driver: 'vfio-pci' },
      { addr: '0000:41:00.0', vendor: '0x10de', device: '0x2331', cls: '0x030200', driver: 'vfio-pci' },
      { addr: '0000:c1:00.0', vendor: '0x10de', device: '0x1234', cls: '0x030200', group: 7 },
      { addr: '0000:00:02.0', vendor: '0x1af4', device: '0x1050', cls: '0x030000', group: 1, driver: 'virtio-pci' },
      { addr: '0000:00:03.0', vendor: '0x8086', device: '0x100e', cls: '0x020000', group: 2, driver: 'e1000' },
    ]);
  });
  after(() => rmSync(root, { recursive: true, force: true }));

  test('finds NVIDIA display functions only, with group, driver and model, sorted by address', () => {
    assert.deepEqual(scanGpus(root), [
      {
        pci_address: '0000:01:00.0',
        vendor_id: '10de',
        device_id: '2684',
        model: 'NVIDIA GeForce RTX 4090',
        iommu_group: 12,
        driver: 'vfio-pci',
        vfio: true,
      },
      {
        pci_address: '0000:41:00.0',
        vendor_id: '10de',
        device_id: '2331',
        model: 'NVIDIA H100 PCIe',
        iommu_group: null,
        driver: 'vfio-pci',
        vfio: true,
      },
      {
        pci_address: '0000:81:00.0',
        vendor_id: '10de',
        device_id: '2b85',
        model: 'NVIDIA GeForce RTX 5090',
        iommu_group: 40,
        driver: 'nvidia',
        vfio: false,
      },
      {
        pci_address: '0000:c1:00.0',
        vendor_id: '10de',
        device_id: '1234',
        model: 'NVIDIA [10de:1234]',
        iommu_group: 7,
        driver: null,
        vfio: false,
      },
    ]);
  });

  test('a missing or empty sysfs gives no GPUs', () => {
    assert.deepEqual(scanGpus(join(root, 'nope')), []);
    const empty = join(root, 'empty');
    mkdirSync(join(empty, 'bus/pci/devices'), { recursive: true });
    assert.deepEqual(scanGpus(empty), []);
  });

  test('this host scans without throwing', () => {
    assert.ok(Array.isArray(scanGpus()));
  });
});

describe('model names', () => {
  test('common cards by device id', () => {
    const expected: Record<string, RegExp> = {
      '2684': /RTX 4090/,
      '2b85': /RTX 5090/,
      '2331': /H100 PCIe/,
      '2330': /H100 SXM/,
      '20b0': /A100/,
      '20b2': /A100/,
      '20f1': /A100/,
      '26b9': /L40S/,
      '26b1': /RTX 6000 Ada/,
      '2bb1': /RTX PRO 6000 Blackwell/,
    };
    for (const [id, re] of Object.entries(expected)) assert.match(gpuModelName(id), re, id);
    assert.equal(gpuModelName('ffff'), 'NVIDIA [10de:ffff]');
  });
});

describe('fakeGpus', () => {
  test('n stand-ins that can never be PCI addresses', () => {
    const g = fakeGpus(3);
    assert.deepEqual(
      g.map((x) => x.pci_address),
      ['fake:0', 'fake:1', 'fake:2'],
    );
    for (const x of g) {
      assert.equal(x.model, 'fake');
      assert.equal(x.vfio, false);
      assert.equal(isFakeGpu(x.pci_address), true);
    }
    assert.deepEqual(fakeGpus(0), []);
    assert.throws(() => fakeGpus(-1), RangeError);
    assert.throws(() => fakeGpus(1.5), RangeError);
    assert.equal(isFakeGpu('0000:01:00.0'), false);
  });
});
