/**
 * `gpucloud restore FILE`: brings a backup (src/db/backup.ts) back into a
 * data directory whose service is stopped. The archive is checked whole
 * before anything is written (gzip, every tar header's checksum, the
 * manifest, migrations this build knows), then unpacked beside DATA_DIR/pg
 * and opened once, so that the database proves it opens (and recovers); only
 * then is the database that was there moved aside (kept, never deleted) and
 * the restored one renamed into its place. A refusal or a failure at any step leaves the data
 * directory as it was: nothing half-restored is ever DATA_DIR/pg.
 */
import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { gunzipSync } from 'node:zlib';
import {
  BACKUP_FORMAT,
  compactUtc,
  DATABASE_FOLDER,
  MANIFEST_NAME,
  SECRET_NAME,
  serviceVersion,
  type BackupManifest,
} from './backup.js';
import { PgliteDb } from './db.js';
import { loadMigrations } from './migrate.js';
import { dataDirHolder } from './pid-file.js';
import { pgliteVersion, tarEntries, unpackTar } from './template.js';

/** A restore that cannot or must not go on; the data directory is unchanged. */
export class RestoreRefused extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'RestoreRefused';
  }
}

export interface RestoreOptions {
  /** The data directory (GPUCLOUD_DATA_DIR). */
  dataDir: string;
  /** Replace a database that is there (it is kept aside). */
  force?: boolean;
  now?: Date;
}

export interface RestoreResult {
  manifest: BackupManifest;
  /** Where the restored database now is: DATA_DIR/pg. */
  database: string;
  /** Where the database that was there was moved. */
  previousDatabase?: string;
  /** The signing secret restored into DATA_DIR/jwt-secret; undefined when the backup holds none. */
  secret?: string;
  /** Where the secret that was there was moved. */
  previousSecret?: string;
  /** Migrations of this build the database has not had yet: the next start applies them. */
  pendingMigrations: string[];
}

/** The manifest of an archive (its text, if it holds one), checked: a backup this build can bring back. */
function checkManifest(text: string | undefined, file: string): BackupManifest {
  if (text === undefined) throw new RestoreRefused(`${file} is not a gpucloud backup: it holds no ${MANIFEST_NAME}`);
  let m: Partial<BackupManifest>;
  try {
    m = JSON.parse(text) as Partial<BackupManifest>;
  } catch (err) {
    throw new RestoreRefused(`${file}: its ${MANIFEST_NAME} is not JSON (${(err as Error).message})`);
  }
  if (typeof m.format !== 'number' || m.format > BACKUP_FORMAT)
    throw new RestoreRefused(
      `${file} is a backup of format ${String(m.format)} (made by gpucloud ${String(m.service_version)}); ` +
        `this release (${serviceVersion()}) reads format ${BACKUP_FORMAT}: restore it with that release or a newer one`,
    );
  if (
    !Array.isArray(m.migrations) ||
    !m.migrations.every((v) => typeof v === 'string') ||
    (m.jwt_secret !== 'included' && m.jwt_secret !== 'environment')
  )
    throw new RestoreRefused(`${file}: its ${MANIFEST_NAME} is incomplete (migrations, jwt_secret)`);
  refuseUnknownMigrations(m.migrations, file, m.service_version);
  return m as BackupManifest;
}

/**
 * Reads the whole archive (every header's checksum) and checks what it holds before anything is written: its
 * manifest, the secret it lists, a database.
 */
function checkArchive(tar: Uint8Array, file: string): BackupManifest {
  let manifest: string | undefined;
  const names = new Set<string>();
  try {
    for (const e of tarEntries(tar)) {
      names.add(e.name);
      if (e.name === MANIFEST_NAME && e.type === 'file') manifest = Buffer.from(e.data).toString('utf8');
    }
  } catch (err) {
    throw new RestoreRefused(`${file} is damaged: ${(err as Error).message}`);
  }
  const m = checkManifest(manifest, file);
  if (!names.has(`${DATABASE_FOLDER}/PG_VERSION`))
    throw new RestoreRefused(`${file} holds no database (${DATABASE_FOLDER}/PG_VERSION is missing)`);
  if (m.jwt_secret === 'included' && !names.has(SECRET_NAME))
    throw new RestoreRefused(`${file} is damaged: its manifest lists the signing secret, which it does not hold`);
  return m;
}

/** A database with migrations this build does not have was made by a newer release: this one cannot run it. */
function refuseUnknownMigrations(applied: string[], file: string, madeBy: unknown): void {
  const known = new Set(loadMigrations().map((m) => m.version));
  const unknown = applied.filter((v) => !known.has(v));
  if (unknown.length === 0) return;
  throw new RestoreRefused(
    `${file} was made by a newer release (gpucloud ${String(madeBy)}): its database has migrations this release ` +
      `(${serviceVersion()}) does not know (${unknown.join(', ')}). Restore it with that release or a newer one`,
  );
}

/** `base` if free, else base-2, base-3...: a name beside it that nothing holds. */
function freeName(base: string): string {
  let name = base;
  for (let n = 2; existsSync(name); n++) name = `${base}-${n}`;
  return name;
}

/** Opens the unpacked database once (PGlite recovers it) and reads its migrations. */
async function proveItOpens(dir: string, file: string, manifest: BackupManifest): Promise<string[]> {
  let db: PgliteDb | undefined;
  try {
    db = await PgliteDb.open(dir);
    const r = await db.query<{ version: string }>('SELECT version FROM schema_migrations ORDER BY version');
    return r.rows.map((row) => row.version);
  } catch (err) {
    throw new RestoreRefused(
      `the database in ${file} does not open (made with PGlite ${String(manifest.pglite_version)}, this is ` +
        `${String(pgliteVersion())}): ${(err as Error).message}`,
    );
  } finally {
    await db?.close().catch(() => {});
  }
}

/**
 * Restores the backup `file` into `opts.dataDir`. Throws RestoreRefused, with the data directory unchanged, when a
 * server runs on it, when it holds a database and `force` is not given, or when the archive is damaged, is no
 * gpucloud backup, or was made by a newer release.
 */
export async function restoreBackup(file: string, opts: RestoreOptions): Promise<RestoreResult> {
  const dataDir = resolve(opts.dataDir);
  const database = join(dataDir, 'pg');
  const holder = dataDirHolder(dataDir);
  if (holder !== undefined)
    throw new RestoreRefused(
      `a gpucloud server (pid ${holder}) is running on ${dataDir}: stop it first (restore replaces its database)`,
    );
  const existing = existsSync(database) && readdirSync(database).length > 0;
  if (existing && !opts.force)
    throw new RestoreRefused(
      `${database} holds a database: add --force to replace it (it is then kept as ${database}.before-restore-<time>)`,
    );

  let compressed: Buffer;
  try {
    compressed = readFileSync(file);
  } catch (err) {
    throw new RestoreRefused(`cannot read ${file}: ${(err as Error).message}`);
  }
  let tar: Buffer;
  try {
    tar = gunzipSync(compressed);
  } catch (err) {
    throw new RestoreRefused(
      `${file} is damaged or truncated: it is not a whole gzip archive (${(err as Error).message})`,
    );
  }

  const manifest = checkArchive(tar, file);

  mkdirSync(dataDir, { recursive: true, mode: 0o700 });
  const staging = join(dataDir, `.restore-${process.pid}-${randomBytes(4).toString('hex')}`);
  try {
    try {
      unpackTar(tar, staging);
    } catch (err) {
      throw new RestoreRefused(`${file} is damaged: ${(err as Error).message}`);
    }
    const restored = join(staging, DATABASE_FOLDER);
    const secretFile = join(staging, SECRET_NAME);
    const applied = await proveItOpens(restored, file, manifest);
    refuseUnknownMigrations(applied, file, manifest.service_version);

    const started = dataDirHolder(dataDir);
    if (started !== undefined)
      throw new RestoreRefused(`a gpucloud server (pid ${started}) started on ${dataDir} meanwhile: stop it first`);
    // From here on only renames, within the data directory: the database is either the old one or the new one.
    const stamp = compactUtc(opts.now ?? new Date());
    let previousDatabase: string | undefined;
    if (existing) {
      previousDatabase = freeName(`${database}.before-restore-${stamp}`);
      renameSync(database, previousDatabase);
    } else rmSync(database, { recursive: true, force: true }); // an empty folder, or nothing
    try {
      renameSync(restored, database);
    } catch (err) {
      if (previousDatabase) renameSync(previousDatabase, database);
      throw err;
    }
    const result: RestoreResult = {
      manifest,
      database,
      pendingMigrations: loadMigrations()
        .map((m) => m.version)
        .filter((v) => !applied.includes(v)),
    };
    if (previousDatabase) result.previousDatabase = previousDatabase;
    if (manifest.jwt_secret === 'included') {
      const secret = join(dataDir, SECRET_NAME);
      if (existsSync(secret)) {
        const previousSecret = freeName(`${secret}.before-restore-${stamp}`);
        renameSync(secret, previousSecret);
        result.previousSecret = previousSecret;
      }
      renameSync(secretFile, secret);
      result.secret = secret;
    }
    return result;
  } finally {
    rmSync(staging, { recursive: true, force: true });
  }
}
