/**
 * Runs a client command of `gpucloud` and answers its exit
 * code: 0 success, 1 the API refused (its detail on stderr), 2 bad usage.
 * The commands (commands.ts) become commander commands, one per group and
 * subcommand, which parse argv and write the help; the command then runs here.
 */
import { Command as Commander, CommanderError, Help, Option } from 'commander';
import { GpuCloudClient, GpuCloudError } from '../sdk/index.js';
import { saveTokens } from './auth.js';
import type { Command, Ctx, OptionSpec, Values } from './command.js';
import { COMMANDS, GROUP_SUMMARIES } from './commands.js';
import { configPath, readConfig, resolve, type Resolved } from './config.js';
import { CliFailure, CliUsageError } from './output.js';

/** The options every client command takes (login has its own --api-key). */
const COMMON_OPTIONS: OptionSpec[] = [
  ['--json', "Print the API's JSON response body instead of a table"],
  ['--api-url <URL>', 'The API (default: GPUCLOUD_API_URL, the saved login, or http://127.0.0.1:8080)'],
  ['--api-key <KEY>', 'Authenticate with this API key (default: GPUCLOUD_API_KEY, or the saved login)'],
];
const HELP_FLAGS = '-h, --help';
const HELP_TEXT = 'Show this help';

/**
 * The groups of subcommands, for `gpucloud vm --help` and the top-level help: every leading part of a command's
 * words ("admin", "admin templates"). A group may be a command too ("admin nodes", with "admin nodes templates").
 */
const GROUPS = [
  ...new Set(
    COMMANDS.flatMap((c) => {
      const words = c.path.split(' ');
      return words.slice(1).map((_, i) => words.slice(0, i + 1).join(' '));
    }),
  ),
];

/** The client-side lines of `gpucloud --help`. */
export function clientUsage(): string {
  const w = Math.max(...COMMANDS.map((c) => usageLine(c).length)) + 2;
  return COMMANDS.map((c) => `  ${usageLine(c).padEnd(w)} ${c.summary}`).join('\n');
}

function usageLine(c: Command): string {
  return `gpucloud ${c.path}${c.args ? ` ${c.args}` : ''}`;
}

/** The command argv names, or undefined when it is not a client command. */
export function findCommand(argv: string[]): { command?: Command; group?: string; rest: string[] } | undefined {
  // The longest run of leading words that names a command, else a group.
  for (let n = Math.min(3, argv.length); n >= 1; n--) {
    const path = argv.slice(0, n).join(' ');
    const command = COMMANDS.find((c) => c.path === path);
    if (command) return { command, rest: argv.slice(n) };
  }
  for (let n = Math.min(2, argv.length); n >= 1; n--) {
    const path = argv.slice(0, n).join(' ');
    if (GROUPS.includes(path)) return { group: path, rest: argv.slice(n) };
  }
  return undefined;
}

export interface Io {
  out(s: string): void;
  err(s: string): void;
}

const stdio: Io = { out: (s) => console.log(s), err: (s) => console.error(s) };

/** A commander command that shows its examples (or other notes) after its help. */
class CliCommand extends Commander {
  footer?: string;

  override createCommand(name?: string): CliCommand {
    return new CliCommand(name);
  }

  override createHelp(): Help {
    return Object.assign(new CliHelp(), this.configureHelp());
  }
}

class CliHelp extends Help {
  override formatHelp(cmd: Commander, helper: Help): string {
    const text = super.formatHelp(cmd, helper);
    const footer = (cmd as CliCommand).footer;
    return footer ? `${text}\n${footer}\n` : text;
  }
}

/** Commander refused argv (or showed a help): which command, and why. */
class ParseStop extends Error {
  constructor(
    readonly path: string,
    readonly command: Commander,
    readonly reason: CommanderError,
  ) {
    super(reason.message);
  }
}

function commanderOption([flags, description, more]: OptionSpec): Option {
  const o = new Option(flags, description);
  if (more?.repeatable) o.argParser((value: string, previous: string[] | undefined) => [...(previous ?? []), value]);
  return o;
}

function helpOption(group?: string): Option {
  const o = new Option(HELP_FLAGS, HELP_TEXT);
  return group ? o.helpGroup(group) : o;
}

/** Stops parsing with a ParseStop naming this command (commander would exit the process). */
function stopsWith(cmd: Commander, path: string): void {
  cmd.exitOverride((reason) => {
    throw new ParseStop(path, cmd, reason);
  });
}

interface Chosen {
  command: Command;
  values: Values;
  positionals: string[];
}

/** The program: a commander command per group and per client command; parsing one records it in `chosen`. */
function program(io: Io, chosen: (c: Chosen) => void): CliCommand {
  const strip = (s: string) => s.replace(/\n$/, '');
  const root = new CliCommand('gpucloud')
    .configureOutput({ writeOut: (s) => io.out(strip(s)), writeErr: (s) => io.err(strip(s)), outputError: () => {} })
    // Options after a subcommand are that subcommand's, and `--` reaches it (vm ssh VM -- ARGS).
    .enablePositionalOptions()
    .helpCommand('help [command]', 'Show the help of a command')
    .addHelpOption(helpOption()) as CliCommand;
  stopsWith(root, '');
  /** Every commander command made, groups and commands, by the words that name it. */
  const made = new Map<string, CliCommand>([['', root]]);
  const groups = new Map<string, CliCommand>();
  const groupOf = (path: string): CliCommand => {
    const found = made.get(path);
    if (found) return found; // the root, a group made already, or a command that is a group too
    const words = path.split(' ');
    const g = groupOf(words.slice(0, -1).join(' '))
      .command(words[words.length - 1]!)
      .description(GROUP_SUMMARIES[path] ?? '')
      .addHelpOption(helpOption()) as CliCommand;
    stopsWith(g, path);
    made.set(path, g);
    groups.set(path, g);
    return g;
  };
  for (const c of COMMANDS) {
    const words = c.path.split(' ');
    // A command that is also a group comes before its subcommands in COMMANDS.
    if (made.has(c.path)) throw new Error(`gpucloud ${c.path} is listed after its subcommands`);
    const cmd = groupOf(words.slice(0, -1).join(' ')).command(words[words.length - 1]!) as CliCommand;
    made.set(c.path, cmd);
    cmd.description(c.summary);
    if (c.args) cmd.arguments(c.args);
    for (const o of c.options ?? []) cmd.addOption(commanderOption(o));
    const longs = new Set(cmd.options.map((o) => o.long));
    for (const o of COMMON_OPTIONS) {
      const option = commanderOption(o);
      if (!longs.has(option.long)) cmd.addOption(option.helpGroup('Common options:'));
    }
    cmd.addHelpOption(helpOption('Common options:'));
    const examples = [c.example].flat();
    cmd.footer = [`Example${examples.length > 1 ? 's' : ''}:`, ...examples.map((e) => `  ${e}`)].join('\n');
    stopsWith(cmd, c.path);
    cmd.action(() => {
      const given = cmd.opts();
      const values: Values = {};
      for (const o of cmd.options) values[o.long!.slice(2)] = given[o.attributeName()] as Values[string];
      chosen({ command: c, values, positionals: [...cmd.args] });
    });
  }
  for (const [name, g] of groups) {
    const first = COMMANDS.find((c) => c.path.startsWith(`${name} `))!;
    const subgroups = [...groups.keys()].filter(
      (p) => p.startsWith(`${name} `) && !p.slice(name.length + 1).includes(' '),
    );
    g.footer = [
      ...(name === 'admin'
        ? [
            'On the database (see gpucloud --help):',
            '  gpucloud admin create-user --email E     Create a user',
            '  gpucloud admin ledger-check              Verify the ledger',
            '',
          ]
        : []),
      ...(subgroups.length ? [`See also: ${subgroups.map((p) => `"gpucloud ${p} --help"`).join(', ')}.`, ''] : []),
      `Run "gpucloud ${name} <command> --help" for its options. Example:`,
      `  ${[first.example].flat()[0]}`,
    ].join('\n');
  }
  return root;
}

/** The commander command named by `path` ('' is gpucloud itself). */
function commandAt(root: Commander, path: string): Commander {
  let c = root;
  for (const w of path ? path.split(' ') : []) c = c.commands.find((x) => x.name() === w)!;
  return c;
}

/** The help of a command, with its examples. */
function helpOf(cmd: Commander): string {
  return cmd.helpInformation().replace(/\n$/, '');
}

/** Runs argv (a client command or group) and answers the exit code. */
export async function runCli(argv: string[], env: NodeJS.ProcessEnv = process.env, io: Io = stdio): Promise<number> {
  const found = findCommand(argv);
  if (!found) {
    io.err(`gpucloud: unknown command "${argv.join(' ')}"; see gpucloud --help`);
    return 2;
  }
  let picked: Chosen | undefined;
  const root = program(io, (c) => (picked = c));
  if (found.group && found.rest.length === 0) {
    // A group alone: its help, as bad usage.
    io.out(helpOf(commandAt(root, found.group)));
    return 2;
  }
  try {
    root.parse(argv, { from: 'user' });
  } catch (err) {
    if (!(err instanceof ParseStop)) throw err;
    const { code, exitCode, message } = err.reason;
    // --help, -h and `help` (already written); a help shown because of a mistake is bad usage.
    if (code === 'commander.helpDisplayed' || code === 'commander.help') return exitCode === 0 ? 0 : 2;
    io.err(`gpucloud${err.path ? ` ${err.path}` : ''}: ${message.replace(/^error: /, '')}\n\n${helpOf(err.command)}`);
    return 2;
  }
  if (!picked) return 2;
  const cmd = picked.command;
  const { values, positionals } = picked;

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
      io.err(
        `Error: cannot reach the API at ${getResolved().apiUrl}${cause?.code ? ` (${cause.code})` : cause?.message ? ` (${cause.message})` : ''}`,
      );
      return 1;
    }
    throw err;
  }
}
