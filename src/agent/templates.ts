/**
 * VM templates on a host: the base disk of every VM of one `template_vmid`.
 * `gpucloud agent template add VMID FILE [--user NAME]` copies a qcow2 or raw
 * image into DATA/templates/VMID/disk.qcow2 (converted to qcow2, so overlays
 * can stand on it) with the SSH login user; a VM's disk is a copy-on-write
 * overlay on it, so the template itself is never written.
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

const run = promisify(execFile);

export interface Template {
  vmid: number;
  user: string;
  path: string;
  size_bytes: number;
  added_at: string;
}

export const USER_RE = /^[a-z_][a-z0-9_-]{0,31}$/;

export function templateVmid(raw: string | number): number {
  const s = String(raw);
  if (!/^\d{1,9}$/.test(s) || Number(s) < 1)
    throw new Error(`template VMID must be a positive whole number, got "${s}"`);
  return Number(s);
}

export class TemplateStore {
  constructor(private readonly dir: string) {}

  private folder(vmid: number): string {
    return join(this.dir, String(templateVmid(vmid)));
  }

  get(vmid: number): Template | null {
    const meta = join(this.folder(vmid), 'template.json');
    if (!existsSync(meta)) return null;
    const m = JSON.parse(readFileSync(meta, 'utf8')) as { user: string; added_at: string };
    const path = join(this.folder(vmid), 'disk.qcow2');
    return { vmid, user: m.user, path, size_bytes: existsSync(path) ? statSync(path).size : 0, added_at: m.added_at };
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
      const info = await run('qemu-img', ['info', '--output=json', file]);
      format = String((JSON.parse(info.stdout) as { format?: string }).format);
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
      writeFileSync(
        join(tmp, 'template.json'),
        JSON.stringify({ vmid, user, added_at: now.toISOString() }, null, 2) + '\n',
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
}
