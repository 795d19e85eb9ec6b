/**
 * The agent's side of the checks on a disk image before a VM may stand on it
 * (the rules are src/disk-image/check.ts, shared with the control plane): its
 * SHA-256 over the whole file, and what `qemu-img info` says of it (the
 * declared format, no backing file, no external data file: an image that
 * points at any other file, `/etc/shadow` say, is refused), in the words the
 * agent reports. A verified image's size and mtime are kept in a small JSON
 * file beside it, so a copy changed on disk since is noticed and hashed again
 * before it is used.
 */
import { existsSync, readFileSync, renameSync, statfsSync, writeFileSync } from 'node:fs';
import { DiskImageRefused, inspectDiskImage, type DiskFormat, type ImageProblem } from '../../disk-image/check.js';

export type ImageFormat = DiskFormat;

/** What is recorded beside a verified image: `<sha256>.json`. */
export interface ImageMeta {
  sha256: string;
  format: ImageFormat;
  size_bytes: number;
  virtual_size_bytes: number;
  /** The file's mtime when it was verified: a different one means it changed on disk. */
  mtime_ms: number;
  verified_at: string;
}

/** An image `qemu-img info` does not accept as a template's base. */
export class ImageRefused extends Error {}

/** Why an image was refused, as the agent reports it (a template's `reason`, an import's `error`). */
function refusal(problem: ImageProblem, declared: ImageFormat): string {
  switch (problem.kind) {
    case 'unreadable':
      return `the image was refused: qemu-img cannot read it (${problem.detail})`;
    case 'format':
      return `the image was refused: it is ${String(problem.format)}, the control plane declared ${declared}`;
    case 'backing_file':
      return `the image was refused: it has a backing file (${problem.file}); an image must stand alone`;
    case 'data_file':
      return `the image was refused: it has an external data file (${problem.file})`;
    case 'corrupt':
      return 'the image was refused: the qcow2 image is marked corrupt';
    case 'damaged':
      return `the image was refused: the qcow2 image is damaged (${problem.detail})`;
  }
}

/**
 * Checks an image with `qemu-img info` (which opens the image alone, never
 * its backing chain): the format must be the declared one, with no backing
 * file and no external data file. Answers its virtual size.
 */
export async function inspectImage(file: string, format: ImageFormat): Promise<{ virtualSize: number }> {
  try {
    const { virtualSize } = await inspectDiskImage(file, [format]);
    return { virtualSize };
  } catch (err) {
    if (err instanceof DiskImageRefused) throw new ImageRefused(refusal(err.problem, format));
    throw err;
  }
}

export function readMeta(file: string): ImageMeta | null {
  if (!existsSync(file)) return null;
  try {
    const m = JSON.parse(readFileSync(file, 'utf8')) as ImageMeta;
    return typeof m.sha256 === 'string' && typeof m.mtime_ms === 'number' && typeof m.size_bytes === 'number'
      ? m
      : null;
  } catch {
    return null; // a torn or edited record: the image is verified again
  }
}

/** A JSON file's value, or null when it is missing or torn. */
export function readJson<T>(file: string): T | null {
  try {
    const v = JSON.parse(readFileSync(file, 'utf8')) as unknown;
    return v && typeof v === 'object' ? (v as T) : null;
  } catch {
    return null;
  }
}

/** Writes a JSON file whole (a temporary file renamed into place). */
export function writeJson(file: string, value: unknown): void {
  writeFileSync(`${file}.tmp`, JSON.stringify(value, null, 2) + '\n', { mode: 0o600 });
  renameSync(`${file}.tmp`, file);
}

/** Free bytes for this user on the file system holding `dir`. */
export function freeBytes(dir: string): number {
  const s = statfsSync(dir);
  return s.bavail * s.bsize;
}

/** Bytes as GB for a message: "79", "3.2", "0.0021". */
export function gb(bytes: number): string {
  const v = bytes / 1e9;
  if (v >= 10) return v.toFixed(0);
  if (v >= 1) return v.toFixed(1);
  return String(Number(v.toPrecision(2)));
}

export function diskFullReason(free: number, need: number): string {
  return `disk full on the host: ${gb(free)} GB free, the image needs ${gb(need)} GB`;
}
