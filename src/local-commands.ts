/**
 * The commands of `gpucloud` that run on this machine rather than through
 * the API (those are src/cli): serve, migrate, restore, the host agent and
 * its templates, admin create-user and ledger-check. Here is what each one is
 * and its help, and serve's options; src/main.ts runs them. Each answers `--help`
 * and `-h` (and `gpucloud help PATH`) with its own help on stdout, exit 0.
 */
import { parseArgs } from 'node:util';
import { AGENT_OPTION_SPEC, agentOptionLines, type AgentFlag } from './host-agent/options.js';
import type { Role } from './server.js';

export type LocalPath =
  | 'serve'
  | 'migrate'
  | 'restore'
  | 'agent'
  | 'agent template'
  | 'agent template add'
  | 'agent template list'
  | 'agent template remove'
  | 'admin create-user'
  | 'admin ledger-check';

export interface LocalCommand {
  /** The words that name it. */
  path: LocalPath;
  /** What follows the path on its usage line. */
  args: string;
  summary: string;
  /** Its options, commands and notes, after the summary. */
  body: string;
  examples: string[];
  /** It only groups subcommands: alone, it shows its help as bad usage. */
  group?: true;
}

const ROLES: Role[] = ['api', 'worker', 'portal', 'all'];

/** A usage mistake in a local command: main.ts prints it with that command's help, exit 2. */
export class LocalUsageError extends Error {
  constructor(
    message: string,
    readonly path?: LocalPath,
  ) {
    super(message);
    this.name = 'LocalUsageError';
  }
}

const HELP_LINE = '  -h, --help             Show this help';

/** The agent's options that `serve --local-agent` takes: all but the token, which each start makes anew. */
export const LOCAL_AGENT_FLAGS = (Object.keys(AGENT_OPTION_SPEC) as AgentFlag[]).filter((f) => f !== 'token');

const DATA_DIR_OPTION =
  "  --data-dir DIR         The agent's data directory (default GPUCLOUD_AGENT_DATA_DIR, else ./agent-data)";

const TEMPLATE_LINES = [
  '  gpucloud agent template add VMID FILE [--user NAME]   Store a qcow2 or raw image as template VMID',
  '  gpucloud agent template list                          The templates on this host',
  '  gpucloud agent template remove VMID                   Remove a template no VM stands on',
].join('\n');

export const LOCAL_COMMANDS: LocalCommand[] = [
  {
    path: 'serve',
    args: '[--role api|worker|portal|all] [--local-agent [AGENT OPTIONS]]',
    summary: 'Start the API and/or the background jobs (default: all)',
    body: `Options:
  --role ROLE            api (the HTTP API and the access portal), worker (the background jobs),
                         portal (the access portal alone) or all of them (default all)
  --local-agent          Also run this host's VMs: a host agent in this process, and this host
                         registered as a node (or GPUCLOUD_LOCAL_AGENT=1)
${HELP_LINE}

Local agent options, with --local-agent: those of gpucloud agent but --token (the local agent gets
a new one at each start). Each also reads its variable; a flag wins.
${agentOptionLines({
  except: ['token'],
  help: {
    'data-dir': ["the agent's files, default DATA_DIR/agent (the server's own", 'data directory is GPUCLOUD_DATA_DIR)'],
  },
})}

The server's configuration comes from environment variables (PORT, HOST, DATABASE_URL,
GPUCLOUD_*): docs/configuration.md. SIGINT or SIGTERM stops it.`,
    examples: [
      'gpucloud serve',
      'DATABASE_URL=postgres://localhost/gpucloud GPUCLOUD_JWT_SECRET=... gpucloud serve --role api',
      'gpucloud serve --local-agent --fake-gpus 2 --accel tcg',
    ],
  },
  {
    path: 'migrate',
    args: '',
    summary: 'Apply database migrations and exit',
    body: `The database is DATABASE_URL's, else the embedded one in GPUCLOUD_DATA_DIR (default ./data).
Every start migrates too; this runs the migrations alone.

Options:
${HELP_LINE}`,
    examples: ['DATABASE_URL=postgres://localhost/gpucloud gpucloud migrate'],
  },
  {
    path: 'restore',
    args: 'FILE [--data-dir DIR] [--force]',
    summary: 'Bring back the embedded database from a backup (the service stopped)',
    body: `FILE is an archive made by gpucloud backup. It is checked whole (gzip, tar, its manifest; a
backup of a newer release, with migrations this one does not know, is refused), unpacked
beside DIR/pg and opened once to prove it opens; only then does it replace DIR/pg. The database
that was there is moved to DIR/pg.before-restore-<time> (never deleted), and the signing
secret in the backup replaces DIR/jwt-secret the same way. A refusal changes nothing.

It refuses while a gpucloud server runs on DIR (DIR/server.pid names a live process).

Options:
  --data-dir DIR         The data directory (default GPUCLOUD_DATA_DIR, else ./data)
  --force                Replace the database DIR holds (without it, restore refuses)
${HELP_LINE}`,
    examples: [
      'gpucloud restore gpucloud-backup-20260101T000000Z.tar.gz --data-dir /var/lib/gpucloud',
      'gpucloud restore last-night.tar.gz --force   # replaces ./data/pg, kept aside',
    ],
  },
  {
    path: 'agent',
    args: '--token TOKEN [options]',
    summary: "Run this host's VMs under QEMU for the control plane (docs/agent.md)",
    body: `Options (each also an environment variable; a flag wins):
${agentOptionLines()}
${HELP_LINE}

Templates (gpucloud agent template <command> --help):
${TEMPLATE_LINES}`,
    examples: [
      'gpucloud agent --token "$GPUCLOUD_AGENT_TOKEN" --listen 10.0.0.7:7070 --public-host gpu7.example.com',
      'gpucloud agent --token "$GPUCLOUD_AGENT_TOKEN" --fake-gpus 2 --accel tcg   # no GPU at hand',
    ],
  },
  {
    path: 'agent template',
    args: '<command> [options]',
    summary: "The VM images of this host's agent, in its data directory",
    body: `Commands:
${TEMPLATE_LINES}

Options:
${HELP_LINE}

Run "gpucloud agent template <command> --help" for its options.`,
    examples: ['gpucloud agent template list --data-dir /var/lib/gpucloud-agent'],
    group: true,
  },
  {
    path: 'agent template add',
    args: 'VMID FILE [--user NAME] [--data-dir DIR]',
    summary: 'Store a qcow2 or raw image as template VMID (a copy: FILE stays yours)',
    body: `Options:
  --user NAME            The image's SSH login user (default root)
${DATA_DIR_OPTION};
                         with gpucloud serve --local-agent, DATA_DIR/agent
${HELP_LINE}`,
    examples: [
      'gpucloud agent template add 100 noble-server-cloudimg-amd64.img --user ubuntu --data-dir /var/lib/gpucloud-agent',
    ],
  },
  {
    path: 'agent template list',
    args: '[--data-dir DIR]',
    summary: 'The templates on this host',
    body: `Options:
${DATA_DIR_OPTION}
${HELP_LINE}`,
    examples: ['gpucloud agent template list --data-dir /var/lib/gpucloud-agent'],
  },
  {
    path: 'agent template remove',
    args: 'VMID [--data-dir DIR]',
    summary: 'Remove a template no VM stands on',
    body: `Options:
${DATA_DIR_OPTION}
${HELP_LINE}`,
    examples: ['gpucloud agent template remove 100 --data-dir /var/lib/gpucloud-agent'],
  },
  {
    path: 'admin create-user',
    args: '--email E [--password P] [--name N] [--admin]',
    summary: 'Create a user (or reset its password and role), on the database',
    body: `Options:
  --email E              The user's email (required)
  --password P           12+ characters (default: asked, or the first line of stdin)
  --name N               A display name
  --admin                Make the user an administrator
${HELP_LINE}

It works on the database of this machine's configuration (DATABASE_URL, GPUCLOUD_DATA_DIR).`,
    examples: ['gpucloud admin create-user --email ops@example.com --admin'],
  },
  {
    path: 'admin ledger-check',
    args: '',
    summary: 'Verify every balance and reservation against the ledger, on the database',
    body: `Exits 1 naming each account that is off.

Options:
${HELP_LINE}`,
    examples: ['gpucloud admin ledger-check'],
  },
];

/** The local command argv names (the longest path that matches), and the words after it. */
export function findLocalCommand(argv: string[]): { command: LocalCommand; rest: string[] } | undefined {
  let best: LocalCommand | undefined;
  for (const c of LOCAL_COMMANDS) {
    const words = c.path.split(' ');
    if (words.every((w, i) => argv[i] === w) && (!best || words.length > best.path.split(' ').length)) best = c;
  }
  return best && { command: best, rest: argv.slice(best.path.split(' ').length) };
}

/** Whether the words ask for help: --help or -h before any `--`. */
export function wantsHelp(args: string[]): boolean {
  const end = args.indexOf('--');
  return (end === -1 ? args : args.slice(0, end)).some((a) => a === '--help' || a === '-h');
}

export function usageOf(c: LocalCommand): string {
  return `gpucloud ${c.path}${c.args ? ` ${c.args}` : ''}`;
}

/** The help of a local command, as --help prints it. */
export function localHelp(c: LocalCommand): string {
  const examples = c.examples.map((e) => `  ${e}`).join('\n');
  return `Usage: ${usageOf(c)}\n\n${c.summary}\n\n${c.body}\n\nExample${c.examples.length > 1 ? 's' : ''}:\n${examples}`;
}

export interface ServeArgs {
  role: Role;
  /** --local-agent was given. */
  localAgent: boolean;
  /** The agent options given, as `gpucloud agent` takes them. */
  agentArgs: string[];
}

/** serve's options: its own, and the local agent's (checked by the agent's parser when the agent starts). */
export function parseServeArgs(args: string[]): ServeArgs {
  const { values, positionals, tokens } = parseArgs({
    args,
    tokens: true,
    options: {
      role: { type: 'string', default: 'all' },
      'local-agent': { type: 'boolean', default: false },
      ...AGENT_OPTION_SPEC,
    },
    strict: true,
    allowPositionals: true,
  });
  if (positionals.length) throw new LocalUsageError(`unexpected argument "${positionals[0]}"`, 'serve');
  const role = values.role as Role;
  if (!ROLES.includes(role))
    throw new LocalUsageError(`--role must be api, worker, portal or all, got "${role}"`, 'serve');
  if (values.token !== undefined)
    throw new LocalUsageError('--token: the local agent gets a new token at each start; serve takes none', 'serve');
  // In the order given, so that a refusal names them as the user wrote them.
  const agentArgs = tokens.flatMap((t) =>
    t.kind === 'option' && (LOCAL_AGENT_FLAGS as string[]).includes(t.name) ? [`--${t.name}`, t.value ?? ''] : [],
  );
  return { role, localAgent: values['local-agent'], agentArgs };
}

/** Refuses agent options without a local agent (neither --local-agent nor GPUCLOUD_LOCAL_AGENT). */
export function requireLocalAgent(args: ServeArgs, localAgent: boolean): void {
  if (localAgent || args.agentArgs.length === 0) return;
  const given = [...new Set(args.agentArgs.filter((a) => a.startsWith('--')))];
  const dataDir = given.includes('--data-dir')
    ? "; the server's own data directory is the variable GPUCLOUD_DATA_DIR"
    : '';
  throw new LocalUsageError(
    `${given.join(', ')} ${given.length > 1 ? 'are options' : 'is an option'} of the local agent: add --local-agent (or set GPUCLOUD_LOCAL_AGENT=1)${dataDir}`,
    'serve',
  );
}

export interface RestoreArgs {
  file: string;
  dataDir: string;
  force: boolean;
}

/** restore's arguments: FILE, --data-dir (default GPUCLOUD_DATA_DIR, else ./data) and --force. */
export function parseRestoreArgs(args: string[], env: NodeJS.ProcessEnv): RestoreArgs {
  const { values, positionals } = parseArgs({
    args,
    options: { 'data-dir': { type: 'string' }, force: { type: 'boolean', default: false } },
    strict: true,
    allowPositionals: true,
  });
  if (positionals.length === 0) throw new LocalUsageError('which backup? restore needs FILE', 'restore');
  if (positionals.length > 1) throw new LocalUsageError(`unexpected argument "${positionals[1]}"`, 'restore');
  const dataDir = values['data-dir'] || env.GPUCLOUD_DATA_DIR?.trim() || './data';
  return { file: positionals[0]!, dataDir, force: values.force };
}
