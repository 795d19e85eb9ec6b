/** Command-line options of `npm run soak`. Pure: no I/O, so it can be tested alone. */
import { parseArgs } from 'node:util';

export interface SoakOptions {
  /** Length of the traffic phase, warm-up included (may be fractional: 0.5 = 30 s). */
  minutes: number;
  /** Request starts per second (open model: scheduled by time, not by completions). */
  rate: number;
  db: 'embedded' | 'postgres';
  /** An already running server: nothing is started, RSS is read only with --pid. */
  url: string | undefined;
  pid: number | undefined;
  redisUrl: string | undefined;
  adminEmail: string;
  adminPassword: string | undefined;
  users: number;
  /** Live (not destroyed) VMs per user at most; also capped by the user's max_vms. */
  vmsPerUser: number;
  /** Requests in flight at most; starts that find no slot wait (their wait counts in their latency). */
  concurrency: number;
  timeoutMs: number;
  /** The server's LOG_LEVEL (silent by default); its output goes to stderr prefixed with [server]. */
  logLevel: string;
  maxRssGrowthPct: number;
  /** Seconds of traffic before the RSS baseline is taken. */
  warmupS: number;
}

export class SoakUsageError extends Error {}

export const SOAK_USAGE = `npm run soak -- [--minutes 10] [--rate 50] [--db embedded|postgres] [--url URL] [options]

Mixed API traffic at a fixed rate against a fresh server (started here on an
empty database) for the given time; exits 1 on any error or when the server's
RSS grows more than --max-rss-growth-pct over its RSS after setup + warm-up.

  --minutes N             traffic time, warm-up included (default 10, at least 0.5)
  --rate N                requests started per second (default 50)
  --db embedded|postgres  embedded: a fresh data dir; postgres: a fresh database
                          soak_<random> on DATABASE_URL, dropped at the end
  --redis URL             the server uses this Redis for rate limits (GPUCLOUD_REDIS_URL)
  --url URL               soak a running server instead (needs its admin login:
                          --admin-email, --admin-password or GPUCLOUD_ADMIN_PASSWORD)
  --pid PID               with --url: the server's pid, to read its RSS (without it
                          the summary's rss_* fields are 0 and RSS is not judged)
  --users N               users generating traffic (default 5)
  --vms-per-user N        live VMs per user at most (default 3, at most 10)
  --concurrency N         requests in flight at most (default 64)
  --timeout-ms N          per-request timeout (default 10000)
  --log-level LEVEL       the started server's LOG_LEVEL (default silent)
  --max-rss-growth-pct N  default 20
  --warmup-s N            seconds of traffic before the RSS baseline (default 10)`;

function num(name: string, raw: string | undefined, def: number, min: number, max: number, integer = true): number {
  if (raw === undefined) return def;
  const n = Number(raw);
  if (raw.trim() === '' || !Number.isFinite(n) || (integer && !Number.isInteger(n)) || n < min || n > max) {
    throw new SoakUsageError(
      `--${name} must be ${integer ? 'a whole number' : 'a number'} from ${min} to ${max}, got "${raw}"`,
    );
  }
  return n;
}

export function parseSoakArgs(argv: string[], env: Record<string, string | undefined> = process.env): SoakOptions {
  let values;
  try {
    ({ values } = parseArgs({
      args: argv,
      options: {
        minutes: { type: 'string' },
        rate: { type: 'string' },
        db: { type: 'string' },
        url: { type: 'string' },
        pid: { type: 'string' },
        redis: { type: 'string' },
        'admin-email': { type: 'string' },
        'admin-password': { type: 'string' },
        users: { type: 'string' },
        'vms-per-user': { type: 'string' },
        concurrency: { type: 'string' },
        'timeout-ms': { type: 'string' },
        'log-level': { type: 'string' },
        'max-rss-growth-pct': { type: 'string' },
        'warmup-s': { type: 'string' },
        help: { type: 'boolean', short: 'h' },
      },
      strict: true,
      allowPositionals: false,
    }));
  } catch (err) {
    throw new SoakUsageError((err as Error).message);
  }
  if (values.help) throw new SoakUsageError('');
  const db = values.db ?? 'embedded';
  if (db !== 'embedded' && db !== 'postgres')
    throw new SoakUsageError(`--db must be embedded or postgres, got "${db}"`);
  if (values.url !== undefined) {
    let u: URL;
    try {
      u = new URL(values.url);
    } catch {
      throw new SoakUsageError(`--url is not a URL: "${values.url}"`);
    }
    if (u.protocol !== 'http:' && u.protocol !== 'https:') throw new SoakUsageError('--url must be http(s)');
    if (values.db !== undefined || values.redis !== undefined || values['log-level'] !== undefined) {
      throw new SoakUsageError(
        '--db, --redis and --log-level configure the server started here; they do not go with --url',
      );
    }
  } else if (values.pid !== undefined) {
    throw new SoakUsageError('--pid only goes with --url (the started server is watched anyway)');
  }
  if (db === 'postgres' && !values.url && !env.DATABASE_URL)
    throw new SoakUsageError('--db postgres needs DATABASE_URL (a server and a user that may create databases)');
  const warmupS = num('warmup-s', values['warmup-s'], 10, 0, 3600);
  const minutes = num('minutes', values.minutes, 10, 0.5, 7 * 24 * 60, false);
  if (minutes * 60 < warmupS + 10)
    throw new SoakUsageError(`--minutes must leave at least 10 s after the ${warmupS} s warm-up`);
  const logLevel = values['log-level'] ?? 'silent';
  if (!['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'].includes(logLevel))
    throw new SoakUsageError(`--log-level: unknown level "${logLevel}"`);
  return {
    minutes,
    rate: num('rate', values.rate, 50, 0.1, 10_000, false),
    db,
    url: values.url?.replace(/\/+$/, ''),
    pid: values.pid === undefined ? undefined : num('pid', values.pid, 0, 1, 2 ** 31),
    redisUrl: values.redis,
    adminEmail: values['admin-email'] ?? 'soak-admin@example.com',
    adminPassword: values['admin-password'] ?? (values.url ? env.GPUCLOUD_ADMIN_PASSWORD : undefined),
    users: num('users', values.users, 5, 1, 100),
    vmsPerUser: num('vms-per-user', values['vms-per-user'], 3, 0, 10),
    concurrency: num('concurrency', values.concurrency, 64, 1, 10_000),
    timeoutMs: num('timeout-ms', values['timeout-ms'], 10_000, 100, 600_000),
    logLevel,
    maxRssGrowthPct: num('max-rss-growth-pct', values['max-rss-growth-pct'], 20, 0, 10_000, false),
    warmupS,
  };
}
