/**
 * The embedded database's template: an empty, migrated data directory packed
 * by `npm run build` (dist/pglite-template-<PGlite version>.tar.gz). A new
 * data directory is the template's files, written out here before PGlite
 * opens them as it opens any existing directory: no initdb, which takes
 * seconds and grows the WebAssembly heap to several hundred MB that the
 * process never gives back, and no load of the archive inside PGlite, which
 * leaves the heap as large as the archive. Without a template (a checkout
 * that was never built), or with one that cannot be read or opened, a new
 * data directory is made by initdb as before; migrations run after either.
 */
import { existsSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { createRequire } from 'node:module';
import { gunzipSync } from 'node:zlib';
import { dirname, join, posix, sep } from 'node:path';
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
 * The template's tar archive (ungzipped and its first header checked here: a
 * damaged file is then an error of ours), or undefined when there is none or
 * it cannot be unpacked.
 */
export function readTemplate(file = templateFile()): Uint8Array | undefined {
  if (!file || !existsSync(file)) return undefined;
  let tar: Buffer;
  try {
    tar = gunzipSync(readFileSync(file));
  } catch {
    return undefined;
  }
  // A tar archive's first header says "ustar" at byte 257.
  if (tar.subarray(257, 262).toString('latin1') !== 'ustar') return undefined;
  return tar;
}

const BLOCK = 512;

/** A NUL-terminated field of a tar header. */
function field(h: Uint8Array, at: number, len: number): string {
  const raw = h.subarray(at, at + len);
  const end = raw.indexOf(0);
  return Buffer.from(end === -1 ? raw : raw.subarray(0, end)).toString('utf8');
}

function octal(h: Uint8Array, at: number, len: number): number {
  const text = field(h, at, len).trim();
  if (!/^[0-7]+$/.test(text)) throw new Error(`tar: bad number field ${JSON.stringify(text)}`);
  return parseInt(text, 8);
}

/** An entry of a ustar archive: a directory, or a regular file and its content (a view into the archive). */
export interface TarEntry {
  /** Its path, relative (leading slashes dropped, `.` and `..` resolved). */
  name: string;
  type: 'dir' | 'file';
  data: Uint8Array;
}

/**
 * The entries of a ustar archive (what PGlite's `dumpDataDir` packs: regular
 * files and directories, paths from the data directory's root), in order.
 * Every header's checksum is checked; a path that leaves the archive's root,
 * any other kind of entry, or an archive that ends early is refused.
 */
export function* tarEntries(tar: Uint8Array): Generator<TarEntry> {
  let at = 0;
  while (at + BLOCK <= tar.length) {
    const h = tar.subarray(at, at + BLOCK);
    if (h.every((b) => b === 0)) return; // the end-of-archive blocks
    let sum = 0;
    for (let i = 0; i < BLOCK; i++) sum += i >= 148 && i < 156 ? 0x20 : h[i]!;
    if (sum !== octal(h, 148, 8)) throw new Error(`tar: bad header checksum at byte ${at}`);
    const prefix = field(h, 345, 155);
    const name = posix.normalize((prefix ? `${prefix}/` : '') + field(h, 0, 100)).replace(/^\/+/, '');
    if (name === '' || name === '.' || name === '..' || name.startsWith('../')) {
      throw new Error(`tar: entry outside the directory: ${JSON.stringify(name)}`);
    }
    const size = octal(h, 124, 12);
    const type = String.fromCharCode(h[156]!);
    at += BLOCK;
    if (type === '5') yield { name: name.replace(/\/+$/, ''), type: 'dir', data: new Uint8Array(0) };
    else if (type === '0' || type === '\0') {
      if (at + size > tar.length) throw new Error(`tar: ${name} runs past the end of the archive`);
      yield { name, type: 'file', data: tar.subarray(at, at + size) };
    } else throw new Error(`tar: unsupported entry type ${JSON.stringify(type)} for ${name}`);
    at += Math.ceil(size / BLOCK) * BLOCK;
  }
  throw new Error('tar: the archive ends without its end-of-archive blocks');
}

/**
 * Writes the files and directories of a ustar archive (tarEntries) under
 * `dir`; a path that would leave `dir` is refused.
 */
export function unpackTar(tar: Uint8Array, dir: string): void {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const made = new Set<string>([dir]);
  const folder = (path: string) => {
    if (made.has(path)) return;
    mkdirSync(path, { recursive: true, mode: 0o700 });
    made.add(path);
  };
  for (const e of tarEntries(tar)) {
    const target = join(dir, e.name);
    if (!target.startsWith(dir + sep)) throw new Error(`tar: entry outside the directory: ${JSON.stringify(e.name)}`);
    if (e.type === 'dir') folder(target);
    else {
      folder(dirname(target));
      writeFileSync(target, e.data, { mode: 0o600 });
    }
  }
}

/**
 * Makes `dataDir` from a template's archive: written under a name of its own
 * beside it and renamed into place, so a start that dies half way leaves no
 * directory that looks like a database. Throws (leaving nothing behind) when
 * the archive cannot be unpacked.
 */
export function unpackTemplate(tar: Uint8Array, dataDir: string): void {
  const tmp = `${dataDir}.${process.pid}.${randomBytes(4).toString('hex')}.unpacking`;
  try {
    unpackTar(tar, tmp);
    rmSync(dataDir, { recursive: true, force: true }); // a directory without PG_VERSION: nothing in it to keep
    renameSync(tmp, dataDir);
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
}

/**
 * Writes a new data directory from the template (`file`, the installed
 * PGlite's by default); false, with nothing written, when there is none or it
 * cannot be unpacked.
 */
export function startFromTemplate(dataDir: string, file = templateFile()): boolean {
  const tar = readTemplate(file);
  if (!tar) return false;
  try {
    unpackTemplate(tar, dataDir);
    return true;
  } catch {
    return false;
  }
}

/**
 * Packs a template: a new in-memory PGlite, every migration, without the template databases, gzipped (or a plain
 * tar with `compression: 'none'`, which loads faster: the tests' snapshot). Returns its size in bytes.
 */
export async function packTemplate(file: string, compression: 'gzip' | 'none' = 'gzip'): Promise<number> {
  const db = await PgliteDb.open();
  try {
    await migrate(db);
    // PostgreSQL's template databases are read only by CREATE DATABASE, which the embedded database, one database
    // for one process, never runs. They were 600 of the template's 1,123 files, each one written at a first start.
    for (const name of ['template0', 'template1']) {
      await db.pg.exec(`ALTER DATABASE ${name} WITH IS_TEMPLATE false`);
      await db.pg.exec(`DROP DATABASE ${name}`);
    }
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
