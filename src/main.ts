#!/usr/bin/env node
/**
 * The `gpucloud` command: serve, migrate, admin create-user / ledger-check
 * (on the database), and the client commands (src/cli, built on the SDK).
 */
import { parseArgs } from 'node:util';
import type { Config } from './config.js';
import type { Role } from './server.js';
import type { RateLimitStoreKind } from './http/rate-limit.js';
// The server's modules are imported when a server command runs, so that the
// client commands start fast.
import { clientUsage, findCommand, runCli } from './cli/index.js';

let ConfigErrorClass: (new (...args: never[]) => Error) | undefined;

/** How the start-up banner names the rate-limit store in use. */
const RATE_LIMIT_STORES: Record<RateLimitStoreKind, string> = {
  redis: 'Redis (shared by every instance)',
  postgres: 'PostgreSQL (shared by every instance; set GPUCLOUD_REDIS_URL for the faster Redis store)',
  memory: 'this process (one instance only)',
};

const USAGE = `gpucloud: rent GPU virtual machines

Server commands:
  gpucloud serve [--role api|worker|portal|all] [--local-agent]
                                           Start the API and/or the background jobs (default: all);
                                           --local-agent also runs this host's VMs (GPUCLOUD_LOCAL_AGENT=1)
  gpucloud migrate                         Apply database migrations and exit
  gpucloud agent --token TOKEN [...]       Run this host's VMs under QEMU (gpucloud agent --help)
  gpucloud admin create-user --email E [--password P] [--name N] [--admin]
                                           Create a user (or reset its password and role)
  gpucloud admin ledger-check              Verify every balance and reservation against the ledger;
                                           exits 1 naming each account that is off

Client commands (every one takes --json, --api-url, --api-key and --help):
${clientUsage()}

The client reads GPUCLOUD_API_URL (default http://127.0.0.1:8080) and GPUCLOUD_API_KEY,
--api-url / --api-key, and the saved login in $XDG_CONFIG_HOME/gpucloud/config.json.
Exit codes: 0 success, 1 the API refused (its detail on stderr), 2 bad usage.
  gpucloud login --email me@example.com
  gpucloud search --gpu 4090
  gpucloud vm create --node vm01 --gpu 4090 --ssh-key ID --wait

Server configuration comes from environment variables (PORT, HOST, DATABASE_URL, GPUCLOUD_*);
see the README. Examples:
  gpucloud serve
  DATABASE_URL=postgres://localhost/gpucloud GPUCLOUD_JWT_SECRET=... gpucloud serve --role api
  gpucloud admin create-user --email ops@example.com --admin
`;

class UsageError extends Error {}

async function config(): Promise<Config> {
  const { ConfigError, loadConfig } = await import('./config.js');
  ConfigErrorClass = ConfigError;
  return loadConfig(process.env);
}

async function openDatabase(cfg: Config) {
  return (await import('./server.js')).openDatabase(cfg);
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
  const { values } = parseArgs({
    args,
    options: { role: { type: 'string', default: 'all' }, 'local-agent': { type: 'boolean', default: false } },
    strict: true,
  });
  const role = values.role as Role;
  if (!['api', 'worker', 'portal', 'all'].includes(role))
    throw new UsageError(`--role must be api, worker, portal or all, got "${role}"`);
  const cfg = await config();
  if (values['local-agent']) cfg.localAgent = true;
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
    const dir = process.env.GPUCLOUD_AGENT_DATA_DIR?.trim() || `${cfg.dataDir}/agent`;
    lines.push(
      `  Local agent: ${server.localAgent.url} (node ${server.localAgent.node}); add templates with`,
      `    gpucloud agent template add VMID FILE --data-dir ${dir}`,
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
  const db = await openDatabase(await config());
  await db.close();
  console.log('Database is up to date');
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

async function adminCmd(args: string[]): Promise<void> {
  const [sub, ...rest] = args;
  if (sub === 'ledger-check') return ledgerCheckCmd();
  if (sub !== 'create-user') throw new UsageError(`unknown admin command "${sub ?? ''}"`);
  const { values } = parseArgs({
    args: rest,
    options: {
      email: { type: 'string' },
      password: { type: 'string' },
      name: { type: 'string' },
      admin: { type: 'boolean', default: false },
    },
    strict: true,
  });
  if (!values.email) throw new UsageError('--email is required');
  const password = values.password ?? (await readPassword('Password (12+ characters): '));
  if (password.length < 12) throw new UsageError('the password must be at least 12 characters');
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

async function main(argv: string[]): Promise<void> {
  const [cmd, ...rest] = argv;
  const local = cmd === 'admin' && (rest[0] === 'create-user' || rest[0] === 'ledger-check');
  if (!local && findCommand(argv)) {
    process.exitCode = await runCli(argv);
    return;
  }
  switch (cmd) {
    case 'serve':
      return serve(rest);
    case 'migrate':
      return migrateCmd();
    case 'agent': {
      const agent = await import('./agent/main.js');
      try {
        return await agent.agentCommand(rest);
      } catch (err) {
        const { AgentOptionError } = await import('./agent/options.js');
        if (err instanceof AgentOptionError || err instanceof agent.AgentUsageError) throw new UsageError(err.message);
        throw err;
      }
    }
    case 'admin':
      return adminCmd(rest);
    case undefined:
    case 'help':
    case '--help':
    case '-h':
      console.log(USAGE);
      return;
    default:
      throw new UsageError(`unknown command "${cmd}"`);
  }
}

main(process.argv.slice(2)).catch((err: unknown) => {
  if (ConfigErrorClass && err instanceof ConfigErrorClass) {
    console.error(`Configuration error: ${err.message}`);
    process.exit(2);
  }
  if (err instanceof UsageError || (err as { code?: string }).code?.startsWith('ERR_PARSE_ARGS')) {
    console.error(`gpucloud: ${(err as Error).message}\n\n${USAGE}`);
    process.exit(2);
  }
  console.error(err instanceof Error ? (err.stack ?? err.message) : err);
  process.exit(1);
});
