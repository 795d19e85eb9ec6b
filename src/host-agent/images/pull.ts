/**
 * Images the control plane wants on this host (`PUT /v1/templates`), pulled
 * into DATA/images/<sha256>.<format>, one download at a time.
 *
 * Rules:
 * - The desired set is kept in DATA/images/desired.json, so a restarted agent
 *   knows it before the control plane's next call and resumes what it was
 *   downloading (the `.part` stays when the agent stops).
 * - An image is `ready` only once the whole file's SHA-256 is the declared one
 *   and `qemu-img info` accepts it (the declared format, no backing file, no
 *   external data file); only then is the part renamed into place. A size and
 *   mtime recorded beside it (`<sha256>.json`) tell whether it changed on disk
 *   since: a changed copy is hashed again before it is used and at each
 *   desired push, and deleted and downloaded again if it no longer matches.
 * - A failure is retried with a backoff (30 s doubling to 10 min); a download
 *   cut after it made progress resumes at once. An image `qemu-img` refuses is
 *   not fetched again until the control plane names another checksum.
 * - Images no desired template uses are deleted once no VM stands on them
 *   (the caller says which: `sweep`).
 */
import { existsSync, readdirSync, readFileSync, renameSync, rmSync, statSync, chmodSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import type { AgentDesiredTemplate, AgentTemplateState } from '../api.js';
import { download, DownloadError } from './download.js';
import { newEntry, set, unavailable, type Entry } from './entry.js';
import {
  diskFullReason,
  freeBytes,
  ImageRefused,
  inspectImage,
  readMeta,
  writeJson,
  type ImageFormat,
  type ImageMeta,
} from './verify.js';
import { sha256File } from '../../disk-image/check.js';

export const SHA256_RE = /^[0-9a-f]{64}$/;

export interface ImagePullerOptions {
  /** DATA/images. */
  dir: string;
  /** The agent's own token, sent as `Authorization: Bearer` to the image source. */
  token: string;
  /** MB/s (1 MB = 1,000,000 bytes), or null for no cap. */
  limitMbps?: number | null;
  log?: (msg: string, data?: Record<string, unknown>) => void;
  /** The first retry's wait after a failure (30 s), doubled each time up to `retryMaxMs` (10 min). */
  retryBaseMs?: number;
  retryMaxMs?: number;
}

/** A pulled image a template can stand on. */
export interface PulledBase {
  path: string;
  format: ImageFormat;
  sha256: string;
  user: string;
}

export class ImagePuller {
  private desired: AgentDesiredTemplate[] = [];
  private readonly entries = new Map<string, Entry>();
  private seq = 0;
  private started = false;
  private closed = false;
  private pumping = false;
  private timer: NodeJS.Timeout | null = null;
  private current: { entry: Entry; abort: AbortController; done: Promise<void> } | null = null;

  constructor(private readonly opts: ImagePullerOptions) {}

  private file(e: Pick<Entry, 'sha256' | 'format'>): string {
    return join(this.opts.dir, `${e.sha256}.${e.format}`);
  }

  private metaFile(sha256: string): string {
    return join(this.opts.dir, `${sha256}.json`);
  }

  private log(msg: string, data?: Record<string, unknown>): void {
    this.opts.log?.(msg, data);
  }

  /** Reads the desired set and the verified images; starts nothing (`start` does). */
  load(): void {
    const dir = this.opts.dir;
    if (!existsSync(dir)) return;
    try {
      const d = JSON.parse(readFileSync(join(dir, 'desired.json'), 'utf8')) as { templates?: AgentDesiredTemplate[] };
      this.desired = (d.templates ?? []).filter((t) => SHA256_RE.test(t.sha256) && /^(qcow2|raw)$/.test(t.format));
    } catch {
      this.desired = [];
    }
    for (const name of readdirSync(dir)) {
      const m = /^([0-9a-f]{64})\.json$/.exec(name);
      if (!m) continue;
      const meta = readMeta(join(dir, name));
      if (!meta || meta.sha256 !== m[1] || !existsSync(this.file(meta))) continue;
      const want = this.desired.find((t) => t.sha256 === meta.sha256);
      this.entries.set(meta.sha256, {
        ...newEntry(++this.seq, meta.sha256, meta.format, meta.size_bytes, want?.url ?? ''),
        state: 'ready',
        bytesDone: meta.size_bytes,
        meta,
      });
    }
    for (const t of this.desired) this.want(t);
  }

  /** An entry for a desired image: queued (with the part's progress) unless one exists. */
  private want(t: AgentDesiredTemplate): Entry {
    let e = this.entries.get(t.sha256);
    if (e) {
      e.url = t.url;
      return e;
    }
    e = newEntry(++this.seq, t.sha256, t.format, t.size_bytes, t.url);
    const part = `${this.file(e)}.part`;
    e.bytesDone = existsSync(part) ? Math.min(statSync(part).size, e.size) : 0;
    this.entries.set(t.sha256, e);
    return e;
  }

  /** Starts downloading what the desired set lacks. */
  start(): void {
    mkdirSync(this.opts.dir, { recursive: true, mode: 0o700 });
    // Records a stop left half-written (the records themselves were renamed into place whole).
    for (const name of readdirSync(this.opts.dir))
      if (name.endsWith('.json.tmp')) rmSync(join(this.opts.dir, name), { force: true });
    this.started = true;
    this.kick(0);
  }

  /**
   * Sets the desired set (checked already: one entry per vmid). Queues what is missing; a ready image that
   * changed on disk is verified again (in the background: until then it stays ready).
   */
  setDesired(list: AgentDesiredTemplate[]): void {
    const next = [...list].sort((a, b) => a.vmid - b.vmid);
    // Written only when it changed: the set comes with every heartbeat, and a write may wait on a busy disk.
    const changed = JSON.stringify(next) !== JSON.stringify(this.desired);
    this.desired = next;
    if (changed) {
      mkdirSync(this.opts.dir, { recursive: true, mode: 0o700 });
      writeJson(join(this.opts.dir, 'desired.json'), { templates: this.desired });
    }
    for (const t of this.desired) {
      const e = this.want(t);
      if (e.state === 'ready') void this.intact(e);
    }
    this.kick(0);
  }

  /** Pulled images a template of the desired set names, by vmid, as the agent API shows them. */
  states(): AgentTemplateState[] {
    return this.desired.map((t) => {
      const e = this.entries.get(t.sha256);
      return {
        vmid: t.vmid,
        user: t.user,
        sha256: t.sha256,
        source: 'pulled' as const,
        state: e?.state ?? 'queued',
        bytes_done: e?.bytesDone ?? 0,
        size_bytes: t.size_bytes,
        reason: e?.reason ?? null,
      };
    });
  }

  /** The desired template for a vmid, if the control plane asked for one. */
  desiredFor(vmid: number): AgentDesiredTemplate | undefined {
    return this.desired.find((t) => t.vmid === vmid);
  }

  /**
   * The pulled image template `vmid` stands on, verified again first if it changed on disk; else why there
   * is none (null: the control plane did not ask for this template).
   */
  async resolve(vmid: number): Promise<{ base: PulledBase } | { unavailable: string } | null> {
    const t = this.desiredFor(vmid);
    if (!t) return null;
    const e = this.entries.get(t.sha256);
    if (e && e.state === 'ready' && (await this.intact(e)) && e.state === 'ready')
      return { base: { path: this.file(e), format: e.format, sha256: e.sha256, user: t.user } };
    return { unavailable: unavailable(vmid, this.entries.get(t.sha256)) };
  }

  /**
   * True when a ready image is as verified. One whose size or mtime changed is hashed again (once at a
   * time); a copy that no longer matches is deleted, marked failed and downloaded again.
   */
  private intact(e: Entry): Promise<boolean> {
    if (e.state !== 'ready' || !e.meta) return Promise.resolve(false);
    const path = this.file(e);
    let st: { size: number; mtimeMs: number } | null = null;
    try {
      st = statSync(path);
    } catch {
      st = null;
    }
    if (st && st.size === e.meta.size_bytes && st.mtimeMs === e.meta.mtime_ms) return Promise.resolve(true);
    e.verifying ??= (async () => {
      const hash = st && st.size === e.size ? await sha256File(path).catch(() => null) : null;
      if (hash === e.sha256 && e.meta) {
        e.meta = { ...e.meta, mtime_ms: statSync(path).mtimeMs, verified_at: new Date().toISOString() };
        writeJson(this.metaFile(e.sha256), e.meta);
        return true;
      }
      rmSync(path, { force: true });
      rmSync(this.metaFile(e.sha256), { force: true });
      this.log('a pulled image changed on disk and no longer matches its checksum: fetching it again', {
        sha256: e.sha256,
      });
      set(e, {
        state: 'failed',
        meta: null,
        bytesDone: 0,
        reason: st
          ? 'the copy on the host was corrupted (its SHA-256 no longer matches); downloading it again'
          : 'the copy on the host was deleted; downloading it again',
        retryAt: Date.now(),
      });
      this.kick(0);
      return false;
    })()
      .catch((err: unknown) => {
        this.log('could not verify a pulled image again', { sha256: e.sha256, err: String(err) });
        return false;
      })
      .finally(() => {
        e.verifying = null;
      });
    return e.verifying;
  }

  /** Runs the queue soon (timers let the answer being built show the state as it is now). */
  private kick(ms: number): void {
    if (!this.started || this.closed) return;
    if (this.timer) clearTimeout(this.timer);
    this.timer = setTimeout(() => {
      this.timer = null;
      void this.pump();
    }, ms);
    this.timer.unref();
  }

  private next(): Entry | null {
    const wanted = new Set(this.desired.map((t) => t.sha256));
    const now = Date.now();
    let best: Entry | null = null;
    for (const e of this.entries.values()) {
      if (!wanted.has(e.sha256)) continue;
      const due = e.state === 'queued' || (e.state === 'failed' && !e.permanent && e.retryAt <= now);
      if (due && (!best || e.seq < best.seq)) best = e;
    }
    return best;
  }

  /** One download at a time, in queue order; then waits for the next retry that falls due. */
  private async pump(): Promise<void> {
    if (this.pumping) return;
    this.pumping = true;
    try {
      for (let e = this.next(); e && !this.closed; e = this.next()) {
        const abort = new AbortController();
        const entry = e;
        const done = this.fetch(entry, abort.signal);
        this.current = { entry, abort, done };
        await done;
        this.current = null;
        if (entry.dropped) rmSync(`${this.file(entry)}.part`, { force: true });
      }
    } finally {
      this.pumping = false;
    }
    const wanted = new Set(this.desired.map((t) => t.sha256));
    const waits = [...this.entries.values()]
      .filter((x) => wanted.has(x.sha256) && x.state === 'failed' && !x.permanent)
      .map((x) => x.retryAt - Date.now());
    if (waits.length && !this.closed) this.kick(Math.max(0, Math.min(...waits)));
  }

  private async fetch(e: Entry, signal: AbortSignal): Promise<void> {
    const final = this.file(e);
    const part = `${final}.part`;
    set(e, { state: 'downloading', reason: null });
    try {
      // A copy in place without its record (the record was lost): checked before it is used.
      if (existsSync(final)) {
        if ((await sha256File(final)) === e.sha256) return await this.install(e, final);
        rmSync(final, { force: true });
      }
      const have = existsSync(part) ? statSync(part).size : 0;
      const free = freeBytes(this.opts.dir);
      if (free < e.size - have) throw new DownloadError(diskFullReason(free, e.size - have), 'disk_full');
      this.log('downloading an image', { sha256: e.sha256, size: e.size, resume_from: have });
      const got = await download({
        url: e.url,
        token: this.opts.token,
        part,
        size: e.size,
        limitBytesPerS: this.opts.limitMbps ? this.opts.limitMbps * 1e6 : null,
        signal,
        onProgress: (n) => {
          e.bytesDone = n;
        },
      });
      if (got !== e.sha256) {
        rmSync(part, { force: true });
        throw new DownloadError(
          `checksum mismatch: the downloaded file's SHA-256 is ${got}, the control plane declared ${e.sha256}`,
          'size',
        );
      }
      await this.install(e, part);
    } catch (err) {
      this.failed(e, err, signal);
    }
  }

  /** Checks a file whose checksum matched with qemu-img, records it and puts it in place: ready. */
  private async install(e: Entry, file: string): Promise<void> {
    const final = this.file(e);
    try {
      const { virtualSize } = await inspectImage(file, e.format);
      chmodSync(file, 0o400);
      const st = statSync(file);
      const meta: ImageMeta = {
        sha256: e.sha256,
        format: e.format,
        size_bytes: st.size,
        virtual_size_bytes: virtualSize,
        mtime_ms: st.mtimeMs,
        verified_at: new Date().toISOString(),
      };
      // The record first: a stop in between leaves a verified part, resumed (and hashed) at the next start.
      writeJson(this.metaFile(e.sha256), meta);
      if (file !== final) renameSync(file, final);
      set(e, { state: 'ready', meta, bytesDone: st.size, failures: 0, reason: null });
      this.log('image ready', { sha256: e.sha256 });
    } catch (err) {
      rmSync(file, { force: true });
      rmSync(this.metaFile(e.sha256), { force: true });
      throw err;
    }
  }

  private failed(e: Entry, err: unknown, signal: AbortSignal): void {
    const part = `${this.file(e)}.part`;
    if (signal.aborted) {
      // The agent stops (or the image is no longer wanted): the part stays for the next start.
      e.state = 'queued';
      return;
    }
    let reason = (err as Error).message;
    if (err instanceof ImageRefused) {
      rmSync(part, { force: true });
      e.permanent = true;
    } else if (err instanceof DownloadError && err.kind === 'disk_full') {
      rmSync(part, { force: true }); // the VMs' disks need the room more
      if (err.message === 'ENOSPC') reason = diskFullReason(freeBytes(this.opts.dir), e.size);
    } else if (err instanceof DownloadError && err.kind === 'cut' && err.progressed) {
      // Resumed at once from where it stopped.
      set(e, { state: 'queued', seq: ++this.seq, bytesDone: existsSync(part) ? statSync(part).size : 0 });
      this.log('download cut; resuming', { sha256: e.sha256, err: reason });
      return;
    } else if (!(err instanceof DownloadError)) {
      reason = `the download failed: ${reason}`;
    }
    e.failures++;
    const base = this.opts.retryBaseMs ?? 30_000;
    const wait = Math.min(base * 2 ** Math.min(e.failures - 1, 20), this.opts.retryMaxMs ?? 600_000);
    set(e, {
      state: 'failed',
      reason,
      retryAt: Date.now() + wait,
      bytesDone: existsSync(part) ? statSync(part).size : 0,
    });
    this.log('image download failed', {
      sha256: e.sha256,
      reason,
      retry_in_s: e.permanent ? null : Math.round(wait / 1000),
    });
  }

  /**
   * Deletes pulled images (and parts, and downloads under way) that no desired template names and
   * no VM stands on. `used`: the checksums and paths VMs are built from; null when unknown (then only
   * parts and queued downloads go).
   */
  sweep(used: { sha256s: Set<string>; paths: Set<string> } | null): void {
    const wanted = new Set(this.desired.map((t) => t.sha256));
    for (const e of [...this.entries.values()]) {
      if (wanted.has(e.sha256)) continue;
      const path = this.file(e);
      if (this.current?.entry === e) {
        e.dropped = true;
        this.current.abort.abort();
      } else {
        rmSync(`${path}.part`, { force: true });
      }
      if (e.state !== 'ready' && !existsSync(path)) {
        this.entries.delete(e.sha256);
        continue;
      }
      if (!used || used.sha256s.has(e.sha256) || used.paths.has(path)) continue;
      rmSync(path, { force: true });
      rmSync(this.metaFile(e.sha256), { force: true });
      this.entries.delete(e.sha256);
      this.log('removed an image no template uses', { sha256: e.sha256 });
    }
  }

  /** Stops the download under way; its part stays, and the next start resumes it. */
  async close(): Promise<void> {
    this.closed = true;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    const c = this.current;
    c?.abort.abort();
    await c?.done;
  }
}
