/**
 * The `gpucloud` command as a user meets it: `serve` on a fresh embedded data
 * dir (demo data, banner with URL, docs and demo login), `migrate`,
 * `admin create-user`, and a bad configuration stopping the start.
 */
import { after, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { chmodSync, mkdtempSync, readdirSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { gpucloudMain } from '../helpers/entry.js';

const dirs: string[] = [];
const freshDir = () => {
  const d = mkdtempSync(join(tmpdir(), 'gpucloud-cli-'));
  dirs.push(d);
  return d;
};
after(() => dirs.forEach((d) => rmSync(d, { recursive: true, force: true })));

/** The environment of a newcomer: no database URL, no Redis. */
function env(dataDir: string, extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const e: NodeJS.ProcessEnv = { ...process.env };
  for (const k of [
    'DATABASE_URL',
    'GPUCLOUD_REDIS_URL',
    'GPUCLOUD_JWT_SECRET',
    'GPUCLOUD_CLOCK',
    'GPUCLOUD_CLOCK_START',
  ])
    delete e[k];
  return { ...e, GPUCLOUD_DATA_DIR: dataDir, PORT: '0', LOG_LEVEL: 'silent', ...extra };
}

function run(args: string[], e: NodeJS.ProcessEnv) {
  return spawnSync(process.execPath, [gpucloudMain(), ...args], {
    env: e,
    encoding: 'utf8',
    timeout: 120_000,
  });
}

describe('gpucloud command', () => {
  test('serve: banner, health, docs, demo login; a second start keeps the data', async () => {
    const dir = freshDir();
    for (let round = 0; round < 2; round++) {
      // The second start also runs on the manual clock from a given instant, which the banner shows.
      const manual = { GPUCLOUD_CLOCK: 'manual', GPUCLOUD_CLOCK_START: '2026-03-31T23:59:30+02:00' };
      const child = spawn(process.execPath, [gpucloudMain(), 'serve'], {
        env: env(dir, round === 1 ? manual : {}),
      });
      let out = '';
      child.stdout.on('data', (d) => (out += d));
      child.stderr.on('data', (d) => (out += d));
      try {
        const url = await new Promise<string>((resolve, reject) => {
          const timer = setTimeout(() => reject(new Error(`no banner: ${out}`)), 90_000);
          const check = () => {
            const m = /API:\s+(http:\/\/\S+)/.exec(out);
            if (m && /Demo login:/.test(out)) {
              clearTimeout(timer);
              resolve(m[1]!);
            }
          };
          child.stdout.on('data', check);
          child.on('exit', (code) => reject(new Error(`exited ${code}: ${out}`)));
        });
        assert.match(out, /Docs:\s+http:\/\/\S+\/docs/);
        assert.equal(statSync(join(dir, 'jwt-secret')).mode & 0o777, 0o600, "the signing secret is the user's alone");
        if (round === 1) assert.match(out, /Clock: manual, now 2026-03-31T21:59:30\.000Z/);
        else assert.doesNotMatch(out, /Clock:/);
        assert.match(out, /demo@gpucloud\.local \/ demo-password-123/);
        assert.equal((await fetch(`${url}/healthz`)).status, 200);
        assert.equal((await fetch(`${url}/readyz`)).status, 200);
        const docs = await fetch(`${url}/docs`);
        assert.equal(docs.status, 200);
        assert.match(await docs.text(), /swagger/i);
        const login = await fetch(`${url}/auth/login`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ email: 'demo@gpucloud.local', password: 'demo-password-123' }),
        });
        assert.equal(login.status, 200);
        const { access_token } = (await login.json()) as { access_token: string };
        const bal = (await (
          await fetch(`${url}/billing/balance`, { headers: { authorization: `Bearer ${access_token}` } })
        ).json()) as { balance: number };
        assert.equal(bal.balance, 100); // seeded once: the second start does not credit again
        const offers = (await (await fetch(`${url}/search`)).json()) as { gpu_type: string }[];
        assert.deepEqual([...new Set(offers.map((o) => o.gpu_type))].sort(), ['4090', '5090', 'pro6000']);
      } finally {
        child.kill('SIGTERM');
        await new Promise((r) => child.once('exit', r));
      }
    }
    // Without GPUCLOUD_JWT_SECRET, the generated signing secret is kept in the data dir, readable by its owner only.
    assert.equal(statSync(join(dir, 'jwt-secret')).mode & 0o777, 0o600);
  });

  test("the data directory is the user's alone: 0700, files 0600, corrected at every start", () => {
    const dir = freshDir();
    const loose = (root: string): string[] => {
      const found: string[] = [];
      const walk = (d: string) => {
        if ((statSync(d).mode & 0o077) !== 0) found.push(d);
        for (const e of readdirSync(d, { withFileTypes: true })) {
          const p = join(d, e.name);
          if (e.isDirectory()) walk(p);
          else if ((statSync(p).mode & 0o077) !== 0) found.push(p);
        }
      };
      walk(root);
      return found;
    };
    assert.equal(run(['migrate'], env(dir)).status, 0);
    assert.equal(statSync(dir).mode & 0o777, 0o700);
    assert.deepEqual(loose(dir), [], 'no file or folder readable by others');
    // Loosened by hand (a backup restored, a careless chmod): the next start corrects it.
    chmodSync(dir, 0o755);
    const pgFile = readdirSync(join(dir, 'pg')).find((f) => statSync(join(dir, 'pg', f)).isFile())!;
    chmodSync(join(dir, 'pg', pgFile), 0o666);
    assert.ok(loose(dir).length >= 2);
    assert.equal(run(['migrate'], env(dir)).status, 0);
    assert.deepEqual(loose(dir), []);
  });

  test('migrate and admin create-user work on a fresh data dir', () => {
    const dir = freshDir();
    const m = run(['migrate'], env(dir));
    assert.equal(m.status, 0, m.stderr);
    assert.match(m.stdout, /up to date/);
    const c = run(
      ['admin', 'create-user', '--email', 'ops@example.com', '--password', 'a very long password', '--admin'],
      env(dir),
    );
    assert.equal(c.status, 0, c.stderr);
    assert.match(c.stdout, /Created admin ops@example\.com/);
    const again = run(
      ['admin', 'create-user', '--email', 'ops@example.com', '--password', 'another long password'],
      env(dir),
    );
    assert.equal(again.status, 0, again.stderr);
    assert.match(again.stdout, /Updated user ops@example\.com/);
    const short = run(['admin', 'create-user', '--email', 'x@example.com', '--password', 'short'], env(dir));
    assert.equal(short.status, 2);
    const check = run(['admin', 'ledger-check'], env(dir));
    assert.equal(check.status, 0, check.stderr);
  });

  test('bad configuration and bad usage exit 2 with a message naming the problem', () => {
    const dir = freshDir();
    const bad = run(['serve'], env(dir, { PORT: 'eighty' }));
    assert.equal(bad.status, 2);
    assert.match(bad.stderr, /PORT/);
    const clock = run(['serve'], env(dir, { GPUCLOUD_CLOCK: 'manual', NODE_ENV: 'production' }));
    assert.equal(clock.status, 2);
    assert.match(clock.stderr, /GPUCLOUD_CLOCK/);
    const start = run(['serve'], env(dir, { GPUCLOUD_CLOCK_START: '2026-01-01T00:00:00Z' }));
    assert.equal(start.status, 2, 'a clock start without the manual clock is refused');
    assert.match(start.stderr, /GPUCLOUD_CLOCK_START/);
    const proxmox = run(['serve'], env(dir, { GPUCLOUD_HYPERVISOR: 'proxmox' }));
    assert.equal(proxmox.status, 2, 'a hypervisor without a driver is a configuration error, not a crash');
    assert.match(proxmox.stderr, /GPUCLOUD_HYPERVISOR.*no driver/);
    assert.doesNotMatch(proxmox.stderr, /\n\s+at /, 'no stack trace');
    const unknown = run(['frobnicate'], env(dir));
    assert.equal(unknown.status, 2);
    assert.match(unknown.stderr, /unknown command/);
    const help = run(['--help'], env(dir));
    assert.equal(help.status, 0);
    assert.match(help.stdout, /gpucloud serve/);
  });
});
