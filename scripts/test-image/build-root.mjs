// The guest's root file system for scripts/test-image.mjs, staged in a directory: the kernel's modules (those
// MODULES need), busybox and its applets, bash, dropbear and websocketd with the libraries they link, and the
// configuration and scripts of this folder. Only the guest files installConfig names are copied from here, never
// the build's own modules (build-*.mjs).
import {
  chmodSync,
  copyFileSync,
  existsSync,
  lstatSync,
  mkdirSync,
  readFileSync,
  readdirSync,
  realpathSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { basename, dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { gunzipSync } from 'node:zlib';
import { DROPBEAR_PKG, LIB_PKGS, WEBSOCKETD_PKG, extractDeb } from './build-debs.mjs';
import { fail, run } from './build-process.mjs';

const ASSETS = dirname(fileURLToPath(import.meta.url));
const MODULES = [
  'virtio_ring',
  'virtio',
  'virtio_pci_modern_dev',
  'virtio_pci_legacy_dev',
  'virtio_pci',
  'failover',
  'net_failover',
  'virtio_net',
  'virtio_blk',
  'qemu_fw_cfg',
  'button',
  'evdev',
  'cdrom',
  'isofs',
];

function copyInto(root, dest, src, mode) {
  const to = join(root, dest);
  mkdirSync(dirname(to), { recursive: true });
  copyFileSync(src, to);
  chmodSync(to, mode ?? statSync(src).mode & 0o7777);
}
function writeInto(root, dest, text, mode = 0o644) {
  const to = join(root, dest);
  mkdirSync(dirname(to), { recursive: true });
  writeFileSync(to, text);
  chmodSync(to, mode);
}
function linkInto(root, dest, target) {
  const to = join(root, dest);
  mkdirSync(dirname(to), { recursive: true });
  if (existsSync(to) || isLink(to)) return;
  symlinkSync(target, to);
}
const isLink = (p) => {
  try {
    return lstatSync(p).isSymbolicLink();
  } catch {
    return false;
  }
};

function findModulesDir(kdir) {
  for (const base of ['lib/modules', 'usr/lib/modules']) {
    const dir = join(kdir, base);
    if (existsSync(dir)) {
      const versions = readdirSync(dir).filter((v) => existsSync(join(dir, v, 'kernel')));
      if (versions.length === 1) return { base, version: versions[0] };
      if (versions.length > 1) fail(`several kernels in the kernel package: ${versions.join(', ')}`);
    }
  }
  fail('the kernel package has no lib/modules/VERSION/kernel');
}

export async function installKernel(kdeb, work, root) {
  const kdir = join(work, 'kernel');
  await extractDeb(kdeb, kdir);
  const { base, version } = findModulesDir(kdir);
  if (base !== 'lib/modules') symlinkSync('usr/lib', join(kdir, 'lib')); // depmod -b looks in DIR/lib/modules
  const vmlinuz = join(kdir, 'boot', `vmlinuz-${version}`);
  if (!existsSync(vmlinuz)) fail(`the kernel package has no boot/vmlinuz-${version}`);
  await run('depmod', ['-b', kdir, version]);
  const mdir = join(kdir, 'lib', 'modules', version);
  const norm = (name) => name.replace(/-/g, '_');
  const modName = (path) => norm(basename(path).replace(/\.ko(\.(xz|zst|gz))?$/, ''));
  const deps = new Map();
  for (const line of readFileSync(join(mdir, 'modules.dep'), 'utf8').split('\n')) {
    const m = line.match(/^([^:]+):\s*(.*)$/);
    if (m) deps.set(modName(m[1]), { path: m[1], deps: m[2].split(/\s+/).filter(Boolean).map(modName) });
  }
  const builtin = new Set(
    existsSync(join(mdir, 'modules.builtin'))
      ? readFileSync(join(mdir, 'modules.builtin'), 'utf8').split('\n').filter(Boolean).map(modName)
      : [],
  );
  const order = [];
  const visit = (name, chain) => {
    if (order.includes(name)) return;
    if (chain.includes(name)) fail(`module dependency loop: ${[...chain, name].join(' -> ')}`);
    const entry = deps.get(name);
    if (!entry) {
      if (builtin.has(name)) return;
      fail(`kernel ${version} has no module ${name}`);
    }
    for (const d of entry.deps) visit(d, [...chain, name]);
    order.push(name);
  };
  for (const m of MODULES) visit(norm(m), []);
  const loadList = [];
  for (const name of order) {
    const src = join(mdir, deps.get(name).path);
    const file = `${basename(src).replace(/\.ko(\.(xz|zst|gz))?$/, '')}.ko`;
    const dest = join(root, 'lib', 'modules', version, file);
    mkdirSync(dirname(dest), { recursive: true });
    if (src.endsWith('.ko')) copyFileSync(src, dest);
    else if (src.endsWith('.ko.xz')) writeFileSync(dest, (await run('xz', ['-dc', src], { raw: true })).stdout);
    else if (src.endsWith('.ko.zst')) writeFileSync(dest, (await run('zstd', ['-dc', src], { raw: true })).stdout);
    else if (src.endsWith('.ko.gz')) writeFileSync(dest, gunzipSync(readFileSync(src)));
    else fail(`unexpected module file ${src}`);
    loadList.push(file);
  }
  writeInto(root, 'etc/gpucloud/modules', `${loadList.join('\n')}\n`);
  return { version, vmlinuz, modules: loadList };
}

export async function installBusybox(deb, work, root) {
  const dir = join(work, 'busybox');
  await extractDeb(deb, dir);
  const bin = join(dir, 'bin', 'busybox');
  if (!existsSync(bin)) fail(`${basename(deb)} has no bin/busybox`);
  copyInto(root, 'bin/busybox', bin, 0o755);
  const list = (await run(bin, ['--list-full'])).stdout
    .split('\n')
    .map((s) => s.trim())
    .filter(Boolean);
  let n = 0;
  for (const path of list) {
    const name = basename(path);
    if (name === 'busybox' || path === 'bin/busybox') continue; // a link over the binary itself: ELOOP at boot
    linkInto(root, path, '/bin/busybox');
    linkInto(root, join('bin', name), '/bin/busybox'); // every applet on a plain /bin PATH too
    n++;
  }
  for (const need of [
    'sbin/init',
    'bin/sh',
    'sbin/acpid',
    'sbin/udhcpc',
    'sbin/insmod',
    'sbin/poweroff',
    'usr/bin/awk',
  ]) {
    if (!isLink(join(root, need))) fail(`busybox has no ${need}`);
  }
  return n;
}

/** Debian's statically linked bash as /bin/bash (busybox's sh stays /bin/sh). */
export async function installBash(deb, work, root) {
  const dir = join(work, 'bash');
  await extractDeb(deb, dir);
  const bin = ['bin/bash-static', 'usr/bin/bash-static'].map((p) => join(dir, p)).find((p) => existsSync(p));
  if (!bin) fail(`${basename(deb)} has no bin/bash-static`);
  rmSync(join(root, 'bin/bash'), { force: true }); // in case busybox has a bash applet
  copyInto(root, 'bin/bash', bin, 0o755);
}

// The dynamically linked programs: each package's file at the same path in the image.
export const PROGRAMS = [
  { name: 'dropbear', pkg: DROPBEAR_PKG, path: 'usr/sbin/dropbear' },
  { name: 'websocketd', pkg: WEBSOCKETD_PKG, path: 'usr/bin/websocketd' },
];

/**
 * Installs PROGRAMS, the libraries they link (asked of the packaged ld.so, so
 * only LIB_PKGS can provide them) and the loader; returns program -> sonames.
 */
export async function installPrograms(debs, work, root) {
  const stage = join(work, 'programs');
  for (const deb of debs) await extractDeb(deb, stage);
  const libDirs = ['lib/x86_64-linux-gnu', 'usr/lib/x86_64-linux-gnu'].map((d) => join(stage, d));
  const ldso = libDirs.map((d) => join(d, 'ld-linux-x86-64.so.2')).find((p) => existsSync(p));
  if (!ldso) fail('libc6 has no ld-linux-x86-64.so.2');
  const libs = new Map(); // soname -> file
  const linked = new Map(); // program -> sonames
  for (const { name, pkg, path } of PROGRAMS) {
    const bin = join(stage, path);
    if (!existsSync(bin)) fail(`${pkg} has no ${path}`);
    copyInto(root, path, bin, 0o755);
    // Ask the packaged dynamic loader which libraries it needs, looking only in the packages.
    const out = (await run(ldso, ['--library-path', libDirs.join(':'), '--list', bin])).stdout;
    const sonames = [];
    for (const line of out.split('\n')) {
      const m = line.match(/^\s*(\S+) => (.*?)\s*(\(0x[0-9a-f]+\))?$/);
      if (!m || m[1].includes('/')) continue; // the loader itself is installed below
      if (m[2] === 'not found' || !m[2].startsWith(stage)) {
        fail(`${name} needs ${m[1]}, which none of ${LIB_PKGS.join(', ')} provides; add its package to LIB_PKGS`);
      }
      sonames.push(m[1]);
      libs.set(m[1], realpathSync(m[2]));
    }
    linked.set(name, sonames);
  }
  if (!linked.get('dropbear').some((l) => l.startsWith('libcrypt.so')))
    fail('dropbear is not linked with libcrypt (password login needs it)');
  for (const [soname, file] of libs) copyInto(root, join('lib/x86_64-linux-gnu', soname), file, 0o755);
  copyInto(root, 'lib/x86_64-linux-gnu/ld-linux-x86-64.so.2', realpathSync(ldso), 0o755);
  linkInto(root, 'lib64/ld-linux-x86-64.so.2', '/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2');
  return linked;
}

export function installConfig(root) {
  for (const d of [
    'dev',
    'proc',
    'sys',
    'run',
    'tmp',
    'mnt',
    'var/log',
    'etc/dropbear',
    'etc/acpi/PWRF',
    'home',
    'usr/share/udhcpc',
  ]) {
    mkdirSync(join(root, d), { recursive: true });
  }
  mkdirSync(join(root, 'root'), { recursive: true, mode: 0o700 });
  chmodSync(join(root, 'root'), 0o700);
  chmodSync(join(root, 'tmp'), 0o1777);
  linkInto(root, 'var/run', '/run');
  const asset = (name) => join(ASSETS, name);
  copyInto(root, 'init', asset('init'), 0o755);
  copyInto(root, 'etc/inittab', asset('inittab'), 0o644);
  copyInto(root, 'etc/init.d/rcS', asset('rcS'), 0o755);
  copyInto(root, 'etc/gpucloud/cloud-init', asset('cloud-init'), 0o755);
  copyInto(root, 'etc/gpucloud/user-data.awk', asset('user-data.awk'), 0o644);
  copyInto(root, 'etc/gpucloud/service', asset('service'), 0o755);
  copyInto(root, 'usr/share/udhcpc/default.script', asset('udhcpc.script'), 0o755);
  copyInto(root, 'etc/acpi/PWRF/00000080', asset('power-button'), 0o755);
  copyInto(root, 'etc/gpucloud/cgi-bin/echo', asset('cgi-echo'), 0o755);
  copyInto(root, 'etc/gpucloud/cgi-bin/download', asset('cgi-download'), 0o755);
  writeInto(root, 'etc/passwd', 'root:x:0:0:root:/root:/bin/sh\n');
  writeInto(root, 'etc/group', 'root:x:0:\ntty:x:5:\n');
  writeInto(root, 'etc/shadow', 'root:*:19000:0:99999:7:::\n', 0o600);
  writeInto(root, 'etc/shells', '/bin/sh\n/bin/ash\n/bin/bash\n');
  writeInto(root, 'etc/nsswitch.conf', 'passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n');
  writeInto(root, 'etc/hosts', '127.0.0.1 localhost\n');
  writeInto(root, 'etc/hostname', 'gpucloud-test\n');
  writeInto(root, 'etc/resolv.conf', '');
  writeInto(root, 'etc/profile', 'export PATH=/sbin:/bin:/usr/sbin:/usr/bin\nexport PS1="\\u@\\h:\\w\\$ "\n');
  writeInto(
    root,
    'etc/os-release',
    'NAME="gpucloud test image"\nID=gpucloud-test\nPRETTY_NAME="gpucloud test image (busybox + dropbear)"\n',
  );
}
