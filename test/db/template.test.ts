import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { gzipSync } from 'node:zlib';
import { openDb } from '../../src/db/db.js';
import { migrate, loadMigrations } from '../../src/db/migrate.js';
import { packTemplate, pgliteVersion, readTemplate, templateFile } from '../../src/db/template.js';

describe('the embedded database template', () => {
  let dir: string;
  let template: Blob;

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'gpucloud-template-'));
    await packTemplate(join(dir, 'template.tar.gz'));
    template = readTemplate(join(dir, 'template.tar.gz'))!;
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  test('is named after the installed PGlite, under dist/', () => {
    const version = pgliteVersion();
    assert.match(version ?? '', /^\d+\.\d+\.\d+/);
    assert.ok(templateFile()!.endsWith(join('dist', `pglite-template-${version}.tar.gz`)));
    assert.equal(readTemplate(join(dir, 'missing.tar.gz')), undefined);
  });

  test('a new data directory starts from it, migrated, and opens again from its files', async () => {
    const dataDir = join(dir, 'new');
    let asked = 0;
    const db = await openDb({ dataDir, template: () => (asked++, template) });
    assert.equal(asked, 1);
    assert.ok(existsSync(join(dataDir, 'PG_VERSION')));
    const applied = await db.query<{ n: number }>('SELECT count(*)::int8 AS n FROM schema_migrations');
    assert.equal(applied.rows[0]!.n, loadMigrations().length);
    await migrate(db); // nothing left to apply
    await db.query(`INSERT INTO seeds (name) VALUES ('kept')`);
    await db.close();

    // An existing directory never reads the template.
    const again = await openDb({
      dataDir,
      template: () => assert.fail('the template was read for an existing directory'),
    });
    assert.equal((await again.query(`SELECT name FROM seeds`)).rows.length, 1);
    await again.close();
  });

  test('a damaged template is set aside: initdb makes the directory', async () => {
    const damaged = join(dir, 'damaged.tar.gz');
    writeFileSync(damaged, 'not gzip at all');
    assert.equal(readTemplate(damaged), undefined);
    const notTar = join(dir, 'not-tar.tar.gz');
    writeFileSync(notTar, gzipSync(Buffer.alloc(4096, 7)));
    for (const [name, file] of [
      ['damaged', damaged],
      ['not-tar', notTar],
    ] as const) {
      const dataDir = join(dir, name);
      const db = await openDb({ dataDir, template: () => readTemplate(file) });
      await migrate(db);
      const applied = await db.query<{ n: number }>('SELECT count(*)::int8 AS n FROM schema_migrations');
      assert.equal(applied.rows[0]!.n, loadMigrations().length, name);
      await db.close();
    }
  });
});
