/**
 * GET /admin/backup and `gpucloud backup` on each database: on the embedded
 * one an administrator gets a gzipped ustar archive (manifest, database
 * files; read back by restore and by the system's tar) holding what was
 * committed before it; on PostgreSQL 400 invalid_state, and the command
 * writes nothing. A non-admin is 403, no credential 401.
 *
 * Then restore (src/db/restore.ts) against archives it must refuse, each
 * time leaving the data directory exactly as it was: truncated, corrupted,
 * a tar header with a bad checksum, a tar cut short, no manifest, a newer
 * format, a newer release's migrations, a database that does not open; and
 * over a database without --force. And the pid file: a live holder is
 * refused, one left by a dead process is taken over.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile, spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { gunzipSync, gzipSync } from 'node:zlib';
import { createBackup, packTar, serviceVersion, type BackupManifest } from '../../src/db/backup.js';
import { PgliteDb } from '../../src/db/db.js';
import { loadMigrations } from '../../src/db/migrate.js';
import { DataDirInUse, dataDirHolder, holdDataDir } from '../../src/db/pid-file.js';
import { restoreBackup, RestoreRefused } from '../../src/db/restore.js';
import { pgliteVersion, tarEntries, type TarEntry } from '../../src/db/template.js';
import { describeEachDb } from '../helpers/app.js';
import { createTestDb } from '../helpers/db.js';
import { api, expectError } from '../helpers/api.js';
import { createApiKey, createUser } from '../helpers/factories.js';
import { gpucloudMain } from '../helpers/entry.js';
import { treeOf } from '../helpers/tree.js';

const run = promisify(execFile);
const dirs: string[] = [];
const tempDir = (tag: string) => {
  const d = mkdtempSync(join(tmpdir(), `gpucloud-backup-${tag}-`));
  dirs.push(d);
  return d;
};
after(() => dirs.forEach((d) => rmSync(d, { recursive: true, force: true })));

const entriesOf = (archive: Uint8Array) => [...tarEntries(gunzipSync(archive))];
const manifestOf = (entries: TarEntry[]) =>
  JSON.parse(Buffer.from(entries.find((e) => e.name === 'gpucloud-backup.json')!.data).toString()) as BackupManifest;

describeEachDb('GET /admin/backup', (t) => {
  test('an administrator gets the embedded database as an archive of what was committed; PostgreSQL: 400', async () => {
    const admin = await createUser(t(), { admin: true });
    const committed = await createUser(t());
    if (t().kind === 'postgres') {
      const r = await api(t(), admin.token).get('/admin/backup');
      expectError(r, 400, 'invalid_state', /PostgreSQL.*pg_dump.*docs\/operations\.md#backups/);
      return;
    }
    const res = await t().app.inject({
      method: 'GET',
      url: '/admin/backup',
      headers: { authorization: `Bearer ${admin.token}` },
    });
    assert.equal(res.statusCode, 200, res.body);
    assert.equal(res.headers['content-type'], 'application/gzip');
    assert.equal(res.headers['cache-control'], 'no-store');
    assert.match(
      String(res.headers['content-disposition']),
      /^attachment; filename="gpucloud-backup-\d{8}T\d{6}Z\.tar\.gz"$/,
    );
    const entries = entriesOf(res.rawPayload);
    const manifest = manifestOf(entries);
    assert.equal(manifest.format, 1);
    assert.equal(manifest.service_version, serviceVersion());
    assert.equal(manifest.pglite_version, pgliteVersion());
    assert.ok(Math.abs(Date.parse(manifest.created_at) - Date.now()) < 60_000, manifest.created_at);
    assert.deepEqual(
      manifest.migrations,
      loadMigrations().map((m) => m.version),
    );
    // The test service signs with GPUCLOUD_JWT_SECRET: the operator keeps it, the archive does not.
    assert.equal(manifest.jwt_secret, 'environment');
    const names = entries.map((e) => e.name);
    assert.equal(names[0], 'gpucloud-backup.json');
    assert.ok(!names.includes('jwt-secret'));
    assert.ok(names.includes('pg/PG_VERSION'));
    assert.ok(!names.includes('pg/postmaster.pid'), "the database's lock file is not data");
    assert.ok(
      names.every((n) => n === 'gpucloud-backup.json' || n === 'pg' || n.startsWith('pg/')),
      names.join(' '),
    );
    // The system's tar reads it as well.
    if (spawnSync('tar', ['--version']).status === 0) {
      const listed = spawnSync('tar', ['-tzf', '-'], { input: res.rawPayload, encoding: 'utf8' });
      assert.equal(listed.status, 0, listed.stderr);
      assert.deepEqual(
        listed.stdout
          .trim()
          .split('\n')
          .map((n) => n.replace(/\/$/, '')),
        names,
      );
    }

    // Restored and opened: the account committed before the request is there; no secret was restored.
    const file = join(tempDir('route'), 'b.tar.gz');
    writeFileSync(file, res.rawPayload);
    const target = tempDir('route-target');
    const restored = await restoreBackup(file, { dataDir: target });
    assert.equal(restored.secret, undefined);
    assert.deepEqual(restored.pendingMigrations, []);
    assert.deepEqual(readdirSync(target), ['pg']);
    const db = await PgliteDb.open(join(target, 'pg'));
    try {
      const r = await db.query<{ n: number }>('SELECT count(*)::int AS n FROM users WHERE email = $1', [
        committed.email,
      ]);
      assert.equal(r.rows[0]!.n, 1);
    } finally {
      await db.close();
    }
  });

  test('a non-admin is 403, no credential 401', async () => {
    const user = await createUser(t());
    expectError(await api(t(), user.token).get('/admin/backup'), 403, 'forbidden');
    expectError(await api(t()).get('/admin/backup'), 401, 'unauthorized');
  });

  test('gpucloud backup DIR: the offered name in DIR, mode 0600, size and sha256; nothing written on PostgreSQL', async () => {
    const admin = await createUser(t(), { admin: true });
    const key = await createApiKey(t(), admin.token, 'read_write');
    await t().app.listen({ port: 0, host: '127.0.0.1' });
    const addr = t().app.server.address();
    const url = `http://127.0.0.1:${typeof addr === 'object' && addr ? addr.port : 0}`;
    const home = tempDir('cli-home');
    const out = tempDir('cli-out');
    const env = { PATH: process.env.PATH, HOME: home, XDG_CONFIG_HOME: home, GPUCLOUD_API_URL: url };
    const backup = (json: boolean) =>
      run(process.execPath, [gpucloudMain(), 'backup', out, ...(json ? ['--json'] : []), '--api-key', key], { env });
    if (t().kind === 'postgres') {
      const e = await backup(false).then(
        () => assert.fail('a backup of PostgreSQL through the API'),
        (err: { code?: number; stderr?: string }) => err,
      );
      assert.equal(e.code, 1, e.stderr);
      assert.match(String(e.stderr), /^Error: The service runs on PostgreSQL.*pg_dump/);
      assert.deepEqual(readdirSync(out), []);
      return;
    }
    const { stdout } = await backup(true);
    const saved = JSON.parse(stdout) as { file: string; bytes: number; sha256: string };
    assert.match(saved.file, /\/gpucloud-backup-\d{8}T\d{6}Z\.tar\.gz$/);
    assert.deepEqual(readdirSync(out), [saved.file.slice(out.length + 1)]);
    const bytes = readFileSync(saved.file);
    assert.equal(saved.bytes, bytes.length);
    assert.equal(saved.sha256, createHash('sha256').update(bytes).digest('hex'));
    assert.equal(statSync(saved.file).mode & 0o777, 0o600);
    assert.equal(manifestOf(entriesOf(bytes)).format, 1);
    // Without --json: for people, the same figures.
    const text = (
      await run(process.execPath, [gpucloudMain(), 'backup', join(out, 'b.tar.gz'), '--api-key', key], {
        env,
      })
    ).stdout;
    assert.match(text, /^Saved the backup as \S+\/b\.tar\.gz \(\d+\.\d [KMG]iB, \d+ bytes\)\nsha256 [0-9a-f]{64}\n$/);
  });
});

describe('restore refuses what it cannot bring back, and changes nothing', () => {
  let archive: Buffer;
  let target: string;
  let good: string;

  /** The archive with its entries changed by `edit`. */
  const rewritten = (edit: (entries: TarEntry[]) => TarEntry[]) =>
    gzipSync(packTar(edit(entriesOf(archive)), Math.floor(Date.now() / 1000)), { level: 1 });
  const withManifest = (change: (m: BackupManifest) => void) =>
    rewritten((entries) =>
      entries.map((e) => {
        if (e.name !== 'gpucloud-backup.json') return e;
        const m = manifestOf(entries);
        change(m);
        return { ...e, data: Buffer.from(JSON.stringify(m)) };
      }),
    );

  before(async () => {
    const source = tempDir('source');
    writeFileSync(join(source, 'jwt-secret'), 'a-generated-secret-'.padEnd(64, 's') + '\n', { mode: 0o600 });
    // The suite's migrated database (in memory), with the secret of a data directory.
    const testDb = await createTestDb('pglite');
    try {
      archive = (await createBackup(testDb.db as PgliteDb, { dataDir: source, secretFromEnvironment: false })).archive;
    } finally {
      await testDb.cleanup();
    }
    good = join(source, 'good.tar.gz');
    writeFileSync(good, archive);
    // The data directory the refusals are tried on: a database, a secret.
    target = tempDir('target');
    const first = await restoreBackup(good, { dataDir: target });
    assert.equal(first.secret, join(target, 'jwt-secret'));
    assert.equal(first.manifest.jwt_secret, 'included');
  });

  const refusals: [string, () => Buffer, RegExp][] = [
    ['truncated', () => archive.subarray(0, Math.floor(archive.length / 2)), /is damaged or truncated: it is not/],
    [
      'a corrupted byte',
      () => {
        const b = Buffer.from(archive);
        b[Math.floor(b.length / 2)]! ^= 0xff;
        return b;
      },
      /is damaged or truncated/,
    ],
    [
      'a tar header with a bad checksum',
      () => {
        const tar = gunzipSync(archive);
        tar[0]! ^= 0x01;
        return gzipSync(tar, { level: 1 });
      },
      /is damaged: tar: bad header checksum/,
    ],
    [
      'a tar cut short',
      () => {
        const tar = gunzipSync(archive);
        return gzipSync(tar.subarray(0, Math.floor(tar.length / 2)), { level: 1 });
      },
      /is damaged: tar: /,
    ],
    [
      'no manifest',
      () => rewritten((entries) => entries.filter((e) => e.name !== 'gpucloud-backup.json')),
      /is not a gpucloud backup: it holds no gpucloud-backup\.json/,
    ],
    ['a newer format', () => withManifest((m) => (m.format = 2)), /is a backup of format 2 .*reads format 1/],
    [
      "a newer release's migrations",
      () =>
        withManifest((m) => {
          m.service_version = '99.0.0';
          m.migrations.push('999-from-a-newer-release');
        }),
      /was made by a newer release \(gpucloud 99\.0\.0\).*does not know \(999-from-a-newer-release\)/,
    ],
    [
      'a database that does not open',
      () =>
        rewritten((entries) =>
          entries.map((e) => (e.name === 'pg/global/pg_control' ? { ...e, data: Buffer.alloc(e.data.length, 7) } : e)),
        ),
      /the database in \S+ does not open/,
    ],
  ];

  for (const [what, make, why] of refusals) {
    test(`${what}: refused with a clear message, the data directory untouched`, async () => {
      const file = join(tempDir('bad'), 'bad.tar.gz');
      writeFileSync(file, make());
      const before = treeOf(target);
      await assert.rejects(
        restoreBackup(file, { dataDir: target, force: true }),
        (e: unknown) => e instanceof RestoreRefused && why.test(e.message) && e.message.includes(file),
      );
      assert.deepEqual(treeOf(target), before);
    });
  }

  test('a missing file, or a database there without --force: refused, nothing changed', async () => {
    const before = treeOf(target);
    await assert.rejects(
      restoreBackup(join(target, 'no-such.tar.gz'), { dataDir: target, force: true }),
      /cannot read .*no-such\.tar\.gz/,
    );
    await assert.rejects(
      restoreBackup(good, { dataDir: target }),
      (e: unknown) => e instanceof RestoreRefused && /holds a database: add --force/.test(e.message),
    );
    assert.deepEqual(treeOf(target), before);
    // With --force it goes through: the database and the secret that were there are kept aside.
    const r = await restoreBackup(good, { dataDir: target, force: true, now: new Date('2026-02-03T04:05:06Z') });
    assert.equal(r.previousDatabase, join(target, 'pg.before-restore-20260203T040506Z'));
    assert.equal(r.previousSecret, join(target, 'jwt-secret.before-restore-20260203T040506Z'));
    assert.ok(existsSync(join(r.previousDatabase, 'PG_VERSION')));
    assert.ok(existsSync(join(target, 'pg', 'PG_VERSION')));
  });

  test('gpucloud restore: FILE is required, one only; a usage mistake shows its help, exit 2', async () => {
    for (const [args, why] of [
      [['restore'], /which backup\? restore needs FILE/],
      [['restore', 'a.tar.gz', 'b.tar.gz'], /unexpected argument "b\.tar\.gz"/],
      [['restore', 'a.tar.gz', '--yes'], /Unknown option '--yes'/],
    ] as [string[], RegExp][]) {
      const e = await run(process.execPath, [gpucloudMain(), ...args], { env: { PATH: process.env.PATH } }).then(
        () => assert.fail(`gpucloud ${args.join(' ')} ran`),
        (err: { code?: number; stderr?: string }) => err,
      );
      assert.equal(e.code, 2, e.stderr);
      assert.match(String(e.stderr), why);
      assert.match(String(e.stderr), /^Usage: gpucloud restore FILE/m);
    }
  });

  test('server.pid: a live holder is refused (restore and a second server), a dead one taken over', async () => {
    const dir = tempDir('pid');
    const release = holdDataDir(dir);
    assert.equal(readFileSync(join(dir, 'server.pid'), 'utf8').trim(), String(process.pid));
    assert.equal(dataDirHolder(dir), process.pid);
    assert.throws(() => holdDataDir(dir), DataDirInUse);
    await assert.rejects(restoreBackup(good, { dataDir: dir }), /a gpucloud server \(pid \d+\) is running on/);
    release();
    assert.equal(existsSync(join(dir, 'server.pid')), false);
    // A process that has ended: its pid file holds nothing.
    const gone = spawnSync(process.execPath, ['-e', 'process.stdout.write(String(process.pid))'], {
      encoding: 'utf8',
    });
    writeFileSync(join(dir, 'server.pid'), `${gone.stdout}\n`);
    assert.equal(dataDirHolder(dir), undefined);
    holdDataDir(dir)();
  });
});
