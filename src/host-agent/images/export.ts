/**
 * Exports of stopped VMs' disks (`POST /v1/vms/{id}/export`): the disk
 * flattened into one standalone qcow2 file in the VM's folder, for another
 * host to download (a move) or the control plane to keep (a snapshot).
 *
 * Files, all in the VM's folder (so destroying the VM removes them):
 *   export.qcow2.part  while `qemu-img convert` writes it and it is hashed
 *   export.qcow2       the finished export, served by `GET /v1/vms/{id}/export/disk`
 *   export.json        its SHA-256, size, the SHA-256 of the transfer token, the size
 *                      and mtime the VM's disk had, the host's boot: a restarted agent
 *                      serves it still
 *
 * Rules:
 * - `qemu-img convert -O qcow2` reads the overlay through its template: the
 *   export has no backing file. It writes without flushing (qemu-img's
 *   default for convert), and the file is then hashed (4 MiB reads) from the
 *   page cache, renamed into place and recorded. The agent does not flush it
 *   on purpose (the kernel writes it back in its own time): it is a copy for
 *   a transfer, and waiting for its flush (1 GiB, a second or more) would
 *   only hold the transfer back. Whatever happens to the agent, the page
 *   cache survives it; what does not survive is the host itself, so the
 *   record holds the kernel's boot id, and an export recorded in an earlier
 *   boot counts as failed (the next POST makes it again).
 * - A ready export is answered as it is to the next POST (with the new
 *   token), unless the VM's disk changed since (the VM ran): then it is made
 *   again. A failed one is made again. While one is made, the VM cannot start.
 * - The transfer token is kept only as its SHA-256 and compared in constant
 *   time; it opens the export's disk route and nothing else.
 */
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, readFileSync, renameSync, rmSync, statSync } from 'node:fs';
import { open, rm, type FileHandle } from 'node:fs/promises';
import type { ServerResponse } from 'node:http';
import { dirname, join } from 'node:path';
import { promisify } from 'node:util';
import type { AgentExportState } from '../api.js';
import { sameSecret, secretDigest } from '../../crypto.js';
import { hashHandle } from '../../disk-image/check.js';
import { freeBytes, gb, readJson, writeJson } from './verify.js';

const run = promisify(execFile);

/** What export.json holds. */
export interface ExportRecord {
  sha256: string;
  size_bytes: number;
  format: 'qcow2';
  /** SHA-256 (hex) of the transfer token. */
  token_sha256: string;
  /** The VM's disk.qcow2 when it was exported: another size or mtime means the VM ran since. */
  disk_size: number;
  disk_mtime_ms: number;
  /** The kernel's boot id when it was made: the file is not flushed, so it is trusted in that boot only. */
  boot_id: string;
  exported_at: string;
  /** How long `qemu-img convert` and the hash took. */
  convert_ms: number;
  hash_ms: number;
}

interface Job {
  state: AgentExportState['state'];
  error: string | null;
  record: ExportRecord | null;
  tokenDigest: Buffer;
  abort: AbortController | null;
  done: Promise<void> | null;
}

export class ExportError extends Error {
  constructor(
    readonly status: 404 | 409,
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

/** The kernel's id of this boot of the host ('' where there is none). */
function bootId(): string {
  try {
    return readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim();
  } catch {
    return '';
  }
}

/** The files of a VM folder's export. */
export function exportFiles(vmDir: string) {
  return {
    disk: join(vmDir, 'disk.qcow2'),
    part: join(vmDir, 'export.qcow2.part'),
    file: join(vmDir, 'export.qcow2'),
    meta: join(vmDir, 'export.json'),
  };
}

export class DiskExports {
  /** By VM id: exports made or read since the agent started. */
  private readonly jobs = new Map<string, Job>();

  constructor(private readonly log: (msg: string, data?: Record<string, unknown>) => void = () => undefined) {}

  /** The VM's export as this agent knows it, or as its folder holds it (an agent restarted since). */
  private known(id: string, vmDir: string): Job | null {
    const j = this.jobs.get(id);
    if (j) return j;
    const f = exportFiles(vmDir);
    const rec = readJson<ExportRecord>(f.meta);
    let size = -1;
    try {
      size = statSync(f.file).size;
    } catch {
      size = -1;
    }
    const fresh = rec?.boot_id === bootId();
    if (
      rec &&
      fresh &&
      typeof rec.sha256 === 'string' &&
      rec.size_bytes === size &&
      /^[0-9a-f]{64}$/.test(String(rec.token_sha256))
    ) {
      const job: Job = {
        state: 'ready',
        error: null,
        record: rec,
        tokenDigest: Buffer.from(rec.token_sha256, 'hex'),
        abort: null,
        done: null,
      };
      this.jobs.set(id, job);
      return job;
    }
    if (existsSync(f.part) || existsSync(f.file))
      return {
        state: 'failed',
        error:
          rec && !fresh
            ? 'the host restarted since the export was made (it is not kept across a reboot); ask for it again'
            : 'the export was interrupted (the agent stopped while it was made); ask for it again',
        record: null,
        tokenDigest: Buffer.alloc(32),
        abort: null,
        done: null,
      };
    return null;
  }

  private view(j: Job): AgentExportState {
    return {
      state: j.state,
      sha256: j.state === 'ready' ? (j.record?.sha256 ?? null) : null,
      size_bytes: j.state === 'ready' ? (j.record?.size_bytes ?? null) : null,
      format: 'qcow2',
      error: j.state === 'failed' ? j.error : null,
    };
  }

  /** The export's state, or null when there is none. */
  state(id: string, vmDir: string): AgentExportState | null {
    const j = this.known(id, vmDir);
    return j ? this.view(j) : null;
  }

  /** True while the VM's disk is being exported (it must not start). */
  running(id: string): boolean {
    return this.jobs.get(id)?.state === 'exporting';
  }

  /**
   * Starts an export of a stopped VM's folder (the caller checked it is stopped, in the VM's queue), or
   * answers the one under way or ready (accepting `token` from now on).
   */
  begin(id: string, vmDir: string, token: string): AgentExportState {
    const f = exportFiles(vmDir);
    const j = this.known(id, vmDir);
    const tokenDigest = secretDigest(token);
    if (j && j.state === 'exporting') {
      j.tokenDigest = tokenDigest;
      return this.view(j);
    }
    if (j && j.state === 'ready' && j.record && !this.stale(j.record, f.disk)) {
      j.tokenDigest = tokenDigest;
      j.record = { ...j.record, token_sha256: tokenDigest.toString('hex') };
      writeJson(f.meta, j.record);
      return this.view(j);
    }
    // The record of anything older goes first (its files go in the background, below): a record never
    // describes a file being made.
    rmSync(f.meta, { force: true });
    const abort = new AbortController();
    const job: Job = { state: 'exporting', error: null, record: null, tokenDigest, abort, done: null };
    this.jobs.set(id, job);
    job.done = this.make(id, job, f, abort.signal);
    return this.view(job);
  }

  private stale(rec: ExportRecord, disk: string): boolean {
    try {
      const st = statSync(disk);
      return st.size !== rec.disk_size || st.mtimeMs !== rec.disk_mtime_ms;
    } catch {
      return true;
    }
  }

  private async make(id: string, job: Job, f: ReturnType<typeof exportFiles>, signal: AbortSignal): Promise<void> {
    const began = performance.now();
    try {
      // A large file's unlink takes a while: not on the event loop.
      await Promise.all([rm(f.file, { force: true }), rm(f.part, { force: true })]);
      const disk = statSync(f.disk);
      this.log('exporting a VM disk', { vm: id });
      try {
        // Without -t: qemu-img convert's default cache mode writes without flushing (see above).
        await run('qemu-img', ['convert', '-O', 'qcow2', f.disk, f.part], { signal });
      } catch (err) {
        if (signal.aborted) throw err;
        const detail = (err as { stderr?: string }).stderr?.trim() || (err as Error).message;
        if (/No space left/i.test(detail))
          throw new Error(
            `disk full on the host: ${gb(freeBytes(dirname(f.disk)))} GB free, the export needs up to ${gb(disk.size)} GB`,
          );
        throw new Error(`qemu-img convert failed: ${detail}`);
      }
      const converted = performance.now();
      const fh = await open(f.part, 'r');
      let digest: string;
      let size: number;
      try {
        const hash = createHash('sha256');
        size = await hashHandle(hash, fh);
        digest = hash.digest('hex');
      } finally {
        await fh.close();
      }
      if (signal.aborted) throw new Error('the export was stopped');
      const hashed = performance.now();
      renameSync(f.part, f.file);
      const rec: ExportRecord = {
        sha256: digest,
        size_bytes: size,
        format: 'qcow2',
        token_sha256: job.tokenDigest.toString('hex'),
        disk_size: disk.size,
        disk_mtime_ms: disk.mtimeMs,
        boot_id: bootId(),
        exported_at: new Date().toISOString(),
        convert_ms: Math.round(converted - began),
        hash_ms: Math.round(hashed - converted),
      };
      writeJson(f.meta, rec);
      job.record = rec;
      job.state = 'ready';
      this.log('VM disk exported', { vm: id, size, convert_ms: rec.convert_ms, hash_ms: rec.hash_ms });
    } catch (err) {
      await rm(f.part, { force: true });
      job.state = 'failed';
      job.error = signal.aborted ? 'the export was stopped' : (err as Error).message;
      if (!signal.aborted) this.log('VM disk export failed', { vm: id, err: job.error });
    } finally {
      job.abort = null;
    }
  }

  /** True when `authorization` is `Bearer <the export's transfer token>` (constant time); false without an export. */
  accepts(id: string, vmDir: string, authorization: string | undefined): boolean {
    const j = this.known(id, vmDir);
    if (!j || j.state === 'failed' || !authorization?.startsWith('Bearer ')) return false;
    return sameSecret(authorization.slice('Bearer '.length), j.tokenDigest);
  }

  /** The ready export's file and size; 404 without an export, 409 while it is made or after it failed. */
  ready(id: string, vmDir: string): { path: string; size: number } {
    const j = this.known(id, vmDir);
    if (!j) throw new ExportError(404, 'not_found', `VM ${id} has no export`);
    if (j.state !== 'ready' || !j.record)
      throw new ExportError(
        409,
        'export_not_ready',
        `the export of VM ${id} is ${j.state}${j.error ? `: ${j.error}` : ''}`,
      );
    return { path: exportFiles(vmDir).file, size: j.record.size_bytes };
  }

  /** Stops an export under way and removes its files (`DELETE /v1/vms/{id}/export`). */
  async remove(id: string, vmDir: string): Promise<void> {
    await this.forget(id);
    const f = exportFiles(vmDir);
    rmSync(f.meta, { force: true });
    await Promise.all([rm(f.file, { force: true }), rm(f.part, { force: true })]);
  }

  /** Stops an export under way and forgets it (the VM goes, and its folder with the files). */
  async forget(id: string): Promise<void> {
    const j = this.jobs.get(id);
    j?.abort?.abort();
    await j?.done;
    this.jobs.delete(id);
  }

  /** Stops the exports under way (the agent stops); their parts are removed. */
  async close(): Promise<void> {
    const jobs = [...this.jobs.values()];
    for (const j of jobs) j.abort?.abort();
    await Promise.all(jobs.map((j) => j.done));
  }
}

/** Bytes read from an export at once while it is sent. */
const SEND_CHUNK = 1024 * 1024;

/**
 * Sends bytes `start` to `end` (inclusive) of an open file on a response whose head is written: 1 MiB at a
 * time, into two buffers used in turn (one is read into while the other is written), each read into again
 * only once the socket has taken what was written from it. No buffer is made per MiB, so 1 GiB sent gives
 * the garbage collector nothing to do. Ends the response; rejects when the file ends early or the
 * connection closes first.
 */
export async function sendRange(res: ServerResponse, file: FileHandle, start: number, end: number): Promise<void> {
  const bufs = [Buffer.allocUnsafe(SEND_CHUNK), Buffer.allocUnsafe(SEND_CHUNK)];
  // Per buffer: its write under way (settled with the socket's error or null, never rejected) and how to
  // settle it early when the connection closes.
  const written: Promise<Error | null>[] = [Promise.resolve(null), Promise.resolve(null)];
  const settle: ((err: Error | null) => void)[] = [() => undefined, () => undefined];
  let gone = false;
  const onClose = () => {
    gone = true;
    for (const f of settle) f(null);
  };
  res.once('close', onClose);
  const check = (err: Error | null) => {
    if (err) throw err;
    if (gone) throw new Error('the connection closed');
  };
  try {
    let i = 0;
    for (let at = start; at <= end; i ^= 1) {
      check(await written[i]!);
      const buf = bufs[i]!;
      const { bytesRead } = await file.read(buf, 0, Math.min(SEND_CHUNK, end - at + 1), at);
      if (bytesRead === 0) throw new Error(`the export ends at ${at}, before ${end + 1}`);
      check(null);
      written[i] = new Promise<Error | null>((resolve) => {
        settle[i] = resolve;
        res.write(buf.subarray(0, bytesRead), (err) => resolve(err ?? null));
      });
      at += bytesRead;
    }
    for (const err of await Promise.all(written)) check(err);
    await new Promise<void>((resolve) => res.end(resolve));
  } finally {
    res.off('close', onClose);
  }
}
