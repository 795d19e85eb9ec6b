#!/usr/bin/env node
/**
 * The `gpucloud` command: serve, migrate, restore, the host agent, admin create-user /
 * ledger-check (on the database): the local commands (local-commands.ts),
 * and the client commands (src/cli, built on the SDK).
 */
import { parseArgs } from 'node:util';
import type { Config } from './config.js';
import type { RateLimitStoreKind } from './http/rate-limit.js';
// The server's modules are imported when a server command runs, so that the
// client commands start fast.
import { clientUsage, findCommand, runCli } from './cli/index.js';
import {
  findLocalCommand,
  LOCAL_COMMANDS,
  localHelp,
  LocalUsageError,
  parseRestoreArgs,
  parseServeArgs,
  requireLocalAgent,
  usageOf,
  wantsHelp,
  type LocalCommand,
  type LocalPath,
} from './local-commands.js';

let ConfigErrorClass: (new (...args: never[]) => Error) | undefined;

/** How the start-up banner names the rate-limit store in use. */
const RATE_LIMIT_STORES: Record<RateLimitStoreKind, string> = {
  redis: 'Redis (shared by every instance)',
  postgres: 'PostgreSQL (shared by every instance; set GPUCLOUD_REDIS_URL for the faster Redis store)',
  memory: 'this process (one instance only)',
};

/** The local commands' lines of `gpucloud --help`: usage and summary, the summary below a long usage. */
function localUsage(): string {
  const w = 41;
  return LOCAL_COMMANDS.filter((c) => !c.group)
    .map((c) => {
      const usage = `  ${usageOf(c)}`;
      return usage.length < w ? `${usage.padEnd(w)}  ${c.summary}` : `${usage}\n${' '.repeat(w + 2)}${c.summary}`;
    })
    .join('\n');
}

const USAGE = `Usage: gpucloud <command> [options]

Rent GPU virtual machines: the server, the host agent and the client of the API.
"gpucloud <command> --help" (or -h, or gpucloud help <command>) shows a command's help.

Server commands:
${localUsage()}

Client commands (every one takes --json, --api-url, --api-key and --help):
${clientUsage()}

The client reads GPUCLOUD_API_URL (default http://127.0.0.1:8080) and GPUCLOUD_API_KEY,
--api-url / --api-key, and the saved login in $XDG_CONFIG_HOME/gpucloud/config.json.
Exit codes: 0 success, 1 the API refused (its detail on stderr), 2 bad usage.
  gpucloud login --email me@example.com
  gpucloud search --gpu 4090
  gpucloud vm create --node vm01 --gpu 4090 --ssh-key ID --wait

Server configuration comes from environment variables (PORT, HOST, DATABASE_URL, GPUCLOUD_*);
see docs/configuration.md. Examples:
  gpucloud serve
  DATABASE_URL=postgres://localhost/gpucloud GPUCLOUD_JWT_SECRET=... gpucloud serve --role api
  gpucloud serve --local-agent --fake-gpus 2 --accel tcg
  gpucloud admin create-user --email ops@example.com --admin
`;

/** Bad usage: exit 2, with the help of the command (or the whole usage). */
class UsageError extends Error {
  constructor(
    message: string,
    readonly command?: LocalCommand,
  ) {
    super(message);
  }
}

async function config(): Promise<Config> {
  const { ConfigError, loadConfig } = await import('./config.js');
  ConfigErrorClass = ConfigError;
  return loadConfig(process.env);
}

async function openDatabase(cfg: Config, applied?: string[]) {
  return (await import('./server.js')).openDatabase(cfg, applied);
}

async function readPassword(prompt: string): Promise<string> {
  if (!process.stdin.isTTY) {
    const chunks: Buffer[] = [];
    for await (const c of process.stdin) chunks.push(c as Buffer);
    return Buffer.concat(chunks).toString('utf8').split('\n')[0]!.trim();
  }
  const { createInterface } = await import('node:readline/promises');
  const rl = createInterface({ input: process.stdin, output: process.stdout, terminal: true });
  // Hide typed characters.
  const out = rl as unknown as { _writeToOutput?: (s: string) => void; output: NodeJS.WriteStream };
  process.stdout.write(prompt);
  out._writeToOutput = () => {};
  const answer = await rl.question('');
  rl.close();
  process.stdout.write('\n');
  return answer;
}

async function serve(args: string[]): Promise<void> {
  const parsed = parseServeArgs(args);
  const role = parsed.role;
  const cfg = await config();
  if (parsed.localAgent) cfg.localAgent = true;
  requireLocalAgent(parsed, cfg.localAgent);
  if (cfg.localAgent) {
    cfg.localAgentArgs = parsed.agentArgs;
    // A bad agent option stops the start before anything opens or listens.
    const { localAgentOptions } = await import('./local-host-agent.js');
    const { AgentOptionError } = await import('./host-agent/options.js');
    try {
      localAgentOptions(cfg, process.env, 't'.repeat(32));
    } catch (err) {
      if (!(err instanceof AgentOptionError)) throw err;
      if (err.option.startsWith('--')) throw new LocalUsageError(err.message, 'serve');
      const { ConfigError } = await import('./config.js');
      throw new ConfigError(err.option, err.message.slice(err.option.length + 2));
    }
  }
  const { startServer } = await import('./server.js');
  const server = await startServer(cfg, role);
  const lines = ['', 'gpucloud is running'];
  if (server.url) {
    lines.push(`  API:   ${server.url}`, `  Docs:  ${server.url}/docs`, `  Web console: ${server.url}/console/`);
  }
  if (server.portalUrl) lines.push(`  Access portal: VM web services at VMID-SERVICE names under ${server.portalUrl}`);
  lines.push(`  Role:  ${role}`, `  Database: ${cfg.databaseUrl ? 'PostgreSQL' : `embedded (${cfg.dataDir})`}`);
  lines.push(`  Rate limits: ${RATE_LIMIT_STORES[server.rateLimitStore]}`);
  if (server.metricsUrl) lines.push(`  Metrics: ${server.metricsUrl}`);
  if (server.localAgent) {
    lines.push(
      `  Local agent: ${server.localAgent.url} (node ${server.localAgent.node}); add templates with`,
      `    gpucloud agent template add VMID FILE --data-dir ${server.localAgent.dataDir}`,
    );
  }
  if (cfg.clock === 'manual')
    lines.push(`  Clock: manual, now ${server.services.clock.now().toISOString()} (POST /admin/clock/advance)`);
  if (server.demo) {
    lines.push(`  Demo login: ${server.demo.email} / ${server.demo.password}`);
    if (server.url) {
      lines.push(
        `    curl -s -X POST ${server.url}/auth/login -H 'content-type: application/json' \\`,
        `      -d '{"email":"${server.demo.email}","password":"${server.demo.password}"}'`,
      );
    }
  }
  console.log(lines.join('\n') + '\n');
  let stopping = false;
  const stop = async (signal: string) => {
    if (stopping) return;
    stopping = true;
    console.log(`\n${signal}: shutting down`);
    await server.close();
    process.exit(0);
  };
  process.on('SIGINT', () => void stop('SIGINT'));
  process.on('SIGTERM', () => void stop('SIGTERM'));
}

async function migrateCmd(): Promise<void> {
  const applied: string[] = [];
  const db = await openDatabase(await config(), applied);
  await db.close();
  for (const name of applied) console.log(`Applied ${name}`);
  console.log(applied.length ? 'Database is up to date' : 'Database is up to date (nothing to apply)');
}

async function ledgerCheckCmd(): Promise<void> {
  const db = await openDatabase(await config());
  try {
    const { ledgerCheck } = await import('./modules/billing/ledger-check.js');
    const problems = await ledgerCheck(db);
    if (problems.length === 0) {
      console.log('Ledger OK: every balance equals the sum of its transactions, every reservation adds up');
      return;
    }
    for (const p of problems) console.error(`OFF  user ${p.user_id} <${p.email}>: ${p.detail}`);
    console.error(`${problems.length} problem(s) found`);
    process.exitCode = 1;
  } finally {
    await db.close();
  }
}

async function restoreCmd(args: string[]): Promise<void> {
  const { file, dataDir, force } = parseRestoreArgs(args, process.env);
  const { restoreBackup, RestoreRefused } = await import('./db/restore.js');
  let r: Awaited<ReturnType<typeof restoreBackup>>;
  try {
    r = await restoreBackup(file, { dataDir, force });
  } catch (err) {
    if (!(err instanceof RestoreRefused)) throw err;
    console.error(`gpucloud restore: ${err.message}`);
    process.exitCode = 1;
    return;
  }
  const m = r.manifest;
  const lines = [
    `Restored ${file} (gpucloud ${m.service_version}, made ${m.created_at}) into ${r.database}`,
    r.previousDatabase
      ? `The database that was there is kept in ${r.previousDatabase}: delete it once you no longer need it`
      : 'There was no database there before',
  ];
  if (r.secret)
    lines.push(
      `Signing secret restored into ${r.secret}${r.previousSecret ? ` (the one there is kept in ${r.previousSecret})` : ''}`,
    );
  else
    lines.push(
      'The backup holds no signing secret (it was made with GPUCLOUD_JWT_SECRET set): start the service with that same secret',
    );
  if (r.pendingMigrations.length)
    lines.push(`The next start applies ${r.pendingMigrations.length} migration(s) of this release to it`);
  if (process.env.DATABASE_URL)
    lines.push('Note: DATABASE_URL is set, so the service uses PostgreSQL, not this data directory');
  lines.push('Start the service again: gpucloud serve');
  console.log(lines.join('\n'));
}

/** A command that takes no argument and no option (but --help): node's refusal of anything else. */
function noArguments(args: string[]): void {
  parseArgs({ args, options: {}, strict: true, allowPositionals: false });
}

async function createUserCmd(args: string[]): Promise<void> {
  const { values } = parseArgs({
    args,
    options: {
      email: { type: 'string' },
      password: { type: 'string' },
      name: { type: 'string' },
      admin: { type: 'boolean', default: false },
    },
    strict: true,
  });
  if (!values.email) throw new LocalUsageError('--email is required', 'admin create-user');
  const password = values.password ?? (await readPassword('Password (12+ characters): '));
  if (password.length < 12)
    throw new LocalUsageError('the password must be at least 12 characters', 'admin create-user');
  const cfg = await config();
  const db = await openDatabase(cfg);
  const { AuthService } = await import('./modules/auth/service.js');
  const { PasswordHasher } = await import('./modules/auth/passwords.js');
  const { TokenService } = await import('./modules/auth/tokens.js');
  const { SystemClock } = await import('./clock.js');
  const { randomBytes } = await import('node:crypto');
  try {
    const clock = new SystemClock();
    // Creating a user signs nothing and reads no TOTP secret: throwaway keys.
    const throwaway = randomBytes(32);
    const auth = new AuthService(
      db,
      clock,
      new PasswordHasher(1),
      new TokenService(throwaway.toString('hex'), clock),
      throwaway,
    );
    const { user, created } = await auth.ensureUser(
      values.email,
      password,
      values.admin ? 'admin' : 'user',
      values.name ?? null,
    );
    console.log(`${created ? 'Created' : 'Updated'} ${user.role} ${user.email} (id ${user.id})`);
  } finally {
    await db.close();
  }
}

/** How each local command runs; src/local-commands.ts says what it is and its help. */
const RUN: Record<LocalPath, (args: string[]) => Promise<void>> = {
  serve,
  migrate: async (args) => {
    noArguments(args);
    return migrateCmd();
  },
  restore: restoreCmd,
  agent: async (args) => (await import('./host-agent/main.js')).agentCommand(args),
  'agent template': async (args) => {
    throw new LocalUsageError(
      args.length ? `unknown command "${args[0]}"` : 'which template command?',
      'agent template',
    );
  },
  'agent template add': async (args) => (await import('./host-agent/main.js')).templateAdd(args),
  'agent template list': async (args) => (await import('./host-agent/main.js')).templateList(args),
  'agent template remove': async (args) => (await import('./host-agent/main.js')).templateRemove(args),
  'admin create-user': createUserCmd,
  'admin ledger-check': async (args) => {
    noArguments(args);
    return ledgerCheckCmd();
  },
};

/** The agent's own refusals are bad usage of the agent command that ran. */
async function asLocalUsage(command: LocalCommand, work: Promise<void>): Promise<void> {
  try {
    await work;
  } catch (err) {
    const { AgentOptionError } = await import('./host-agent/options.js');
    const agentUsage = command.path.startsWith('agent') && (await import('./host-agent/main.js')).AgentUsageError;
    const parseArgsError = (err as { code?: string }).code?.startsWith('ERR_PARSE_ARGS');
    if (err instanceof LocalUsageError)
      throw new UsageError(
        err.message,
        LOCAL_COMMANDS.find((c) => c.path === (err.path ?? command.path)),
      );
    if (err instanceof AgentOptionError || (agentUsage && err instanceof agentUsage) || parseArgsError)
      throw new UsageError((err as Error).message, command);
    throw err;
  }
}

async function main(argv: string[]): Promise<void> {
  // `gpucloud help PATH` is `gpucloud PATH --help`.
  if (argv[0] === 'help') argv = [...argv.slice(1), '--help'];
  const [cmd] = argv;
  if (cmd === undefined || cmd === '--help' || cmd === '-h') {
    console.log(USAGE);
    return;
  }
  const local = findLocalCommand(argv);
  if (local) {
    if (wantsHelp(local.rest)) {
      console.log(localHelp(local.command));
      return;
    }
    return asLocalUsage(local.command, RUN[local.command.path](local.rest));
  }
  if (findCommand(argv)) {
    process.exitCode = await runCli(argv);
    return;
  }
  throw new UsageError(`unknown command "${cmd}"`);
}

main(process.argv.slice(2)).catch((err: unknown) => {
  if (ConfigErrorClass && err instanceof ConfigErrorClass) {
    console.error(`Configuration error: ${err.message}`);
    process.exit(2);
  }
  if (err instanceof UsageError) {
    // A command's mistake comes with that command's help; an unknown command with the whole usage.
    const c = err.command;
    console.error(c ? `gpucloud ${c.path}: ${err.message}\n\n${localHelp(c)}` : `gpucloud: ${err.message}\n\n${USAGE}`);
    process.exit(2);
  }
  console.error(err instanceof Error ? (err.stack ?? err.message) : err);
  process.exit(1);
});
