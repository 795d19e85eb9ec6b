/**
 * VM templates on a host: the base disk of every VM of one `template_vmid`.
 * Two sources:
 * - pulled: the control plane's desired set (`PUT /v1/templates`), downloaded
 *   into DATA/images by the puller (images/pull.ts);
 * - local: `gpucloud agent template add VMID FILE [--user NAME]` copies a
 *   qcow2 or raw image into DATA/templates/VMID/disk.qcow2 (converted to
 *   qcow2, so overlays can stand on it) with the SSH login user and the
 *   stored file's SHA-256: for air-gapped hosts, never removed by the
 *   control plane.
 * A VM is built on the pulled image when it is ready, else on the local
 * template. Its disk is a copy-on-write overlay, so the base is never written.
 */
import { execFile } from 'node:child_process';
import {
  chmodSync,
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import type { AgentDesiredTemplate, AgentTemplateState } from './api.js';
import { qemuImgInfo, sha256File } from '../disk-image/check.js';
import type { ImagePuller } from './images/pull.js';
import { AgentError } from './errors.js';

const run = promisify(execFile);

export interface Template {
  vmid: number;
  user: string;
  path: string;
  size_bytes: number;
  added_at: string;
  /** The stored disk's SHA-256; null for a template added before templates recorded it. */
  sha256: string | null;
}

/** What a VM is built on: a pulled image or a local template. */
export interface TemplateBase {
  vmid: number;
  user: string;
  path: string;
  format: 'qcow2' | 'raw';
  sha256: string | null;
  source: 'pulled' | 'local';
}

/** What the VMs on the host are built from (their records), for the clean-up of pulled images. */
export type ImageUsage = () => Iterable<{ sha256: string | null; path: string } | undefined>;

export const USER_RE = /^[a-z_][a-z0-9_-]{0,31}$/;

export function templateVmid(raw: string | number): number {
  const s = String(raw);
  if (!/^\d{1,9}$/.test(s) || Number(s) < 1)
    throw new Error(`template VMID must be a positive whole number, got "${s}"`);
  return Number(s);
}

export class TemplateStore {
  private readonly usage: ImageUsage[] = [];
  /** Bases handed to provisions under way, by VM id: not removed while the VM is built. */
  private readonly leases = new Map<string, TemplateBase>();

  /** `images`: the pulled images (absent: local templates only, `PUT /v1/templates` is refused). */
  constructor(
    private readonly dir: string,
    readonly images: ImagePuller | null = null,
  ) {}

  private folder(vmid: number): string {
    return join(this.dir, String(templateVmid(vmid)));
  }

  get(vmid: number): Template | null {
    const meta = join(this.folder(vmid), 'template.json');
    if (!existsSync(meta)) return null;
    const m = JSON.parse(readFileSync(meta, 'utf8')) as { user: string; added_at: string; sha256?: string };
    const path = join(this.folder(vmid), 'disk.qcow2');
    return {
      vmid,
      user: m.user,
      path,
      size_bytes: existsSync(path) ? statSync(path).size : 0,
      added_at: m.added_at,
      sha256: m.sha256 ?? null,
    };
  }

  list(): Template[] {
    if (!existsSync(this.dir)) return [];
    return readdirSync(this.dir)
      .filter((d) => /^\d+$/.test(d))
      .map((d) => this.get(Number(d)))
      .filter((t): t is Template => t !== null)
      .sort((a, b) => a.vmid - b.vmid);
  }

  /** Adds a template from a qcow2 or raw file. Refuses to replace one: VMs stand on it. */
  async add(vmid: number, file: string, user = 'root', now = new Date()): Promise<Template> {
    templateVmid(vmid);
    if (!USER_RE.test(user)) throw new Error(`--user "${user}" is not a Linux user name`);
    if (!existsSync(file) || !statSync(file).isFile()) throw new Error(`${file} is not a file`);
    if (this.get(vmid))
      throw new Error(
        `template ${vmid} exists already (VMs stand on it); remove it first with: gpucloud agent template remove ${vmid}`,
      );
    let format: string;
    try {
      format = String((await qemuImgInfo(file)).format);
    } catch (err) {
      throw new Error(
        `qemu-img cannot read ${file}: ${(err as { stderr?: string }).stderr?.trim() || (err as Error).message}`,
      );
    }
    if (format !== 'qcow2' && format !== 'raw')
      throw new Error(`${file} is ${format}; a template must be qcow2 or raw`);
    mkdirSync(this.dir, { recursive: true, mode: 0o700 });
    const folder = this.folder(vmid);
    const tmp = `${folder}.tmp-${process.pid}`;
    rmSync(tmp, { recursive: true, force: true });
    mkdirSync(tmp, { mode: 0o700 });
    try {
      // A flat copy without a backing chain: the template stands alone.
      await run('qemu-img', ['convert', '-f', format, '-O', 'qcow2', file, join(tmp, 'disk.qcow2')]);
      chmodSync(join(tmp, 'disk.qcow2'), 0o400);
      const sha256 = await sha256File(join(tmp, 'disk.qcow2'));
      writeFileSync(
        join(tmp, 'template.json'),
        JSON.stringify({ vmid, user, added_at: now.toISOString(), sha256 }, null, 2) + '\n',
        { mode: 0o600 },
      );
      renameSync(tmp, folder);
    } catch (err) {
      rmSync(tmp, { recursive: true, force: true });
      throw err;
    }
    return this.get(vmid)!;
  }

  remove(vmid: number, inUse: boolean): void {
    if (!this.get(vmid)) throw new Error(`there is no template ${vmid}`);
    if (inUse) throw new Error(`template ${vmid} is the base of VMs on this host; destroy them first`);
    rmSync(this.folder(vmid), { recursive: true, force: true });
  }

  /**
   * Every template of the host, one per vmid, as the agent API shows it: the pulled image when it is ready,
   * else a local template of that vmid, else the pulled image's progress (queued, downloading, failed).
   */
  states(): AgentTemplateState[] {
    const byVmid = new Map<number, AgentTemplateState>();
    for (const t of this.list())
      byVmid.set(t.vmid, {
        vmid: t.vmid,
        user: t.user,
        sha256: t.sha256,
        source: 'local',
        state: 'ready',
        bytes_done: t.size_bytes,
        size_bytes: t.size_bytes,
        reason: null,
      });
    for (const p of this.images?.states() ?? []) if (p.state === 'ready' || !byVmid.has(p.vmid)) byVmid.set(p.vmid, p);
    return [...byVmid.values()].sort((a, b) => a.vmid - b.vmid);
  }

  /** Sets the control plane's desired set: downloads what is missing, removes what nothing uses. */
  setDesired(list: AgentDesiredTemplate[]): AgentTemplateState[] {
    if (!this.images) throw new AgentError(409, 'conflict', 'this agent does not pull images');
    this.images.setDesired(list);
    this.sweep();
    return this.states();
  }

  /** Tells which images the host's VMs are built from (each VM manager on the store does, once). */
  track(usage: ImageUsage): void {
    this.usage.push(usage);
  }

  /**
   * What a VM of template `vmid` is built on: the pulled image if it is ready (verified again first when it
   * changed on disk), else the local template. Refused with 409 `template_unavailable` otherwise. Held for
   * `lease` (the VM's id) until `unlease`: an image is not removed while a VM is built on it.
   */
  async base(vmid: number, lease: string): Promise<TemplateBase> {
    const pulled = await this.images?.resolve(vmid);
    const local = this.get(vmid);
    let base: TemplateBase | null = null;
    if (pulled && 'base' in pulled) base = { vmid, ...pulled.base, source: 'pulled' };
    else if (local)
      base = { vmid, user: local.user, path: local.path, format: 'qcow2', sha256: local.sha256, source: 'local' };
    if (!base)
      throw new AgentError(
        409,
        'template_unavailable',
        pulled && 'unavailable' in pulled
          ? `${pulled.unavailable}; no VM can be built on it until it is ready`
          : `template ${vmid} is not on this host: the control plane has not sent it, and there is no local template ${vmid} (gpucloud agent template add ${vmid} FILE)`,
      );
    this.leases.set(lease, base);
    return base;
  }

  unlease(lease: string): void {
    this.leases.delete(lease);
  }

  /** A VM went away: pulled images nothing uses any more are removed. */
  released(): void {
    this.sweep();
  }

  private sweep(): void {
    if (!this.images) return;
    if (this.usage.length === 0) return this.images.sweep(null);
    const used = { sha256s: new Set<string>(), paths: new Set<string>() };
    for (const u of [...this.usage.flatMap((f) => [...f()]), ...this.leases.values()]) {
      if (!u) continue;
      if (u.sha256) used.sha256s.add(u.sha256);
      used.paths.add(u.path);
    }
    this.images.sweep(used);
  }
}
