/**
 * QEMU's command line for one VM, built by a pure function. Rules:
 *
 * - Every input is validated strictly and anything odd throws a TypeError:
 *   QEMU splits option values on `,`, so a comma in a path or name would
 *   inject options. Paths must be absolute and normalized (an absolute path
 *   also keeps `-drive file=` from reading a `proto:` prefix), and printable.
 * - Everything QEMU leaves behind for the agent lives in `vmDir`: the QMP
 *   socket `qmp.sock`, the pid file `qemu.pid` and the serial console's socket
 *   `con.sock`, which the agent reads into a capped `console.log`
 *   (qemu/console.ts). A unix socket path is at most 107 bytes, which limits
 *   `vmDir`'s length.
 * - QEMU always daemonizes (`-daemonize`): it returns once QMP listens and the
 *   VM outlives the agent. `-nodefaults` keeps out every device not listed.
 * - `-sandbox on,obsolete=deny,resourcecontrol=deny`. `elevateprivileges=deny`
 *   and `spawn=deny` are left out: QEMU 7.2 installs the seccomp filter
 *   before `-daemonize` forks and calls setsid(), so `spawn=deny` kills QEMU
 *   on the fork and `elevateprivileges=deny` kills the daemon child on setsid
 *   (both SIGSYS, exit 1 with no message).
 * - The disk uses `cache=writeback`: `cache=none` opens the file with
 *   O_DIRECT, which tmpfs and some overlay filesystems refuse.
 * - GPU i (0-based) sits behind its own PCIe root port `rpI` with chassis and
 *   slot I+1 (q35 needs distinct ones).
 * - The argv does not include the binary; `qemuBinary(spec)` gives it.
 */
import { posix } from 'node:path';
import { isIPv4 } from 'node:net';

export const DEFAULT_QEMU_BINARY = 'qemu-system-x86_64';

/**
 * user: QEMU's user-mode networking, the SSH port forwarded from `hostfwdHost`, and each web port
 * of `webForwards` from a port on 127.0.0.1 only (the portal reaches it through the agent's tunnel).
 */
export type QemuNet =
  | { kind: 'user'; hostfwdHost: string; sshPort: number; webForwards?: { guest: number; host: number }[] }
  | { kind: 'tap'; ifname: string; mac: string };

export interface QemuLaunchSpec {
  binary?: string;
  name: string;
  vmDir: string;
  accel: 'kvm' | 'tcg';
  cpuCores: number;
  ramMb: number;
  diskPath: string;
  seedPath: string;
  /** PCI addresses like 0000:01:00.0 */
  gpus: string[];
  net: QemuNet;
}

export const MAX_GPUS_PER_VM = 16;
const NAME = /^[a-z0-9-]{1,64}$/;
const PCI = /^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$/;
const IFNAME = /^[a-zA-Z0-9_-]{1,15}$/;
const MAC = /^[0-9a-f]{2}(:[0-9a-f]{2}){5}$/;
const BINARY_NAME = /^[A-Za-z0-9._-]+$/;
const SUN_PATH_MAX = 107;

/** The files QEMU writes for a VM, by its directory. */
export function vmFiles(vmDir: string): {
  qmpSocket: string;
  pidFile: string;
  consoleSocket: string;
  consoleLog: string;
} {
  return {
    qmpSocket: `${vmDir}/qmp.sock`,
    pidFile: `${vmDir}/qemu.pid`,
    consoleSocket: `${vmDir}/con.sock`,
    consoleLog: `${vmDir}/console.log`,
  };
}

/** The `-qmp` value: also what `isAlive(pid, expectArg)` can look for in a VM's cmdline. */
export function qmpArg(vmDir: string): string {
  return `unix:${vmFiles(vmDir).qmpSocket},server=on,wait=off`;
}

export function qemuBinary(spec: Pick<QemuLaunchSpec, 'binary'>): string {
  const b = spec.binary ?? DEFAULT_QEMU_BINARY;
  if (typeof b !== 'string' || !(BINARY_NAME.test(b) || isCleanAbsolutePath(b)))
    throw new TypeError(`bad QEMU binary: ${JSON.stringify(b)}`);
  return b;
}

export function qemuArgs(spec: QemuLaunchSpec): string[] {
  if (typeof spec !== 'object' || spec === null) throw new TypeError('spec must be an object');
  qemuBinary(spec);
  const name = match(spec.name, NAME, 'name');
  const vmDir = absPath(spec.vmDir, 'vmDir');
  const files = vmFiles(vmDir);
  if (Math.max(Buffer.byteLength(files.qmpSocket), Buffer.byteLength(files.consoleSocket)) > SUN_PATH_MAX)
    throw new TypeError(`vmDir too long for a unix socket: ${vmDir}`);
  if (spec.accel !== 'kvm' && spec.accel !== 'tcg') throw new TypeError(`bad accel: ${JSON.stringify(spec.accel)}`);
  const cores = intIn(spec.cpuCores, 1, 256, 'cpuCores');
  const ram = intIn(spec.ramMb, 64, 4_194_304, 'ramMb');
  const disk = absPath(spec.diskPath, 'diskPath');
  const seed = absPath(spec.seedPath, 'seedPath');
  if (disk === seed) throw new TypeError('diskPath and seedPath are the same file');

  const args = [
    '-name',
    `guest=${name}`,
    '-machine',
    'q35',
    '-accel',
    spec.accel,
    '-cpu',
    spec.accel === 'kvm' ? 'host' : 'max',
    '-smp',
    String(cores),
    '-m',
    String(ram),
    '-nodefaults',
    '-display',
    'none',
    '-vga',
    'none',
    '-chardev',
    `socket,id=serial0,path=${files.consoleSocket},server=on,wait=off`,
    '-serial',
    'chardev:serial0',
    '-qmp',
    qmpArg(vmDir),
    '-pidfile',
    files.pidFile,
    '-daemonize',
    '-sandbox',
    'on,obsolete=deny,resourcecontrol=deny',
    '-drive',
    `file=${disk},if=virtio,format=qcow2,cache=writeback,discard=unmap`,
    '-drive',
    `file=${seed},if=virtio,format=raw,readonly=on`,
    ...netArgs(spec.net),
  ];

  if (!Array.isArray(spec.gpus)) throw new TypeError('gpus must be an array');
  if (spec.gpus.length > MAX_GPUS_PER_VM) throw new TypeError(`at most ${MAX_GPUS_PER_VM} GPUs per VM`);
  const seen = new Set<string>();
  spec.gpus.forEach((addr, i) => {
    const a = match(addr, PCI, 'GPU PCI address');
    if (seen.has(a)) throw new TypeError(`GPU ${a} listed twice`);
    seen.add(a);
    args.push(
      '-device',
      `pcie-root-port,id=rp${i},chassis=${i + 1},slot=${i + 1}`,
      '-device',
      `vfio-pci,host=${a},bus=rp${i}`,
    );
  });
  return args;
}

function netArgs(net: QemuNet): string[] {
  if (typeof net !== 'object' || net === null) throw new TypeError('net must be an object');
  if (net.kind === 'user') {
    if (typeof net.hostfwdHost !== 'string' || !isIPv4(net.hostfwdHost))
      throw new TypeError(`bad hostfwdHost (IPv4 only): ${JSON.stringify(net.hostfwdHost)}`);
    const port = intIn(net.sshPort, 1, 65535, 'sshPort');
    const web = (net.webForwards ?? []).map(
      (f) =>
        `,hostfwd=tcp:127.0.0.1:${intIn(f.host, 1, 65535, 'web forward host port')}-:${intIn(f.guest, 1, 65535, 'web forward guest port')}`,
    );
    if (web.length > 16) throw new TypeError('at most 16 web forwards');
    return [
      '-netdev',
      `user,id=net0,hostfwd=tcp:${net.hostfwdHost}:${port}-:22${web.join('')}`,
      '-device',
      'virtio-net-pci,netdev=net0',
    ];
  }
  if (net.kind === 'tap') {
    const ifname = match(net.ifname, IFNAME, 'ifname');
    const mac = typeof net.mac === 'string' ? net.mac.toLowerCase() : net.mac;
    match(mac, MAC, 'mac');
    if (parseInt(mac.slice(0, 2), 16) & 1) throw new TypeError(`mac is a multicast address: ${mac}`);
    if (mac === '00:00:00:00:00:00') throw new TypeError('mac is all zeros');
    return [
      '-netdev',
      `tap,id=net0,ifname=${ifname},script=no,downscript=no`,
      '-device',
      `virtio-net-pci,netdev=net0,mac=${mac}`,
    ];
  }
  throw new TypeError(`bad net kind: ${JSON.stringify((net as { kind?: unknown }).kind)}`);
}

function match(v: unknown, re: RegExp, what: string): string {
  if (typeof v !== 'string' || !re.test(v)) throw new TypeError(`bad ${what}: ${JSON.stringify(v)}`);
  return v;
}

function intIn(v: unknown, min: number, max: number, what: string): number {
  if (typeof v !== 'number' || !Number.isInteger(v) || v < min || v > max)
    throw new TypeError(`bad ${what} (integer ${min}..${max}): ${JSON.stringify(v)}`);
  return v;
}

function isCleanAbsolutePath(p: string): boolean {
  return (
    p.length > 1 &&
    p.length <= 4096 &&
    p.startsWith('/') &&
    !p.endsWith('/') &&
    posix.normalize(p) === p &&
    // eslint-disable-next-line no-control-regex -- control characters are what this looks for
    !/[,\u0000-\u001f\u007f]/.test(p)
  );
}

function absPath(v: unknown, what: string): string {
  if (typeof v !== 'string' || !isCleanAbsolutePath(v)) {
    throw new TypeError(
      `bad ${what} (an absolute, normalized path without commas or control characters): ${JSON.stringify(v)}`,
    );
  }
  return v;
}
