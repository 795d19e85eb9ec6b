/**
 * Helpers of test/reliability/instances.test.ts: a fresh PostgreSQL database,
 * `gpucloud serve` child processes on it, and a small HTTP client that
 * records every unexpected answer instead of throwing.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { createScratchDatabase } from '../../scripts/scratch-db.js';
import { gpucloudMain } from '../helpers/entry.js';

export const ROOT = new URL('../../', import.meta.url).pathname;

export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

// ---- the database ----

export interface FreshDatabase {
  name: string;
  url: string;
  pool: pg.Pool;
  drop(): Promise<void>;
}

/** Creates `inst_<random>` on the server of `serverUrl`; drop() removes it (closing every connection to it). */
export async function createDatabase(serverUrl: string): Promise<FreshDatabase> {
  const scratch = await createScratchDatabase(serverUrl, 'inst');
  const pool = new pg.Pool({ connectionString: scratch.url, max: 4 });
  // Dropping the database ends its connections; an idle client's error then is expected, not a crash.
  pool.on('error', () => undefined);
  return {
    name: scratch.name,
    url: scratch.url,
    pool,
    drop: async () => {
      await pool.end().catch(() => undefined);
      await scratch.drop();
    },
  };
}

// ---- processes ----

export interface Instance {
  name: string;
  role: 'api' | 'worker' | 'portal' | 'all';
  child: ChildProcess;
  /** Everything it wrote on stdout and stderr. */
  output: () => string;
  /** The API's base URL (api role). */
  url?: string;
  /** Exit code / signal once it ended. */
  exited?: { code: number | null; signal: NodeJS.Signals | null; expected: boolean };
  stop(timeoutMs?: number): Promise<{ code: number | null; signal: NodeJS.Signals | null; killed: boolean }>;
}

/** The environment of every process: the inherited one minus any gpucloud setting, plus `extra`. */
export function cleanEnv(extra: Record<string, string>): NodeJS.ProcessEnv {
  const e: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(process.env)) {
    if (
      k.startsWith('GPUCLOUD_') ||
      k === 'DATABASE_URL' ||
      k === 'PORT' ||
      k === 'HOST' ||
      k === 'LOG_LEVEL' ||
      k === 'NODE_ENV'
    )
      continue;
    if (k.startsWith('NODE_TEST') || k === 'NODE_OPTIONS') continue; // not a test-runner child itself
    e[k] = v;
  }
  return { ...e, ...extra };
}

/** Starts `gpucloud serve --role <role>` and resolves once its banner says it runs. */
export function startInstance(
  name: string,
  role: 'api' | 'worker' | 'portal' | 'all',
  env: NodeJS.ProcessEnv,
  timeoutMs = 90_000,
): Promise<Instance> {
  const child = spawn(process.execPath, [gpucloudMain(), 'serve', '--role', role], {
    env,
    cwd: ROOT,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  child.stdout!.on('data', (d) => (out += d));
  child.stderr!.on('data', (d) => (out += d));
  let stopping = false;
  const inst: Instance = {
    name,
    role,
    child,
    output: () => out,
    stop: async (ms = 20_000) => {
      stopping = true;
      if (inst.exited) return { code: inst.exited.code, signal: inst.exited.signal, killed: false };
      const done = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((r) =>
        child.once('exit', (code, signal) => r({ code, signal })),
      );
      child.kill('SIGTERM');
      let timer: NodeJS.Timeout | undefined;
      const t = await Promise.race([done, new Promise<null>((r) => (timer = setTimeout(() => r(null), ms)))]);
      clearTimeout(timer);
      if (t) return { ...t, killed: false };
      child.kill('SIGKILL');
      return { ...(await done), killed: true };
    },
  };
  child.on('exit', (code, signal) => {
    inst.exited = { code, signal, expected: stopping };
  });
  return new Promise<Instance>((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new Error(`${name}: no start banner within ${timeoutMs} ms:\n${out}`)),
      timeoutMs,
    );
    const check = () => {
      if (!/gpucloud is running/.test(out) || !/Role:\s+\w+/.test(out)) return;
      if (role === 'api' || role === 'all') {
        const m = /API:\s+(http:\/\/\S+)/.exec(out);
        if (!m) return;
        inst.url = m[1]!;
      }
      clearTimeout(timer);
      child.stdout!.off('data', check);
      resolve(inst);
    };
    child.stdout!.on('data', check);
    child.once('exit', (code, signal) => {
      clearTimeout(timer);
      reject(new Error(`${name} exited (${code ?? signal}) before it ran:\n${out}`));
    });
  });
}

/** `gpucloud admin ledger-check` on the database. */
export function ledgerCheck(env: NodeJS.ProcessEnv): { status: number | null; stdout: string; stderr: string } {
  const r = spawnSync(process.execPath, [gpucloudMain(), 'admin', 'ledger-check'], {
    env,
    cwd: ROOT,
    encoding: 'utf8',
    timeout: 60_000,
  });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** A fresh ed25519 public key from ssh-keygen. */
export function sshPublicKey(comment: string): string {
  const dir = mkdtempSync(join(tmpdir(), 'gpucloud-inst-key-'));
  try {
    const r = spawnSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-C', comment, '-f', join(dir, 'k')], {
      encoding: 'utf8',
    });
    if (r.status !== 0) throw new Error(`ssh-keygen failed: ${r.stderr}`);
    return readFileSync(join(dir, 'k.pub'), 'utf8').trim();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

// ---- HTTP ----

export interface Answer {
  status: number;
  /** The parsed JSON, or undefined; read it with helpers/json.ts. */
  body: unknown;
  headers: Headers;
  instance: string;
}

export class Http {
  /** Every answer that no caller expected, and every network failure, for the report. */
  readonly problems: string[] = [];
  /** Requests sent per API instance. */
  readonly sent = new Map<string, number>();
  private next = 0;

  constructor(readonly apis: Instance[]) {}

  /** The instance for this request: round robin (callers may pin one with `on`). */
  pick(on?: number): Instance {
    const i = on ?? this.next++ % this.apis.length;
    return this.apis[i % this.apis.length]!;
  }

  async call(
    method: string,
    path: string,
    opts: { token?: string; body?: unknown; on?: number; headers?: Record<string, string> } = {},
  ): Promise<Answer> {
    const inst = this.pick(opts.on);
    this.sent.set(inst.name, (this.sent.get(inst.name) ?? 0) + 1);
    const headers: Record<string, string> = { ...opts.headers };
    if (opts.token) headers.authorization = `Bearer ${opts.token}`;
    if (opts.body !== undefined) headers['content-type'] = 'application/json';
    let res: Response;
    try {
      res = await fetch(`${inst.url}${path}`, {
        method,
        headers,
        body: opts.body === undefined ? undefined : JSON.stringify(opts.body),
        signal: AbortSignal.timeout(30_000),
      });
    } catch (err) {
      const msg = `${inst.name} ${method} ${path}: network error ${(err as Error).message} ${String((err as { cause?: unknown }).cause ?? '')}`;
      this.problems.push(msg);
      return { status: 0, body: { detail: msg }, headers: new Headers(), instance: inst.name };
    }
    const text = await res.text();
    let body: unknown = text;
    try {
      body = text ? JSON.parse(text) : null;
    } catch {
      /* not JSON */
    }
    return { status: res.status, body, headers: res.headers, instance: inst.name };
  }

  /** Like call(), and records the answer as a problem unless its status is one of `ok`. */
  async expect(ok: number[], method: string, path: string, opts: Parameters<Http['call']>[2] = {}): Promise<Answer> {
    const a = await this.call(method, path, opts);
    if (a.status !== 0 && !ok.includes(a.status)) {
      this.problems.push(`${a.instance} ${method} ${path}: ${a.status} ${JSON.stringify(a.body).slice(0, 300)}`);
    }
    return a;
  }

  /** Like call(), and throws unless the status is one of `ok` (setup steps). */
  async must(ok: number[], method: string, path: string, opts: Parameters<Http['call']>[2] = {}): Promise<Answer> {
    const a = await this.call(method, path, opts);
    if (!ok.includes(a.status))
      throw new Error(`${a.instance} ${method} ${path}: ${a.status} ${JSON.stringify(a.body).slice(0, 500)}`);
    return a;
  }
}
