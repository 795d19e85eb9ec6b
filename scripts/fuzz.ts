/**
 * npm run fuzz -- [--requests N] [--seed S] [--db embedded|postgres|both] [--url URL] [options]
 *
 * Fuzzes the API from its served OpenAPI document (see scripts/fuzz/index.ts).
 * Exit code 1 when any response is a 5xx, has a status the document does not
 * list for the operation, or has a body that does not match the documented
 * schema; 2 on bad usage or when the run could not be set up.
 */
import { parseArgs } from 'node:util';
import { runFuzz, type FuzzOptions } from './fuzz/index.js';

const USAGE = `npm run fuzz -- [--requests N] [--seed S] [--db embedded|postgres|both] [--url URL] [options]

Starts the server (a fresh data dir, or with --db postgres a fresh database
fuzz_<random> on DATABASE_URL, dropped at the end), reads /openapi.json and
sends N requests built from it (valid ones and broken ones) as an admin, a
user with credit, that user's API keys of each scope, another user and no one.
Fails (exit 1) on any 5xx, undocumented status or body not matching the
documented schema.

  --requests N            planned requests (default 3000)
  --seed S                fast-check seed (default random; printed for replay)
  --db KIND               embedded (default), postgres (needs DATABASE_URL) or both
  --url URL               fuzz a running server instead; give its admin login with
                          --admin-email / --admin-password (or GPUCLOUD_ADMIN_EMAIL /
                          GPUCLOUD_ADMIN_PASSWORD)
  --concurrency N         requests in flight (default 8; 1 makes the run fully repeatable)
  --only TEXT             only operations whose id contains TEXT, like "POST /vms"
  --server-log-level L    LOG_LEVEL of the started server (default silent; "error"
                          shows the stack of each 500 at the end)
  --stats                 also print the statuses seen per operation
  --trace FILE            write every request and its response (shortened) to FILE (JSON lines)
  --quiet                 no progress lines on stderr`;

function int(name: string, raw: string | undefined, min: number, max: number): number | undefined {
  if (raw === undefined) return undefined;
  const n = Number(raw);
  if (!/^\d+$/.test(raw.trim()) || n < min || n > max)
    throw new UsageError(`--${name} must be a whole number from ${min} to ${max}, got "${raw}"`);
  return n;
}

class UsageError extends Error {}

async function main(): Promise<number> {
  let values;
  try {
    ({ values } = parseArgs({
      args: process.argv.slice(2),
      options: {
        requests: { type: 'string' },
        seed: { type: 'string' },
        db: { type: 'string' },
        url: { type: 'string' },
        'admin-email': { type: 'string' },
        'admin-password': { type: 'string' },
        concurrency: { type: 'string' },
        only: { type: 'string' },
        'server-log-level': { type: 'string' },
        quiet: { type: 'boolean', default: false },
        stats: { type: 'boolean', default: false },
        trace: { type: 'string' },
        help: { type: 'boolean', short: 'h', default: false },
      },
      strict: true,
    }));
  } catch (e) {
    throw new UsageError((e as Error).message);
  }
  if (values.help) {
    console.log(USAGE);
    return 0;
  }
  const db = values.db ?? 'embedded';
  if (!['embedded', 'postgres', 'both'].includes(db))
    throw new UsageError(`--db must be embedded, postgres or both, got "${db}"`);
  if ((db === 'postgres' || db === 'both') && !process.env.DATABASE_URL && !values.url)
    throw new UsageError('--db postgres needs DATABASE_URL');
  const base: FuzzOptions = {
    requests: int('requests', values.requests, 1, 10_000_000),
    seed: int('seed', values.seed, 0, 2 ** 31 - 1),
    url: values.url,
    adminEmail: values['admin-email'],
    adminPassword: values['admin-password'],
    concurrency: int('concurrency', values.concurrency, 1, 256),
    only: values.only,
    serverLogLevel: values['server-log-level'],
    trace: values.trace,
    log: values.quiet ? undefined : (l) => process.stderr.write(`${l}\n`),
  };
  const kinds: ('embedded' | 'postgres')[] = values.url
    ? ['embedded']
    : db === 'both'
      ? ['embedded', 'postgres']
      : [db as 'embedded' | 'postgres'];
  let failed = false;
  for (const kind of kinds) {
    const r = await runFuzz({ ...base, db: kind });
    console.log(r.report);
    if (values.stats) {
      console.log('\nstatuses per operation:');
      for (const [op, m] of Object.entries(r.statuses).sort(([a], [b]) => a.localeCompare(b))) {
        console.log(
          `  ${op.padEnd(44)} ${Object.entries(m)
            .map(([s, n]) => `${s}x${n}`)
            .join(' ')}`,
        );
      }
    }
    if (!r.ok && base.serverLogLevel && base.serverLogLevel !== 'silent' && r.serverOutput) {
      console.log(`\nserver output (last lines):\n${r.serverOutput}`);
    }
    if (!r.ok) failed = true;
  }
  return failed ? 1 : 0;
}

main().then(
  (code) => process.exit(code),
  (e: unknown) => {
    if (e instanceof UsageError) {
      console.error(`fuzz: ${e.message}\n\n${USAGE}`);
    } else {
      console.error(`fuzz: ${(e as Error).stack ?? String(e)}`);
    }
    process.exit(2);
  },
);
