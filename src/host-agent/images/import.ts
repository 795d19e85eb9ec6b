/**
 * Imports: VMs built from a disk downloaded from elsewhere (`disk` in the
 * provision spec) instead of an overlay on a template: another host's export
 * of the VM's disk (a move), or an image of the control plane's store.
 *
 * Files: DATA/vms/<vmid>.import/ (beside the VMs' folders, named from the
 * vmid, so an agent restarted mid-way finds it again):
 *   import.json  the VM's record and where its disk comes from (not the token)
 *   disk.part    the download, resumed from where it ends (`Range: bytes=N-`)
 *
 * Rules:
 * - The download is the one the pulled images use (download.ts): the token as
 *   `Authorization: Bearer`, the declared size, `--download-limit`, the
 *   SHA-256 computed as the bytes arrive (a resumed part is hashed first).
 * - Then the checksum must be the declared one, and `qemu-img info` must find
 *   the declared format, no backing file, no external data file, a qcow2 not
 *   marked corrupt (src/disk-image/check.ts), and a virtual size no larger
 *   than the VM's `storage_gb`. Only then is the VM built from it (the
 *   caller's `install`: its folder, grown disk, seed).
 * - A failure leaves the VM `importing` with the reason; the part stays when
 *   it can be resumed (an HTTP error, a source unreachable, a cut) and goes
 *   when it cannot (a checksum mismatch, an image refused, a full disk). The
 *   next provision of the VM tries again. A cut that made progress is resumed
 *   at once.
 * - An agent restarted during an import lists the VM as `importing`, with
 *   the reason that it restarted; the next provision resumes the part (the
 *   token is not kept on disk: it comes with the provision).
 */
import { execFile } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, renameSync, rmSync, statSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { join } from 'node:path';
import { promisify } from 'node:util';
import type { AgentDiskSource, AgentProvisionSpec } from '../api.js';
import type { TemplateStore } from '../templates.js';
import { USER_RE } from '../templates.js';
import { download, DownloadError } from './download.js';
import { diskFullReason, freeBytes, gb, ImageRefused, inspectImage, readJson, writeJson } from './verify.js';

const GIB = 1024 ** 3;
const run = promisify(execFile);

/** What an import needs to know of its VM. */
export interface ImportTarget {
  id: string;
  vmid: number;
  storage_gb: number;
}

export type ImportSpec = AgentProvisionSpec & { disk: AgentDiskSource };

/**
 * Builds the VM from the verified file (the caller's queue for the VM): answers false when the VM is no
 * longer there to build (destroyed meanwhile). Throws when the build fails.
 */
export type Install = (id: string, spec: ImportSpec, file: string, virtualSize: number) => Promise<boolean>;

interface Saved {
  record: ImportTarget;
  disk: Omit<AgentDiskSource, 'token'>;
}

interface Job {
  target: ImportTarget;
  disk: AgentDiskSource;
  spec: ImportSpec | null;
  bytesDone: number;
  error: string | null;
  abort: AbortController | null;
  /** The download and its checks. */
  fetching: Promise<void> | null;
  /** True from the download's start until the VM is built or the import failed. */
  running: boolean;
  cancelled: boolean;
}

export interface DiskImportsOptions {
  /** DATA/vms. */
  vmsDir: string;
  /** MB/s (1 MB = 1,000,000 bytes), or null for no cap: the agent's --download-limit. */
  limitMbps: number | null;
  install: Install;
  log?: (msg: string, data?: Record<string, unknown>) => void;
}

/**
 * The login user of a VM built without its template: the template's, when the host knows it, else
 * the one the control plane named, else root.
 */
export function importUser(templates: TemplateStore, templateVmid: number, named?: string): string {
  const known = templates.images?.desiredFor(templateVmid)?.user ?? templates.get(templateVmid)?.user;
  const user = known ?? named;
  return user && USER_RE.test(user) ? user : 'root';
}

/**
 * Makes a verified download the VM's disk.qcow2 at `disk` (in the folder being built): renamed (a raw image
 * converted to qcow2), then grown to `storageGb` GiB when it is smaller. A qcow2 download whose growth
 * fails is put back, for the next attempt.
 */
export async function placeDisk(
  file: string,
  format: 'qcow2' | 'raw',
  virtualSize: number,
  storageGb: number,
  disk: string,
): Promise<void> {
  if (format === 'raw') await run('qemu-img', ['convert', '-q', '-f', 'raw', '-O', 'qcow2', file, disk]);
  else renameSync(file, disk);
  try {
    const want = storageGb * GIB;
    if (virtualSize < want) await run('qemu-img', ['resize', '-q', '-f', 'qcow2', disk, String(want)]);
  } catch (err) {
    if (format === 'qcow2') renameSync(disk, file);
    throw err;
  }
}

function sameDisk(a: Omit<AgentDiskSource, 'token'>, b: Omit<AgentDiskSource, 'token'>): boolean {
  return a.sha256 === b.sha256 && a.size_bytes === b.size_bytes && a.format === b.format;
}

export class DiskImports {
  private readonly jobs = new Map<string, Job>();

  constructor(private readonly opts: DiskImportsOptions) {}

  private log(msg: string, data?: Record<string, unknown>): void {
    this.opts.log?.(msg, data);
  }

  dir(vmid: number): string {
    return join(this.opts.vmsDir, `${vmid}.import`);
  }

  private part(vmid: number): string {
    return join(this.dir(vmid), 'disk.part');
  }

  private partSize(vmid: number): number {
    try {
      return statSync(this.part(vmid)).size;
    } catch {
      return 0;
    }
  }

  /**
   * Starts (or resumes) the import of a VM, unless one runs for it already. `record` is what the VM's
   * record will be, kept in import.json so a restarted agent still lists the VM.
   */
  start(target: ImportTarget, record: unknown, spec: ImportSpec): void {
    const prior = this.jobs.get(target.id);
    if (prior?.running) return;
    const dir = this.dir(target.vmid);
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    const disk = {
      url: spec.disk.url,
      sha256: spec.disk.sha256,
      size_bytes: spec.disk.size_bytes,
      format: spec.disk.format,
    };
    const saved = readJson<Saved>(join(dir, 'import.json'));
    // A part of another file is no start for this one.
    if (saved?.disk && !sameDisk(saved.disk, disk)) rmSync(this.part(target.vmid), { force: true });
    writeJson(join(dir, 'import.json'), { record, disk } satisfies { record: unknown; disk: Saved['disk'] });
    const job: Job = {
      target,
      disk: spec.disk,
      spec,
      bytesDone: Math.min(this.partSize(target.vmid), disk.size_bytes),
      error: null,
      abort: null,
      fetching: null,
      running: false,
      cancelled: false,
    };
    this.jobs.set(target.id, job);
    this.run(job);
  }

  private run(job: Job): void {
    const abort = new AbortController();
    job.abort = abort;
    job.running = true;
    job.error = null;
    let verified: { file: string; virtualSize: number } | null = null;
    const ms = { download: 0, check: 0, build: 0 };
    job.fetching = this.fetch(job, abort.signal, ms).then(
      (v) => {
        verified = v;
      },
      (err: unknown) => {
        job.error = this.reason(err, job, abort.signal);
        job.bytesDone = this.partSize(job.target.vmid);
        if (!abort.signal.aborted) this.log('import failed', { vm: job.target.id, reason: job.error });
      },
    );
    void job.fetching
      .then(async () => {
        const v = verified as { file: string; virtualSize: number } | null;
        if (!v || job.cancelled || !job.spec) return;
        try {
          const began = performance.now();
          const built = await this.opts.install(job.target.id, job.spec, v.file, v.virtualSize);
          if (built && !job.cancelled) {
            await rm(this.dir(job.target.vmid), { recursive: true, force: true });
            this.jobs.delete(job.target.id);
            ms.build = Math.round(performance.now() - began);
            this.log('VM disk imported', {
              vm: job.target.id,
              download_ms: ms.download,
              check_ms: ms.check,
              build_ms: ms.build,
            });
          }
        } catch (err) {
          job.error = (err as Error).message;
          job.bytesDone = this.partSize(job.target.vmid);
          this.log('import failed', { vm: job.target.id, reason: job.error });
        }
      })
      .finally(() => {
        job.running = false;
        job.abort = null;
      });
  }

  /** Downloads and checks the disk; answers the verified file. */
  private async fetch(
    job: Job,
    signal: AbortSignal,
    ms: { download: number; check: number },
  ): Promise<{ file: string; virtualSize: number }> {
    const began = performance.now();
    const { vmid, storage_gb } = job.target;
    const d = job.disk;
    const part = this.part(vmid);
    mkdirSync(this.dir(vmid), { recursive: true, mode: 0o700 });
    this.log('importing a VM disk', { vm: job.target.id, size: d.size_bytes, resume_from: this.partSize(vmid) });
    let got: string;
    for (;;) {
      const have = this.partSize(vmid);
      const free = freeBytes(this.dir(vmid));
      if (free < d.size_bytes - have) throw new DownloadError(diskFullReason(free, d.size_bytes - have), 'disk_full');
      try {
        got = await download({
          url: d.url,
          token: d.token,
          part,
          size: d.size_bytes,
          limitBytesPerS: this.opts.limitMbps ? this.opts.limitMbps * 1e6 : null,
          signal,
          onProgress: (n) => {
            job.bytesDone = n;
          },
        });
        break;
      } catch (err) {
        // A cut after progress is resumed at once.
        if (err instanceof DownloadError && err.kind === 'cut' && err.progressed && !signal.aborted) {
          this.log('import download cut; resuming', { vm: job.target.id, err: err.message });
          continue;
        }
        throw err;
      }
    }
    const downloaded = performance.now();
    ms.download = Math.round(downloaded - began);
    if (got !== d.sha256) {
      await rm(part, { force: true });
      throw new Error(`checksum mismatch: the downloaded disk's SHA-256 is ${got}, the provision declared ${d.sha256}`);
    }
    let virtualSize: number;
    try {
      ({ virtualSize } = await inspectImage(part, d.format));
      if (virtualSize > storage_gb * GIB)
        throw new ImageRefused(
          `the image was refused: its virtual size is ${gb(virtualSize)} GB, more than the VM's storage_gb (${storage_gb})`,
        );
    } catch (err) {
      await rm(part, { force: true });
      throw err;
    }
    ms.check = Math.round(performance.now() - downloaded);
    return { file: part, virtualSize };
  }

  /** Why an import failed, as `import.error` says it; removes a part that cannot be resumed. */
  private reason(err: unknown, job: Job, signal: AbortSignal): string {
    if (signal.aborted) return 'the import was stopped (the agent stopped); the next provision resumes it';
    const part = this.part(job.target.vmid);
    if (err instanceof DownloadError) {
      if (err.kind === 'disk_full') {
        rmSync(part, { force: true }); // the VMs' disks need the room more
        return err.message === 'ENOSPC'
          ? diskFullReason(freeBytes(this.dir(job.target.vmid)), job.disk.size_bytes)
          : err.message;
      }
      if (err.status === 401 || err.status === 403) return `the disk source refused the token (HTTP ${err.status})`;
      if (err.status === 404) return `the disk source does not have the disk (HTTP 404)`;
      return err.message.replace('the image source', 'the disk source');
    }
    if (err instanceof ImageRefused) return err.message;
    const message = (err as Error).message;
    return message.startsWith('checksum mismatch') ? message : `the import failed: ${message}`;
  }

  /** The import's progress for the VM's view; undefined when there is none. */
  progress(id: string): { bytes_done: number; size_bytes: number; error: string | null } | undefined {
    const j = this.jobs.get(id);
    return j
      ? { bytes_done: j.bytesDone, size_bytes: j.disk.size_bytes, error: j.running ? null : j.error }
      : undefined;
  }

  /** Stops the VM's import (its download and checks) and removes its files. */
  async cancel(id: string, vmid: number): Promise<void> {
    const j = this.jobs.get(id);
    if (j) {
      j.cancelled = true;
      j.abort?.abort();
      await j.fetching;
      this.jobs.delete(id);
    }
    await rm(this.dir(vmid), { recursive: true, force: true });
  }

  /**
   * The imports an earlier agent left (DATA/vms/<vmid>.import): answers their VMs' records, each listed
   * `importing` with the reason until the next provision resumes it. A folder whose VM was built (`built`)
   * or that holds no readable record is removed.
   */
  load(built: (id: string) => boolean): unknown[] {
    const records: unknown[] = [];
    if (!existsSync(this.opts.vmsDir)) return records;
    for (const name of readdirSync(this.opts.vmsDir)) {
      const m = /^(\d+)\.import$/.exec(name);
      if (!m) continue;
      const saved = readJson<Saved & { record: Record<string, unknown> }>(join(this.opts.vmsDir, name, 'import.json'));
      const r = saved?.record;
      const valid =
        r &&
        typeof r.id === 'string' &&
        r.vmid === Number(m[1]) &&
        typeof r.storage_gb === 'number' &&
        saved.disk &&
        typeof saved.disk.size_bytes === 'number';
      if (!valid || built(r.id as string)) {
        rmSync(join(this.opts.vmsDir, name), { recursive: true, force: true });
        continue;
      }
      const target = r as unknown as ImportTarget;
      this.jobs.set(target.id, {
        target,
        disk: { ...saved.disk, token: '' },
        spec: null,
        bytesDone: Math.min(this.partSize(target.vmid), saved.disk.size_bytes),
        error: 'the agent restarted during the import; the next provision resumes it',
        abort: null,
        fetching: null,
        running: false,
        cancelled: false,
      });
      records.push(r);
    }
    return records;
  }

  /** Stops the downloads under way (the agent stops); their parts stay for the next start. */
  close(): void {
    for (const j of this.jobs.values()) j.abort?.abort();
  }
}
