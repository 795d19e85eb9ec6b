/**
 * What an uploaded disk image must be before any host is given it
 * (docs/templates.md#what-an-image-must-be): qcow2 or raw as `qemu-img info`
 * reads it, no backing file and no external data file (either would make a
 * host read a file of its own, e.g. /etc/shadow, into a customer's disk), a
 * consistent qcow2 (`qemu-img check`), and a virtual size within bounds.
 */
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { promisify } from 'node:util';

const run = promisify(execFile);

export class ImageCheckError extends Error {}

export interface ImageFacts {
  format: 'qcow2' | 'raw';
  virtual_size_bytes: number;
}

interface QemuImgInfo {
  format?: string;
  'virtual-size'?: number;
  'backing-filename'?: string;
  'full-backing-filename'?: string;
  'format-specific'?: { type?: string; data?: { 'data-file'?: string; corrupt?: boolean } };
}

/** Whether qemu-img is installed here (the checks need it). */
export async function qemuImgAvailable(): Promise<boolean> {
  try {
    await run('qemu-img', ['--version'], { timeout: 10_000 });
    return true;
  } catch {
    return false;
  }
}

export async function checkImage(file: string, maxVirtualBytes: number): Promise<ImageFacts> {
  let info: QemuImgInfo;
  try {
    const out = await run('qemu-img', ['info', '--output=json', file], { timeout: 60_000, maxBuffer: 1 << 20 });
    info = JSON.parse(out.stdout) as QemuImgInfo;
  } catch (err) {
    const why = (err as { stderr?: string }).stderr?.trim() || (err as Error).message;
    throw new ImageCheckError(`qemu-img cannot read the image: ${why.slice(0, 300)}`);
  }
  const format = info.format;
  if (format !== 'qcow2' && format !== 'raw')
    throw new ImageCheckError(`the image is ${String(format)}; an image must be qcow2 or raw`);
  const backing = info['full-backing-filename'] ?? info['backing-filename'];
  if (backing !== undefined)
    throw new ImageCheckError(
      `the image has a backing file (${JSON.stringify(backing).slice(0, 200)}); flatten it first: qemu-img convert -O qcow2 IN OUT`,
    );
  const data = info['format-specific']?.data;
  if (data?.['data-file'] !== undefined)
    throw new ImageCheckError('the image keeps its data in an external file; convert it to a plain qcow2 first');
  if (data?.corrupt === true) throw new ImageCheckError('the qcow2 image is marked corrupt');
  const virtual = info['virtual-size'];
  if (typeof virtual !== 'number' || !Number.isSafeInteger(virtual) || virtual <= 0)
    throw new ImageCheckError('the image has no virtual size');
  if (virtual > maxVirtualBytes)
    throw new ImageCheckError(
      `the image's disk is ${gb(virtual)} GB; at most ${gb(maxVirtualBytes)} GB (GPUCLOUD_IMAGE_MAX_GB)`,
    );
  if (format === 'qcow2') await checkQcow2(file);
  return { format, virtual_size_bytes: virtual };
}

/** `qemu-img check`: 0 is clean, 3 only leaked clusters (harmless); 2 is corruption, 1 an image it cannot check. */
async function checkQcow2(file: string): Promise<void> {
  try {
    await run('qemu-img', ['check', '-f', 'qcow2', file], { timeout: 300_000, maxBuffer: 1 << 20 });
  } catch (err) {
    const code = (err as { code?: number }).code;
    if (code === 3) return;
    // stdout sums up ("37 errors were found on the image."); stderr lists each error.
    const lines = [(err as { stdout?: string }).stdout ?? '', (err as { stderr?: string }).stderr ?? '']
      .join('\n')
      .split('\n')
      .map((l) => l.trim())
      .filter(Boolean);
    const why = lines.find((l) => /errors? (were|was) found/.test(l)) ?? lines[0] ?? `exit status ${String(code)}`;
    throw new ImageCheckError(`the qcow2 image is damaged or truncated (qemu-img check: ${why.slice(0, 200)})`);
  }
}

export async function sha256OfFile(file: string): Promise<string> {
  const hash = createHash('sha256');
  for await (const chunk of createReadStream(file, { highWaterMark: 1 << 20 })) hash.update(chunk as Buffer);
  return hash.digest('hex');
}

function gb(bytes: number): string {
  return (bytes / 1024 ** 3).toFixed(bytes % 1024 ** 3 === 0 ? 0 : 1);
}
