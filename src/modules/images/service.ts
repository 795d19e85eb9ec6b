/**
 * Disk images (docs/templates.md#pushing-an-image): an operator uploads one
 * in ranges (a resumable upload), completing it checks the whole file (its
 * SHA-256, then qemu-img's rules) and puts it in the image store, optionally
 * as a template's image; host agents download images from here with their
 * node's token.
 */
import { sameSecret } from '../../crypto.js';
import { Readable } from 'node:stream';
import type { Db, Queryable } from '../../db/db.js';
import type { Clock } from '../../clock.js';
import { AppError, notFound, unauthorized, validation } from '../../errors.js';
import { newId, UUID_RE } from '../../ids.js';
import type { ImageStore } from './store.js';
import { checkImage, ImageCheckError, qemuImgAvailable, sha256OfFile } from './check.js';
import * as uploads from './repository.js';
import * as repo from './repository.js';
import type { ImageRow } from './repository.js';
import type { ImageRecord, UploadRecord } from './schemas.js';

/** The most one range of an upload may carry (a request stays short, whatever the image's size). */
export const UPLOAD_RANGE_MAX = 64 * 1024 * 1024;
/** An upload not completed within this is forgotten, with its bytes. */
const UPLOAD_TTL_MS = 24 * 3600_000;

export interface ImageLimits {
  /** The largest image file, and the largest disk an image may describe, in bytes. */
  maxBytes: number;
}

export class ImageService {
  /** Uploads this instance is writing a range of now: a second range at once is refused. */
  private readonly writing = new Set<string>();

  constructor(
    private readonly db: Db,
    private readonly clock: Clock,
    readonly store: ImageStore,
    private readonly limits: ImageLimits,
    /** The node's agent token, unsealed; null for a node without an agent. */
    private readonly agentTokenOf: (node: string) => Promise<string | null>,
    /** The images a node's host must hold. */
    private readonly imagesFor: (node: string) => Promise<Set<string>>,
    /** The template catalogue: whether a template exists, and making an image a template's. */
    private readonly templates: {
      exists: (vmid: number) => Promise<boolean>;
      setImage: (tx: Queryable, vmid: number, sha256: string) => Promise<void>;
    },
  ) {}

  async createUpload(input: { size_bytes: number; sha256?: string; template_vmid?: number }): Promise<UploadRecord> {
    if (input.size_bytes > this.limits.maxBytes)
      throw validation(
        'body.size_bytes',
        `is more than the largest image allowed, ${this.limits.maxBytes} bytes (GPUCLOUD_IMAGE_MAX_GB)`,
      );
    if (!(await qemuImgAvailable()))
      throw new AppError(
        'invalid_state',
        'The control plane checks images with qemu-img, which is not installed here (Debian: apt-get install qemu-utils)',
      );
    if (input.template_vmid !== undefined && !(await this.templates.exists(input.template_vmid)))
      throw validation('body.template_vmid', `there is no template ${input.template_vmid}; create it first`);
    await this.forgetExpired();
    const now = this.clock.now();
    const id = newId();
    await this.store.createUpload(id);
    const row = await uploads.insertUpload(this.db, {
      id,
      size_bytes: input.size_bytes,
      received_bytes: 0,
      sha256: input.sha256 ?? null,
      template_vmid: input.template_vmid ?? null,
      created_at: now,
      expires_at: new Date(now.getTime() + UPLOAD_TTL_MS),
    });
    return toUpload(row);
  }

  async upload(id: string): Promise<UploadRecord> {
    return toUpload(await this.liveUpload(id));
  }

  /** Writes one range, which must start where the upload ends. */
  async appendRange(id: string, offset: number, body: Readable): Promise<UploadRecord> {
    const row = await this.liveUpload(id);
    if (offset !== row.received_bytes)
      throw new AppError(
        'conflict',
        `The upload holds ${row.received_bytes} bytes: send the range that starts there (offset=${row.received_bytes})`,
      );
    if (this.writing.has(id)) throw new AppError('conflict', 'A range of this upload is being written already');
    this.writing.add(id);
    try {
      const max = Math.min(UPLOAD_RANGE_MAX, row.size_bytes - offset);
      let end: number;
      try {
        end = await this.store.appendUpload(id, offset, body, max);
      } catch (err) {
        if (err instanceof RangeError)
          throw new AppError('payload_too_large', `A range carries at most ${max} bytes here: ${err.message}`);
        throw new AppError('validation_error', 'The range did not arrive whole; send it again from the same offset');
      }
      if (!(await uploads.advanceUpload(this.db, id, offset, end)))
        throw new AppError('conflict', 'The upload changed meanwhile; ask for its state and go on from there');
      return toUpload({ ...row, received_bytes: end });
    } finally {
      this.writing.delete(id);
    }
  }

  /** Checks the whole upload and makes it an image (and the template's image when the upload named one). */
  async complete(id: string): Promise<ImageRecord> {
    const row = await this.liveUpload(id);
    if (row.received_bytes !== row.size_bytes)
      throw new AppError(
        'invalid_state',
        `The upload holds ${row.received_bytes} of ${row.size_bytes} bytes; send the rest before completing it`,
      );
    const file = this.store.uploadFile(id);
    const fail = async (field: string, message: string): Promise<never> => {
      await this.store.discardUpload(id);
      await uploads.deleteUpload(this.db, id);
      throw new AppError('validation_error', `${message}; nothing was kept, upload it again`, [{ field, message }]);
    };
    const sha256 = await sha256OfFile(file);
    if (row.sha256 && row.sha256 !== sha256)
      await fail('body.sha256', `checksum mismatch: expected ${row.sha256}, the bytes received hash to ${sha256}`);
    let facts;
    try {
      facts = await checkImage(file, this.limits.maxBytes);
    } catch (err) {
      if (!(err instanceof ImageCheckError)) throw err;
      return fail('image', err.message);
    }
    const now = this.clock.now();
    await this.store.commitUpload(id, sha256);
    await this.db.transaction(async (tx) => {
      await repo.insertImage(tx, { sha256, ...facts, size_bytes: row.size_bytes, created_at: now });
      if (row.template_vmid !== null) await this.templates.setImage(tx, row.template_vmid, sha256);
      await uploads.deleteUpload(tx, id);
    });
    return this.get(sha256);
  }

  /**
   * Copies an image a host exports (a customer's snapshot, docs/images.md) into the store: the bytes
   * must hash to `src.sha256` and make a clean image without a backing file. Content the store holds
   * already is not copied again. Returns the image's size.
   */
  async importFrom(src: { url: string; token: string; sha256: string; sizeBytes: number }): Promise<number> {
    if ((await repo.getImage(this.db, src.sha256)) && (await this.store.imageSize(src.sha256)) !== null)
      return src.sizeBytes;
    const id = newId();
    await this.store.createUpload(id);
    try {
      // A host that stops sending is given up on: a minute, plus the time the bytes take at 5 MB/s.
      const res = await fetch(src.url, {
        headers: { authorization: `Bearer ${src.token}` },
        redirect: 'error',
        signal: AbortSignal.timeout(60_000 + Math.ceil(src.sizeBytes / 5_000)),
      });
      if (!res.ok || !res.body) throw new Error(`the host answered HTTP ${res.status}`);
      const end = await this.store.appendUpload(
        id,
        0,
        Readable.fromWeb(res.body as import('node:stream/web').ReadableStream<Uint8Array>),
        src.sizeBytes,
      );
      if (end !== src.sizeBytes) throw new Error(`the copy holds ${end} of ${src.sizeBytes} bytes`);
      const file = this.store.uploadFile(id);
      const sha256 = await sha256OfFile(file);
      if (sha256 !== src.sha256)
        throw new Error(`checksum mismatch: expected ${src.sha256}, the copy hashes to ${sha256}`);
      // The VM's own disk: its size was allowed when it was rented.
      const facts = await checkImage(file, Number.MAX_SAFE_INTEGER).catch((err: unknown) => {
        throw new Error(err instanceof Error ? err.message : String(err));
      });
      await this.store.commitUpload(id, sha256);
      await repo.insertImage(this.db, { sha256, ...facts, size_bytes: end, created_at: this.clock.now() });
      return end;
    } catch (err) {
      await this.store.discardUpload(id);
      throw err;
    }
  }

  /** Removes content from the store once nothing stands on it any more (a deleted customer image's). */
  async forgetUnused(sha256: string, inUse: (tx: Queryable) => Promise<boolean>): Promise<void> {
    const gone = await this.db.transaction(async (tx) => {
      if (!(await repo.getImage(tx, sha256, true)) || (await inUse(tx))) return false;
      await repo.deleteImage(tx, sha256);
      return true;
    });
    if (gone) await this.store.removeImage(sha256);
  }

  async cancelUpload(id: string): Promise<void> {
    await this.liveUpload(id);
    await this.store.discardUpload(id);
    await uploads.deleteUpload(this.db, id);
  }

  async get(sha256: string): Promise<ImageRecord> {
    const row = await repo.getImage(this.db, sha256);
    if (!row) throw notFound('Image');
    return toImage(row, await repo.templatesOfImage(this.db, sha256));
  }

  async list(limit: number, offset: number): Promise<{ items: ImageRecord[]; total: number }> {
    const r = await repo.listImages(this.db, limit, offset);
    return { items: r.rows.map((i) => toImage(i, i.templates)), total: r.total };
  }

  /** Deletes an image no template uses; hosts remove their copies once no VM stands on them. */
  async delete(sha256: string): Promise<void> {
    await this.db.transaction(async (tx) => {
      if (!(await repo.getImage(tx, sha256, true))) throw notFound('Image');
      const using = await repo.templatesOfImage(tx, sha256);
      if (using.length > 0)
        throw new AppError(
          'conflict',
          `The image is template ${using.join(', ')}'s; give the template another image or delete it first`,
        );
      const customers = await repo.customerImagesOf(tx, sha256);
      if (customers > 0)
        throw new AppError(
          'conflict',
          `The content is ${customers} customer image(s)' (snapshots); it goes when their owners delete them`,
        );
      await repo.deleteImage(tx, sha256);
    });
    await this.store.removeImage(sha256);
  }

  /**
   * An agent's download: `authorization` must be the node's agent token, and the image one the node's host
   * must hold. Answers the image's size (the caller streams the range).
   */
  async forAgent(node: string, sha256: string, authorization: string | undefined): Promise<number> {
    const token = await this.agentTokenOf(node).catch(() => null);
    // Compared even without a token (with one nobody holds), so the answer takes as long either way.
    if (!sameSecret(authorization ?? '', `Bearer ${token ?? newId()}`) || !token)
      throw unauthorized("The node's agent token is required");
    const size = await this.store.imageSize(sha256);
    if (size === null || !(await this.imagesFor(node)).has(sha256)) throw notFound('Image (for this node)');
    return size;
  }

  private async liveUpload(id: string) {
    const row = UUID_RE.test(id) ? await uploads.getUpload(this.db, id) : undefined;
    if (!row || row.expires_at <= this.clock.now()) throw notFound('Upload');
    return row;
  }

  private async forgetExpired(): Promise<void> {
    for (const id of await uploads.deleteExpired(this.db, this.clock.now())) await this.store.discardUpload(id);
  }
}

function toImage(i: ImageRow, templates: number[]): ImageRecord {
  return {
    sha256: i.sha256,
    format: i.format,
    size_bytes: i.size_bytes,
    virtual_size_bytes: i.virtual_size_bytes,
    templates,
    created_at: i.created_at.toISOString(),
  };
}

function toUpload(u: uploads.UploadRow): UploadRecord {
  return {
    id: u.id,
    size_bytes: u.size_bytes,
    received_bytes: u.received_bytes,
    sha256: u.sha256,
    template_vmid: u.template_vmid,
    created_at: u.created_at.toISOString(),
    expires_at: u.expires_at.toISOString(),
  };
}
