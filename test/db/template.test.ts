import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { gzipSync } from 'node:zlib';
import { openDb } from '../../src/db/db.js';
import { migrate, loadMigrations } from '../../src/db/migrate.js';
import {
  packTemplate,
  pgliteVersion,
  readTemplate,
  startFromTemplate,
  templateFile,
  unpackTar,
} from '../../src/db/template.js';

/** A one-entry ustar archive whose header is valid (checksummed), with the given name, type and content. */
function tarOf(name: string, type: string, content = ''): Buffer {
  const h = Buffer.alloc(512);
  h.write(name, 0, 'utf8');
  h.write('0000600\0', 100);
  h.write('0000000\0', 108);
  h.write('0000000\0', 116);
  h.write(Buffer.byteLength(content).toString(8).padStart(11, '0') + '\0', 124);
  h.write('00000000000\0', 136);
  h.write(type, 156);
  h.write('ustar\x0000', 257, 'latin1');
  h.fill(0x20, 148, 156);
  let sum = 0;
  for (const b of h) sum += b;
  h.write(sum.toString(8).padStart(6, '0') + '\0 ', 148, 'latin1');
  const body = Buffer.alloc(Math.ceil(Buffer.byteLength(content) / 512) * 512);
  body.write(content);
  return Buffer.concat([h, body, Buffer.alloc(1024)]);
}

describe('the embedded database template', () => {
  let dir: string;
  let file: string;

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'gpucloud-template-'));
    file = join(dir, 'template.tar.gz');
    await packTemplate(file);
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  test('is named after the installed PGlite, under dist/', () => {
    const version = pgliteVersion();
    assert.match(version ?? '', /^\d+\.\d+\.\d+/);
    assert.ok(templateFile()!.endsWith(join('dist', `pglite-template-${version}.tar.gz`)));
    assert.equal(readTemplate(join(dir, 'missing.tar.gz')), undefined);
    assert.equal(startFromTemplate(join(dir, 'never'), join(dir, 'missing.tar.gz')), false);
    assert.equal(existsSync(join(dir, 'never')), false);
  });

  test('a new data directory is its files, migrated, and opens again from them', async () => {
    const dataDir = join(dir, 'new');
    let asked = 0;
    const db = await openDb({ dataDir, template: (d) => (asked++, startFromTemplate(d, file)) });
    assert.equal(asked, 1);
    assert.ok(existsSync(join(dataDir, 'PG_VERSION')));
    // The directory holds every file of the archive, as the archive has it.
    assert.match(readFileSync(join(dataDir, 'PG_VERSION'), 'utf8'), /^\d+\n$/);
    assert.equal(statSync(join(dataDir, 'pg_wal')).isDirectory(), true);
    assert.equal(statSync(dataDir).mode & 0o077, 0, 'no one else may enter the data directory');
    // Nothing was left beside it while it was written.
    assert.deepEqual(
      readdirSync(dir).filter((f) => f.includes('unpacking')),
      [],
    );
    const applied = await db.query<{ n: number }>('SELECT count(*)::int8 AS n FROM schema_migrations');
    assert.equal(applied.rows[0]!.n, loadMigrations().length);
    await migrate(db); // nothing left to apply
    // One database, the one the service uses: PostgreSQL's template databases are left out, and their files too.
    const databases = await db.query<{ datname: string; oid: number }>(
      'SELECT datname, oid::int8 AS oid FROM pg_database',
    );
    assert.deepEqual(databases.rows, [{ datname: 'postgres', oid: databases.rows[0]!.oid }]);
    assert.deepEqual(readdirSync(join(dataDir, 'base')), [String(databases.rows[0]!.oid)]);
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
    // A real archive cut short: its headers are good but its files are not all there.
    const cut = join(dir, 'cut.tar.gz');
    const whole = readTemplate(file)!;
    writeFileSync(cut, gzipSync(whole.subarray(0, Math.floor(whole.length / 2))));
    assert.throws(() => unpackTar(readTemplate(cut)!, join(dir, 'cut-files')), /tar:/);
    for (const [name, f] of [
      ['damaged', damaged],
      ['not-tar', notTar],
      ['cut', cut],
    ] as const) {
      assert.equal(startFromTemplate(join(dir, name), f), false, name);
      assert.equal(existsSync(join(dir, name)), false, `${name}: nothing is left of a template that did not unpack`);
    }
    // openDb then makes the directory with initdb (once here: each takes seconds).
    const dataDir = join(dir, 'initdb');
    let asked = 0;
    const db = await openDb({ dataDir, template: (d) => (asked++, startFromTemplate(d, cut)) });
    assert.equal(asked, 1);
    await migrate(db);
    const applied = await db.query<{ n: number }>('SELECT count(*)::int8 AS n FROM schema_migrations');
    assert.equal(applied.rows[0]!.n, loadMigrations().length);
    await db.close();
  });

  test('an archive is refused whole for a bad checksum, a path outside, or an entry that is not a file or folder', () => {
    const out = join(dir, 'refused');
    const good = tarOf('PG_VERSION', '0', '17\n');
    unpackTar(good, out);
    assert.equal(readFileSync(join(out, 'PG_VERSION'), 'utf8'), '17\n');

    const badSum = Buffer.from(good);
    badSum[0] = 'Q'.charCodeAt(0);
    assert.throws(() => unpackTar(badSum, join(dir, 'r1')), /checksum/);
    assert.throws(() => unpackTar(tarOf('../escaped', '0', 'x'), join(dir, 'r2')), /outside/);
    assert.throws(() => unpackTar(tarOf('a/../../escaped', '0', 'x'), join(dir, 'r3')), /outside/);
    // A path from the root is a path from the archive's root.
    unpackTar(tarOf('/a/../../inside', '0', 'x'), join(dir, 'r6'));
    assert.equal(readFileSync(join(dir, 'r6', 'inside'), 'utf8'), 'x');
    assert.equal(existsSync(join(dir, 'escaped')), false);
    assert.throws(() => unpackTar(tarOf('link', '2'), join(dir, 'r4')), /unsupported entry type/);
    assert.throws(() => unpackTar(good.subarray(0, 1024), join(dir, 'r5')), /end/);
  });
});
