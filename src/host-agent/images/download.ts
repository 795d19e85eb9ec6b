/**
 * One image download into a `.part` file: `GET url` with the agent's token,
 * resumed from the part already on disk with `Range: bytes=N-` (a 206 whose
 * Content-Range starts at N continues it, a 200 starts over), the SHA-256
 * computed over the whole file (the existing part is hashed again first), and
 * an optional bandwidth cap. What is on disk stays a `.part`: the caller
 * checks the checksum and the image, then renames it into place.
 */
import { createHash } from 'node:crypto';
import { existsSync, rmSync, statSync } from 'node:fs';
import { open } from 'node:fs/promises';
import { request as httpRequest, type IncomingMessage } from 'node:http';
import { request as httpsRequest } from 'node:https';
import { hashInto } from '../../disk-image/check.js';

/** Bytes gathered before one write to the part file. */
const WRITE_BATCH = 1024 * 1024;
/**
 * Bytes written between two flushes to disk (fdatasync, in the background while the download goes on): the
 * fsync at the end then has little left to write, where it had the whole file to flush after the last byte.
 */
const SYNC_EVERY = 64 * 1024 * 1024;
export interface DownloadJob {
  url: string;
  token: string;
  /** The `.part` file: resumed when it exists. */
  part: string;
  /** The declared size: the source must send exactly this many bytes. */
  size: number;
  /** Bytes per second, or null for no cap. */
  limitBytesPerS: number | null;
  signal: AbortSignal;
  onProgress(bytesDone: number): void;
  /** Idle time after which a silent source counts as gone. */
  idleTimeoutMs?: number;
}

export type DownloadErrorKind = 'http' | 'unreachable' | 'cut' | 'size' | 'disk_full';

export class DownloadError extends Error {
  constructor(
    message: string,
    readonly kind: DownloadErrorKind,
    /** True when this attempt wrote bytes to the part (a cut download is resumed at once). */
    readonly progressed = false,
    /** The source's HTTP status, for kind `http`. */
    readonly status?: number,
  ) {
    super(message);
    this.name = 'DownloadError';
  }
}

/** Waits `ms`, or less if the download is stopped. */
function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise<void>((resolve) => {
    const done = () => {
      clearTimeout(t);
      signal.removeEventListener('abort', done);
      resolve();
    };
    const t = setTimeout(done, ms);
    signal.addEventListener('abort', done, { once: true });
  });
}

function get(url: URL, headers: Record<string, string>, job: DownloadJob): Promise<IncomingMessage> {
  return new Promise((resolve, reject) => {
    const request = url.protocol === 'https:' ? httpsRequest : httpRequest;
    const req = request(url, { method: 'GET', headers, signal: job.signal }, resolve);
    req.setTimeout(job.idleTimeoutMs ?? 60_000, () =>
      req.destroy(new Error(`no answer for ${Math.round((job.idleTimeoutMs ?? 60_000) / 1000)} s`)),
    );
    req.on('error', reject);
    req.end();
  });
}

/** The `detail` of a `{detail, code}` error answer, if the body is one (read up to 4 KiB). */
async function errorDetail(res: IncomingMessage): Promise<string> {
  let body = '';
  for await (const chunk of res) {
    body += String(chunk);
    if (body.length > 4096) break;
  }
  res.destroy();
  try {
    const d = (JSON.parse(body) as { detail?: unknown }).detail;
    return typeof d === 'string' ? `: ${d.slice(0, 300)}` : '';
  } catch {
    return '';
  }
}

async function httpError(res: IncomingMessage): Promise<DownloadError> {
  const status = res.statusCode ?? 0;
  const detail = await errorDetail(res);
  if (status === 401 || status === 403)
    return new DownloadError(
      `the image source refused the agent's token (HTTP ${status}${detail}); is the node's agent token this agent's?`,
      'http',
      false,
      status,
    );
  if (status === 404)
    return new DownloadError(`the image source does not have the image (HTTP 404${detail})`, 'http', false, status);
  return new DownloadError(`the download failed: HTTP ${status}${detail}`, 'http', false, status);
}

/** Downloads into `job.part` (resuming it); answers the SHA-256 of the whole part. Throws DownloadError or on abort. */
export async function download(job: DownloadJob): Promise<string> {
  let have = existsSync(job.part) ? statSync(job.part).size : 0;
  if (have > job.size) {
    rmSync(job.part, { force: true });
    have = 0;
  }
  /** What the part held before: an attempt that ends below it made no progress (a 200 starts over). */
  const before = have;
  let hash = createHash('sha256');
  await hashInto(hash, job.part, existsSync(job.part) ? have : 0);
  job.onProgress(have);
  if (have === job.size) return hash.digest('hex');

  const url = new URL(job.url);
  const headers: Record<string, string> = {
    authorization: `Bearer ${job.token}`,
    'accept-encoding': 'identity',
    ...(have > 0 ? { range: `bytes=${have}-` } : {}),
  };
  let res: IncomingMessage;
  try {
    res = await get(url, headers, job);
  } catch (err) {
    if (job.signal.aborted) throw err;
    const e = err as NodeJS.ErrnoException;
    throw new DownloadError(`the image source is unreachable (${url.host}): ${e.code ?? e.message}`, 'unreachable');
  }
  const status = res.statusCode ?? 0;
  if (status === 200) {
    // The whole image from its first byte: whatever part there was is dropped.
    have = 0;
    hash = createHash('sha256');
    const length = res.headers['content-length'];
    if (length !== undefined && Number(length) !== job.size) {
      res.destroy();
      throw new DownloadError(`the source sends ${length} bytes, the control plane declared ${job.size}`, 'size');
    }
  } else if (status === 206) {
    const m = /^bytes (\d+)-(\d+)\/(\d+|\*)$/.exec(res.headers['content-range'] ?? '');
    if (!m || Number(m[1]) !== have || (m[3] !== '*' && Number(m[3]) !== job.size)) {
      res.destroy();
      rmSync(job.part, { force: true }); // the next attempt starts over
      throw new DownloadError(
        `the source answered the range ${res.headers['content-range'] ?? '(none)'} to bytes=${have}- of ${job.size}`,
        'size',
      );
    }
  } else if (status === 416) {
    res.destroy();
    rmSync(job.part, { force: true });
    throw new DownloadError('the source could not resume the download (HTTP 416); it starts over', 'size');
  } else {
    throw await httpError(res);
  }

  const start = have;
  const began = Date.now();
  const progressed = () => have > before;
  const file = await open(job.part, status === 200 ? 'w' : 'a', 0o600);
  // Pieces are written in batches of about 1 MiB, each while the next is read: a write per 64 KiB piece,
  // awaited before the next read, held a download to half the speed the disk and the network allow.
  let batch: Buffer[] = [];
  let batchBytes = 0;
  let pending: Promise<unknown> = Promise.resolve(null);
  const written = async () => {
    const err = await pending;
    if (!err) return;
    if ((err as NodeJS.ErrnoException).code === 'ENOSPC') throw new DownloadError('ENOSPC', 'disk_full', progressed());
    throw err;
  };
  // One writev per batch (the pieces are not copied into one buffer first). A write may take only part of
  // it (a file system nearly full): the rest is written until it all is, or until the file system refuses
  // with ENOSPC.
  const writeAll = async (pieces: Buffer[], total: number) => {
    const { bytesWritten } = await file.writev(pieces);
    if (bytesWritten === total) return;
    const rest = Buffer.concat(pieces).subarray(bytesWritten);
    for (let at = 0; at < rest.length;) {
      const { bytesWritten: n } = await file.write(rest, at, rest.length - at);
      if (n <= 0) throw Object.assign(new Error('ENOSPC: nothing written'), { code: 'ENOSPC' });
      at += n;
    }
  };
  let unsynced = 0;
  let syncing: Promise<unknown> = Promise.resolve();
  const flush = async () => {
    await written();
    if (batchBytes === 0) return;
    const pieces = batch;
    const total = batchBytes;
    batch = [];
    batchBytes = 0;
    pending = writeAll(pieces, total).then(
      () => null,
      (err: unknown) => err,
    );
    unsynced += total;
    if (unsynced >= SYNC_EVERY) {
      unsynced = 0;
      // After this write, not awaited: the download goes on while the disk catches up (errors: the last sync).
      const after = pending;
      syncing = syncing.then(() => after).then(() => file.datasync().catch(() => undefined));
    }
  };
  try {
    for await (const chunk of res as AsyncIterable<Buffer>) {
      if (have + chunk.length > job.size)
        throw new DownloadError(`the source sends more than the declared ${job.size} bytes`, 'size');
      batch.push(chunk);
      batchBytes += chunk.length;
      if (batchBytes >= WRITE_BATCH) await flush();
      hash.update(chunk);
      have += chunk.length;
      job.onProgress(have);
      if (job.limitBytesPerS) {
        const wait = began + ((have - start) / job.limitBytesPerS) * 1000 - Date.now();
        if (wait > 0) await sleep(wait, job.signal);
        if (job.signal.aborted) throw new Error('the download was stopped');
      }
    }
    await flush();
    await written();
    await syncing;
    await file.sync();
  } catch (err) {
    res.destroy();
    // What arrived before a cut or a stop is kept in the part, for the next attempt to resume from.
    if (!(err instanceof DownloadError)) await flush().catch(() => undefined);
    await pending;
    await syncing;
    if (job.signal.aborted || err instanceof DownloadError) throw err;
    const e = err as NodeJS.ErrnoException;
    if (e.code === 'ENOSPC') throw new DownloadError('ENOSPC', 'disk_full', progressed());
    throw new DownloadError(
      `the connection ended after ${have} of ${job.size} bytes (${e.code ?? e.message})`,
      'cut',
      progressed(),
    );
  } finally {
    await file.close().catch(() => undefined);
  }
  if (have < job.size)
    throw new DownloadError(`the connection ended after ${have} of ${job.size} bytes`, 'cut', progressed());
  return hash.digest('hex');
}
