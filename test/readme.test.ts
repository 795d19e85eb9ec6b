/**
 * The README's tours run as printed. The curl tour ("First requests") and the
 * command-line tour ("The command line") are read from README.md itself, by
 * their headings, and run with bash (-euo pipefail: every step must succeed)
 * against a fresh `gpucloud serve` with the demo data, as a newcomer on a
 * fresh machine would run them:
 *
 * - HOME is a new empty directory, so `~/.ssh` and the CLI's saved login are
 *   fresh (a tour makes its own SSH key);
 * - PATH holds only node, curl, bash, coreutils and ssh-keygen, so a step
 *   that needs any other tool (uuidgen, jq, python) fails here;
 * - the only substitutions are what the README itself leaves to the
 *   environment: `API` (the curl tour reads `API=${API:-http://127.0.0.1:8080}`)
 *   and `GPUCLOUD_API_URL` (read by the client) name this test's server, and
 *   `gpucloud` on PATH is the built command (`node <gpucloudMain()>`), which
 *   is what the README's alias of dist/bin/gpucloud.js runs.
 *
 * Also: the alias the README gives for `gpucloud` names the package's own
 * bin, and every `gpucloud ...` the README shows is a command that exists,
 * with options that command takes.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import {
  accessSync,
  constants,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { gpucloudMain } from './helpers/entry.js';
import { freePort } from './helpers/ports.js';
import { COMMANDS } from '../src/cli/commands.js';
import { findCommand } from '../src/cli/index.js';

const ROOT = join(import.meta.dirname, '..');
const README = readFileSync(join(ROOT, 'README.md'), 'utf8');

/** The first ```sh block under the `## ` heading that starts with `heading`. */
function shBlockUnder(heading: string): string {
  const lines = README.split('\n');
  const at = lines.findIndex((l) => l.startsWith(`## ${heading}`));
  assert.ok(at >= 0, `README.md has no "## ${heading}" heading`);
  for (let i = at + 1; i < lines.length; i++) {
    assert.ok(!/^## /.test(lines[i]!), `no sh block under "## ${heading}"`);
    if (lines[i] !== '```sh') continue;
    const end = lines.indexOf('```', i + 1);
    return lines.slice(i + 1, end).join('\n');
  }
  throw new Error(`no sh block under "## ${heading}"`);
}

/** Where `name` is on this machine's PATH, or undefined. */
function which(name: string): string | undefined {
  for (const dir of (process.env.PATH ?? '/usr/bin:/bin').split(':')) {
    if (!dir) continue;
    const p = join(dir, name);
    try {
      accessSync(p, constants.X_OK);
      if (statSync(p).isFile()) return p;
    } catch {
      // not here
    }
  }
  return undefined;
}

/** What a fresh Debian machine with Node.js has: coreutils (those found here), curl, bash and ssh-keygen. */
// prettier-ignore
const COREUTILS = [
  'basename', 'cat', 'chmod', 'cp', 'cut', 'date', 'dirname', 'echo', 'env', 'false', 'head', 'id', 'ln', 'ls',
  'mkdir', 'mktemp', 'mv', 'printf', 'pwd', 'readlink', 'realpath', 'rm', 'rmdir', 'seq', 'sleep', 'sort', 'stat',
  'tail', 'tee', 'test', 'touch', 'tr', 'true', 'uname', 'uniq', 'wc',
];
const NEEDED = ['bash', 'curl', 'ssh-keygen'];
const missing = NEEDED.filter((n) => !which(n));

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
}

describe('the README tours, run as printed', { skip: missing.length ? `needs ${missing.join(', ')}` : false }, () => {
  let dir = '';
  let bin = '';
  let server: ChildProcess | undefined;
  let api = '';
  let serverOut = '';

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'gpucloud-readme-'));
    // The tools a tour may use, and nothing else.
    bin = join(dir, 'bin');
    mkdirSync(bin);
    symlinkSync(process.execPath, join(bin, 'node'));
    for (const name of [...NEEDED, ...COREUTILS]) {
      const p = which(name);
      if (p) symlinkSync(p, join(bin, name));
    }
    // `gpucloud`: the built command, as the README's alias runs dist/bin/gpucloud.js.
    writeFileSync(
      join(bin, 'gpucloud'),
      `#!${which('bash')}\nexec ${JSON.stringify(process.execPath)} ${JSON.stringify(gpucloudMain())} "$@"\n`,
      { mode: 0o755 },
    );

    const port = await freePort();
    const env: NodeJS.ProcessEnv = { ...process.env };
    for (const k of Object.keys(env)) if (k.startsWith('GPUCLOUD_') || k === 'DATABASE_URL') delete env[k];
    delete env.NODE_OPTIONS;
    delete env.NODE_ENV;
    Object.assign(env, {
      GPUCLOUD_DATA_DIR: join(dir, 'data'),
      PORT: String(port),
      HOST: '127.0.0.1',
      LOG_LEVEL: 'silent',
      GPUCLOUD_DEMO: '1',
      GPUCLOUD_SIM_PROVISION_MS: '300',
      GPUCLOUD_PASSWORD_HASH_COST: 'test',
    });
    server = spawn(process.execPath, [gpucloudMain(), 'serve'], { cwd: dir, env, stdio: ['ignore', 'pipe', 'pipe'] });
    server.stdout!.on('data', (d) => (serverOut += d));
    server.stderr!.on('data', (d) => (serverOut += d));
    api = `http://127.0.0.1:${port}`;
    const deadline = Date.now() + 60_000;
    for (;;) {
      if (server.exitCode !== null) throw new Error(`the server exited (${server.exitCode}): ${serverOut}`);
      // Up once the banner (printed after the demo data is in) is out.
      if (/Demo login:/.test(serverOut)) break;
      if (Date.now() > deadline) throw new Error(`the server did not start: ${serverOut}`);
      await sleep(100);
    }
  });

  after(async () => {
    if (server && server.exitCode === null) {
      server.kill('SIGTERM');
      await new Promise((r) => server!.once('exit', r));
    }
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  /** Runs a README block with bash -euo pipefail, in a fresh HOME, with only the tools above on PATH. */
  function runBlock(name: string, block: string, extraEnv: Record<string, string>): Promise<Run> {
    const home = mkdtempSync(join(dir, `home-${name}-`));
    const script = join(dir, `${name}.sh`);
    writeFileSync(script, `${block}\n`);
    return new Promise((resolve, reject) => {
      const child = spawn(which('bash')!, ['-euo', 'pipefail', script], {
        cwd: home,
        env: { HOME: home, PATH: bin, LANG: 'C.UTF-8', ...extraEnv },
        stdio: ['ignore', 'pipe', 'pipe'],
        timeout: 60_000,
      });
      let stdout = '';
      let stderr = '';
      child.stdout.on('data', (d) => (stdout += d));
      child.stderr.on('data', (d) => (stderr += d));
      child.on('error', reject);
      child.on('close', (code) => resolve({ code, stdout, stderr }));
    });
  }

  const show = (r: Run) => `exit ${r.code}\n--- stdout\n${r.stdout}\n--- stderr\n${r.stderr}`;

  /**
   * A tool missing from PATH inside a command substitution in an argument (`-H "Key: $(uuidgen)"`) fails no step
   * under set -e: bash only says so on stderr.
   */
  const noMissingTool = (r: Run) => assert.doesNotMatch(r.stderr, /command not found|No such file/, show(r));

  /** The demo user's VMs (destroyed ones too) and SSH keys, read through the API. */
  async function demoState(): Promise<{ vms: { vmid: number; status: string }[]; keys: unknown[] }> {
    const login = await fetch(`${api}/auth/login`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ email: 'demo@gpucloud.local', password: 'demo-password-123' }),
    });
    assert.equal(login.status, 200);
    const { access_token } = (await login.json()) as { access_token: string };
    const headers = { authorization: `Bearer ${access_token}` };
    const vms = (await (await fetch(`${api}/vms?include_destroyed=true`, { headers })).json()) as {
      vmid: number;
      status: string;
    }[];
    const keys = (await (await fetch(`${api}/ssh-keys`, { headers })).json()) as unknown[];
    return { vms, keys };
  }

  test('the curl tour: search, log in, an SSH key, create, wait, access-info, stop, destroy', async () => {
    const block = shBlockUnder('First requests');
    assert.match(block, /^API=\$\{API:-http:\/\/127\.0\.0\.1:8080\}/, 'the tour reads API from the environment');
    const r = await runBlock('curl', block, { API: api });
    assert.equal(r.code, 0, show(r));
    noMissingTool(r);
    assert.equal(r.stderr, '', 'curl -sS and the json helper print nothing on stderr unless something failed');
    // Step 6: the access-info of a simulated VM says nothing answers on its address, as the README says.
    assert.match(r.stdout, /"ssh":\{[^}]*"command":"ssh ubuntu@/, show(r));
    const vmid = Number(/"notice":"VM (\d+) runs on a simulated node/.exec(r.stdout)?.[1]);
    assert.ok(vmid, show(r));
    // Step 7: stopped, then destroyed.
    assert.match(r.stdout, new RegExp(`"message":"VM ${vmid} is stopping`), show(r));
    assert.match(r.stdout, new RegExp(`"message":"VM ${vmid} destroyed`), show(r));
    const { vms, keys } = await demoState();
    assert.equal(vms.find((v) => v.vmid === vmid)?.status, 'destroyed', JSON.stringify(vms));
    assert.ok(keys.length >= 1, 'the tour made a key in the fresh HOME and uploaded it');
  });

  test('the command-line tour: login, an SSH key, search, create --wait, ssh, open, spend, events, destroy', async () => {
    const block = shBlockUnder('The command line');
    const r = await runBlock('cli', block, { GPUCLOUD_API_URL: api });
    assert.equal(r.code, 0, show(r));
    noMissingTool(r);
    assert.match(r.stdout, /Logged in as demo@gpucloud\.local/, show(r));
    assert.match(r.stdout, /^Added SSH key /m, show(r));
    assert.match(r.stdout, /^ssh -p 22 ubuntu@\S+$/m, 'vm ssh --dry-run prints the ssh command');
    // events --vm shows the VM's history.
    const vmid = Number(/VM (\d+) creating -> starting/.exec(r.stdout)?.[1]);
    assert.ok(vmid, show(r));
    assert.match(
      r.stdout,
      new RegExp(`^http://${vmid}-webui\\.localhost:\\d+/\\.gpucloud/launch#launch_token=`, 'm'),
      show(r),
    );
    // No browser on this PATH: vm open --browser says so and still succeeds.
    assert.match(r.stderr, /Could not open a browser/, show(r));
    assert.match(r.stdout, new RegExp(`VM ${vmid} destroyed`), show(r));
    const { vms, keys } = await demoState();
    assert.equal(vms.find((v) => v.vmid === vmid)?.status, 'destroyed', JSON.stringify(vms));
    assert.ok(keys.length >= 1, 'the tour made a key in the fresh HOME and uploaded it');
  });
});

describe('the gpucloud command in the README', () => {
  test("the README's alias runs the package's own bin", () => {
    const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { bin: Record<string, string> };
    assert.ok(
      README.includes(`alias gpucloud="node $PWD/${pkg.bin.gpucloud}"`),
      `README.md shows alias gpucloud="node $PWD/${pkg.bin.gpucloud}"`,
    );
  });

  test('every gpucloud command the README shows exists and takes the options shown', () => {
    // The commands src/main.ts runs itself; the client commands are src/cli's.
    const SERVER = ['serve', 'migrate', 'restore', 'agent', 'admin create-user', 'admin ledger-check'];
    const common = ['--json', '--api-url', '--api-key', '--help'];
    const problems: string[] = [];
    const uses: string[] = [];
    let fenced = false;
    for (const line of README.split('\n')) {
      if (line.startsWith('```')) fenced = !fenced;
      // Commands in sh blocks (without their comments) and in inline code.
      const spans = fenced ? [line.replace(/(^|\s)#.*$/, '')] : [...line.matchAll(/`([^`]+)`/g)].map((m) => m[1]!);
      for (const span of spans) {
        for (const m of span.matchAll(/(?:^|(?<!alias)[\s(])gpucloud((?:\s+[^\s|)#;&<>]+)*)/g)) uses.push(m[1]!.trim());
      }
    }
    assert.ok(uses.length > 20, `found only ${uses.length} uses`);
    for (const use of uses) {
      const words = use.split(/\s+/).filter(Boolean);
      if (words.length === 0 || words[0]!.startsWith('-')) continue; // gpucloud, gpucloud --help
      const two = words.slice(0, 2).join(' ');
      if (SERVER.includes(words[0]!) || SERVER.includes(two)) continue;
      const found = findCommand(words);
      if (!found?.command) {
        // A group alone (`gpucloud webhooks`) is fine in prose.
        if (!(found?.group && found.rest.length === 0)) problems.push(`gpucloud ${use}: no such command`);
        continue;
      }
      const c = COMMANDS.find((x) => x.path === found.command!.path)!;
      const takes = new Set([...common, ...(c.options ?? []).map(([flags]) => /--[\w-]+/.exec(flags)![0])]);
      for (const w of found.rest) {
        if (w === '--') break; // what follows goes to ssh
        const flag = /^--[\w-]+/.exec(w)?.[0];
        if (flag && !takes.has(flag)) problems.push(`gpucloud ${use}: ${c.path} takes no ${flag}`);
      }
    }
    assert.deepEqual(problems, []);
  });
});
