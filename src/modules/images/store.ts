/**
 * The image store (docs/templates.md#the-image-store): disk images named by
 * their SHA-256, and the uploads that become them. One small interface, so
 * that a store other than a directory (an S3-compatible bucket) can be added
 * without touching its callers; today's store is a directory, which several
 * API instances share by mounting the same path (NFS or similar).
 *
 *   ROOT/<sha256>              an image, never written again once in place
 *   ROOT/uploads/<id>.part     an upload in progress, written in ranges
 */
import { createReadStream, createWriteStream, type ReadStream } from 'node:fs';
import { mkdir, open, rename, rm, stat, truncate } from 'node:fs/promises';
import { join } from 'node:path';
import type { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { Transform } from 'node:stream';

export interface ImageStore {
  /** Where the store is, as an operator would name it. */
  readonly location: string;
  /** Starts an empty upload. */
  createUpload(id: string): Promise<void>;
  /**
   * Appends what `body` sends to an upload that holds `offset` bytes, at most `maxBytes`: returns the new length.
   * On any error (the client went away, more than `maxBytes`) the upload is cut back to `offset` and the error thrown.
   */
  appendUpload(id: string, offset: number, body: Readable, maxBytes: number): Promise<number>;
  /** The bytes an upload holds (0 for one that is gone). */
  uploadSize(id: string): Promise<number>;
  /** A local file with the upload's bytes, for the checks (qemu-img reads files). */
  uploadFile(id: string): string;
  /** Makes an upload the image `sha256` (the caller checked it); an image already there is kept. */
  commitUpload(id: string, sha256: string): Promise<void>;
  discardUpload(id: string): Promise<void>;
  /** An image's size in bytes, or null when the store does not hold it. */
  imageSize(sha256: string): Promise<number | null>;
  /** Reads an image from byte `start` to byte `end` (inclusive). */
  readImage(sha256: string, start: number, end: number): ReadStream;
  removeImage(sha256: string): Promise<void>;
}

const SHA256_RE = /^[0-9a-f]{64}$/;
const ID_RE = /^[0-9a-f-]{36}$/;

export class DirectoryImageStore implements ImageStore {
  constructor(readonly location: string) {}

  private image(sha256: string): string {
    if (!SHA256_RE.test(sha256)) throw new Error(`not a SHA-256: ${sha256}`);
    return join(this.location, sha256);
  }

  uploadFile(id: string): string {
    if (!ID_RE.test(id)) throw new Error(`not an upload id: ${id}`);
    return join(this.location, 'uploads', `${id}.part`);
  }

  async createUpload(id: string): Promise<void> {
    await mkdir(join(this.location, 'uploads'), { recursive: true, mode: 0o700 });
    await (await open(this.uploadFile(id), 'w', 0o600)).close();
  }

  async appendUpload(id: string, offset: number, body: Readable, maxBytes: number): Promise<number> {
    const file = this.uploadFile(id);
    let written = 0;
    const counter = new Transform({
      transform(chunk: Buffer, _enc, done) {
        written += chunk.length;
        if (written > maxBytes) return done(new RangeError(`more than the ${maxBytes} bytes this range may hold`));
        done(null, chunk);
      },
    });
    try {
      await pipeline(body, counter, createWriteStream(file, { flags: 'r+', start: offset }));
    } catch (err) {
      await truncate(file, offset).catch(() => undefined);
      throw err;
    }
    return offset + written;
  }

  async uploadSize(id: string): Promise<number> {
    try {
      return (await stat(this.uploadFile(id))).size;
    } catch {
      return 0;
    }
  }

  async commitUpload(id: string, sha256: string): Promise<void> {
    const target = this.image(sha256);
    if ((await this.imageSize(sha256)) !== null) return this.discardUpload(id);
    await rename(this.uploadFile(id), target);
  }

  async discardUpload(id: string): Promise<void> {
    await rm(this.uploadFile(id), { force: true });
  }

  async imageSize(sha256: string): Promise<number | null> {
    try {
      return (await stat(this.image(sha256))).size;
    } catch {
      return null;
    }
  }

  readImage(sha256: string, start: number, end: number): ReadStream {
    return createReadStream(this.image(sha256), { start, end, highWaterMark: 1024 * 1024 });
  }

  async removeImage(sha256: string): Promise<void> {
    await rm(this.image(sha256), { force: true });
  }
}
