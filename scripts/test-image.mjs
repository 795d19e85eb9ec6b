// Builds a tiny Linux guest disk image for testing gpucloud's VM lifecycle with
// real QEMU: it boots by itself like a cloud image (SeaBIOS -> syslinux ->
// Debian's cloud kernel + an initramfs that holds the whole root: busybox,
// bash, dropbear, websocketd, a few modules), reads a cloud-init NoCloud seed (an
// ISO9660 labelled "cidata": hostname, users with their shell, groups and sudo
// rule, SSH keys, password hash, write_files; scripts/test-image/cloud-init says
// how it follows cloud-init), gets its address by DHCP, runs dropbear on port
// 22, prints cloud-init's final message on the console once SSH listens (the
// agent waits for it), and powers off on the ACPI power button (QMP
// system_powerdown).
//
// It also serves HTTP on the web ports templates declare (7860, 8188, 6080,
// 8888, 8000), one websocketd a port on all addresses, to test web access end
// to end (dropbear starts only once all of them listen):
//   GET /          200 text/html, the body "gpucloud-test-guest vm=HOSTNAME port=PORT"
//                  (HOSTNAME as the seed set it, PORT the guest port)
//   ANY /echo      200 text/plain: "METHOD PATH?QUERY" as it came, one
//                  "name: value" line a request header (lowercase, sorted),
//                  an empty line, then the request body verbatim (a chunked
//                  request body gets 400: Go's CGI host wants a length)
//   GET /download  200 application/octet-stream, 4194304 bytes of
//                  "0123456789abcde\n" repeated, generated as it is sent
//   WebSocket /ws  each text message comes back (any path upgrades)
//
//   npm run test-image -- OUT.qcow2
//   node scripts/test-image.mjs OUT.qcow2
//
// Boot it (an overlay keeps OUT.qcow2 pristine; no -kernel/-initrd needed):
//   qemu-img create -f qcow2 -F qcow2 -b OUT.qcow2 overlay.qcow2 10G
//   genisoimage -output seed.iso -volid cidata -joliet -rock user-data meta-data
//   qemu-system-x86_64 -machine q35 -accel tcg -m 512 -nodefaults -display none \
//     -serial file:console.log -drive file=overlay.qcow2,if=virtio,format=qcow2 \
//     -drive file=seed.iso,if=virtio,format=raw,readonly=on \
//     -netdev user,id=n0,hostfwd=tcp:127.0.0.1:2222-:22,hostfwd=tcp:127.0.0.1:7860-:7860 \
//     -device virtio-net-pci,netdev=n0
//
// Everything comes from Debian packages: linux-image-*-cloud-amd64,
// busybox-static, bash-static (/bin/bash), dropbear-bin, websocketd and the libraries those two link
// (checked with ld.so). The .debs are fetched with `apt-get download` into a
// cache ($GPUCLOUD_TEST_IMAGE_CACHE, else ~/.cache/gpucloud-test-image), so
// later builds need no network. Host tools (Debian packages): apt, dpkg, kmod
// (depmod), fdisk (sfdisk), dosfstools (mkfs.vfat), mtools (mcopy), syslinux +
// syslinux-common, qemu-utils (qemu-img); xz-utils/zstd only if the kernel's
// modules are compressed. No root, loop devices or mounts are needed (apt-get
// update, run only when a package cannot be found or fetched, needs root).
//
// The disk: an MBR (syslinux's mbr.bin) and one bootable FAT partition holding
// ldlinux.sys, syslinux.cfg, vmlinuz and initrd.img. The root file system lives
// in RAM, so the guest does not grow anything to the overlay's size. The guest's
// scripts are in scripts/test-image/ (the web app: service, cgi-echo, cgi-download).
import { spawn } from 'node:child_process';
import {
  chmodSync,
  closeSync,
  copyFileSync,
  existsSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readFileSync,
  readdirSync,
  readlinkSync,
  readSync,
  realpathSync,
  renameSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
  writeSync,
} from 'node:fs';
import { homedir, tmpdir } from 'node:os';
import { basename, dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { gunzipSync, gzipSync } from 'node:zlib';

const ASSETS = join(dirname(fileURLToPath(import.meta.url)), 'test-image');
const KERNEL_META = 'linux-image-cloud-amd64';
const BUSYBOX_PKG = 'busybox-static';
// The user's login shell the seed declares (cloud images have bash); statically linked.
const BASH_PKG = 'bash-static';
const DROPBEAR_PKG = 'dropbear-bin';
const WEBSOCKETD_PKG = 'websocketd';
// The libraries of dropbear-bin and websocketd (bookworm); the build checks with ld.so that these cover them.
const LIB_PKGS = ['libc6', 'libcrypt1', 'libtomcrypt1', 'libtommath1', 'libgmp10', 'zlib1g'];
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
const CMDLINE = 'console=ttyS0,115200';
const MBR_BIN = ['/usr/lib/syslinux/mbr/mbr.bin', '/usr/lib/SYSLINUX/mbr.bin', '/usr/share/syslinux/mbr.bin'];
const MiB = 1024 * 1024;

class BuildError extends Error {}
const fail = (msg) => {
  throw new BuildError(msg);
};
const started = Date.now();
const log = (msg) => console.log(`test-image: ${msg}`);

const children = new Set();
let interrupted = false;
/** Runs cmd; resolves to { status, stdout, stderr } (strings, or Buffers with raw). */
function run(cmd, args, { cwd, input, allowFail = false, raw = false } = {}) {
  return new Promise((resolveRun, reject) => {
    // Own process group, so that an interrupt can stop a tool and all its helpers (dpkg-deb's tar).
    const child = spawn(cmd, args, { cwd, stdio: ['pipe', 'pipe', 'pipe'], detached: true });
    children.add(child);
    const out = [];
    const err = [];
    child.stdout.on('data', (d) => out.push(d));
    child.stderr.on('data', (d) => err.push(d));
    child.stdin.on('error', () => {});
    child.stdin.end(input ?? '');
    child.on('error', (e) => {
      children.delete(child);
      reject(new BuildError(e.code === 'ENOENT' ? `${cmd} is not installed (${hint(cmd)})` : `${cmd}: ${e.message}`));
    });
    child.on('close', (code, signal) => {
      children.delete(child);
      if (interrupted) return; // the signal handler reports and exits
      const stdout = raw ? Buffer.concat(out) : Buffer.concat(out).toString('utf8');
      const stderr = Buffer.concat(err).toString('utf8');
      if (code !== 0 && !allowFail) {
        const text = `${stderr}${raw ? '' : stdout}`.trim().split('\n').slice(-15).join('\n');
        reject(
          new BuildError(
            `${cmd} ${args.join(' ')} failed (${signal ? `signal ${signal}` : `exit ${code}`})${text ? `:\n${text}` : ''}`,
          ),
        );
        return;
      }
      resolveRun({ status: code, stdout, stderr });
    });
  });
}

const TOOL_PACKAGES = {
  'apt-get': 'apt',
  'apt-cache': 'apt',
  'dpkg-deb': 'dpkg',
  depmod: 'kmod',
  sfdisk: 'fdisk',
  'mkfs.vfat': 'dosfstools',
  mcopy: 'mtools',
  syslinux: 'syslinux',
  'qemu-img': 'qemu-utils',
  xz: 'xz-utils',
  zstd: 'zstd',
};
function hint(cmd) {
  return TOOL_PACKAGES[cmd] ? `apt-get install ${TOOL_PACKAGES[cmd]}` : 'install it';
}
function checkTools() {
  const missing = [];
  for (const tool of [
    'apt-get',
    'apt-cache',
    'dpkg-deb',
    'depmod',
    'sfdisk',
    'mkfs.vfat',
    'mcopy',
    'syslinux',
    'qemu-img',
  ]) {
    if (!which(tool)) missing.push(tool);
  }
  if (!MBR_BIN.some((p) => existsSync(p))) missing.push('mbr.bin (syslinux-common)');
  if (missing.length) {
    const pkgs = [...new Set(missing.map((t) => TOOL_PACKAGES[t] ?? t.replace(/.*\((.*)\)/, '$1')))];
    fail(`missing host tools: ${missing.join(', ')}; apt-get install ${pkgs.join(' ')}`);
  }
}
function which(cmd) {
  const dirs = (process.env.PATH ?? '').split(':').concat(['/usr/sbin', '/sbin']);
  return dirs.some((d) => d && existsSync(join(d, cmd)));
}
function sbinPath() {
  const p = (process.env.PATH ?? '').split(':');
  for (const d of ['/usr/sbin', '/sbin']) if (!p.includes(d)) p.push(d);
  process.env.PATH = p.join(':');
}

// ---------------------------------------------------------------- packages

function cacheDir() {
  const dir =
    process.env.GPUCLOUD_TEST_IMAGE_CACHE ||
    join(process.env.XDG_CACHE_HOME || join(homedir(), '.cache'), 'gpucloud-test-image');
  mkdirSync(dir, { recursive: true });
  return resolve(dir);
}

/** apt-cache show of the candidate versions: package -> { pkg, version, arch, depends } for those apt knows. */
async function aptShow(pkgs) {
  const r = await run('apt-cache', ['show', '--no-all-versions', ...pkgs], { allowFail: true });
  const found = new Map();
  for (const stanza of (r.stdout ?? '').split(/\n\s*\n/)) {
    const field = (name) => stanza.match(new RegExp(`^${name}: (.*)$`, 'm'))?.[1]?.trim();
    const pkg = field('Package');
    if (pkg && !found.has(pkg)) {
      found.set(pkg, { pkg, version: field('Version'), arch: field('Architecture'), depends: field('Depends') ?? '' });
    }
  }
  return found;
}

let aptUpdated = false;
async function aptUpdate(why) {
  if (aptUpdated) return false;
  aptUpdated = true;
  log(`${why}: running apt-get update`);
  const r = await run('apt-get', ['update'], { allowFail: true });
  if (r.status !== 0) {
    log(`apt-get update failed (exit ${r.status}${process.getuid?.() !== 0 ? '; it needs root' : ''})`);
    return false;
  }
  return true;
}

const debName = (p) => `${p.pkg}_${p.version.replace(/:/g, '%3a')}_${p.arch}.deb`;
function cachedDebs(cache, pkg) {
  return readdirSync(cache)
    .filter((f) => f.startsWith(`${pkg}_`) && f.endsWith('.deb'))
    .map((f) => join(cache, f))
    .sort((a, b) => statSync(b).mtimeMs - statSync(a).mtimeMs);
}

/** The concrete kernel package behind linux-image-cloud-amd64. */
async function kernelPackage(cache) {
  let meta = (await aptShow([KERNEL_META])).get(KERNEL_META);
  if (!meta && (await aptUpdate(`apt does not know ${KERNEL_META}`)))
    meta = (await aptShow([KERNEL_META])).get(KERNEL_META);
  const dep = meta?.depends
    .split(',')
    .map((d) => d.trim().split(/\s/)[0])
    .find((d) => /^linux-image-.*-cloud-amd64$/.test(d));
  if (dep) return dep;
  // Offline: use the newest cached kernel.
  const cached = readdirSync(cache)
    .filter((f) => /^linux-image-[0-9].*-cloud-amd64_.*\.deb$/.test(f))
    .sort((a, b) => statSync(join(cache, b)).mtimeMs - statSync(join(cache, a)).mtimeMs);
  if (cached.length) return cached[0].split('_')[0];
  fail(`cannot resolve ${KERNEL_META} (is deb.debian.org in the apt sources?)`);
}

/** Paths of the .debs for pkgs: from the cache, else apt-get download into it. */
async function fetchDebs(cache, pkgs) {
  let info = await aptShow(pkgs);
  if (
    pkgs.some((p) => !info.has(p)) &&
    (await aptUpdate(`apt does not know ${pkgs.filter((p) => !info.has(p)).join(' ')}`))
  ) {
    info = await aptShow(pkgs);
  }
  const result = new Map();
  const toFetch = [];
  for (const pkg of pkgs) {
    const p = info.get(pkg);
    if (p?.version && p.arch) {
      const want = join(cache, debName(p));
      if (existsSync(want)) result.set(pkg, want);
      else toFetch.push(p);
    } else {
      const cached = cachedDebs(cache, pkg);
      if (!cached.length) fail(`package ${pkg} is not in apt's lists nor in the cache ${cache}`);
      log(`apt has no candidate for ${pkg}; using the cached ${basename(cached[0])}`);
      result.set(pkg, cached[0]);
    }
  }
  if (toFetch.length) {
    const specs = toFetch.map((p) => `${p.pkg}=${p.version}`);
    log(`downloading ${toFetch.map((p) => debName(p)).join(' ')} (apt-get download into ${cache})`);
    let r = await run('apt-get', ['download', ...specs], { cwd: cache, allowFail: true });
    if (r.status !== 0 && (await aptUpdate('apt-get download failed'))) {
      info = await aptShow(toFetch.map((p) => p.pkg));
      const again = toFetch.map((p) => info.get(p.pkg) ?? p);
      toFetch.splice(0, toFetch.length, ...again);
      r = await run('apt-get', ['download', ...again.map((p) => `${p.pkg}=${p.version}`)], {
        cwd: cache,
        allowFail: true,
      });
    }
    if (r.status !== 0) {
      fail(
        `apt-get download ${specs.join(' ')} failed:\n${`${r.stderr}${r.stdout}`.trim().split('\n').slice(-10).join('\n')}`,
      );
    }
    for (const p of toFetch) {
      const file = join(cache, debName(p));
      if (!existsSync(file)) fail(`apt-get download did not produce ${file}`);
      // Drop older versions of the same package.
      for (const old of cachedDebs(cache, p.pkg)) if (old !== file) rmSync(old, { force: true });
      result.set(p.pkg, file);
    }
  }
  return result;
}

async function extractDeb(deb, dir) {
  mkdirSync(dir, { recursive: true });
  try {
    await run('dpkg-deb', ['-x', deb, dir]);
  } catch (err) {
    // A damaged download must not poison every later build.
    rmSync(deb, { force: true });
    fail(`${err.message}\n${basename(deb)} looks damaged and was removed from the cache; run the build again`);
  }
}

// ---------------------------------------------------------------- the root

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

async function installKernel(kdeb, work, root) {
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

async function installBusybox(deb, work, root) {
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
async function installBash(deb, work, root) {
  const dir = join(work, 'bash');
  await extractDeb(deb, dir);
  const bin = ['bin/bash-static', 'usr/bin/bash-static'].map((p) => join(dir, p)).find((p) => existsSync(p));
  if (!bin) fail(`${basename(deb)} has no bin/bash-static`);
  rmSync(join(root, 'bin/bash'), { force: true }); // in case busybox has a bash applet
  copyInto(root, 'bin/bash', bin, 0o755);
}

// The dynamically linked programs: each package's file at the same path in the image.
const PROGRAMS = [
  { name: 'dropbear', pkg: DROPBEAR_PKG, path: 'usr/sbin/dropbear' },
  { name: 'websocketd', pkg: WEBSOCKETD_PKG, path: 'usr/bin/websocketd' },
];

/**
 * Installs PROGRAMS, the libraries they link (asked of the packaged ld.so, so
 * only LIB_PKGS can provide them) and the loader; returns program -> sonames.
 */
async function installPrograms(debs, work, root) {
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

function installConfig(root) {
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

// ---------------------------------------------------------------- initramfs (cpio newc)

const MODES = { root: 0o700, tmp: 0o1777, 'etc/shadow': 0o600 };
function cpioArchive(root, extra) {
  const chunks = [];
  let ino = 1;
  const pad4 = (n) => (4 - (n % 4)) % 4;
  const add = (name, mode, data = Buffer.alloc(0), { nlink = 1, rmajor = 0, rminor = 0 } = {}) => {
    const nameBuf = Buffer.from(`${name}\0`);
    const fields = [ino++, mode, 0, 0, nlink, 0, data.length, 0, 0, rmajor, rminor, nameBuf.length, 0];
    const header = `070701${fields.map((f) => f.toString(16).padStart(8, '0')).join('')}`;
    chunks.push(
      Buffer.from(header),
      nameBuf,
      Buffer.alloc(pad4(110 + nameBuf.length)),
      data,
      Buffer.alloc(pad4(data.length)),
    );
  };
  const walk = (rel) => {
    const full = rel ? join(root, rel) : root;
    for (const ent of readdirSync(full).sort()) {
      const r = rel ? `${rel}/${ent}` : ent;
      const st = lstatSync(join(root, r));
      // Everything belongs to root; modes are normalised (the host's umask must not matter).
      if (st.isSymbolicLink()) add(r, 0o120777, Buffer.from(readlinkSync(join(root, r))));
      else if (st.isDirectory()) {
        add(r, 0o040000 | (MODES[r] ?? 0o755), undefined, { nlink: 2 });
        walk(r);
      } else if (st.isFile())
        add(r, 0o100000 | (MODES[r] ?? (st.mode & 0o111 ? 0o755 : 0o644)), readFileSync(join(root, r)));
      else fail(`unexpected file type in the initramfs: ${r}`);
    }
  };
  add('.', 0o040755, undefined, { nlink: 2 });
  walk('');
  for (const e of extra) add(e.name, e.mode, undefined, e);
  add('TRAILER!!!', 0);
  return Buffer.concat(chunks);
}

// ---------------------------------------------------------------- the disk

async function buildDisk(work, vmlinuz, initrd, out) {
  const cfg = [
    'SERIAL 0 115200',
    'DEFAULT gpucloud',
    'PROMPT 0',
    'TIMEOUT 0',
    'LABEL gpucloud',
    '  LINUX /vmlinuz',
    '  INITRD /initrd.img',
    `  APPEND ${CMDLINE}`,
    '',
  ].join('\n');
  const cfgFile = join(work, 'syslinux.cfg');
  writeFileSync(cfgFile, cfg);
  const payload = statSync(vmlinuz).size + statSync(initrd).size + 512 * 1024;
  const partMiB = Math.max(16, Math.ceil((payload * 1.1) / MiB) + 2);
  const part = join(work, 'part.img');
  await run('mkfs.vfat', ['-C', '-F', '16', '-n', 'GPUCLOUD', part, String(partMiB * 1024)]);
  await run('syslinux', ['--install', part]);
  await run('mcopy', ['-i', part, vmlinuz, '::vmlinuz']);
  await run('mcopy', ['-i', part, initrd, '::initrd.img']);
  await run('mcopy', ['-i', part, cfgFile, '::syslinux.cfg']);

  const disk = join(work, 'disk.img');
  const startSector = 2048;
  const partSize = statSync(part).size;
  const fd = openSync(disk, 'w+');
  try {
    // An empty file of the final size, then the partition table.
    writeSync(fd, Buffer.alloc(1), 0, 1, startSector * 512 + partSize - 1);
  } finally {
    closeSync(fd);
  }
  await run('sfdisk', ['--no-reread', '--no-tell-kernel', disk], {
    input: `label: dos\nunit: sectors\n\nstart=${startSector}, size=${partSize / 512}, type=e, bootable\n`,
  });
  const mbr = readFileSync(MBR_BIN.find((p) => existsSync(p)));
  if (mbr.length > 440) fail('mbr.bin is larger than 440 bytes');
  const dfd = openSync(disk, 'r+');
  try {
    writeSync(dfd, mbr, 0, mbr.length, 0); // boot code only; sfdisk's table stays
    const pfd = openSync(part, 'r');
    try {
      const buf = Buffer.alloc(4 * MiB);
      for (let off = 0; off < partSize;) {
        const n = readSync(pfd, buf, 0, buf.length, off);
        if (n <= 0) fail('short read of the FAT partition');
        writeSync(dfd, buf, 0, n, startSector * 512 + off);
        off += n;
      }
    } finally {
      closeSync(pfd);
    }
  } finally {
    closeSync(dfd);
  }
  // Compressed like a distribution's cloud image (saves a few MB of the kernel).
  await run('qemu-img', ['convert', '-c', '-f', 'raw', '-O', 'qcow2', disk, out]);
}

// ---------------------------------------------------------------- main

async function main() {
  const args = process.argv.slice(2);
  if (args.length !== 1 || args[0].startsWith('-')) {
    console.error('usage: npm run test-image -- OUT.qcow2   (or node scripts/test-image.mjs OUT.qcow2)');
    process.exit(2);
  }
  const out = resolve(args[0]);
  if (!existsSync(dirname(out))) fail(`${dirname(out)} does not exist`);
  sbinPath();
  checkTools();
  const cache = cacheDir();
  const work = mkdtempSync(join(tmpdir(), 'gpucloud-test-image-'));
  const partial = `${out}.partial-${process.pid}`;
  const cleanup = () => {
    rmSync(work, { recursive: true, force: true });
    rmSync(partial, { force: true });
  };
  for (const [sig, code] of [
    ['SIGINT', 130],
    ['SIGTERM', 143],
    ['SIGHUP', 129],
  ]) {
    process.on(sig, async () => {
      if (interrupted) return;
      interrupted = true;
      const running = [...children];
      for (const child of running) {
        try {
          process.kill(-child.pid, 'SIGKILL');
        } catch {
          /* already gone */
        }
      }
      // Let them die before removing the files they write.
      await Promise.race([
        Promise.all(
          running.map((c) =>
            c.exitCode !== null || c.signalCode !== null ? null : new Promise((r) => c.once('close', r)),
          ),
        ),
        new Promise((r) => setTimeout(r, 3000)),
      ]);
      await new Promise((r) => setTimeout(r, 100));
      cleanup();
      console.error(`test-image: interrupted (${sig}); removed the temporary files`);
      process.exit(code);
    });
  }
  try {
    log(`package cache ${cache}`);
    const kpkg = await kernelPackage(cache);
    const debs = await fetchDebs(cache, [kpkg, BUSYBOX_PKG, BASH_PKG, DROPBEAR_PKG, WEBSOCKETD_PKG, ...LIB_PKGS]);
    for (const f of readdirSync(cache)) {
      // Kernels of older ABIs (another package name) are not needed any more.
      if (/^linux-image-.*-cloud-amd64_.*\.deb$/.test(f) && join(cache, f) !== debs.get(kpkg))
        rmSync(join(cache, f), { force: true });
    }
    log(`packages: ${[...debs.values()].map((d) => basename(d)).join(' ')}`);

    const root = join(work, 'root');
    mkdirSync(root);
    const kernel = await installKernel(debs.get(kpkg), work, root);
    log(`kernel ${kernel.version}; modules: ${kernel.modules.map((m) => m.replace(/\.ko$/, '')).join(' ')}`);
    const applets = await installBusybox(debs.get(BUSYBOX_PKG), work, root);
    await installBash(debs.get(BASH_PKG), work, root);
    const linked = await installPrograms(
      [...PROGRAMS.map((p) => p.pkg), ...LIB_PKGS].map((p) => debs.get(p)),
      work,
      root,
    );
    log(
      `busybox (${applets} applets), ${[...linked].map(([name, sonames]) => `${name} with ${sonames.join(' ')}`).join(', ')}`,
    );
    installConfig(root);

    const initrd = join(work, 'initrd.img');
    const cpio = cpioArchive(root, [
      { name: 'dev/console', mode: 0o020600, rmajor: 5, rminor: 1 },
      { name: 'dev/null', mode: 0o020666, rmajor: 1, rminor: 3 },
    ]);
    writeFileSync(initrd, gzipSync(cpio, { level: 9 }));
    log(`initramfs ${(statSync(initrd).size / MiB).toFixed(1)} MiB (${(cpio.length / MiB).toFixed(1)} MiB unpacked)`);

    await buildDisk(work, kernel.vmlinuz, initrd, partial);
    renameSync(partial, out);
    const size = statSync(out).size;
    log(`wrote ${out}: ${(size / MiB).toFixed(1)} MiB in ${((Date.now() - started) / 1000).toFixed(1)} s`);
  } finally {
    cleanup();
  }
}

try {
  await main();
} catch (err) {
  console.error(`test-image: error: ${err instanceof BuildError ? err.message : (err.stack ?? err)}`);
  process.exit(1);
}
