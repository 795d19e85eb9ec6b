/**
 * What an uploaded disk image must be before any host is given it
 * (docs/templates.md#what-an-image-must-be): the rules of
 * src/disk-image/check.ts (qcow2 or raw as `qemu-img info` reads it, no
 * backing file and no external data file, a consistent qcow2), worded for the
 * uploader, and a virtual size within bounds.
 */
import { checkConsistency, DiskImageRefused, inspectDiskImage, type ImageProblem } from '../../disk-image/check.js';

export { qemuImgAvailable, sha256File as sha256OfFile } from '../../disk-image/check.js';

export class ImageCheckError extends Error {}

export interface ImageFacts {
  format: 'qcow2' | 'raw';
  virtual_size_bytes: number;
}

/** Why an image was refused, for the uploader (the upload's validation error). */
function refusal(problem: ImageProblem): string {
  switch (problem.kind) {
    case 'unreadable':
      return `qemu-img cannot read the image: ${problem.detail.slice(0, 300)}`;
    case 'format':
      return `the image is ${String(problem.format)}; an image must be qcow2 or raw`;
    case 'backing_file':
      return `the image has a backing file (${JSON.stringify(problem.file).slice(0, 200)}); flatten it first: qemu-img convert -O qcow2 IN OUT`;
    case 'data_file':
      return 'the image keeps its data in an external file; convert it to a plain qcow2 first';
    case 'corrupt':
      return 'the qcow2 image is marked corrupt';
    case 'damaged':
      return `the qcow2 image is damaged or truncated (qemu-img check: ${problem.detail.slice(0, 200)})`;
  }
}

export async function checkImage(file: string, maxVirtualBytes: number): Promise<ImageFacts> {
  try {
    const { format, virtualSize: virtual } = await inspectDiskImage(file, ['qcow2', 'raw']);
    if (!Number.isSafeInteger(virtual) || virtual <= 0) throw new ImageCheckError('the image has no virtual size');
    if (virtual > maxVirtualBytes)
      throw new ImageCheckError(
        `the image's disk is ${gb(virtual)} GB; at most ${gb(maxVirtualBytes)} GB (GPUCLOUD_IMAGE_MAX_GB)`,
      );
    await checkConsistency(file, format);
    return { format, virtual_size_bytes: virtual };
  } catch (err) {
    if (err instanceof DiskImageRefused) throw new ImageCheckError(refusal(err.problem));
    throw err;
  }
}

function gb(bytes: number): string {
  return (bytes / 1024 ** 3).toFixed(bytes % 1024 ** 3 === 0 ? 0 : 1);
}
