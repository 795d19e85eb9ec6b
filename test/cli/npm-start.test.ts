/**
 * `npm start` hands the signals that stop it to the server: npm runs the
 * start script through `sh -c` and forwards SIGTERM and SIGINT to that
 * child, so the script must `exec` node for the server to be the child (a
 * shell in between dies of the signal and leaves the server running with
 * its port held). Here npm runs the repository's start script as it is, in
 * a folder of its own, pointed at the test build of the command instead of
 * dist/ (which may be missing or older than the source); the server must be
 * npm's own child, and be gone with its port closed within 10 s of the
 * signal to npm.
 */
import { after, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { gpucloudMain } from '../helpers/entry.js';

const ROOT = join(import.meta.dirname, '..', '..');
const npm = spawnSync('npm', ['--version'], { encoding: 'utf8' });
const skip = npm.status !== 0 ? 'npm is not on PATH' : process.platform !== 'linux' ? 'reads /proc' : false;

const dirs: string[] = [];
const leftovers: number[] = [];
after(() => {
  for (const pid of leftovers) if (alive(pid)) process.kill(pid, 'SIGKILL');
  dirs.forEach((d) => rmSync(d, { recursive: true, force: true }));
});

/** The processes whose parent is `pid`, from /proc. */
function childrenOf(pid: number): number[] {
  const found: number[] = [];
  for (const e of readdirSync('/proc')) {
    if (!/^\d+$/.test(e)) continue;
    try {
      // "PID (COMM) STATE PPID ...": COMM may hold spaces and parentheses, so read after its last ")".
      const stat = readFileSync(`/proc/${e}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      if (ppid === pid) found.push(Number(e));
    } catch {
      // gone meanwhile
    }
  }
  return found;
}

/** Whether the process runs (a zombie waiting for its parent to reap it has ended). */
function alive(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2)[0] !== 'Z';
  } catch {
    return false;
  }
}

function portOpen(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = connect({ host: '127.0.0.1', port });
    s.once('connect', () => (s.destroy(), resolve(true)));
    s.once('error', () => resolve(false));
  });
}

async function until(check: () => boolean | Promise<boolean>, ms: number): Promise<boolean> {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (await check()) return true;
    await new Promise((r) => setTimeout(r, 100));
  }
  return check();
}

describe('npm start', { skip }, () => {
  const start = (JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { scripts: { start: string } }).scripts
    .start;

  test('the start script execs node, so that the server is what npm signals', () => {
    assert.match(start, /^exec node .*dist\/bin\/gpucloud\.js serve$/);
  });

  for (const signal of ['SIGTERM', 'SIGINT'] as const) {
    test(`${signal} to npm stops the server and frees its port within 10 s`, async () => {
      const dir = mkdtempSync(join(tmpdir(), 'gpucloud-npm-start-'));
      dirs.push(dir);
      const script = start.replace('dist/bin/gpucloud.js', `'${gpucloudMain().replace(/'/g, `'\\''`)}'`);
      writeFileSync(
        join(dir, 'package.json'),
        JSON.stringify({ name: 'npm-start-check', version: '1.0.0', private: true, scripts: { start: script } }),
      );
      const env: NodeJS.ProcessEnv = { ...process.env };
      for (const k of ['DATABASE_URL', 'GPUCLOUD_REDIS_URL', 'GPUCLOUD_JWT_SECRET', 'GPUCLOUD_CLOCK', 'NODE_OPTIONS'])
        delete env[k];
      Object.assign(env, {
        PORT: '0',
        GPUCLOUD_DATA_DIR: join(dir, 'data'),
        GPUCLOUD_DEMO: '0',
        LOG_LEVEL: 'silent',
        npm_config_update_notifier: 'false',
        npm_config_fund: 'false',
      });
      const child: ChildProcess = spawn('npm', ['start'], { cwd: dir, env, stdio: ['ignore', 'pipe', 'pipe'] });
      const npmPid = child.pid!;
      leftovers.push(npmPid);
      let out = '';
      child.stdout!.on('data', (d) => (out += d));
      child.stderr!.on('data', (d) => (out += d));
      const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
        child.once('exit', (code, sig) => resolve({ code, signal: sig })),
      );
      const port = await new Promise<number>((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`no banner: ${out}`)), 90_000);
        child.stdout!.on('data', () => {
          const m = /API:\s+http:\/\/127\.0\.0\.1:(\d+)/.exec(out);
          if (m) {
            clearTimeout(timer);
            resolve(Number(m[1]));
          }
        });
        void exited.then(({ code }) => reject(new Error(`npm exited ${code}: ${out}`)));
      });
      // Whatever npm started is stopped after the test, even when it fails midway.
      const descendants = (pid: number): number[] => childrenOf(pid).flatMap((c) => [c, ...descendants(c)]);
      leftovers.push(...descendants(npmPid));
      // The server is npm's child itself: no shell waits in between.
      const children = childrenOf(npmPid);
      assert.equal(children.length, 1, `npm's children: ${children.join(', ')}`);
      const server = children[0]!;
      const cmdline = readFileSync(`/proc/${server}/cmdline`, 'utf8').split('\0');
      assert.equal(cmdline[0], 'node', cmdline.join(' '));
      assert.ok(cmdline.includes('serve'), cmdline.join(' '));
      assert.equal(await portOpen(port), true);

      process.kill(npmPid, signal);
      assert.ok(await until(() => !alive(server), 10_000), `the server (pid ${server}) still runs: ${out}`);
      assert.ok(await until(async () => !(await portOpen(port)), 10_000), `port ${port} is still open`);
      await exited;
      assert.match(out, new RegExp(`${signal}: shutting down`));
    });
  }
});
