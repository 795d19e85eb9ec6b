/**
 * Runs a client command of `gpucloud` and answers its exit
 * code: 0 success, 1 the API refused (its detail on stderr), 2 bad usage.
 */
import { parseArgs } from 'node:util';
import { GpuCloudClient, GpuCloudError } from '../sdk/index.js';
import { COMMANDS, saveTokens, type Command, type Ctx } from './commands.js';
import { configPath, readConfig, resolve, type Resolved } from './config.js';
import { CliFailure, CliUsageError } from './output.js';

const COMMON_OPTIONS = {
  json: { type: 'boolean' },
  'api-url': { type: 'string' },
  'api-key': { type: 'string' },
  help: { type: 'boolean', short: 'h' },
} as const;

const COMMON_HELP = `Common options:
  --json           Print the API's JSON response body instead of a table
  --api-url URL    The API (default: GPUCLOUD_API_URL, the saved login, or http://127.0.0.1:8080)
  --api-key KEY    Authenticate with this API key (default: GPUCLOUD_API_KEY, or the saved login)
  --help, -h       Show this help`;

/** The groups of subcommands, for `gpucloud vm --help` and the top-level help. */
const GROUPS = [...new Set(COMMANDS.filter((c) => c.path.includes(' ')).map((c) => c.path.split(' ')[0]!))];

/** The client-side lines of `gpucloud --help`. */
export function clientUsage(): string {
  const w = Math.max(...COMMANDS.map((c) => usageLine(c).length)) + 2;
  return COMMANDS.map((c) => `  ${usageLine(c).padEnd(w)} ${c.summary}`).join('\n');
}

function usageLine(c: Command): string {
  return `gpucloud ${c.path}${c.args ? ` ${c.args}` : ''}`;
}

export function commandHelp(c: Command): string {
  const lines = [`${usageLine(c)}${c.options && Object.keys(c.options).length ? ' [options]' : ''}`, '', c.summary, ''];
  if (c.optionHelp?.length) {
    const w = Math.max(...c.optionHelp.map(([o]) => o.length)) + 2;
    lines.push('Options:', ...c.optionHelp.map(([o, d]) => `  ${o.padEnd(w)} ${d}`), '');
  }
  lines.push(COMMON_HELP, '', `Example${Array.isArray(c.example) ? 's' : ''}:`, ...(Array.isArray(c.example) ? c.example : [c.example]).map((e) => `  ${e}`));
  return lines.join('\n');
}

function groupHelp(group: string): string {
  const cmds = COMMANDS.filter((c) => c.path.startsWith(`${group} `));
  const w = Math.max(...cmds.map((c) => usageLine(c).length)) + 2;
  return [
    `gpucloud ${group} <command>`,
    '',
    ...cmds.map((c) => `  ${usageLine(c).padEnd(w)} ${c.summary}`),
    ...(group === 'admin'
      ? ['  gpucloud admin create-user --email E     Create a user (on the database; see gpucloud --help)', '  gpucloud admin ledger-check              Verify the ledger (on the database)']
      : []),
    '',
    `Run "gpucloud ${group} <command> --help" for its options. Example:`,
    `  ${[cmds[0]!.example].flat()[0]}`,
  ].join('\n');
}

/** The command argv names, or undefined when it is not a client command. */
export function findCommand(argv: string[]): { command?: Command; group?: string; rest: string[] } | undefined {
  const [a, b] = argv;
  const two = COMMANDS.find((c) => c.path === `${a} ${b}`);
  if (two) return { command: two, rest: argv.slice(2) };
  const one = COMMANDS.find((c) => c.path === a);
  if (one) return { command: one, rest: argv.slice(1) };
  if (a && GROUPS.includes(a)) return { group: a, rest: argv.slice(1) };
  return undefined;
}

export interface Io {
  out(s: string): void;
  err(s: string): void;
}

const stdio: Io = { out: (s) => console.log(s), err: (s) => console.error(s) };

/** Runs argv (a client command or group) and answers the exit code. */
export async function runCli(argv: string[], env: NodeJS.ProcessEnv = process.env, io: Io = stdio): Promise<number> {
  const found = findCommand(argv);
  if (!found) {
    io.err(`gpucloud: unknown command "${argv.join(' ')}"; see gpucloud --help`);
    return 2;
  }
  if (!found.command) {
    const g = found.group!;
    const help = groupHelp(g);
    if (found.rest.length === 0 || found.rest[0] === '--help' || found.rest[0] === '-h' || found.rest[0] === 'help') {
      io.out(help);
      return found.rest.length === 0 ? 2 : 0;
    }
    io.err(`gpucloud: unknown command "${g} ${found.rest[0]}"\n\n${help}`);
    return 2;
  }
  const cmd = found.command;
  let values: Record<string, string | boolean | undefined>;
  let positionals: string[];
  try {
    const parsed = parseArgs({ args: found.rest, options: { ...COMMON_OPTIONS, ...(cmd.options ?? {}) }, allowPositionals: true, strict: true });
    values = parsed.values as typeof values;
    positionals = parsed.positionals;
  } catch (err) {
    io.err(`gpucloud ${cmd.path}: ${(err as Error).message}\n\n${commandHelp(cmd)}`);
    return 2;
  }
  if (values.help) {
    io.out(commandHelp(cmd));
    return 0;
  }
  const [min, max] = Array.isArray(cmd.positionals) ? cmd.positionals : [cmd.positionals ?? 0, cmd.positionals ?? 0];
  if (positionals.length < min || positionals.length > max) {
    const what = positionals.length < min ? `missing ${cmd.args ?? 'arguments'}` : `unexpected argument "${positionals[max]}"`;
    io.err(`gpucloud ${cmd.path}: ${what}\n\n${commandHelp(cmd)}`);
    return 2;
  }

  const file = configPath(env);
  let resolved: Resolved | undefined;
  let client: GpuCloudClient | undefined;
  const getResolved = () =>
    (resolved ??= resolve(
      { apiUrl: values['api-url'] as string | undefined, apiKey: values['api-key'] as string | undefined },
      env,
      readConfig(file),
    ));
  const ctx: Ctx = {
    values,
    positionals,
    json: values.json === true,
    env,
    configFile: file,
    resolved: getResolved,
    client: () => {
      if (client) return client;
      const r = getResolved();
      const opts: ConstructorParameters<typeof GpuCloudClient>[0] = { baseUrl: r.apiUrl };
      if (r.apiKey) opts.apiKey = r.apiKey;
      else if (r.refreshToken || r.accessToken) {
        if (r.accessToken) opts.accessToken = r.accessToken;
        if (r.refreshToken) opts.refreshToken = r.refreshToken;
        // Refresh tokens are single use: keep the rotated pair for the next run.
        opts.onTokens = (t) => saveTokens(ctx, t);
      }
      client = new GpuCloudClient(opts);
      return client;
    },
    out: io.out,
    err: io.err,
  };
  try {
    new URL(getResolved().apiUrl);
  } catch {
    io.err(`gpucloud: the API URL "${getResolved().apiUrl}" is not a URL`);
    return 2;
  }

  try {
    await cmd.run(ctx);
    return 0;
  } catch (err) {
    if (err instanceof CliUsageError) {
      io.err(`gpucloud ${cmd.path}: ${err.message}\n\nSee: gpucloud ${cmd.path} --help`);
      return 2;
    }
    if (err instanceof GpuCloudError) {
      const lines = [`Error: ${err.detail}`];
      for (const e of err.errors ?? []) {
        const line = `${e.field}: ${e.message}`;
        if (!err.detail.includes(e.message)) lines.push(`  ${line}`);
      }
      if (err.status === 401 && getResolved().source === 'none') lines.push('Log in first: gpucloud login');
      if (err.requestId && err.status >= 500) lines.push(`(request id ${err.requestId})`);
      io.err(lines.join('\n'));
      return 1;
    }
    if (err instanceof CliFailure) {
      if (err.message) io.err(err.message);
      return err.exitCode;
    }
    if (err instanceof TypeError && /fetch failed/i.test(err.message)) {
      const cause = (err as { cause?: { code?: string; message?: string } }).cause;
      io.err(`Error: cannot reach the API at ${getResolved().apiUrl}${cause?.code ? ` (${cause.code})` : cause?.message ? ` (${cause.message})` : ''}`);
      return 1;
    }
    throw err;
  }
}
