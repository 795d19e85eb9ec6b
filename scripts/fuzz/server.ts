/**
 * The server under test: `node --import tsx src/main.ts serve` in a child
 * process, on a fresh data dir (embedded) or a fresh database fuzz_<random>
 * on the PostgreSQL server of DATABASE_URL (dropped afterwards).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createScratchDatabase } from '../scratch-db.js';

export const REPO_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');

export interface StartedServer {
  url: string;
  adminEmail: string;
  adminPassword: string;
  /** The last lines the server wrote (stdout and stderr). */
  output(): string;
  /** Set once the process has exited. */
  exited(): string | undefined;
  stop(): Promise<void>;
}

export interface ServerOptions {
  db: 'embedded' | 'postgres';
  databaseUrl?: string;
  logLevel?: string;
  startTimeoutMs?: number;
}

export const FUZZ_ADMIN_EMAIL = 'fuzz-admin@example.com';

/** Lets the started server run with this process's environment minus anything that configures it. */
function baseEnv(): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(process.env)) {
    if (k.startsWith('GPUCLOUD_') || ['DATABASE_URL', 'PORT', 'HOST', 'LOG_LEVEL', 'NODE_ENV'].includes(k)) continue;
    // The test runner's own hooks must not leak into the child.
    if (k === 'NODE_TEST_CONTEXT' || k === 'NODE_OPTIONS') continue;
    env[k] = v;
  }
  return env;
}

export async function startServer(opts: ServerOptions): Promise<StartedServer> {
  const dataDir = mkdtempSync(join(tmpdir(), 'gpucloud-fuzz-'));
  const adminPassword = `fuzz-${randomBytes(12).toString('hex')}`;
  const env: NodeJS.ProcessEnv = {
    ...baseEnv(),
    GPUCLOUD_DATA_DIR: dataDir,
    PORT: '0',
    LOG_LEVEL: opts.logLevel ?? 'silent',
    GPUCLOUD_CLOCK: 'manual',
    GPUCLOUD_CLOCK_START: '2026-01-01T00:00:00Z',
    GPUCLOUD_SIM_PROVISION_MS: '0',
    GPUCLOUD_DEMO: '0',
    GPUCLOUD_ADMIN_EMAIL: FUZZ_ADMIN_EMAIL,
    GPUCLOUD_ADMIN_PASSWORD: adminPassword,
    GPUCLOUD_RATE_LIMIT_LOGIN: '100000',
    GPUCLOUD_RATE_LIMIT_AUTH: '100000',
    GPUCLOUD_RATE_LIMIT_VM_MUTATIONS: '100000',
    GPUCLOUD_RATE_LIMIT_DEFAULT: '1000000',
    // Newer per-address and service-wide login limits (ignored by servers that do not have them).
    GPUCLOUD_RATE_LIMIT_LOGIN_IP: '100000',
    GPUCLOUD_RATE_LIMIT_LOGIN_GLOBAL: '1000000',
  };
  let dropDb: (() => Promise<void>) | undefined;
  if (opts.db === 'postgres') {
    const base = opts.databaseUrl ?? process.env.DATABASE_URL;
    if (!base) {
      rmSync(dataDir, { recursive: true, force: true });
      throw new Error('--db postgres needs DATABASE_URL (a PostgreSQL server where this user may CREATE DATABASE)');
    }
    const created = await createScratchDatabase(base, 'fuzz');
    dropDb = created.drop;
    env.DATABASE_URL = created.url;
    env.GPUCLOUD_JWT_SECRET = randomBytes(32).toString('hex');
  }

  const lines: string[] = [];
  const keep = (chunk: Buffer, prefix: string) => {
    for (const l of chunk.toString('utf8').split('\n')) {
      if (!l.trim()) continue;
      lines.push(prefix + l);
      if (lines.length > 400) lines.splice(0, lines.length - 400);
    }
  };
  const child: ChildProcess = spawn(process.execPath, ['--import', 'tsx', 'src/main.ts', 'serve'], {
    cwd: REPO_ROOT,
    env,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let exitInfo: string | undefined;
  const exitedP = new Promise<void>((res) =>
    child.on('exit', (code, signal) => {
      exitInfo = `exited with ${signal ?? `code ${code}`}`;
      res();
    }),
  );
  child.stderr!.on('data', (c: Buffer) => keep(c, '[stderr] '));

  const cleanup = async () => {
    if (!exitInfo) {
      child.kill('SIGTERM');
      const t = setTimeout(() => child.kill('SIGKILL'), 10_000);
      await exitedP;
      clearTimeout(t);
    }
    rmSync(dataDir, { recursive: true, force: true });
    if (dropDb) await dropDb().catch((e: Error) => console.error(`fuzz: could not drop the database: ${e.message}`));
  };

  const url = await new Promise<string>((res, rej) => {
    let buf = '';
    const timer = setTimeout(
      () => rej(new Error(`the server did not print its URL within ${opts.startTimeoutMs ?? 90_000} ms`)),
      opts.startTimeoutMs ?? 90_000,
    );
    child.stdout!.on('data', (c: Buffer) => {
      keep(c, '');
      buf += c.toString('utf8');
      const m = /API:\s+(http:\/\/\S+)/.exec(buf);
      if (m) {
        clearTimeout(timer);
        res(m[1]!);
      }
    });
    void exitedP.then(() => {
      clearTimeout(timer);
      rej(new Error(`the server ${exitInfo} before it printed its URL:\n${lines.slice(-30).join('\n')}`));
    });
  }).catch(async (e: Error) => {
    await cleanup();
    throw e;
  });

  return {
    url,
    adminEmail: FUZZ_ADMIN_EMAIL,
    adminPassword,
    output: () => lines.slice(-60).join('\n'),
    exited: () => exitInfo,
    stop: cleanup,
  };
}
