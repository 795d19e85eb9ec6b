/**
 * `--help` and `-h` on every command and subcommand of `gpucloud`, run as
 * the process users run: exit 0, the command's own help on stdout (its
 * "Usage: gpucloud PATH" line first), nothing on stderr.
 *
 * The list comes from the code, not from this file: the client commands and
 * their groups from src/cli/commands.ts (commander makes their help), the
 * local ones (serve, migrate, agent and its template commands, admin
 * create-user / ledger-check) from src/local-commands.ts, which src/main.ts
 * dispatches through, so a local command cannot run without an entry there
 * and the help it holds. The top-level help is checked against that list
 * both ways: every command it names is run here, and every command run here
 * is in it.
 */
import { after, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { COMMANDS } from '../../src/cli/commands.js';
import { LOCAL_COMMANDS } from '../../src/local-commands.js';
import { gpucloudMain } from '../helpers/entry.js';

interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
}

const home = mkdtempSync(join(tmpdir(), 'gpucloud-help-'));
after(() => rmSync(home, { recursive: true, force: true }));
/** No server, database or saved login is needed, and none may be touched. */
const env: NodeJS.ProcessEnv = {
  PATH: process.env.PATH,
  HOME: home,
  XDG_CONFIG_HOME: home,
  GPUCLOUD_DATA_DIR: join(home, 'data'),
  GPUCLOUD_API_URL: 'http://127.0.0.1:9',
  // A help printed for a terminal of this width: stable for the checks on its lines.
  COLUMNS: '120',
};

function gpucloud(args: string[]): Promise<Run> {
  const child = spawn(process.execPath, [gpucloudMain(), ...args], { env, stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d) => (stdout += d));
  child.stderr.on('data', (d) => (stderr += d));
  const timer = setTimeout(() => child.kill('SIGKILL'), 30_000);
  return new Promise((resolve) =>
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    }),
  );
}

/** Runs each at most two at a time (two cores). */
async function runAll(list: string[][]): Promise<Run[]> {
  const out: Run[] = new Array<Run>(list.length);
  let next = 0;
  const worker = async () => {
    while (next < list.length) {
      const i = next++;
      out[i] = await gpucloud(list[i]!);
    }
  };
  await Promise.all([worker(), worker()]);
  return out;
}

/** The groups of subcommands ("admin", "admin templates"), but those that are commands too ("admin nodes"). */
const GROUPS = [
  ...new Set(
    COMMANDS.flatMap((c) => {
      const words = c.path.split(' ');
      return words.slice(1).map((_, i) => words.slice(0, i + 1).join(' '));
    }),
  ),
].filter((g) => !COMMANDS.some((c) => c.path === g));
/** Every command and subcommand, by the words that name it ('' is gpucloud itself). */
const PATHS = ['', ...LOCAL_COMMANDS.map((c) => c.path), ...GROUPS, ...COMMANDS.map((c) => c.path)];

const esc = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
/** The first line of a command's help: its usage, naming exactly that command. */
const usageLine = (path: string) => new RegExp(`^Usage: gpucloud${path ? ` ${esc(path)}` : ''}( |$)`, 'm');

describe('gpucloud --help', () => {
  test('every command and subcommand answers --help and -h with its own usage, exit 0, on stdout only', async () => {
    assert.equal(new Set(PATHS).size, PATHS.length, 'no command is named twice');
    for (const path of [
      'serve',
      'migrate',
      'agent',
      'agent template',
      'agent template add',
      'admin create-user',
      'admin templates',
      'admin templates add',
      'admin nodes templates',
      'admin images push',
    ])
      assert.ok(PATHS.includes(path), path);
    const cases = PATHS.flatMap((path) => {
      const words = path ? path.split(' ') : [];
      return [
        [...words, '--help'],
        [...words, '-h'],
      ];
    });
    const runs = await runAll(cases);
    cases.forEach((args, i) => {
      const r = runs[i]!;
      const path = args.slice(0, -1).join(' ');
      const what = `gpucloud ${args.join(' ')}: exit ${r.code}\nstdout: ${r.stdout}\nstderr: ${r.stderr}`;
      assert.equal(r.code, 0, what);
      assert.equal(r.stderr, '', what);
      assert.match(r.stdout.split('\n')[0]!, usageLine(path), what);
    });
  });

  test('the top-level help names every command, and only commands that answer --help', async () => {
    const r = await gpucloud(['--help']);
    assert.equal(r.code, 0, r.stderr);
    // "  gpucloud vm create --node N ...": the command is the longest known path at the start.
    const named = [...r.stdout.matchAll(/^ {2}gpucloud ([a-z][a-z-]*(?: [a-z][a-z-]*)*)/gm)].map((m) => m[1]!);
    assert.ok(named.length > 40, 'the usage lists the commands');
    for (const words of named) {
      const path = PATHS.filter((p) => p && `${words} `.startsWith(`${p} `)).sort((a, b) => b.length - a.length)[0];
      assert.ok(path, `the top-level help names "gpucloud ${words}", which this test does not run`);
    }
    for (const c of [...LOCAL_COMMANDS.filter((c) => !c.group), ...COMMANDS])
      assert.match(r.stdout, new RegExp(`^ {2}gpucloud ${esc(c.path)}( |$)`, 'm'), c.path);
    // The agent's help lists its template commands.
    const agent = await gpucloud(['agent', '--help']);
    for (const c of LOCAL_COMMANDS.filter((c) => c.path.startsWith('agent template ')))
      assert.ok(agent.stdout.includes(`gpucloud ${c.path}`), c.path);
  });

  test('gpucloud help PATH is PATH --help; a mistake shows the command’s own help on stderr, exit 2', async () => {
    const [helpServe, serveHelp, helpAdd, addHelp, helpVm, vmHelp] = await runAll([
      ['help', 'serve'],
      ['serve', '--help'],
      ['help', 'agent', 'template', 'add'],
      ['agent', 'template', 'add', '--help'],
      ['help', 'vm', 'create'],
      ['vm', 'create', '--help'],
    ]);
    assert.deepEqual(helpServe, serveHelp);
    assert.deepEqual(helpAdd, addHelp);
    assert.deepEqual(helpVm, vmHelp);
    // --help anywhere among a command's words, even after other options.
    const late = await gpucloud(['serve', '--role', 'api', '--help']);
    assert.deepEqual(late, serveHelp);

    for (const [args, path, why] of [
      [['serve', '--bogus'], 'serve', /Unknown option '--bogus'/],
      [['serve', '--role', 'everything'], 'serve', /--role must be api, worker, portal or all/],
      [['agent', 'template'], 'agent template', /which template command/],
      [['agent', 'template', 'frob'], 'agent template', /unknown command "frob"/],
      [['agent', 'template', 'list', 'extra'], 'agent template list', /takes no argument/],
      [['agent', 'template', 'add', '100'], 'agent template add', /needs VMID and FILE/],
      [['migrate', 'now'], 'migrate', /Unexpected argument 'now'/],
      [['admin', 'ledger-check', '--all'], 'admin ledger-check', /Unknown option '--all'/],
      [['admin', 'create-user'], 'admin create-user', /--email is required/],
      [['admin', 'templates', 'frob'], 'admin templates', /unknown command 'frob'/],
      [['admin', 'nodes', 'templates'], 'admin nodes templates', /missing required argument 'NODE'/],
      [['admin', 'images', 'push'], 'admin images push', /missing required argument 'FILE'/],
      [['templates', 'extra'], 'templates', /too many arguments/],
    ] as [string[], string, RegExp][]) {
      const r = await gpucloud(args);
      const what = `gpucloud ${args.join(' ')}: exit ${r.code}\nstdout: ${r.stdout}\nstderr: ${r.stderr}`;
      assert.equal(r.code, 2, what);
      assert.equal(r.stdout, '', what);
      assert.ok(r.stderr.startsWith(`gpucloud ${path}: `), what);
      assert.match(r.stderr, why, what);
      assert.match(r.stderr, usageLine(path), what);
    }
  });
});
