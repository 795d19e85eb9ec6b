/**
 * The service under test: `npm start` of DIR (`node DIR/dist/bin/gpucloud.js serve`) as a child process on
 * a fresh database, configured for benchmarking (system clock, LOG_LEVEL=warn,
 * no demo data, a bench administrator, every rate limit far above what the
 * bench can reach, instant simulated provisioning). Embedded: PGlite in a new
 * temporary data dir. PostgreSQL: a scratch database gpucloud_bench_<random>
 * on DATABASE_URL (default postgres://postgres@127.0.0.1:5432/test), with
 * Redis at GPUCLOUD_REDIS_URL (default redis://127.0.0.1:6379) under a prefix
 * of its own. Used by bench/http.ts and bench/startup.ts, not run on its own.
 */
import { randomBytes } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { createScratchDatabase } from '../scripts/scratch-db.js';
import { rateLimitVariables, startChildServer, type ChildServer } from '../scripts/soak/server.js';
import type { Release, Scope } from './cleanup.js';

export type DbKind = 'embedded' | 'postgres';

/** Every rate limit of the service in the bench: the most its configuration allows, per minute. */
export const BENCH_RATE_LIMIT = 1_000_000;

export interface ServiceDb {
  kind: DbKind;
  /** What the service is given to use this database. */
  env: Record<string, string>;
  /** PostgreSQL: the scratch database. */
  databaseUrl?: string;
  /** Embedded: PGlite's directory inside the data dir, for the database baseline once the service has exited. */
  pgliteDir?: string;
}

export interface Credentials {
  email: string;
  password: string;
}

export interface Service {
  url: string;
  pid: number;
  stop: Release;
}

const POSTGRES_SERVER = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const REDIS = process.env.GPUCLOUD_REDIS_URL ?? 'redis://127.0.0.1:6379';
const START_TIMEOUT_MS = 120_000;

/** A database nobody has used, dropped (or deleted) with the scope. */
export async function freshDatabase(scope: Scope, kind: DbKind): Promise<ServiceDb> {
  if (kind === 'embedded') {
    const dataDir = join(scope.tempDir(), 'data');
    return { kind, env: { GPUCLOUD_DATA_DIR: dataDir }, pgliteDir: join(dataDir, 'pg') };
  }
  const scratch = await createScratchDatabase(POSTGRES_SERVER, 'gpucloud_bench');
  scope.defer(() => scratch.drop());
  console.log(`  database ${scratch.name} created on ${new URL(POSTGRES_SERVER).host}`);
  const env = {
    DATABASE_URL: scratch.url,
    GPUCLOUD_JWT_SECRET: randomBytes(24).toString('hex'),
    GPUCLOUD_REDIS_URL: REDIS,
    GPUCLOUD_REDIS_PREFIX: `gpucloud-bench-${randomBytes(6).toString('hex')}:`,
  };
  return { kind, env, databaseUrl: scratch.url };
}

export function benchAdmin(): Credentials {
  return { email: 'bench-admin@example.com', password: `bench-${randomBytes(12).toString('hex')}` };
}

function serviceEnv(db: ServiceDb, admin: Credentials, port: number): Record<string, string> {
  const env: Record<string, string> = {
    ...db.env,
    PORT: String(port),
    HOST: '127.0.0.1',
    LOG_LEVEL: 'warn',
    GPUCLOUD_CLOCK: 'system',
    GPUCLOUD_DEMO: '0',
    GPUCLOUD_ADMIN_EMAIL: admin.email,
    GPUCLOUD_ADMIN_PASSWORD: admin.password,
    GPUCLOUD_SIM_PROVISION_MS: '0',
  };
  // The highest the service accepts for each (1000000 a minute): the bench measures work, not 429s.
  for (const v of rateLimitVariables()) env[v] = String(BENCH_RATE_LIMIT);
  return env;
}

/** What the service prints while it runs (warnings and errors at LOG_LEVEL=warn). */
function forward(line: string): void {
  if (!/shutting down$/.test(line)) process.stderr.write(`  [service] ${line}\n`);
}

/**
 * Node's arguments for the service as `npm start` runs it in `repo`: the words of
 * its start script after `node` (`--v8-pool-size=1 dist/bin/gpucloud.js serve`), so the
 * bench measures the flags the checkout ships, not a command of its own. A leading
 * `exec` (the shell hands its place, and the signals npm forwards, to node) is skipped.
 */
export function startArgs(repo: string): string[] {
  const pkg = JSON.parse(readFileSync(join(repo, 'package.json'), 'utf8')) as { scripts?: { start?: string } };
  const all = (pkg.scripts?.start ?? '').trim().split(/\s+/);
  const words = all[0] === 'exec' ? all.slice(1) : all;
  // dist/main.js: a checkout from before the command was bundled.
  if (words[0] !== 'node' || !words.some((w) => /^dist\/.*\.js$/.test(w))) {
    throw new Error(`${repo}/package.json: the start script is not "[exec] node ... dist/....js serve"`);
  }
  return words.slice(1);
}

/**
 * Starts the service as `npm start` does (startArgs) (PORT 0: any free port) and resolves
 * when it prints its `API: http://...` line; stopped with the scope, or
 * earlier with stop().
 */
export async function startService(
  scope: Scope,
  repo: string,
  db: ServiceDb,
  admin: Credentials,
  port = 0,
): Promise<Service> {
  const main = join(repo, 'dist', 'main.js');
  if (!existsSync(main)) throw new Error(`${main} does not exist: run npm run build in ${repo} first`);
  const server: ChildServer = await startChildServer(serviceEnv(db, admin, port), START_TIMEOUT_MS, forward, {
    args: startArgs(repo),
    cwd: repo,
  });
  const stop = scope.defer(() => server.stop());
  return { url: server.url, pid: server.pid, stop };
}
