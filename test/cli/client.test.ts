/**
 * The client commands of `gpucloud` run as a child
 * process against a real server listening on a port: login (password, 2FA by
 * flag and by stdin, API key), the saved config (mode 0600) and its rotated
 * tokens, --json printing the API's body, exit codes 1 (refused, with the
 * server's detail on stderr) and 2 (bad usage), and the journey
 * login -> ssh-keys add -> search -> vm create --wait -> vm show -> vm ssh
 * --dry-run -> vm destroy --yes.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { buildTestApp, type TestApp } from '../helpers/app.js';
import { api, type BodyFor } from '../helpers/api.js';

// What `--json` prints: the answer of the API operation each command calls.
type AccountOut = BodyFor<'/account', 'get', 200>;
type SshKeyOut = BodyFor<'/ssh-keys', 'post', 201>;
type OffersOut = BodyFor<'/search', 'get', 200>;
type VmOut = BodyFor<'/vms/{vm_id}', 'get', 200>;
type VmsOut = BodyFor<'/vms', 'get', 200>;
type MessageOut = BodyFor<'/vms/{vm_id}', 'delete', 200>;
type BalanceOut = BodyFor<'/billing/balance', 'get', 200>;
type TransactionsOut = BodyFor<'/billing/transactions', 'get', 200>;
type NewKeyOut = BodyFor<'/api-keys', 'post', 201>;
type KeysOut = BodyFor<'/api-keys', 'get', 200>;
type PricingOut = BodyFor<'/pricing', 'get', 200>;
type QuoteOut = BodyFor<'/reservations/calculate', 'post', 200>;
type NodesOut = BodyFor<'/admin/nodes', 'get', 200>;
type CreditOut = BodyFor<'/admin/users/{user_id}/credits', 'post', 201>;
type UsersOut = BodyFor<'/admin/users', 'get', 200>;
type InterruptionsOut = BodyFor<'/vms/{vm_id}/interruption-history', 'get', 200>;
type ReservationsOut = BodyFor<'/reservations', 'get', 200>;
type CancelledOut = BodyFor<'/reservations/{reservation_id}', 'delete', 200>;
type EventsOut = BodyFor<'/events', 'get', 200>;
import { createNode, createUser, credit, tokensOf, type TestUser } from '../helpers/factories.js';
import { generateKey } from '../ssh-keys/keygen.js';
import { stepAt, totpAt } from '../../src/modules/auth/totp.js';
import { runCli } from '../../src/cli/index.js';
import { COMMANDS, GROUP_SUMMARIES } from '../../src/cli/commands.js';
import { configPath, writeConfig } from '../../src/cli/config.js';
import { gpucloudMain } from '../helpers/entry.js';

interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
}

describe('gpucloud client commands', () => {
  let t: TestApp;
  let baseUrl: string;
  let admin: TestUser;
  let node: string;
  const dirs: string[] = [];
  const freshHome = () => {
    const d = mkdtempSync(join(tmpdir(), 'gpucloud-cli-client-'));
    dirs.push(d);
    return d;
  };

  before(async () => {
    t = await buildTestApp('pglite');
    await t.app.listen({ port: 0, host: '127.0.0.1' });
    const addr = t.app.server.address();
    assert.ok(addr && typeof addr === 'object');
    baseUrl = `http://127.0.0.1:${addr.port}`;
    admin = await createUser(t, { admin: true });
    node = (await createNode(t, admin.token, { gpu_type: '4090', gpu_count: 8 })).node;
    await createNode(t, admin.token, { gpu_type: '5090', gpu_count: 4 });
  });
  after(async () => {
    await t?.close();
    dirs.forEach((d) => rmSync(d, { recursive: true, force: true }));
  });

  /**
   * Runs `gpucloud ARGS` (never spawnSync: the server answers from this process).
   * `during` is called every 100 ms while it runs (to advance the manual clock).
   */
  function cli(
    home: string,
    args: string[],
    opts: { input?: string; env?: Record<string, string>; during?: () => Promise<unknown> } = {},
  ): Promise<Run> {
    const env: NodeJS.ProcessEnv = {
      ...process.env,
      XDG_CONFIG_HOME: home,
      GPUCLOUD_API_URL: baseUrl,
      GPUCLOUD_POLL_MS: '50',
      ...opts.env,
    };
    delete env.GPUCLOUD_API_KEY;
    if (opts.env?.GPUCLOUD_API_KEY) env.GPUCLOUD_API_KEY = opts.env.GPUCLOUD_API_KEY;
    const child = spawn(process.execPath, [gpucloudMain(), ...args], { env, stdio: ['pipe', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => (stderr += d));
    child.stdin.end(opts.input ?? '');
    let done = false;
    const exited = new Promise<number | null>((resolve) => child.on('close', (code) => ((done = true), resolve(code))));
    const timer = setTimeout(() => child.kill('SIGKILL'), 90_000);
    return (async () => {
      if (opts.during) {
        while (!done) {
          await opts.during();
          await new Promise((r) => setTimeout(r, 100));
        }
      }
      const code = await exited;
      clearTimeout(timer);
      return { code, stdout, stderr };
    })();
  }

  const ok = (r: Run) => assert.equal(r.code, 0, `exit ${r.code}\nstdout: ${r.stdout}\nstderr: ${r.stderr}`);
  /** The --json output of a successful run, as the API operation the command mirrors answers it. */
  const json = <T>(r: Run): T => {
    ok(r);
    return JSON.parse(r.stdout) as T;
  };

  async function newUser(balance = 100): Promise<TestUser> {
    const u = await createUser(t);
    if (balance) {
      // A fresh admin token: other tests move the manual clock past its expiry.
      const login = await api(t).post('/auth/login', { body: { email: admin.email, password: admin.password } });
      assert.equal(login.status, 200, login.text);
      await credit(t, tokensOf(login.body).access_token, u.id, balance);
    }
    return u;
  }

  /** The VM as the API shows it to u. */
  async function vmOf(u: TestUser, id: string) {
    const r = await api(t, u.token).get('/vms/{vm_id}', { params: { vm_id: id } });
    assert.equal(r.status, 200, r.text);
    return r.body;
  }

  /**
   * A config dir holding the session of u, as `login` saves it (login itself is tested in the journey and 2FA tests).
   */
  async function loggedIn(u: TestUser): Promise<string> {
    const home = freshHome();
    const login = await api(t).post('/auth/login', { body: { email: u.email, password: u.password } });
    assert.equal(login.status, 200, login.text);
    const tokens = tokensOf(login.body);
    writeConfig(configPath({ XDG_CONFIG_HOME: home }), {
      api_url: baseUrl,
      email: u.email,
      access_token: tokens.access_token,
      refresh_token: tokens.refresh_token,
    });
    return home;
  }

  test('journey: login, ssh-keys add, search, vm create --wait, show, ssh --dry-run, destroy', async () => {
    const u = await newUser();
    const home = freshHome();
    const login = await cli(home, ['login', '--email', u.email, '--password', u.password]);
    ok(login);
    assert.match(login.stdout, new RegExp(`Logged in as ${u.email.replace(/[.+]/g, '\\$&')}`));
    const cfgFile = join(home, 'gpucloud', 'config.json');
    assert.equal(statSync(cfgFile).mode & 0o777, 0o600);
    assert.equal(statSync(join(home, 'gpucloud')).mode & 0o777, 0o700);
    const saved = JSON.parse(readFileSync(cfgFile, 'utf8'));
    assert.equal(typeof saved.refresh_token, 'string');
    assert.equal(saved.api_url, baseUrl);

    const me = json<AccountOut>(await cli(home, ['whoami', '--json']));
    assert.equal(me.email, u.email);
    assert.equal(me.id, u.id);

    // A real key made by ssh-keygen, uploaded from its file.
    const key = generateKey('ed25519', { comment: 'cli@laptop' });
    const pub = join(home, 'id_ed25519.pub');
    writeFileSync(pub, key.line);
    const added = json<SshKeyOut>(await cli(home, ['ssh-keys', 'add', pub, '--json']));
    assert.equal(added.fingerprint, key.fingerprint);
    const keys = await cli(home, ['ssh-keys', 'list']);
    ok(keys);
    assert.match(keys.stdout, /^ID\s+LABEL\s+TYPE\s+FINGERPRINT/);
    assert.ok(keys.stdout.includes(key.fingerprint));

    // search: --json is the API's array; the table lists it in the API's order.
    const offers = json<OffersOut>(await cli(home, ['search', '--json']));
    const direct = (await (await fetch(`${baseUrl}/search`)).json()) as unknown[];
    assert.deepEqual(offers, direct);
    const only4090 = json<OffersOut>(await cli(home, ['search', '--gpu', '4090', '--min-gpus', '2', '--json']));
    assert.ok(only4090.length > 0 && only4090.every((o: { gpu_type: string }) => o.gpu_type === '4090'));
    const tableRun = await cli(home, ['search']);
    ok(tableRun);
    const lines = tableRun.stdout.trim().split('\n');
    assert.match(lines[0]!, /^NODE\s+GPU\s+GPUS/);
    assert.deepEqual(
      lines.slice(1).map((l) => l.split(/\s+/)[0]),
      offers.map((o) => o.node),
    );
    // Columns are aligned: every row's GPU column starts where the header's does.
    const gpuCol = lines[0]!.indexOf('GPU');
    for (const l of lines.slice(1)) assert.match(l.slice(gpuCol), /^(4090|5090|pro6000)/);

    // vm create --wait: the test advances the manual clock while the command polls.
    const created = await cli(
      home,
      [
        'vm',
        'create',
        '--node',
        node,
        '--gpu',
        '4090',
        '--template',
        'ubuntu-24.04',
        '--ssh-key',
        added.id,
        '--label',
        'cli-test',
        '--wait',
        '--json',
      ],
      {
        during: () => t.services.clock.advance(0),
      },
    );
    const vm = json<VmOut>(created);
    assert.equal(vm.status, 'running');
    assert.equal(vm.template_vmid, 101);
    assert.equal(vm.storage_gb, 50);
    assert.equal(vm.gpu_count, 1);
    assert.equal(vm.instance_label, 'cli-test');
    assert.match(created.stderr, /running/);

    // show by vmid and by id.
    const byVmid = json<VmOut>(await cli(home, ['vm', 'show', String(vm.vmid), '--json']));
    assert.equal(byVmid.id, vm.id);
    const show = await cli(home, ['vm', 'show', vm.id]);
    ok(show);
    assert.match(show.stdout, /Status:\s+running/);
    const list = json<VmsOut>(await cli(home, ['vm', 'list', '--json']));
    assert.deepEqual(
      list.map((v: { id: string }) => v.id),
      [vm.id],
    );

    const ssh = await cli(home, ['vm', 'ssh', String(vm.vmid), '--dry-run']);
    ok(ssh);
    const access = await api(t, u.token).get('/vms/{vm_id}/access-info', { params: { vm_id: vm.id } });
    assert.equal(access.status, 200, access.text);
    const info = access.body;
    assert.ok(info.ssh, access.text);
    assert.equal(ssh.stdout.trim(), `ssh -p ${info.ssh.port} ${info.ssh.username}@${info.ssh.host}`);
    // A key by its short option, and what follows -- (options included) is ssh's.
    const sshArgs = await cli(home, [
      'vm',
      'ssh',
      String(vm.vmid),
      '-i',
      'id_test',
      '--dry-run',
      '--',
      'nvidia-smi',
      '-L',
    ]);
    ok(sshArgs);
    assert.equal(
      sshArgs.stdout.trim(),
      `ssh -p ${info.ssh.port} -i id_test ${info.ssh.username}@${info.ssh.host} nvidia-smi -L`,
    );

    // destroy asks; "n" on stdin aborts, --yes does not ask.
    const no = await cli(home, ['vm', 'destroy', String(vm.vmid)], { input: 'n\n' });
    assert.equal(no.code, 1);
    assert.equal((await vmOf(u, vm.id)).status, 'running');
    const destroyed = json<MessageOut>(await cli(home, ['vm', 'destroy', String(vm.vmid), '--yes', '--json']));
    assert.equal(typeof destroyed.message, 'string');
    assert.notEqual((await vmOf(u, vm.id)).status, 'running');

    const out = await cli(home, ['logout']);
    ok(out);
    const after = await cli(home, ['whoami']);
    assert.equal(after.code, 1);
    assert.match(after.stderr, /gpucloud login/);
  });

  test('search --interruptible and pricing show the interruptible price per GPU-hour, as the API gives it', async () => {
    const env = { XDG_CONFIG_HOME: freshHome(), GPUCLOUD_API_URL: baseUrl };
    const run = async (args: string[]) => {
      const out: string[] = [];
      const err: string[] = [];
      const code = await runCli(args, env, { out: (s) => out.push(s), err: (s) => err.push(s) });
      assert.equal(code, 0, `${args.join(' ')}: ${err.join('\n')}`);
      return out.join('\n').trim().split('\n');
    };
    const esc = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
    const micros = (v: number) => Math.round(v * 1e6);
    type Offer = {
      node: string;
      gpu_count: number;
      gpu_price_hourly: number;
      interruptible_rate: number;
      storage_price_hourly: number;
      total_price_hourly: number;
      location: string;
    };

    // The on-demand total the API gives: gpu_count x gpu_price_hourly + 50 GB x storage_price_hourly.
    const onDemand = (await (await fetch(`${baseUrl}/search`)).json()) as Offer[];
    assert.ok(onDemand.length > 0);
    for (const o of onDemand)
      assert.equal(
        micros(o.total_price_hourly),
        o.gpu_count * micros(o.gpu_price_hourly) + 50 * micros(o.storage_price_hourly),
        o.node,
      );

    // The interruptible offers: $/GPU/H is interruptible_rate itself, $/H (INT) the same sum at that rate.
    const offers = (await (await fetch(`${baseUrl}/search?rental_type=interruptible`)).json()) as Offer[];
    assert.ok(offers.length > 0);
    const lines = await run(['search', '--interruptible']);
    assert.match(lines[0]!, /\$\/GPU\/H\s+\$\/H \(INT\)\s+LOCATION$/);
    for (const o of offers) {
      assert.ok(
        o.interruptible_rate < o.gpu_price_hourly,
        'the test needs an interruptible rate below the on-demand price',
      );
      const total = (o.gpu_count * micros(o.interruptible_rate) + 50 * micros(o.storage_price_hourly)) / 1e6;
      const row = lines.find((l) => l.startsWith(`${o.node} `));
      assert.ok(row, o.node);
      assert.match(
        row,
        new RegExp(`\\$${esc(o.interruptible_rate.toFixed(3))}\\s+\\$${esc(total.toFixed(3))}\\s+${esc(o.location)}$`),
        row,
      );
    }

    // pricing: the interruptible column is a price per GPU-hour, not a percentage.
    const pricing = (await (await fetch(`${baseUrl}/pricing`)).json()) as {
      gpu_types: { gpu_type: string; gpu_price_hourly: number; interruptible_rate: number }[];
    };
    const table = await run(['pricing']);
    assert.match(table[0]!, /^GPU\s+VRAM\s+\$\/GPU\/H\s+INT \$\/GPU\/H\s/);
    for (const g of pricing.gpu_types) {
      const row = table.find((l) => l.startsWith(`${g.gpu_type} `));
      assert.ok(row, g.gpu_type);
      assert.match(
        row,
        new RegExp(
          `^${esc(g.gpu_type)}\\s+\\d+ GB\\s+\\$${esc(g.gpu_price_hourly.toFixed(3))}\\s+\\$${esc(g.interruptible_rate.toFixed(3))}\\s`,
        ),
        row,
      );
    }
  });

  test('vm create then vm wait; billing balance --json is the API body', async () => {
    const u = await newUser(50);
    const home = await loggedIn(u);
    const vm = json<VmOut>(
      await cli(home, [
        'vm',
        'create',
        '--node',
        node,
        '--gpu',
        '4090',
        '--template',
        '100',
        '--disk',
        '80',
        '--password',
        'a-long-vm-password-1',
        '--json',
      ]),
    );
    assert.equal(vm.storage_gb, 80);
    assert.equal(vm.template_vmid, 100);
    await t.services.clock.advance(0);
    const waited = json<VmOut>(await cli(home, ['vm', 'wait', vm.id, '--json']));
    assert.equal(waited.status, 'running');
    const bal = json<BalanceOut>(await cli(home, ['billing', 'balance', '--json']));
    const balance = await api(t, u.token).get('/billing/balance');
    assert.equal(balance.status, 200, balance.text);
    assert.deepEqual(bal, balance.body);
    const tx = json<TransactionsOut>(await cli(home, ['billing', 'transactions', '--json']));
    assert.ok(Array.isArray(tx) && tx.length >= 1);
    json<MessageOut>(await cli(home, ['vm', 'destroy', vm.id, '--yes', '--json']));
  });

  test('exit 1 with the server detail on stderr when the API refuses', async () => {
    const u = await newUser(0);
    const home = await loggedIn(u);
    const missing = '00000000-0000-4000-8000-000000000000';
    const direct = await api(t, u.token).get('/vms/{vm_id}', { params: { vm_id: missing } });
    assert.equal(direct.status, 404);
    const r = await cli(home, ['vm', 'show', missing]);
    assert.equal(r.code, 1);
    assert.ok(r.stderr.includes(direct.body.detail), r.stderr);
    assert.equal(r.stdout, '');
    // A user without credit cannot rent: the server's refusal, exit 1.
    const poor = await cli(home, [
      'vm',
      'create',
      '--node',
      node,
      '--gpu',
      '4090',
      '--password',
      'a-long-vm-password-1',
    ]);
    assert.equal(poor.code, 1, poor.stderr);
    assert.match(poor.stderr, /^Error: /);
    // Not an admin.
    const adm = await cli(home, ['admin', 'nodes']);
    assert.equal(adm.code, 1);
    // A wrong password.
    const bad = await cli(freshHome(), ['login', '--email', u.email, '--password', 'wrong-password-123']);
    assert.equal(bad.code, 1);
    assert.match(bad.stderr, /Error: /);
  });

  test('exit 2 for bad usage; --help on every command with an example', async () => {
    const home = freshHome();
    // Through the real process: the exit code and stderr.
    const r = await cli(home, ['vm', 'create', '--node', 'x', '--gpu', '4090', '--count', '3']);
    assert.equal(r.code, 2);
    assert.match(r.stderr, /--count must be 1, 2, 4 or 8/);
    assert.equal((await cli(home, ['nonsense'])).code, 2);
    // The rest in-process (runCli answers the exit code the process exits with).
    const env = { XDG_CONFIG_HOME: home, GPUCLOUD_API_URL: baseUrl };
    for (const args of [
      ['vm', 'create', '--gpu', '4090'],
      ['vm', 'create', '--node', 'x', '--gpu', 'h100'],
      ['vm', 'create', '--node', 'x', '--gpu', '4090', '--template', 'windows'],
      ['vm', 'create', '--node', 'x', '--gpu', '4090', '--reserved', '2'],
      ['vm', 'show'],
      ['vm', 'show', '1', '--bogus'],
      ['vm', 'auto-restart', '1', 'maybe'],
      ['search', '--min-gpus', 'two'],
      ['vm', 'nonsense'],
      ['keys', 'create'],
      ['admin', 'credit', 'bob', '5'],
    ]) {
      const err: string[] = [];
      const code = await runCli(args, env, { out: () => {}, err: (s) => err.push(s) });
      assert.equal(code, 2, `${args.join(' ')}: ${code} ${err.join('\n')}`);
      assert.notEqual(err.join(''), '');
    }
    const login = await cli(home, ['login']); // no terminal: --email is required
    assert.equal(login.code, 2);
    const help = await cli(home, ['--help']);
    ok(help);
    for (const c of [
      'serve',
      'migrate',
      'admin create-user',
      'admin ledger-check',
      'login',
      'logout',
      'whoami',
      'search',
      'pricing',
      'ssh-keys add',
      'keys create',
      'vm create',
      'vm ssh',
      'billing usage',
      'reservations quote',
      'admin credit',
    ]) {
      assert.ok(help.stdout.includes(`gpucloud ${c}`), c);
    }
    const vmHelp = await cli(home, ['vm', 'create', '--help']);
    ok(vmHelp);
    assert.match(vmHelp.stdout, /Example/);
    for (const c of COMMANDS) {
      const out: string[] = [];
      assert.equal(
        await runCli([...c.path.split(' '), '--help'], {}, { out: (s) => out.push(s), err: () => {} }),
        0,
        c.path,
      );
      assert.match(out.join('\n'), /Example/, c.path);
      assert.ok(out.join('\n').includes(`gpucloud ${c.path}`), c.path);
    }
  });

  test('help: a group lists its commands, a command its options and the common ones, each with its description', async () => {
    const run = async (args: string[]) => {
      const out: string[] = [];
      const err: string[] = [];
      const code = await runCli(args, {}, { out: (s) => out.push(s), err: (s) => err.push(s) });
      // Descriptions wrap at the width of the terminal: compare with the spaces collapsed.
      return { code, out: out.join('\n').replace(/\s+/g, ' '), err: err.join('\n') };
    };
    const flat = (s: string) => s.replace(/\s+/g, ' ');
    const common = [' --json ', ' --api-url <', ' --api-key <', ' -h, --help ']; // login's --api-key is its own
    for (const c of COMMANDS) {
      const help = await run([...c.path.split(' '), '--help']);
      assert.equal(help.code, 0, c.path);
      for (const [flags, description] of c.options ?? [])
        assert.ok(help.out.includes(flat(`${flags} ${description}`)), `${c.path}: ${flags}`);
      for (const flags of common) assert.ok(help.out.includes(flags), `${c.path}: ${flags}`);
    }
    // Groups, and groups within a group ("admin templates"), but those that are commands too ("admin nodes").
    const groups = [
      ...new Set(
        COMMANDS.flatMap((c) => {
          const words = c.path.split(' ');
          return words.slice(1).map((_, i) => words.slice(0, i + 1).join(' '));
        }),
      ),
    ].filter((g) => !COMMANDS.some((c) => c.path === g));
    assert.deepEqual(groups, [
      'ssh-keys',
      'keys',
      'webhooks',
      'vm',
      'billing',
      'reservations',
      'admin',
      'admin templates',
      'admin images',
    ]);
    const child = (g: string, path: string) => path.startsWith(`${g} `) && !path.slice(g.length + 1).includes(' ');
    for (const g of groups) {
      const words = g.split(' ');
      const help = await run([...words, '--help']);
      assert.equal(help.code, 0, g);
      // Its commands by their summary, its own groups by theirs.
      for (const c of COMMANDS.filter((x) => child(g, x.path)))
        assert.ok(help.out.includes(flat(c.summary)), `${g}: ${c.path}`);
      for (const sub of groups.filter((x) => child(g, x)))
        assert.ok(help.out.includes(flat(GROUP_SUMMARIES[sub]!)), `${g}: ${sub}`);
      assert.deepEqual(await run([...words, 'help']), help);
      // The group alone: its help, but bad usage.
      assert.equal((await run(words)).code, 2, g);
    }
    // A command that is a group too lists its subcommands.
    const nodes = await run(['admin', 'nodes', '--help']);
    assert.ok(nodes.out.includes(flat(COMMANDS.find((c) => c.path === 'admin nodes templates')!.summary)));
    const sub = await run(['vm', 'help', 'ssh']);
    assert.equal(sub.code, 0);
    assert.ok(sub.out.includes('gpucloud vm ssh'));
    // Refused by the parser: exit 2, "gpucloud PATH: what", then the command's help.
    for (const [args, path, what] of [
      [['vm', 'show', '1', '2'], 'vm show', 'too many arguments'],
      [['vm', 'list', '--limit'], 'vm list', "option '--limit <N>' argument missing"],
      [['whoami', '--bogus'], 'whoami', "unknown option '--bogus'"],
      [['billing', 'balance', '--json=yes'], 'billing balance', "unknown option '--json=yes'"],
      [['vm', 'frobnicate'], 'vm', "unknown command 'frobnicate'"],
    ] as [string[], string, string][]) {
      const r = await run(args);
      assert.equal(r.code, 2, args.join(' '));
      assert.ok(r.err.startsWith(`gpucloud ${path}: ${what}`), r.err);
      assert.ok(r.err.includes(`\n\nUsage: gpucloud ${path} [options]`), r.err);
    }
  });

  test('2FA login with the code by flag and on stdin', async () => {
    const u = await newUser(0);
    const setup = await api(t, u.token).post('/auth/2fa/setup');
    assert.equal(setup.status, 200, setup.text);
    const secret = setup.body.secret;
    const code = () => totpAt(secret, stepAt(t.clock.nowMs()));
    assert.equal((await api(t, u.token).post('/auth/2fa/enable', { body: { code: code() } })).status, 200);
    await t.services.clock.advance(30);

    const h1 = freshHome();
    const byFlag = await cli(h1, ['login', '--email', u.email, '--password', u.password, '--code', code()]);
    ok(byFlag);
    assert.equal(json<AccountOut>(await cli(h1, ['whoami', '--json'])).two_factor_enabled, true);

    await t.services.clock.advance(30); // a code is good once
    const h2 = freshHome();
    const byStdin = await cli(h2, ['login', '--email', u.email, '--password', u.password], { input: `${code()}\n` });
    ok(byStdin);
    assert.equal(json<AccountOut>(await cli(h2, ['whoami', '--json'])).email, u.email);

    await t.services.clock.advance(30);
    const wrong = await cli(freshHome(), ['login', '--email', u.email, '--password', u.password, '--code', '000000']);
    assert.equal(wrong.code, 1);
    const none = await cli(freshHome(), ['login', '--email', u.email, '--password', u.password]);
    assert.equal(none.code, 2);
  });

  test('rotated tokens are saved back; API keys by login, env and flag', async () => {
    const u = await newUser(0);
    const home = await loggedIn(u);
    const file = join(home, 'gpucloud', 'config.json');
    const before = JSON.parse(readFileSync(file, 'utf8'));
    await t.services.clock.advance(3601); // the access token expires
    ok(await cli(home, ['whoami']));
    const rotated = JSON.parse(readFileSync(file, 'utf8'));
    assert.notEqual(rotated.refresh_token, before.refresh_token);
    assert.equal(statSync(file).mode & 0o777, 0o600);
    ok(await cli(home, ['whoami'])); // the saved pair works on the next run

    const created = json<NewKeyOut>(await cli(home, ['keys', 'create', '--name', 'ci', '--json']));
    assert.match(created.key, /^gpc_/);
    t.forbidSecret(created.key);
    const listed = json<KeysOut>(await cli(home, ['keys', 'list', '--json']));
    assert.ok(listed.some((k: { id: string }) => k.id === created.id));

    const empty = freshHome();
    assert.equal(
      json<AccountOut>(await cli(empty, ['whoami', '--json'], { env: { GPUCLOUD_API_KEY: created.key } })).email,
      u.email,
    );
    assert.equal(json<AccountOut>(await cli(empty, ['whoami', '--json', '--api-key', created.key])).email, u.email);
    const keyHome = freshHome();
    ok(await cli(keyHome, ['login', '--api-key', created.key]));
    assert.equal(JSON.parse(readFileSync(join(keyHome, 'gpucloud', 'config.json'), 'utf8')).api_key, created.key);
    assert.equal(json<AccountOut>(await cli(keyHome, ['whoami', '--json'])).email, u.email);

    ok(await cli(home, ['keys', 'revoke', created.id]));
    const revoked = await cli(keyHome, ['whoami']);
    assert.equal(revoked.code, 1);
  });

  test('pricing, reservations quote, admin commands', async () => {
    const home = await loggedIn(admin);
    const pricing = json<PricingOut>(await cli(home, ['pricing', '--json']));
    const shipped = await api(t).get('/pricing');
    assert.equal(shipped.status, 200, shipped.text);
    assert.deepEqual(pricing, shipped.body);
    const quote = json<QuoteOut>(
      await cli(home, ['reservations', 'quote', '--gpu', '4090', '--months', '3', '--json']),
    );
    assert.equal(quote.reservation_months, 3);
    const nodes = json<NodesOut>(await cli(home, ['admin', 'nodes', '--json']));
    assert.ok(nodes.some((n: { node: string }) => n.node === node));
    const u = await newUser(0);
    const tx = json<CreditOut>(await cli(home, ['admin', 'credit', String(u.id), '12.5', '--json']));
    assert.equal(tx.amount, 12.5);
    const users = json<UsersOut>(await cli(home, ['admin', 'users', '--email', u.email, '--json']));
    assert.equal(users[0]?.email, u.email);
    const table = await cli(home, ['admin', 'pricing']);
    ok(table);
    assert.match(table.stdout, /^GPU\s+\$\/GPU\/H/);
  });

  test('vm lifecycle: stop, start, label, auto-restart, interruptions, list table', async () => {
    const u = await newUser(100);
    const home = await loggedIn(u);
    const vm = json<VmOut>(
      await cli(
        home,
        [
          'vm',
          'create',
          '--node',
          node,
          '--gpu',
          '4090',
          '--interruptible',
          '--password',
          'a-long-vm-password-1',
          '--wait',
          '--json',
        ],
        { during: () => t.services.clock.advance(0) },
      ),
    );
    assert.equal(vm.rental_type, 'interruptible');
    ok(await cli(home, ['vm', 'label', String(vm.vmid), 'renamed']));
    ok(await cli(home, ['vm', 'auto-restart', vm.id, 'on']));
    let now = await vmOf(u, vm.id);
    assert.equal(now.instance_label, 'renamed');
    assert.equal(now.auto_restart, true);
    assert.deepEqual(json<InterruptionsOut>(await cli(home, ['vm', 'interruptions', vm.id, '--json'])), []);
    ok(await cli(home, ['vm', 'stop', vm.id]));
    await t.services.clock.advance(0);
    assert.equal(
      json<VmOut>(await cli(home, ['vm', 'wait', vm.id, '--status', 'stopped', '--json'])).status,
      'stopped',
    );
    ok(await cli(home, ['vm', 'start', vm.id]));
    await t.services.clock.advance(0);
    const list = await cli(home, ['vm', 'list']);
    ok(list);
    assert.match(list.stdout, /^ID\s+VMID\s+LABEL\s+STATUS/);
    assert.ok(list.stdout.includes('renamed'));
    // Without --yes and without an answer on stdin: bad usage, nothing destroyed.
    const noAnswer = await cli(home, ['vm', 'destroy', vm.id]);
    assert.equal(noAnswer.code, 2, noAnswer.stderr);
    now = await vmOf(u, vm.id);
    assert.notEqual(now.status, 'destroyed');
    ok(await cli(home, ['vm', 'destroy', vm.id], { input: 'y\n' }));
  });

  test('vm create --reserved shows the quote and asks; reservations list and cancel', async () => {
    const u = await newUser(5000);
    const home = await loggedIn(u);
    const args = [
      'vm',
      'create',
      '--node',
      node,
      '--gpu',
      '4090',
      '--reserved',
      '1',
      '--password',
      'a-long-vm-password-1',
    ];
    const declined = await cli(home, args, { input: 'n\n' });
    assert.equal(declined.code, 1);
    assert.match(declined.stderr, /Deposit now:\s+\$\d/);
    const none = await api(t, u.token).get('/vms');
    assert.equal(none.status, 200, none.text);
    assert.deepEqual(none.body, []);
    const vm = json<VmOut>(await cli(home, [...args, '--yes', '--json']));
    assert.equal(vm.rental_type, 'reserved');
    const reservations = json<ReservationsOut>(await cli(home, ['reservations', 'list', '--json']));
    assert.equal(reservations.length, 1);
    const [reservation] = reservations;
    assert.ok(reservation, 'the reservation is listed');
    assert.equal(reservation.vm_id, vm.id);
    const cancelled = json<CancelledOut>(
      await cli(home, ['reservations', 'cancel', reservation.id, '--yes', '--json']),
    );
    assert.equal(cancelled.status, 'cancelled');
  });

  test('events: the list, filters by type and VM, and --follow printing what happens next', async () => {
    const u = await newUser(100);
    const home = await loggedIn(u);
    const vm = json<VmOut>(
      await cli(home, [
        'vm',
        'create',
        '--node',
        node,
        '--gpu',
        '4090',
        '--password',
        'a-long-vm-password-1',
        '--yes',
        '--json',
      ]),
    );
    await t.services.clock.advance(0);
    const listed = await cli(home, ['events']);
    ok(listed);
    assert.match(listed.stdout, /account\.login/);
    assert.match(listed.stdout, new RegExp(`vm\\.status_changed\\s+VM ${vm.vmid} starting -> running \\(started\\)`));
    const typed = json<EventsOut>(
      await cli(home, [
        'events',
        '--type',
        'vm.created',
        '--type',
        'vm.status_changed',
        '--vm',
        String(vm.vmid),
        '--json',
      ]),
    );
    assert.deepEqual(
      typed.map((e: { type: string }) => e.type),
      ['vm.created', 'vm.status_changed', 'vm.status_changed'],
    );
    assert.ok(typed.every((e) => e.vm_id === vm.id));
    const bad = await cli(home, ['events', '--type', 'vm.nope']);
    assert.equal(bad.code, 1);
    assert.match(bad.stderr, /unknown event type/);

    // --follow: starts after the last event and prints the stop as it happens, as JSON lines.
    const last = typed.at(-1)?.id;
    assert.ok(last, 'the last event has an id');
    const env: NodeJS.ProcessEnv = {
      ...process.env,
      XDG_CONFIG_HOME: home,
      GPUCLOUD_API_URL: baseUrl,
      GPUCLOUD_POLL_MS: '50',
    };
    delete env.GPUCLOUD_API_KEY;
    const child = spawn(process.execPath, [gpucloudMain(), 'events', '--follow', '--after', last, '--json'], {
      env,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    child.stdout.on('data', (d) => (out += d));
    try {
      assert.equal((await api(t, u.token).post('/vms/{vm_id}/stop', { params: { vm_id: vm.id } })).status, 200);
      await t.services.clock.advance(0);
      const deadline = Date.now() + 30_000;
      while (!out.includes('"to":"stopped"') && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
      const lines = out
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l) as { type: string; data: { to: string; reason: string } });
      assert.deepEqual(
        lines.map((e) => [e.type, e.data.to, e.data.reason]),
        [
          ['vm.status_changed', 'stopping', 'user'],
          ['vm.status_changed', 'stopped', 'stopped'],
        ],
      );
    } finally {
      child.kill('SIGTERM');
    }
  });

  test('logout revokes the saved session on the server', async () => {
    const u = await newUser(0);
    const home = await loggedIn(u);
    const saved = JSON.parse(readFileSync(join(home, 'gpucloud', 'config.json'), 'utf8'));
    ok(await cli(home, ['logout']));
    const refresh = await api(t).post('/auth/refresh', { body: { refresh_token: saved.refresh_token } });
    assert.equal(refresh.status, 401);
  });
});
