/**
 * The embedded database's template: an empty, migrated data directory packed
 * by `npm run build` (dist/pglite-template-<PGlite version>.tar.gz). A new
 * data directory starts from it in about half a second instead of running
 * initdb, which takes seconds and grows the WebAssembly heap to several hundred
 * MB that the process never gives back. Without a template (a checkout that
 * was never built), or with one PGlite cannot load, a new data directory is
 * made by initdb as before; migrations run after either.
 */
import { existsSync, mkdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { createRequire } from 'node:module';
import { gunzipSync } from 'node:zlib';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { PgliteDb } from './db.js';
import { migrate } from './migrate.js';

/** The installed PGlite's version (a template is only good for the PGlite that packed it), or undefined. */
export function pgliteVersion(): string | undefined {
  try {
    const entry = createRequire(import.meta.url).resolve('@electric-sql/pglite');
    let dir = dirname(entry);
    while (!existsSync(join(dir, 'package.json'))) {
      const up = dirname(dir);
      if (up === dir) return undefined;
      dir = up;
    }
    return (JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8')) as { version?: string }).version;
  } catch {
    return undefined;
  }
}

/** Where the template of the installed PGlite lives (dist/ of this package, from src/ or dist/ alike). */
export function templateFile(): string | undefined {
  const version = pgliteVersion();
  if (!version) return undefined;
  return fileURLToPath(new URL(`../../dist/pglite-template-${version}.tar.gz`, import.meta.url));
}

/**
 * The template as PGlite loads it (the tar unpacked here: a damaged file is then
 * an error of ours, not one inside PGlite), or undefined when there is none or
 * it cannot be unpacked.
 */
export function readTemplate(file = templateFile()): Blob | undefined {
  if (!file || !existsSync(file)) return undefined;
  let tar: Buffer;
  try {
    tar = gunzipSync(readFileSync(file));
  } catch {
    return undefined;
  }
  // A tar archive's first header says "ustar" at byte 257; PGlite takes anything else for gzip.
  if (tar.subarray(257, 262).toString('latin1') !== 'ustar') return undefined;
  return new Blob([new Uint8Array(tar.buffer as ArrayBuffer, tar.byteOffset, tar.byteLength)], {
    type: 'application/x-tar',
  });
}

/**
 * Packs a template: a new in-memory PGlite, every migration, gzipped (or a plain tar with
 * `compression: 'none'`, which loads faster: the tests' snapshot). Returns its size in bytes.
 */
export async function packTemplate(file: string, compression: 'gzip' | 'none' = 'gzip'): Promise<number> {
  const db = await PgliteDb.open();
  try {
    await migrate(db);
    const dump = await db.pg.dumpDataDir(compression);
    mkdirSync(dirname(file), { recursive: true });
    // Written under a name of its own, then renamed: a process reading the file never sees half of it.
    const tmp = `${file}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`;
    writeFileSync(tmp, Buffer.from(await dump.arrayBuffer()));
    renameSync(tmp, file);
    return dump.size;
  } finally {
    await db.close();
  }
}
