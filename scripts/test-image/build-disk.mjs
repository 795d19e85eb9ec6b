// The boot disk of scripts/test-image.mjs: the root file system as an initramfs (cpio newc), and a disk with an MBR
// (syslinux's mbr.bin) and one bootable FAT partition holding syslinux, the kernel and the initramfs, as qcow2.
import {
  closeSync,
  existsSync,
  lstatSync,
  openSync,
  readFileSync,
  readdirSync,
  readlinkSync,
  readSync,
  statSync,
  writeFileSync,
  writeSync,
} from 'node:fs';
import { join } from 'node:path';
import { MBR_BIN, MiB, fail, run } from './build-process.mjs';

const CMDLINE = 'console=ttyS0,115200';

const MODES = { root: 0o700, tmp: 0o1777, 'etc/shadow': 0o600 };
export function cpioArchive(root, extra) {
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

export async function buildDisk(work, vmlinuz, initrd, out) {
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
