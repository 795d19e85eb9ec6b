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
// The build's steps are the modules beside them, which the guest never gets
// (build-root.mjs copies the guest's files by name): build-process.mjs (running
// tools, the host tools check), build-debs.mjs (the packages and their cache),
// build-root.mjs (the root file system), build-disk.mjs (initramfs and disk).
import { existsSync, mkdirSync, mkdtempSync, readdirSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, dirname, join, resolve } from 'node:path';
import { gzipSync } from 'node:zlib';
import {
  BASH_PKG,
  BUSYBOX_PKG,
  DROPBEAR_PKG,
  LIB_PKGS,
  WEBSOCKETD_PKG,
  cacheDir,
  fetchDebs,
  kernelPackage,
} from './test-image/build-debs.mjs';
import { buildDisk, cpioArchive } from './test-image/build-disk.mjs';
import { BuildError, MiB, checkTools, fail, log, onInterrupt, sbinPath } from './test-image/build-process.mjs';
import {
  PROGRAMS,
  installBash,
  installBusybox,
  installConfig,
  installKernel,
  installPrograms,
} from './test-image/build-root.mjs';

const started = Date.now();

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
  onInterrupt(cleanup);
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
