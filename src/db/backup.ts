/**
 * Backups of the embedded database (docs/operations.md#backups): one gzipped
 * ustar archive holding
 *
 *   gpucloud-backup.json   the manifest: format, the service and PGlite
 *                          versions, when it was made, the migrations applied
 *   jwt-secret             the generated signing secret of the data directory
 *                          (absent when GPUCLOUD_JWT_SECRET is set: the
 *                          manifest says so), without which the database's
 *                          sealed values never open again
 *   pg/...                 the database's files, copied between transactions
 *
 * The archive is written here (a ustar writer of regular files and
 * directories, what tarEntries in template.ts reads back); src/db/restore.ts
 * brings one back.
 */
import { existsSync, readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { promisify } from 'node:util';
import { gzip } from 'node:zlib';
import type { PgliteDb } from './db.js';
import { pgliteVersion, tarEntries, type TarEntry } from './template.js';

export const BACKUP_FORMAT = 1;
export const MANIFEST_NAME = 'gpucloud-backup.json';
export const SECRET_NAME = 'jwt-secret';
/** The folder of the archive that holds the database's files. */
export const DATABASE_FOLDER = 'pg';

export interface BackupManifest {
  format: number;
  /** The release of gpucloud that made it (package.json). */
  service_version: string;
  /** The PGlite that wrote the database's files. */
  pglite_version: string | null;
  created_at: string;
  /** The migrations applied to the database, in order. */
  migrations: string[];
  /** `included`: the archive holds the generated secret; `environment`: the service ran with GPUCLOUD_JWT_SECRET. */
  jwt_secret: 'included' | 'environment';
}

/** This release's version, from package.json (two levels up from src/db/ and from dist/db/ alike). */
export function serviceVersion(): string {
  const pkg = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { version: string };
  return pkg.version;
}

/** `gpucloud-backup-20260101T000000Z.tar.gz`: the name a download is offered under. */
export function backupFileName(at: Date): string {
  return `gpucloud-backup-${compactUtc(at)}.tar.gz`;
}

/** 2026-01-01T00:00:00.000Z as 20260101T000000Z: a timestamp that fits a file name. */
export function compactUtc(at: Date): string {
  return at
    .toISOString()
    .replace(/[-:]/g, '')
    .replace(/\.\d+Z$/, 'Z');
}

// ---------------------------------------------------------------------------
// The ustar writer.

const BLOCK = 512;

/** Splits a path into ustar's prefix (155 bytes) and name (100 bytes) fields, at a slash. */
function splitPath(path: string): [prefix: string, name: string] {
  if (Buffer.byteLength(path) <= 100) return ['', path];
  for (let i = path.indexOf('/'); i !== -1; i = path.indexOf('/', i + 1)) {
    const prefix = path.slice(0, i);
    const name = path.slice(i + 1);
    if (Buffer.byteLength(prefix) <= 155 && Buffer.byteLength(name) <= 100 && name !== '') return [prefix, name];
  }
  throw new Error(`tar: the path ${JSON.stringify(path)} is too long for a ustar archive`);
}

function header(entry: TarEntry, mtime: number): Buffer {
  const h = Buffer.alloc(BLOCK);
  const dir = entry.type === 'dir';
  const [prefix, name] = splitPath(dir ? `${entry.name}/` : entry.name);
  const num = (value: number, at: number, len: number) =>
    h.write(value.toString(8).padStart(len - 1, '0') + '\0', at, len, 'latin1');
  h.write(name, 0, 100, 'utf8');
  num(dir ? 0o700 : 0o600, 100, 8);
  num(0, 108, 8); // uid
  num(0, 116, 8); // gid
  num(dir ? 0 : entry.data.length, 124, 12);
  num(mtime, 136, 12);
  h.write(dir ? '5' : '0', 156, 1, 'latin1');
  h.write('ustar\0' + '00', 257, 8, 'latin1');
  h.write(prefix, 345, 155, 'utf8');
  // The checksum: the sum of the header's bytes with its own field counted as spaces.
  h.fill(0x20, 148, 156);
  let sum = 0;
  for (const b of h) sum += b;
  h.write(sum.toString(8).padStart(6, '0') + '\0 ', 148, 8, 'latin1');
  return h;
}

/** A ustar archive of `entries` (directories and regular files, in order), `mtime` in seconds since 1970. */
export function packTar(entries: Iterable<TarEntry>, mtime: number): Buffer {
  const parts: Uint8Array[] = [];
  for (const e of entries) {
    parts.push(header(e, mtime));
    if (e.type === 'file' && e.data.length > 0) {
      parts.push(e.data);
      const pad = (BLOCK - (e.data.length % BLOCK)) % BLOCK;
      if (pad) parts.push(Buffer.alloc(pad));
    }
  }
  parts.push(Buffer.alloc(2 * BLOCK)); // the end of the archive
  return Buffer.concat(parts);
}

// ---------------------------------------------------------------------------
// Making a backup.

/** Files of a running database that are not its data: its lock file, which the next start writes anew. */
const NOT_DATA = new Set(['postmaster.pid']);

export interface BackupOptions {
  /** The service's data directory (GPUCLOUD_DATA_DIR), where the generated secret lives. */
  dataDir: string;
  /** GPUCLOUD_JWT_SECRET is set: the secret is the operator's to keep, and is not in the archive. */
  secretFromEnvironment: boolean;
  now?: Date;
}

/**
 * A backup of the running embedded database: its files copied between transactions (the service keeps
 * serving; only the copy itself holds other queries back), with the manifest and the generated secret.
 */
export async function createBackup(
  db: PgliteDb,
  opts: BackupOptions,
): Promise<{ archive: Buffer; manifest: BackupManifest }> {
  const now = opts.now ?? new Date();
  let secret: Buffer | undefined;
  if (!opts.secretFromEnvironment) {
    const file = join(resolve(opts.dataDir), SECRET_NAME);
    if (!existsSync(file)) throw new Error(`the signing secret ${file} is missing`);
    secret = readFileSync(file);
  }
  const migrations = (
    await db.query<{ version: string }>('SELECT version FROM schema_migrations ORDER BY version')
  ).rows.map((r) => r.version);
  const files = await db.dumpBetweenTransactions();
  const manifest: BackupManifest = {
    format: BACKUP_FORMAT,
    service_version: serviceVersion(),
    pglite_version: pgliteVersion() ?? null,
    created_at: now.toISOString(),
    migrations,
    jwt_secret: secret ? 'included' : 'environment',
  };
  function* entries(): Generator<TarEntry> {
    yield { name: MANIFEST_NAME, type: 'file', data: Buffer.from(JSON.stringify(manifest, null, 2) + '\n') };
    if (secret) yield { name: SECRET_NAME, type: 'file', data: secret };
    yield { name: DATABASE_FOLDER, type: 'dir', data: new Uint8Array(0) };
    for (const e of tarEntries(files)) {
      if (!NOT_DATA.has(e.name)) yield { ...e, name: `${DATABASE_FOLDER}/${e.name}` };
    }
  }
  const tar = packTar(entries(), Math.floor(now.getTime() / 1000));
  // Compressed on libuv's thread pool: the event loop keeps serving.
  const archive = await promisify(gzip)(tar);
  return { archive, manifest };
}
