/**
 * `gpucloud backup FILE`: a consistent copy of the running service's embedded
 * database (GET /admin/backup), saved as FILE. It is written under a name of
 * its own beside FILE, flushed to disk and renamed into place, so FILE is only
 * ever a whole backup; it is the user's alone (mode 0600: it holds every
 * account and the signing secret). `gpucloud restore FILE` brings it back.
 */
import { createHash, randomBytes } from 'node:crypto';
import { chmodSync, existsSync, statSync } from 'node:fs';
import { open, rename, rm } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import { GpuCloudError } from '../sdk/index.js';
import { printJson, type Command } from './command.js';
import { CliFailure } from './output.js';

/** The file name the service offers the archive under (Content-Disposition), if it is a plain one. */
function offeredName(disposition: string | null): string | undefined {
  const m = /filename="([^"/\\]+)"/.exec(disposition ?? '');
  return m && basename(m[1]!) === m[1] ? m[1] : undefined;
}

/** 12345678 -> "11.8 MiB". */
function size(bytes: number): string {
  if (bytes < 1024) return `${bytes} bytes`;
  const units = ['KiB', 'MiB', 'GiB'];
  let n = bytes / 1024;
  let u = 0;
  while (n >= 1024 && u < units.length - 1) {
    n /= 1024;
    u++;
  }
  return `${n.toFixed(1)} ${units[u]}`;
}

export const BACKUP_COMMAND: Command = {
  path: 'backup',
  args: '<FILE>',
  summary: 'Save a consistent copy of the running embedded database as FILE (admin)',
  example: [
    'gpucloud backup /var/backups/gpucloud/$(date -u +%Y%m%dT%H%M%SZ).tar.gz',
    'gpucloud backup /var/backups/gpucloud/   # a folder: the name the service offers, in it',
  ],
  async run(ctx) {
    let file = ctx.positionals[0]!;
    const { error, response, data } = await ctx.client().api.GET('/admin/backup', { parseAs: 'stream' });
    if (!response.ok) throw GpuCloudError.from(response, error);
    if (!data) throw new CliFailure('Error: the service answered no backup');
    if (existsSync(file) && statSync(file).isDirectory()) {
      const name = offeredName(response.headers.get('content-disposition'));
      if (!name) throw new CliFailure(`Error: ${file} is a folder, and the service offered no file name: give one`);
      file = join(file, name);
    }
    const tmp = join(dirname(file), `.${basename(file)}.${process.pid}.${randomBytes(4).toString('hex')}.partial`);
    const hash = createHash('sha256');
    let bytes = 0;
    try {
      const out = await open(tmp, 'wx', 0o600);
      try {
        for await (const chunk of data as unknown as AsyncIterable<Uint8Array>) {
          hash.update(chunk);
          bytes += chunk.length;
          await out.write(chunk);
        }
        await out.sync();
      } finally {
        await out.close();
      }
      await rename(tmp, file);
    } catch (err) {
      await rm(tmp, { force: true });
      const e = err as NodeJS.ErrnoException;
      if (e.code && e.path) throw new CliFailure(`Error: cannot write ${file}: ${e.message}`);
      throw new CliFailure(`Error: the download broke off (${e.message}); ${file} was not written`);
    }
    chmodSync(file, 0o600);
    const sha256 = hash.digest('hex');
    if (ctx.json) return printJson(ctx, { file, bytes, sha256 });
    ctx.out(`Saved the backup as ${file} (${size(bytes)}, ${bytes} bytes)\nsha256 ${sha256}`);
  },
};
