/**
 * The databases the suite runs on: always the embedded PGlite; PostgreSQL too
 * when DATABASE_URL is set. Each test app gets its own schema (PostgreSQL) or
 * its own in-memory database (PGlite), migrated, and removed afterwards.
 */
import { createHash, randomBytes } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { PgliteDb, PostgresDb, type Db } from '../../src/db/db.js';
import { loadMigrations, migrate } from '../../src/db/migrate.js';
import { packTemplate } from '../../src/db/template.js';

export type DbKind = 'pglite' | 'postgres';
export const DB_KINDS: DbKind[] = process.env.DATABASE_URL ? ['pglite', 'postgres'] : ['pglite'];

export interface TestDb {
  db: Db;
  kind: DbKind;
  /** Opens another connection pool onto the same database (a second service instance). */
  openAnother(): Promise<Db>;
  cleanup(): Promise<void>;
}

export async function createTestDb(kind: DbKind): Promise<TestDb> {
  if (kind === 'pglite') {
    const db = await PgliteDb.open(undefined, await pgliteSnapshot());
    await migrate(db); // a no-op on a current snapshot
    return { db, kind, openAnother: async () => db, cleanup: () => db.close() };
  }
  const url = process.env.DATABASE_URL!;
  const schema = `gpc_test_${randomBytes(6).toString('hex')}`;
  const admin = new PostgresDb(url, { max: 1 });
  await admin.query(`CREATE SCHEMA ${schema}`);
  const extra: Db[] = [];
  const db = new PostgresDb(url, { searchPath: schema, max: 10 });
  await migrate(db);
  return {
    db,
    kind,
    openAnother: async () => {
      const other = new PostgresDb(url, { searchPath: schema, max: 10 });
      extra.push(other);
      return other;
    },
    cleanup: async () => {
      await Promise.all([db, ...extra].map((d) => d.close()));
      await admin.query(`DROP SCHEMA ${schema} CASCADE`);
      await admin.close();
    },
  };
}

/**
 * initdb plus migrations cost seconds per PGlite; loading a migrated snapshot
 * costs well under one. The snapshot is cached in the temp dir, keyed by the
 * migrations, the PGlite version and the packing code, and rebuilt whenever they change.
 */
async function pgliteSnapshot(): Promise<Blob> {
  const key = createHash('sha256')
    .update(JSON.stringify(loadMigrations()))
    .update(readFileSync(new URL('../../node_modules/@electric-sql/pglite/package.json', import.meta.url)))
    .update(readFileSync(new URL('../../src/db/template.ts', import.meta.url))) // how it is packed
    .digest('hex')
    .slice(0, 16);
  const file = join(tmpdir(), `gpucloud-pglite-${key}.tar`);
  if (!existsSync(file)) await packTemplate(file, 'none');
  return new Blob([readFileSync(file)]);
}
