/**
 * A rolling upgrade (docs/operations.md#upgrades): the previous release keeps
 * serving while this release migrates the same PostgreSQL database, and no
 * request fails; then this release serves the same data. The previous release
 * is the commit PREVIOUS_RELEASE, taken from this repository's history
 * (`git archive`), installed and built the way an operator does (`npm ci`).
 * Migrations must only expand (add tables, nullable or defaulted columns,
 * indexes) so that the release before them runs on the migrated schema.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { randomBytes, randomUUID } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { gpucloudMain } from '../helpers/entry.js';
import { cleanEnv, createDatabase, ROOT, sleep, sshPublicKey, type FreshDatabase } from './instances-cluster.js';

/** The release before this one: the last commit before migration 013. */
const PREVIOUS_RELEASE = '231872e';
const SERVER = process.env.DATABASE_URL;

function skipReason(): string | false {
  if (!SERVER) return 'needs DATABASE_URL (PostgreSQL)';
  const has = spawnSync('git', ['cat-file', '-e', `${PREVIOUS_RELEASE}^{commit}`], { cwd: ROOT });
  if (has.status !== 0) return `the history does not hold ${PREVIOUS_RELEASE} (a shallow clone?)`;
  return false;
}

describe('a rolling upgrade on PostgreSQL', { skip: skipReason() }, () => {
  let dir: string;
  let db: FreshDatabase;
  const children: ReturnType<typeof spawn>[] = [];
  const admin = { email: 'upgrade-admin@example.com', password: `pw-${randomBytes(8).toString('hex')}` };

  const start = (main: string, env: NodeJS.ProcessEnv) =>
    new Promise<{ url: string; output: () => string; child: ReturnType<typeof spawn> }>((resolve, reject) => {
      const child = spawn(process.execPath, [main, 'serve'], { env, stdio: ['ignore', 'pipe', 'pipe'] });
      children.push(child);
      let out = '';
      child.stdout!.on('data', (d) => (out += d));
      child.stderr!.on('data', (d) => (out += d));
      const timer = setTimeout(() => reject(new Error(`no banner:\n${out}`)), 120_000);
      child.stdout!.on('data', () => {
        const m = /API:\s+(http:\/\/\S+)/.exec(out);
        if (m) {
          clearTimeout(timer);
          resolve({ url: m[1]!, output: () => out, child });
        }
      });
      child.once('exit', (code) => reject(new Error(`exited ${code}:\n${out}`)));
    });

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'gpucloud-prev-'));
    const archive = spawnSync('sh', ['-c', `git archive ${PREVIOUS_RELEASE} | tar -x -C "${dir}"`], { cwd: ROOT });
    assert.equal(archive.status, 0, String(archive.stderr));
    // As an operator installs a release: npm ci, whose prepare step builds it.
    const install = spawnSync('npm', ['ci', '--no-audit', '--no-fund', '--loglevel=error'], {
      cwd: dir,
      encoding: 'utf8',
      env: cleanEnv({}),
      timeout: 600_000,
    });
    assert.equal(install.status, 0, `${install.stdout}\n${install.stderr}`);
    db = await createDatabase(SERVER!);
  });
  after(async () => {
    for (const c of children) c.kill('SIGKILL');
    await db?.drop();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  test('the previous release serves while this one migrates; no request fails; this release serves the same data', async () => {
    const env = cleanEnv({
      DATABASE_URL: db.url,
      GPUCLOUD_JWT_SECRET: randomBytes(24).toString('hex'),
      GPUCLOUD_ADMIN_EMAIL: admin.email,
      GPUCLOUD_ADMIN_PASSWORD: admin.password,
      GPUCLOUD_SIM_PROVISION_MS: '0',
      GPUCLOUD_DEMO: '0',
      LOG_LEVEL: 'warn',
      PORT: '0',
      // The load is the test's: limits far above it.
      GPUCLOUD_RATE_LIMIT_VM_MUTATIONS: '1000000',
      GPUCLOUD_RATE_LIMIT_DEFAULT: '1000000',
      GPUCLOUD_RATE_LIMIT_AUTH: '1000000',
    });
    const prev = await start(join(dir, 'dist', 'bin', 'gpucloud.js'), env);
    const call = async (base: string, method: string, path: string, token?: string, body?: unknown, key?: string) => {
      const r = await fetch(`${base}${path}`, {
        method,
        headers: {
          ...(token ? { authorization: `Bearer ${token}` } : {}),
          ...(body ? { 'content-type': 'application/json' } : {}),
          ...(key ? { 'idempotency-key': key } : {}),
        },
        body: body ? JSON.stringify(body) : undefined,
      });
      const text = await r.text();
      return { status: r.status, body: text ? JSON.parse(text) : undefined, text };
    };
    const must = async (...a: Parameters<typeof call>) => {
      const r = await call(...a);
      assert.ok(r.status < 300, `${a[1]} ${a[2]}: ${r.status} ${r.text}`);
      return r.body;
    };
    const token = (await must(prev.url, 'POST', '/auth/login', undefined, admin)).access_token as string;
    const me = await must(prev.url, 'GET', '/account', token);
    await must(prev.url, 'POST', `/admin/users/${me.id}/credits`, token, { amount: 1000, description: 'upgrade test' });
    await must(prev.url, 'PATCH', `/admin/users/${me.id}`, token, { max_vms: 1000, max_gpus: 1000 });
    await must(prev.url, 'POST', '/ssh-keys', token, { ssh_public_key: sshPublicKey('upgrade') });
    await must(prev.url, 'POST', '/admin/nodes', token, {
      node: 'up-1',
      gpu_type: '4090',
      gpu_count: 8,
      ram_gb: 64,
      cpu_cores: 16,
      cpu_model: 'x',
      pcie_gen: '4.0',
      max_storage_gb: 2000,
      location: 'here',
      cluster_name: 'c',
    });

    // Mixed load on the previous release: creates, reads, lists, destroys.
    const failures: string[] = [];
    let requests = 0;
    let running = true;
    const loop = async () => {
      while (running) {
        const key = randomUUID();
        const body = { node: 'up-1', gpu_type: '4090', gpu_count: 1, storage_gb: 50, template_vmid: 101 };
        const c = await call(prev.url, 'POST', '/vms', token, body, key).catch((e: Error) => ({
          status: 0,
          text: e.message,
          body: undefined,
        }));
        requests++;
        if (c.status !== 201) {
          failures.push(`POST /vms ${c.status} ${c.text}`);
          await sleep(100);
          continue;
        }
        for (const [method, path] of [
          ['GET', `/vms/${c.body.id}`],
          ['GET', '/vms'],
          ['GET', '/pricing'],
          ['DELETE', `/vms/${c.body.id}`],
        ] as const) {
          const r = await call(prev.url, method, path, token).catch((e: Error) => ({
            status: 0,
            text: e.message,
            body: undefined,
          }));
          requests++;
          if (r.status >= 300) failures.push(`${method} ${path} ${r.status} ${r.text}`);
        }
      }
    };
    const loops = [loop(), loop(), loop()];
    await sleep(1500);
    // This release migrates the database the previous one serves.
    const migrate = spawnSync(process.execPath, [gpucloudMain(), 'migrate'], {
      env,
      encoding: 'utf8',
      timeout: 120_000,
    });
    assert.equal(migrate.status, 0, `${migrate.stdout}\n${migrate.stderr}`);
    assert.match(migrate.stdout + migrate.stderr, /013/);
    await sleep(2000);
    running = false;
    await Promise.all(loops);
    assert.ok(requests > 20, `${requests} requests`);
    assert.deepEqual(failures, [], `${failures.length} of ${requests} requests failed`);

    // The previous release goes; this release serves what it left.
    prev.child.kill('SIGTERM');
    await new Promise((r) => prev.child.once('exit', r));
    const next = await start(gpucloudMain(), env);
    const token2 = (await must(next.url, 'POST', '/auth/login', undefined, admin)).access_token as string;
    const all = await must(next.url, 'GET', '/vms?include_destroyed=true&limit=100', token2);
    assert.ok(all.length > 0);
    assert.ok(
      all.every((v: { http_ports: unknown }) => Array.isArray(v.http_ports)),
      'the new column, defaulted',
    );
  });
});
