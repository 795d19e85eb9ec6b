/**
 * Helpers for the tests that boot real guests: the tiny test image (built
 * once per content of its build script and cached in the temp dir), an agent
 * run as its own process the way an operator runs it, and SSH as a customer
 * uses it.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import {
  chmodSync,
  existsSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { gpucloudMain } from '../helpers/entry.js';

export const ROOT = fileURLToPath(new URL('../../', import.meta.url));

const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

/**
 * Builds (or reuses) the test guest image; returns its path. Test files run in
 * parallel processes, and two builds at once would download into the same
 * package cache: one process builds while the others wait for its lock file (a
 * lock whose process is gone is taken over).
 */
export function testImage(): string {
  const h = createHash('sha256');
  h.update(readFileSync(join(ROOT, 'scripts/test-image.mjs')));
  const assets = join(ROOT, 'scripts/test-image');
  if (existsSync(assets)) for (const f of readdirSync(assets).sort()) h.update(f).update(readFileSync(join(assets, f)));
  const out = join(tmpdir(), `gpucloud-test-image-${h.digest('hex').slice(0, 16)}.qcow2`);
  const lock = `${out}.lock`;
  const deadline = Date.now() + 600_000;
  for (;;) {
    if (existsSync(out)) return out;
    try {
      writeFileSync(lock, String(process.pid), { flag: 'wx' });
      break;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
      let holder = 0;
      try {
        holder = Number(readFileSync(lock, 'utf8'));
      } catch {
        continue; // released in between
      }
      // An empty file is a lock being written: its holder is alive.
      if (holder > 0 && !alive(holder)) rmSync(lock, { force: true });
      else if (Date.now() > deadline) throw new Error(`the test image is still being built by process ${holder}`);
      else Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 500);
    }
  }
  try {
    if (existsSync(out)) return out;
    const tmp = `${out}.${process.pid}.tmp.qcow2`;
    const r = spawnSync(process.execPath, [join(ROOT, 'scripts/test-image.mjs'), tmp], {
      encoding: 'utf8',
      timeout: 300_000,
    });
    if (r.status !== 0) throw new Error(`npm run test-image failed:\n${r.stdout}\n${r.stderr}`);
    renameSync(tmp, out);
    return out;
  } finally {
    rmSync(lock, { force: true });
  }
}

export { freePort } from '../helpers/ports.js';

/** `gpucloud ARGS` to completion. */
export function cli(args: string[], env: Record<string, string> = {}) {
  return spawnSync(process.execPath, [gpucloudMain(), ...args], {
    cwd: ROOT,
    encoding: 'utf8',
    env: { ...process.env, ...env },
    timeout: 120_000,
  });
}

export interface AgentProcess {
  child: ChildProcess;
  url: string;
  output: () => string;
}

/** Starts `gpucloud agent` and waits for its "listening on" line. */
export async function startAgentProcess(args: string[], opts: { netns?: string } = {}): Promise<AgentProcess> {
  const argv = [process.execPath, gpucloudMain(), 'agent', ...args];
  // In a network namespace of the test's own: `ip netns exec NS node ...`.
  const [cmd, ...rest] = opts.netns ? ['ip', 'netns', 'exec', opts.netns, ...argv] : argv;
  const child = spawn(cmd!, rest, { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  child.stdout!.on('data', (d) => (out += d));
  child.stderr!.on('data', (d) => (out += d));
  const url = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`the agent did not start: ${out}`)), 60_000);
    child.stdout!.on('data', () => {
      const m = /gpucloud agent listening on (\S+)/.exec(out);
      if (m) {
        clearTimeout(timer);
        resolve(m[1]!);
      }
    });
    child.once('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`the agent exited ${code}: ${out}`));
    });
  });
  return { child, url, output: () => out };
}

export async function kill(p: ChildProcess, signal: NodeJS.Signals = 'SIGKILL'): Promise<void> {
  if (p.exitCode !== null || p.signalCode !== null) return;
  const gone = new Promise((r) => p.once('exit', r));
  p.kill(signal);
  await gone;
}

export function workDir(tag: string): string {
  // Short: QEMU's socket paths under it must stay within 107 bytes.
  return mkdtempSync(join('/tmp', `gc-${tag}-`));
}

/** Runs a command in the guest over SSH, exactly as access-info's command says, plus a key or a password. */
export function ssh(command: string, remote: string, auth: { key: string } | { password: string; dir: string }) {
  const parts = command.split(' ');
  if (parts[0] !== 'ssh') throw new Error(`access-info command does not start with ssh: ${command}`);
  const opts = [
    '-o',
    'StrictHostKeyChecking=no',
    '-o',
    'UserKnownHostsFile=/dev/null',
    '-o',
    'ConnectTimeout=20',
    '-o',
    'LogLevel=ERROR',
  ];
  const env: Record<string, string> = { ...(process.env as Record<string, string>) };
  if ('key' in auth) {
    opts.push('-i', auth.key, '-o', 'BatchMode=yes', '-o', 'IdentitiesOnly=yes');
  } else {
    // OpenSSH reads the password from SSH_ASKPASS when told to: no terminal, no extra package.
    const askpass = join(auth.dir, 'askpass.sh');
    writeFileSync(askpass, `#!/bin/sh\nprintf '%s\\n' '${auth.password.replace(/'/g, `'\\''`)}'\n`);
    chmodSync(askpass, 0o700);
    Object.assign(env, { SSH_ASKPASS: askpass, SSH_ASKPASS_REQUIRE: 'force', DISPLAY: ':0' });
    opts.push(
      '-o',
      'PreferredAuthentications=password,keyboard-interactive',
      '-o',
      'PubkeyAuthentication=no',
      '-o',
      'NumberOfPasswordPrompts=1',
    );
  }
  return spawnSync('ssh', [...opts, ...parts.slice(1), remote], {
    encoding: 'utf8',
    env,
    timeout: 60_000,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
}

/** The QEMU processes whose command line mentions this directory. */
export function qemuPidsUnder(dir: string): number[] {
  const pids: number[] = [];
  for (const p of readdirSync('/proc')) {
    if (!/^\d+$/.test(p)) continue;
    try {
      const cmd = readFileSync(`/proc/${p}/cmdline`, 'utf8');
      const stat = readFileSync(`/proc/${p}/stat`, 'utf8');
      if (cmd.includes('qemu-system') && cmd.includes(dir) && !/\) Z /.test(stat)) pids.push(Number(p));
    } catch {
      // gone meanwhile
    }
  }
  return pids;
}
