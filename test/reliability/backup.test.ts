/**
 * Backups of the embedded database (docs/operations.md#backups), with the
 * real processes: `gpucloud serve` on an embedded data directory while
 * several clients sign up, grant credit and create and destroy VMs, and
 * `gpucloud backup FILE` taken in the middle of it through the API. Every
 * write acknowledged before the backup was asked for is found again in a
 * service started on a fresh data directory the backup was restored into
 * (restoreBackup, what `gpucloud restore` runs); the ledger check is clean
 * there, and a session of the original service still works (the signing
 * secret came back too). Writes go on while the backup is made.
 *
 * Also: restore refuses while a server runs on the directory, and a second
 * server on it refuses to start; restore over a database takes --force and
 * keeps the old one aside. test/db/backup.test.ts checks the route on each
 * database (PostgreSQL: 400 invalid_state), for non-admins and anonymous
 * calls, and the archives restore refuses (damaged, foreign, newer).
 */
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { restoreBackup, RestoreRefused } from '../../src/db/restore.js';
import { gpucloudMain } from '../helpers/entry.js';
import { field, isRecord, numberField, stringField } from '../helpers/json.js';
import { generateKey } from '../ssh-keys/keygen.js';
import { cleanEnv, Http, ledgerCheck, ROOT, startInstance, type Instance } from './instances-cluster.js';
import { treeOf } from '../helpers/tree.js';

const run = promisify(execFile);
const dirs: string[] = [];
const tempDir = (tag: string) => {
  const d = mkdtempSync(join(tmpdir(), `gpucloud-backup-${tag}-`));
  dirs.push(d);
  return d;
};
const running: Instance[] = [];
after(async () => {
  await Promise.all(running.map((i) => i.stop(10_000)));
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

const ADMIN_EMAIL = 'backup-admin@example.com';
const ADMIN_PASSWORD = 'backup-admin-password-1234';
const WRITERS = 4;
const ROUNDS = 8;

function serverEnv(dataDir: string, extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  return cleanEnv({
    GPUCLOUD_DATA_DIR: dataDir,
    PORT: '0',
    GPUCLOUD_DEMO: '0',
    LOG_LEVEL: 'warn',
    GPUCLOUD_PASSWORD_HASH_COST: 'test',
    GPUCLOUD_SIM_PROVISION_MS: '300',
    GPUCLOUD_RATE_LIMIT_AUTH: '100000',
    GPUCLOUD_RATE_LIMIT_LOGIN: '100000',
    GPUCLOUD_RATE_LIMIT_LOGIN_IP: '100000',
    GPUCLOUD_RATE_LIMIT_VM_MUTATIONS: '100000',
    GPUCLOUD_RATE_LIMIT_DEFAULT: '100000',
    ...extra,
  });
}

/** A write the service acknowledged, in the order the answers came. */
type Ack =
  | { kind: 'signup'; email: string; password: string }
  | { kind: 'credit'; user: number; token: string; description: string }
  | { kind: 'create'; user: number; vm: string }
  | { kind: 'destroy'; user: number; vm: string };

test('backup during writes, restore into a fresh data directory: every acknowledged write is there, the ledger adds up', async (t) => {
  const dataDir = tempDir('live');
  const live = await startInstance(
    'live',
    'all',
    serverEnv(dataDir, { GPUCLOUD_ADMIN_EMAIL: ADMIN_EMAIL, GPUCLOUD_ADMIN_PASSWORD: ADMIN_PASSWORD }),
  );
  running.push(live);
  assert.equal(readFileSync(join(dataDir, 'server.pid'), 'utf8').trim(), String(live.child.pid));
  const http = new Http([live]);
  const login = (email: string, password: string, on = http) =>
    on
      .must([200], 'POST', '/auth/login', { body: { email, password } })
      .then((r) => stringField(r.body, 'access_token'));
  const admin = await login(ADMIN_EMAIL, ADMIN_PASSWORD);
  const adminKey = stringField(
    (await http.must([201], 'POST', '/api-keys', { token: admin, body: { name: 'backups', scope: 'read_write' } }))
      .body,
    'key',
  );
  for (let n = 0; n < 4; n++) {
    await http.must([201], 'POST', '/admin/nodes', {
      token: admin,
      body: {
        node: `bk${n}`,
        gpu_type: '4090',
        gpu_count: 8,
        ram_gb: 512,
        cpu_cores: 64,
        cpu_model: 'AMD EPYC 7543',
        pcie_gen: '4.0',
        max_storage_gb: 4000,
        location: 'eu-central',
        cluster_name: 'backup',
      },
    });
  }

  const acks: Ack[] = [];
  const writer = async (w: number) => {
    const email = `writer-${w}@example.com`;
    const password = `writer-password-${w}-long`;
    await http.must([201], 'POST', '/auth/register', { body: { email, password } });
    const token = await login(email, password);
    const user = numberField((await http.must([200], 'GET', '/account', { token })).body, 'id');
    await http.must([201], 'POST', '/admin/users/' + user + '/credits', {
      token: admin,
      body: { amount: 100, description: `start ${w}` },
    });
    // The VMs get the user's SSH key.
    await http.must([201], 'POST', '/ssh-keys', { token, body: { ssh_public_key: generateKey('ed25519').line } });
    for (let round = 0; round < ROUNDS; round++) {
      const signup = { email: `signup-${w}-${round}@example.com`, password: `signup-password-${w}-${round}` };
      await http.must([201], 'POST', '/auth/register', { body: signup });
      acks.push({ kind: 'signup', ...signup });
      const description = `grant ${w}/${round}`;
      await http.must([201], 'POST', `/admin/users/${user}/credits`, {
        token: admin,
        body: { amount: 5, description },
      });
      acks.push({ kind: 'credit', user, token, description });
      const vm = stringField(
        (
          await http.must([201], 'POST', '/vms', {
            token,
            body: {
              node: `bk${(w + round) % 4}`,
              gpu_type: '4090',
              gpu_count: 1,
              storage_gb: 50,
              template_vmid: 101,
            },
          })
        ).body,
        'id',
      );
      acks.push({ kind: 'create', user, vm });
      // Every third VM is kept, the others destroyed at once.
      if (round % 3 !== 0) {
        await http.must([200], 'DELETE', `/vms/${vm}`, { token });
        acks.push({ kind: 'destroy', user, vm });
      }
    }
  };
  let settled = false;
  const failed = Promise.all(Array.from({ length: WRITERS }, (_, w) => writer(w)))
    .then(
      () => undefined,
      (err: unknown) => err,
    )
    .finally(() => (settled = true));
  // The backup is asked for once about half the writes are acknowledged.
  while (acks.length < (WRITERS * ROUNDS * 3) / 2 && !settled) await new Promise((r) => setTimeout(r, 20));
  const home = tempDir('home');
  const file = join(home, 'nightly.tar.gz');
  const acknowledged = acks.length;
  const cli = run(process.execPath, [gpucloudMain(), 'backup', file, '--json'], {
    cwd: ROOT,
    env: cleanEnv({ GPUCLOUD_API_URL: live.url!, GPUCLOUD_API_KEY: adminKey, HOME: home, XDG_CONFIG_HOME: home }),
  });
  const { stdout } = await cli;
  const duringBackup = acks.length - acknowledged;
  const err = await failed;
  if (err) throw err;
  assert.deepEqual(http.problems, []);

  // The CLI's answer, and the file it wrote: whole, the user's alone, no partial file beside it.
  const saved = JSON.parse(stdout) as { file: string; bytes: number; sha256: string };
  assert.equal(saved.file, file);
  const bytes = readFileSync(file);
  assert.equal(saved.bytes, bytes.length);
  assert.equal(saved.sha256, createHash('sha256').update(bytes).digest('hex'));
  assert.equal(statSync(file).mode & 0o777, 0o600);
  assert.deepEqual(
    readdirSync(home).filter((f) => f.endsWith('.partial')),
    [],
  );
  // The service kept serving writes while the backup was made.
  assert.ok(duringBackup > 0, `${acknowledged} writes before the backup, none while it was made`);
  t.diagnostic(
    `${acknowledged} writes acknowledged before the backup was asked for, ${duringBackup} while it was made`,
  );

  // While the server runs: restore refuses and changes nothing; a second server refuses to start.
  // (The running server writes its files meanwhile: what shows nothing was touched is the directory's entries.)
  const before = readdirSync(dataDir).sort();
  await assert.rejects(
    restoreBackup(file, { dataDir, force: true }),
    (e: unknown) =>
      e instanceof RestoreRefused && /is running on/.test(e.message) && e.message.includes(String(live.child.pid)),
  );
  assert.deepEqual(readdirSync(dataDir).sort(), before);
  const second = await run(process.execPath, [gpucloudMain(), 'serve'], { cwd: ROOT, env: serverEnv(dataDir) }).then(
    () => assert.fail('a second server started on the same data directory'),
    (e: { code?: number; stderr?: string }) => e,
  );
  assert.equal(second.code, 2, second.stderr);
  assert.match(String(second.stderr), /in use by another gpucloud server \(pid \d+\)/);

  const stopped = await live.stop();
  assert.equal(stopped.code, 0, live.output());
  assert.equal(existsSync(join(dataDir, 'server.pid')), false, 'a stopped server leaves no pid file');

  // Restored into a fresh data directory: the database and the signing secret.
  const fresh = tempDir('fresh');
  const restored = await restoreBackup(file, { dataDir: fresh });
  assert.equal(restored.previousDatabase, undefined);
  assert.equal(restored.manifest.jwt_secret, 'included');
  assert.equal(readFileSync(join(fresh, 'jwt-secret'), 'utf8'), readFileSync(join(dataDir, 'jwt-secret'), 'utf8'));
  assert.deepEqual(readdirSync(fresh).sort(), ['jwt-secret', 'pg']);

  const back = await startInstance('restored', 'all', serverEnv(fresh));
  running.push(back);
  const http2 = new Http([back]);
  // A session of the original service: signed with the secret that came back.
  const check = await http2.must([200], 'GET', '/admin/ledger-check', { token: admin });
  assert.equal(field(check.body, 'ok'), true, JSON.stringify(check.body));
  const vmsOf = new Map<number, Map<string, string>>();
  const vmStatus = async (user: number, vm: string) => {
    let vms = vmsOf.get(user);
    if (!vms) {
      const r = await http2.must([200], 'GET', `/admin/vms?user_id=${user}&include_destroyed=true&limit=100`, {
        token: admin,
      });
      vms = new Map((r.body as unknown[]).map((v) => [stringField(v, 'id'), stringField(v, 'status')]));
      vmsOf.set(user, vms);
    }
    return vms.get(vm);
  };
  const grants = new Map<number, string[]>();
  for (const ack of acks.slice(0, acknowledged)) {
    const what = JSON.stringify(ack);
    if (ack.kind === 'signup') await login(ack.email, ack.password, http2).catch(() => assert.fail(`lost: ${what}`));
    else if (ack.kind === 'credit') {
      if (!grants.has(ack.user)) {
        const r = await http2.must([200], 'GET', '/billing/transactions?limit=100', { token: ack.token });
        grants.set(
          ack.user,
          (r.body as unknown[]).map((t) => (isRecord(t) ? String(t.description) : '')),
        );
      }
      assert.ok(grants.get(ack.user)!.includes(ack.description), `lost: ${what}`);
    } else if (ack.kind === 'create') assert.notEqual(await vmStatus(ack.user, ack.vm), undefined, `lost: ${what}`);
    else assert.equal(await vmStatus(ack.user, ack.vm), 'destroyed', `lost: ${what}`);
  }
  assert.deepEqual(http2.problems, []);
  const stopped2 = await back.stop();
  assert.equal(stopped2.code, 0, back.output());
  const ledger = ledgerCheck(serverEnv(fresh));
  assert.equal(ledger.status, 0, ledger.stdout + ledger.stderr);

  // Over a database: refused without --force (nothing changes), then done by the command, the old one kept aside.
  const kept = treeOf(fresh);
  const refused = await run(process.execPath, [gpucloudMain(), 'restore', file, '--data-dir', fresh], {
    cwd: ROOT,
    env: cleanEnv({}),
  }).then(
    () => assert.fail('restored over a database without --force'),
    (e: { code?: number; stderr?: string }) => e,
  );
  assert.equal(refused.code, 1, refused.stderr);
  assert.match(String(refused.stderr), /holds a database: add --force/);
  assert.deepEqual(treeOf(fresh), kept);
  const forced = await run(process.execPath, [gpucloudMain(), 'restore', file, '--force'], {
    cwd: ROOT,
    env: cleanEnv({ GPUCLOUD_DATA_DIR: fresh }),
  });
  const aside = /kept in (\S+pg\.before-restore-\d{8}T\d{6}Z)/.exec(forced.stdout)?.[1];
  assert.ok(aside && existsSync(join(aside, 'PG_VERSION')), forced.stdout);
  assert.ok(
    readdirSync(fresh).some((f) => f.startsWith('jwt-secret.before-restore-')),
    'the old secret is kept',
  );
  assert.deepEqual(
    readdirSync(fresh).filter((f) => f.startsWith('.restore-')),
    [],
    'no unpacked copy is left behind',
  );
});
