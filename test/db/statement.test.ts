/**
 * A statement's parameters and values are the same on both databases: the embedded one runs each statement in one
 * call into PGlite with node-postgres's parameter preparation and type parsers (db/pglite-statement.ts), and
 * PostgreSQL goes through node-postgres itself. Run on every database the suite has.
 */
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createTestDb, DB_KINDS, type TestDb } from '../helpers/db.js';
import { pgErrorCode, PG } from '../../src/db/db.js';

for (const kind of DB_KINDS) {
  describe(`statements [${kind}]`, () => {
    let t: TestDb;
    before(async () => {
      t = await createTestDb(kind);
      await t.db.exec(
        `CREATE TABLE stmt_t (id int PRIMARY KEY, name text NOT NULL, CONSTRAINT stmt_name UNIQUE (name))`,
      );
    });
    after(() => t.cleanup());

    test('parameters of every JS kind go in, and values come out typed', async () => {
      const at = new Date('2026-01-02T03:04:05.678Z');
      const uuid = '0195f3a2-1111-7000-8000-000000000001';
      const r = await t.db.query<Record<string, unknown>>(
        `SELECT $1::timestamptz AS ts, $2::int8[] AS ints, $3::jsonb AS doc, $4::bool AS yes, $5::text AS nothing,
                $6::uuid[] AS ids, $7::int8 AS big, $8::numeric AS exact, $9::float8 AS real, $10::text AS quoted,
                $11::text[] AS words, 'x' AS name, 2 AS name2, NULL::int AS none`,
        [
          at,
          [1, 2, 3],
          { a: [1, 'two'], b: null },
          true,
          null,
          [uuid],
          9007199254740991,
          '12.50',
          0.25,
          `it's "q"`,
          ['a,b', 'c"d', ''],
        ],
      );
      assert.equal(r.rows.length, 1);
      assert.equal(r.rowCount, 1);
      const row = r.rows[0]!;
      assert.ok(row.ts instanceof Date);
      assert.equal((row.ts as Date).toISOString(), at.toISOString());
      assert.deepEqual(
        row.ints,
        ['1', '2', '3'],
        'int8 arrays as node-postgres parses them (only int8 itself is a number)',
      );
      assert.deepEqual(row.doc, { a: [1, 'two'], b: null });
      assert.equal(row.yes, true);
      assert.equal(row.nothing, null);
      assert.deepEqual(row.ids, [uuid]);
      assert.equal(row.big, 9007199254740991);
      assert.equal(row.exact, '12.50');
      assert.equal(row.real, 0.25);
      assert.equal(row.quoted, `it's "q"`);
      assert.deepEqual(row.words, ['a,b', 'c"d', '']);
      assert.equal(row.none, null);
    });

    test('row counts come from the command: insert, update, delete, select', async () => {
      const ins = await t.db.query(`INSERT INTO stmt_t (id, name) VALUES ($1, $2), ($3, $4)`, [1, 'a', 2, 'b']);
      assert.equal(ins.rowCount, 2);
      assert.deepEqual(ins.rows, []);
      const upd = await t.db.query<{ id: number }>(`UPDATE stmt_t SET name = name || '!' RETURNING id`);
      assert.equal(upd.rowCount, 2);
      assert.deepEqual(upd.rows.map((x) => x.id).sort(), [1, 2]);
      assert.equal((await t.db.query(`SELECT * FROM stmt_t WHERE id > $1`, [5])).rowCount, 0);
      assert.equal((await t.db.query(`DELETE FROM stmt_t WHERE id = $1`, [2])).rowCount, 1);
    });

    test('an error carries its SQLSTATE, and the database goes on', async () => {
      await t.db.query(`INSERT INTO stmt_t (id, name) VALUES (10, 'dup')`);
      await assert.rejects(t.db.query(`INSERT INTO stmt_t (id, name) VALUES (11, $1)`, ['dup']), (err: unknown) => {
        assert.equal(pgErrorCode(err), PG.uniqueViolation);
        assert.equal((err as { constraint?: string }).constraint, 'stmt_name');
        assert.match((err as Error).message, /stmt_name/);
        return true;
      });
      await assert.rejects(t.db.query(`SELEC 1`), (err: unknown) => pgErrorCode(err) === '42601');
      await assert.rejects(t.db.query(`SELECT $1::int AS n`, ['not a number']), (err: unknown) => {
        assert.equal(pgErrorCode(err), '22P02');
        return true;
      });
      assert.equal((await t.db.query<{ n: number }>(`SELECT 1 AS n`)).rows[0]!.n, 1);
    });

    test('a failed statement in a transaction rolls the whole transaction back', async () => {
      await assert.rejects(
        t.db.transaction(async (tx) => {
          await tx.query(`INSERT INTO stmt_t (id, name) VALUES (20, 'kept?')`);
          await tx.query(`INSERT INTO stmt_t (id, name) VALUES (21, 'dup')`);
        }),
        (err: unknown) => pgErrorCode(err) === PG.uniqueViolation,
      );
      assert.equal((await t.db.query(`SELECT id FROM stmt_t WHERE id = 20`)).rows.length, 0);
      const n = await t.db.transaction(async (tx) => {
        await tx.query(`INSERT INTO stmt_t (id, name) VALUES ($1, $2)`, [30, 'x']);
        return (await tx.query<{ n: number }>(`SELECT count(*)::int8 AS n FROM stmt_t WHERE id = $1`, [30])).rows[0]!.n;
      });
      assert.equal(n, 1);
    });

    test("a transaction's first statement runs inside it, whatever it is and however it ends", async () => {
      const txid = 'SELECT txid_current()::int8 AS id';
      // One after another, so that connections come back to the pool and are used again.
      for (let i = 0; i < 6; i++) {
        const [a, b] = await t.db.transaction(async (tx) => [
          (await tx.query<{ id: number }>(i % 2 ? txid : `${txid} WHERE $1::int > 0`, i % 2 ? [] : [1])).rows[0]!.id,
          (await tx.query<{ id: number }>(txid)).rows[0]!.id,
        ]);
        assert.equal(a, b, 'both statements ran in one transaction');
      }
      for (let i = 0; i < 4; i++) {
        // An insert first (with parameters or without), then the transaction fails in JS: nothing stays.
        await assert.rejects(
          t.db.transaction(async (tx) => {
            if (i % 2) await tx.query(`INSERT INTO stmt_t (id, name) VALUES (${50 + i}, 'gone-${i}')`);
            else await tx.query(`INSERT INTO stmt_t (id, name) VALUES ($1, $2)`, [50 + i, `gone-${i}`]);
            throw new Error('changed my mind');
          }),
          /changed my mind/,
        );
        // The first statement fails: nothing of the transaction runs after it, and the connection goes on.
        await assert.rejects(
          t.db.transaction(async (tx) => {
            await tx.query(`INSERT INTO stmt_t (id, name) VALUES ($1, $2)`, [60 + i, 'dup']);
            await tx.query(`INSERT INTO stmt_t (id, name) VALUES ($1, $2)`, [70 + i, 'never']);
          }),
          (err: unknown) => pgErrorCode(err) === PG.uniqueViolation,
        );
        await assert.rejects(
          t.db.transaction((tx) => tx.query(`SELEC 1`)),
          (err: unknown) => pgErrorCode(err) === '42601',
        );
      }
      const left = await t.db.query(`SELECT id FROM stmt_t WHERE id >= 50 AND id < 80`);
      assert.deepEqual(left.rows, []);
      // A script first, then a failure: rolled back as well.
      await assert.rejects(
        t.db.transaction(async (tx) => {
          await tx.exec(
            `INSERT INTO stmt_t (id, name) VALUES (80, 'script-a'); INSERT INTO stmt_t (id, name) VALUES (81, 'script-b')`,
          );
          throw new Error('no');
        }),
        /no/,
      );
      assert.equal((await t.db.query(`SELECT id FROM stmt_t WHERE id IN (80, 81)`)).rows.length, 0);
      // A transaction that runs no statement gives its value and changes nothing.
      assert.equal(await t.db.transaction(async () => 'nothing'), 'nothing');
      const n = await t.db.transaction(async (tx) => {
        await tx.query(`INSERT INTO stmt_t (id, name) VALUES ($1, $2)`, [90, 'kept']);
        return (await tx.query<{ n: number }>(`SELECT count(*)::int8 AS n FROM stmt_t WHERE id = 90`)).rows[0]!.n;
      });
      assert.equal(n, 1);
    });

    test('a statement is planned once per connection, and again when its table changes shape', async () => {
      await t.db.exec(`CREATE TABLE stmt_shape (id int PRIMARY KEY); INSERT INTO stmt_shape VALUES (1), (2)`);
      const sql = 'SELECT * FROM stmt_shape WHERE id = $1';
      // Many at once, so that several of the pool's connections hold the statement.
      const readAll = () => Promise.all(Array.from({ length: 12 }, (_, i) => t.db.query(sql, [1 + (i % 2)])));
      const inTransactions = () =>
        Promise.all(Array.from({ length: 12 }, () => t.db.transaction(async (tx) => (await tx.query(sql, [1])).rows)));
      assert.deepEqual((await readAll()).map((r) => r.rows[0]).slice(0, 2), [{ id: 1 }, { id: 2 }]);
      assert.deepEqual((await inTransactions())[0], [{ id: 1 }]);
      // Another instance migrates the table: the statement's result has a column more.
      const other = await t.openAnother();
      await other.exec(`ALTER TABLE stmt_shape ADD COLUMN label text NOT NULL DEFAULT 'x'`);
      // In a transaction first (the one session of the embedded database then meets the change there).
      for (const rows of await inTransactions()) assert.deepEqual(rows, [{ id: 1, label: 'x' }]);
      for (const r of await readAll()) assert.equal(r.rows[0]!.label, 'x');
    });

    test('a statement with parameters is prepared by name, also when its first run failed', async () => {
      const sql = 'INSERT INTO stmt_t (id, name) VALUES ($1, $2) RETURNING id';
      await t.db.query(`INSERT INTO stmt_t (id, name) VALUES (40, 'taken')`);
      // Parsed, then failed at execution.
      await assert.rejects(t.db.query(sql, [41, 'taken']), (err: unknown) => pgErrorCode(err) === PG.uniqueViolation);
      // Refused before its parse: the transaction it ran in had already failed.
      const sum = 'SELECT $1::int + 1 AS n';
      await assert.rejects(
        t.db.transaction(async (tx) => {
          await tx.query(`SELECT 1/0`).catch(() => {});
          await tx.query(sum, [1]);
        }),
        (err: unknown) => pgErrorCode(err) === '25P02',
      );
      assert.equal((await t.db.query<{ n: number }>(sum, [1])).rows[0]!.n, 2);
      assert.equal((await t.db.query<{ n: number }>(sum, [2])).rows[0]!.n, 3);
      const names = await t.db.transaction(async (tx) => {
        assert.deepEqual((await tx.query(sql, [42, 'new'])).rows, [{ id: 42 }]);
        return (
          await tx.query<{ name: string }>(`SELECT name FROM pg_prepared_statements WHERE statement = $1`, [sql])
        ).rows.map((r) => r.name);
      });
      assert.equal(names.length, 1, 'this connection holds the statement under one name');
      assert.match(names[0]!, /^gpucloud_\d+$/);
      assert.equal((await t.db.query(sql, [43, 'newer'])).rowCount, 1);
    });
  });
}
