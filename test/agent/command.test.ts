/**
 * QEMU's argv: the exact command line for each network kind and GPU count,
 * every rejected input, and (with QEMU installed) that QEMU accepts the argv,
 * sandbox included: the VM runs, its SSH forward accepts TCP without a
 * banner, and QMP quit ends it.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { qemuArgs, qemuBinary, qmpArg, vmFiles, type QemuLaunchSpec } from '../../src/host-agent/qemu/command.js';
import { isAlive, launchQemu, readPid } from '../../src/host-agent/qemu/process.js';
import { QmpClient } from '../../src/host-agent/qemu/qmp.js';
import { freePortInRange, sshBanner } from '../../src/host-agent/network/ssh-probe.js';
import { qemu, qemuImg } from './qemu-helpers.js';

const base: QemuLaunchSpec = {
  name: 'vm-1',
  vmDir: '/var/lib/gpucloud/vms/vm-1',
  accel: 'tcg',
  cpuCores: 2,
  ramMb: 512,
  diskPath: '/var/lib/gpucloud/vms/vm-1/disk.qcow2',
  seedPath: '/var/lib/gpucloud/vms/vm-1/seed.iso',
  gpus: [],
  net: { kind: 'user', hostfwdHost: '127.0.0.1', sshPort: 22001 },
};

const common = (accel: 'kvm' | 'tcg', cores: string, ram: string): string[] => [
  '-name',
  'guest=vm-1',
  '-machine',
  'q35',
  '-accel',
  accel,
  '-cpu',
  accel === 'kvm' ? 'host' : 'max',
  '-smp',
  cores,
  '-m',
  ram,
  '-nodefaults',
  '-display',
  'none',
  '-vga',
  'none',
  '-chardev',
  'socket,id=serial0,path=/var/lib/gpucloud/vms/vm-1/con.sock,server=on,wait=off',
  '-serial',
  'chardev:serial0',
  '-qmp',
  'unix:/var/lib/gpucloud/vms/vm-1/qmp.sock,server=on,wait=off',
  '-pidfile',
  '/var/lib/gpucloud/vms/vm-1/qemu.pid',
  '-daemonize',
  '-sandbox',
  'on,obsolete=deny,resourcecontrol=deny',
  '-drive',
  'file=/var/lib/gpucloud/vms/vm-1/disk.qcow2,if=virtio,format=qcow2,cache=writeback,discard=unmap',
  '-drive',
  'file=/var/lib/gpucloud/vms/vm-1/seed.iso,if=virtio,format=raw,readonly=on',
];

describe('qemuArgs', () => {
  test('tcg, no GPU, user networking', () => {
    assert.deepEqual(qemuArgs(base), [
      ...common('tcg', '2', '512'),
      '-netdev',
      'user,id=net0,hostfwd=tcp:127.0.0.1:22001-:22',
      '-device',
      'virtio-net-pci,netdev=net0',
    ]);
  });

  test('user networking: web ports forwarded from loopback only', () => {
    const net = {
      kind: 'user' as const,
      hostfwdHost: '0.0.0.0',
      sshPort: 22001,
      webForwards: [
        { guest: 7860, host: 40001 },
        { guest: 8888, host: 40002 },
      ],
    };
    assert.deepEqual(qemuArgs({ ...base, net }).slice(-4, -2), [
      '-netdev',
      'user,id=net0,hostfwd=tcp:0.0.0.0:22001-:22,hostfwd=tcp:127.0.0.1:40001-:7860,hostfwd=tcp:127.0.0.1:40002-:8888',
    ]);
  });

  test('kvm with two GPUs behind distinct root ports', () => {
    assert.deepEqual(
      qemuArgs({ ...base, accel: 'kvm', cpuCores: 16, ramMb: 131072, gpus: ['0000:01:00.0', '0000:c1:00.0'] }),
      [
        ...common('kvm', '16', '131072'),
        '-netdev',
        'user,id=net0,hostfwd=tcp:127.0.0.1:22001-:22',
        '-device',
        'virtio-net-pci,netdev=net0',
        '-device',
        'pcie-root-port,id=rp0,chassis=1,slot=1',
        '-device',
        'vfio-pci,host=0000:01:00.0,bus=rp0',
        '-device',
        'pcie-root-port,id=rp1,chassis=2,slot=2',
        '-device',
        'vfio-pci,host=0000:c1:00.0,bus=rp1',
      ],
    );
  });

  test('tap networking (MAC normalized to lower case)', () => {
    assert.deepEqual(qemuArgs({ ...base, net: { kind: 'tap', ifname: 'gc-tap7', mac: '52:54:00:AB:cd:01' } }), [
      ...common('tcg', '2', '512'),
      '-netdev',
      'tap,id=net0,ifname=gc-tap7,script=no,downscript=no',
      '-device',
      'virtio-net-pci,netdev=net0,mac=52:54:00:ab:cd:01',
    ]);
  });

  test('helpers: files in vmDir, -qmp value, binary', () => {
    assert.deepEqual(vmFiles('/v/x'), {
      qmpSocket: '/v/x/qmp.sock',
      pidFile: '/v/x/qemu.pid',
      consoleSocket: '/v/x/con.sock',
      consoleLog: '/v/x/console.log',
    });
    assert.equal(qmpArg('/v/x'), 'unix:/v/x/qmp.sock,server=on,wait=off');
    assert.equal(qemuBinary({}), 'qemu-system-x86_64');
    assert.equal(qemuBinary({ binary: '/opt/qemu/bin/qemu-system-x86_64' }), '/opt/qemu/bin/qemu-system-x86_64');
  });

  const rejected: Array<[string, Record<string, unknown>]> = [
    ['name upper case', { name: 'VM1' }],
    ['name empty', { name: '' }],
    ['name with comma', { name: 'a,b' }],
    ['name with space', { name: 'a b' }],
    ['name too long', { name: 'a'.repeat(65) }],
    ['name not a string', { name: 7 }],
    ['vmDir relative', { vmDir: 'vms/vm-1' }],
    ['vmDir with comma', { vmDir: '/var/lib/x,y' }],
    ['vmDir with newline', { vmDir: '/var/lib/x\ny' }],
    ['vmDir with ..', { vmDir: '/var/lib/../x' }],
    ['vmDir with //', { vmDir: '/var//lib' }],
    ['vmDir with trailing slash', { vmDir: '/var/lib/' }],
    ['vmDir is /', { vmDir: '/' }],
    ['vmDir too long for a unix socket', { vmDir: '/' + 'd'.repeat(100) }],
    ['diskPath relative', { diskPath: 'disk.qcow2' }],
    ['diskPath with comma (option injection)', { diskPath: '/x/disk.qcow2,snapshot=on' }],
    ['diskPath with protocol', { diskPath: 'nbd:127.0.0.1:10809' }],
    ['seedPath with comma', { seedPath: '/x/seed.iso,format=qcow2' }],
    ['seedPath with control char', { seedPath: '/x/se\u0007ed.iso' }],
    ['seedPath same as diskPath', { seedPath: base.diskPath }],
    ['accel unknown', { accel: 'hvf' }],
    ['cores 0', { cpuCores: 0 }],
    ['cores 257', { cpuCores: 257 }],
    ['cores fractional', { cpuCores: 1.5 }],
    ['cores string', { cpuCores: '2' }],
    ['ram 63', { ramMb: 63 }],
    ['ram too big', { ramMb: 4_194_305 }],
    ['ram NaN', { ramMb: NaN }],
    ['gpus not an array', { gpus: '0000:01:00.0' }],
    ['gpu address upper case', { gpus: ['0000:0A:00.0'] }],
    ['gpu address short', { gpus: ['01:00.0'] }],
    ['gpu function 8', { gpus: ['0000:01:00.8'] }],
    ['gpu address with option', { gpus: ['0000:01:00.0,x-vga=on'] }],
    ['fake gpu', { gpus: ['fake:0'] }],
    ['gpu twice', { gpus: ['0000:01:00.0', '0000:01:00.0'] }],
    ['17 gpus', { gpus: Array.from({ length: 17 }, (_, i) => `0000:${(i + 1).toString(16).padStart(2, '0')}:00.0`) }],
    ['binary with a space', { binary: 'qemu system' }],
    ['binary relative path', { binary: './qemu' }],
    ['net missing', { net: null }],
    ['net unknown kind', { net: { kind: 'bridge' } }],
    ['hostfwdHost hostname', { net: { kind: 'user', hostfwdHost: 'localhost', sshPort: 22 } }],
    [
      'hostfwdHost with injection',
      { net: { kind: 'user', hostfwdHost: '127.0.0.1:1-:22,hostfwd=tcp:0.0.0.0', sshPort: 22 } },
    ],
    ['hostfwdHost IPv6', { net: { kind: 'user', hostfwdHost: '::1', sshPort: 22 } }],
    ['port 0', { net: { kind: 'user', hostfwdHost: '127.0.0.1', sshPort: 0 } }],
    ['port 65536', { net: { kind: 'user', hostfwdHost: '127.0.0.1', sshPort: 65536 } }],
    ['port fractional', { net: { kind: 'user', hostfwdHost: '127.0.0.1', sshPort: 22.5 } }],
    [
      'web forward with injection',
      {
        net: {
          kind: 'user',
          hostfwdHost: '127.0.0.1',
          sshPort: 22,
          webForwards: [{ guest: '80,hostfwd=tcp:0.0.0.0:80-:80', host: 40000 }],
        },
      },
    ],
    [
      'web forward port 0',
      { net: { kind: 'user', hostfwdHost: '127.0.0.1', sshPort: 22, webForwards: [{ guest: 80, host: 0 }] } },
    ],
    ['ifname too long', { net: { kind: 'tap', ifname: 'a'.repeat(16), mac: '52:54:00:00:00:01' } }],
    ['ifname with comma', { net: { kind: 'tap', ifname: 'tap0,script=/bin/sh', mac: '52:54:00:00:00:01' } }],
    ['ifname with slash', { net: { kind: 'tap', ifname: '../x', mac: '52:54:00:00:00:01' } }],
    ['mac short', { net: { kind: 'tap', ifname: 'tap0', mac: '52:54:00:00:01' } }],
    ['mac with dashes', { net: { kind: 'tap', ifname: 'tap0', mac: '52-54-00-00-00-01' } }],
    ['mac multicast', { net: { kind: 'tap', ifname: 'tap0', mac: '01:00:5e:00:00:01' } }],
    ['mac all zeros', { net: { kind: 'tap', ifname: 'tap0', mac: '00:00:00:00:00:00' } }],
  ];
  for (const [what, patch] of rejected) {
    test(`rejects: ${what}`, () => {
      assert.throws(() => qemuArgs({ ...base, ...patch } as unknown as QemuLaunchSpec), TypeError);
    });
  }
});

describe('qemuArgs accepted by a real QEMU (tcg)', { skip: qemu.skip || qemuImg.skip }, () => {
  let dir: string;
  let pid: number | null = null;
  before(() => {
    qemu.ensure();
    qemuImg.ensure();
    dir = mkdtempSync(join(tmpdir(), 'gc-cmd-'));
  });
  after(() => {
    if (pid !== null && isAlive(pid)) process.kill(pid, 'SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  });

  test('the VM runs with the sandbox, user networking forwards, quit ends it', async () => {
    const disk = join(dir, 'disk.qcow2');
    const seed = join(dir, 'seed.img');
    const img = spawnSync('qemu-img', ['create', '-q', '-f', 'qcow2', disk, '1G'], { encoding: 'utf8' });
    assert.equal(img.status, 0, img.stderr);
    writeFileSync(seed, Buffer.alloc(64 * 1024));
    const port = await freePortInRange(30000, 40000, new Set(), '127.0.0.1');
    assert.ok(port);
    const args = qemuArgs({
      name: 'cmd-test',
      vmDir: dir,
      accel: 'tcg',
      cpuCores: 1,
      ramMb: 128,
      diskPath: disk,
      seedPath: seed,
      gpus: [],
      net: { kind: 'user', hostfwdHost: '127.0.0.1', sshPort: port },
    });
    await launchQemu(args);
    pid = readPid(vmFiles(dir).pidFile);
    assert.ok(pid);
    assert.equal(isAlive(pid, qmpArg(dir)), true);

    const c = await QmpClient.connect(vmFiles(dir).qmpSocket);
    assert.equal(((await c.execute('query-status')) as { status: string }).status, 'running');
    const blocks = (await c.execute('query-block')) as Array<{
      inserted?: { file: string; ro: boolean; cache: { direct: boolean } };
    }>;
    const files = blocks.flatMap((b) => (b.inserted ? [b.inserted] : []));
    assert.deepEqual(
      files.map((f) => [f.file, f.ro]),
      [
        [disk, false],
        [seed, true],
      ],
    );

    // User networking accepts the TCP connection although nothing in the guest listens.
    await new Promise<void>((resolve, reject) => {
      const s = net.createConnection({ host: '127.0.0.1', port }, () => {
        s.destroy();
        resolve();
      });
      s.on('error', reject);
    });
    assert.equal(await sshBanner('127.0.0.1', port, 500), null);

    let closed = false;
    c.onClose(() => (closed = true));
    await c.execute('quit');
    const end = Date.now() + 2000;
    while ((!closed || isAlive(pid)) && Date.now() < end) await new Promise((r) => setTimeout(r, 20));
    assert.equal(closed, true);
    assert.equal(isAlive(pid), false);
  });
});
