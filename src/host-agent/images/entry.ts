/** What the puller (pull.ts) knows of one image, by checksum, and how the agent API words its state. */
import type { ImageFormat, ImageMeta } from './verify.js';

export interface Entry {
  sha256: string;
  format: ImageFormat;
  size: number;
  url: string;
  state: 'queued' | 'downloading' | 'ready' | 'failed';
  bytesDone: number;
  reason: string | null;
  /** Order in the download queue. */
  seq: number;
  failures: number;
  retryAt: number;
  /** Refused by qemu-img: not fetched again under this checksum. */
  permanent: boolean;
  meta: ImageMeta | null;
  verifying: Promise<boolean> | null;
  /** No longer wanted while it was downloading: its part goes when the download stops. */
  dropped: boolean;
}

export function newEntry(seq: number, sha256: string, format: ImageFormat, size: number, url: string): Entry {
  return {
    sha256,
    format,
    size,
    url,
    state: 'queued',
    bytesDone: 0,
    reason: null,
    seq,
    failures: 0,
    retryAt: 0,
    permanent: false,
    meta: null,
    verifying: null,
    dropped: false,
  };
}

/** Changes some of an entry's fields (typed, unlike a bare Object.assign). */
export function set(e: Entry, patch: Partial<Entry>): void {
  Object.assign(e, patch);
}

/** Why template `vmid` cannot be used yet, for a refused provision. */
export function unavailable(vmid: number, e: Entry | undefined): string {
  if (!e || e.state === 'queued' || e.state === 'ready') return `template ${vmid} is queued for download on this host`;
  if (e.state === 'downloading') {
    const pct = e.size ? Math.floor((e.bytesDone / e.size) * 100) : 0;
    return `template ${vmid} is still downloading on this host (${pct}%)`;
  }
  return `template ${vmid} failed on this host: ${e.reason ?? 'unknown'}`;
}
