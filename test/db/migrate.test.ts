/**
 * The migration runner on both databases: every file once, in order, each as
 * one script inside the run's transaction (a statement may hold semicolons,
 * in a string or a function body), and a failing file leaves nothing of the
 * run behind.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { PgliteDb, PostgresDb, type Db } from '../../src/db/db.js';
import { loadMigrations, migrate } from '../../src/db/migrate.js';

const kinds: Array<[string, () => Promise<{ db: Db; drop: () => Promise<void> }>]> = [
  [
    'pglite',
    async () => {
      const db = await PgliteDb.open();
      return { db, drop: () => db.close() };
    },
  ],
];
if (process.env.DATABASE_URL) {
  kinds.push([
    'postgres',
    async () => {
      const url = process.env.DATABASE_URL!;
      const schema = `gpc_mig_${randomBytes(6).toString('hex')}`;
      const admin = new PostgresDb(url, { max: 1 });
      await admin.query(`CREATE SCHEMA ${schema}`);
      const db = new PostgresDb(url, { searchPath: schema, max: 2 });
      return {
        db,
        drop: async () => {
          await db.close();
          await admin.query(`DROP SCHEMA ${schema} CASCADE`);
          await admin.close();
        },
      };
    },
  ]);
}

const tables = async (db: Db) =>
  (
    await db.query<{ t: string }>(
      `SELECT table_name AS t FROM information_schema.tables WHERE table_schema = current_schema() ORDER BY 1`,
    )
  ).rows.map((r) => r.t);

for (const [kind, open] of kinds) {
  test(`migrations on ${kind}: every file once, in order; scripts with semicolons inside statements; a failure leaves nothing`, async () => {
    const { db, drop } = await open();
    try {
      const all = loadMigrations();
      assert.deepEqual(
        await migrate(db),
        all.map((m) => m.version),
        'a fresh database gets every file, in order',
      );
      assert.deepEqual(await migrate(db), [], 'and none twice');
      assert.ok((await tables(db)).includes('vm_meters'));

      const extra = [
        {
          version: '900-semicolons',
          sql: `-- a comment; with a semicolon
CREATE TABLE notes (body TEXT NOT NULL DEFAULT 'a; b;');
CREATE FUNCTION note_count() RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
  RETURN (SELECT count(*) FROM notes);
END;
$$;
INSERT INTO notes DEFAULT VALUES;`,
        },
      ];
      assert.deepEqual(await migrate(db, [...all, ...extra]), ['900-semicolons']);
      const r = await db.query<{ body: string; n: number }>('SELECT body, note_count() AS n FROM notes');
      assert.deepEqual(r.rows, [{ body: 'a; b;', n: 1 }]);

      const broken = [
        { version: '901-fine', sql: 'CREATE TABLE fine (x int);' },
        { version: '902-broken', sql: 'CREATE TABLE half (x int);\nCREATE TABLE oops (x no_such_type);' },
      ];
      await assert.rejects(migrate(db, [...all, ...extra, ...broken]), /no_such_type/);
      const after = await tables(db);
      assert.ok(!after.includes('fine') && !after.includes('half'), `the whole run rolled back: ${after.join(', ')}`);
      const versions = (
        await db.query<{ version: string }>('SELECT version FROM schema_migrations ORDER BY version')
      ).rows.map((x) => x.version);
      assert.ok(!versions.includes('901-fine') && !versions.includes('902-broken'));
    } finally {
      await drop();
    }
  });
}
