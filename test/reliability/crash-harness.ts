/**
 * Helpers of the crash-injection test (crash.test.ts): a scratch PostgreSQL
 * database, the real server as a child process that can be SIGKILLed and
 * started again on the same port, and a plain HTTP client that tells "got an
 * answer" from "got none" (connection refused, reset or cut mid-response).
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { request as httpRequest, type IncomingHttpHeaders } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createScratchDatabase, type ScratchDatabase } from '../../scripts/scratch-db.js';
import { gpucloudMain } from '../helpers/entry.js';

export const ROOT = fileURLToPath(new URL('../../', import.meta.url));

// ---------- scratch database ----------

export type ScratchDb = ScratchDatabase;

/** CREATE DATABASE crash_<random> on the server of `baseUrl`; drop() removes it (closing what is still connected). */
export function createScratchDb(baseUrl: string, prefix = 'crash'): Promise<ScratchDb> {
  return createScratchDatabase(baseUrl, prefix);
}

export { freePort } from '../helpers/ports.js';

/** One ed25519 public key line made by `ssh-keygen -t ed25519 -N ''`. */
export function sshKeygen(comment: string): string {
  const dir = mkdtempSync(join(tmpdir(), 'gpucloud-crash-key-'));
  try {
    const file = join(dir, 'id');
    const r = spawnSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-C', comment, '-f', file], {
      encoding: 'utf8',
    });
    if (r.status !== 0) throw new Error(`ssh-keygen failed: ${r.stderr || r.error}`);
    return readFileSync(`${file}.pub`, 'utf8').trim();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

// ---------- the server process ----------

/** The environment of the server and the CLI: the test runner's own, minus what would change their behaviour. */
export function childEnv(extra: Record<string, string>): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
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
    if (k.startsWith('NODE_TEST') || k === 'NODE_OPTIONS') continue;
    env[k] = v;
  }
  return { ...env, ...extra };
}

export class ServerProcess {
  private child: ChildProcess | undefined;
  private exited: Promise<void> = Promise.resolve();
  private stderrTail = '';
  private stdoutTail = '';
  /** Set when we kill or stop the process: its exit is not a finding. */
  private expectingExit = false;
  /** Set while the process we started is up and we have not killed it. */
  alive = false;
  /** Exits we did not cause (the server died by itself), with their output. */
  readonly unexpectedExits: string[] = [];
  starts = 0;
  readonly startMs: number[] = [];

  constructor(
    readonly port: number,
    private readonly env: NodeJS.ProcessEnv,
  ) {}

  get pid(): number | undefined {
    return this.child?.pid;
  }

  /** Spawns `node <compiled src/main.ts> serve` (helpers/entry.ts) and resolves once it prints its API line. */
  async start(timeoutMs = 90_000): Promise<void> {
    if (this.child) throw new Error('server already running');
    const t0 = Date.now();
    this.stderrTail = '';
    this.stdoutTail = '';
    const child = spawn(process.execPath, [gpucloudMain(), 'serve'], {
      cwd: ROOT,
      env: this.env,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    this.child = child;
    this.starts++;
    this.expectingExit = false;
    const want = `API:   http://127.0.0.1:${this.port}`;
    let ready = false;
    this.exited = new Promise<void>((resolve) => {
      child.once('exit', (code, signal) => {
        this.alive = false;
        if (this.child === child) this.child = undefined;
        if (!this.expectingExit && ready) {
          this.unexpectedExits.push(
            `server pid ${child.pid} exited by itself (code ${code}, signal ${signal}); stderr: ${this.stderrTail.slice(-2000)}`,
          );
        }
        resolve();
      });
    });
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => {
        child.kill('SIGKILL');
        reject(
          new Error(
            `server did not start within ${timeoutMs} ms; stdout: ${this.stdoutTail}; stderr: ${this.stderrTail}`,
          ),
        );
      }, timeoutMs);
      child.stdout!.setEncoding('utf8');
      child.stderr!.setEncoding('utf8');
      child.stdout!.on('data', (d: string) => {
        this.stdoutTail = (this.stdoutTail + d).slice(-4000);
        if (!ready && this.stdoutTail.includes(want)) {
          ready = true;
          this.alive = true;
          clearTimeout(timer);
          resolve();
        }
      });
      child.stderr!.on('data', (d: string) => {
        this.stderrTail = (this.stderrTail + d).slice(-8000);
      });
      child.once('exit', (code, signal) => {
        if (ready) return;
        clearTimeout(timer);
        reject(
          new Error(
            `server exited during start (code ${code}, signal ${signal}); stdout: ${this.stdoutTail}; stderr: ${this.stderrTail}`,
          ),
        );
      });
    });
    this.startMs.push(Date.now() - t0);
  }

  /** SIGKILL, and wait until the process is gone. */
  async kill(): Promise<void> {
    const child = this.child;
    if (!child) return;
    this.alive = false;
    this.expectingExit = true;
    child.kill('SIGKILL');
    await this.exited;
  }

  /** SIGTERM (a clean stop), SIGKILL after `graceMs`. */
  async stop(graceMs = 10_000): Promise<void> {
    const child = this.child;
    if (!child) return;
    this.alive = false;
    this.expectingExit = true;
    child.kill('SIGTERM');
    const t = setTimeout(() => child.kill('SIGKILL'), graceMs);
    await this.exited;
    clearTimeout(t);
  }

  /** Whether the process has already gone away (without us killing it). */
  get running(): boolean {
    return this.child !== undefined;
  }
}

/** `gpucloud <args>` (the compiled src/main.ts, helpers/entry.ts) to completion (the CLI, e.g. admin ledger-check). */
export function runCli(
  args: string[],
  env: NodeJS.ProcessEnv,
): { status: number | null; stdout: string; stderr: string } {
  const r = spawnSync(process.execPath, [gpucloudMain(), ...args], {
    cwd: ROOT,
    env,
    encoding: 'utf8',
    timeout: 120_000,
  });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr + (r.error ? String(r.error) : '') };
}

// ---------- HTTP ----------

export interface Answer {
  status: number;
  text: string;
  /** The parsed JSON, or undefined; read it with helpers/json.ts. */
  body: unknown;
  headers: IncomingHttpHeaders;
}

/** The request got no complete answer: refused, reset, cut mid-body or timed out. */
export class NoAnswer extends Error {
  constructor(
    readonly reason: string,
    readonly timedOut = false,
  ) {
    super(reason);
  }
}

export interface SendOpts {
  token?: string;
  body?: unknown;
  idempotencyKey?: string;
  timeoutMs?: number;
}

/** One HTTP request on a fresh connection (no keep-alive: nothing of a killed server is reused). */
export function send(port: number, method: string, path: string, opts: SendOpts = {}): Promise<Answer> {
  const payload = opts.body === undefined ? undefined : JSON.stringify(opts.body);
  const headers: Record<string, string> = { accept: 'application/json' };
  if (payload !== undefined) {
    headers['content-type'] = 'application/json';
    headers['content-length'] = String(Buffer.byteLength(payload));
  }
  if (opts.token) headers.authorization = `Bearer ${opts.token}`;
  if (opts.idempotencyKey) headers['idempotency-key'] = opts.idempotencyKey;
  return new Promise<Answer>((resolve, reject) => {
    let settled = false;
    const fail = (reason: string, timedOut = false) => {
      if (settled) return;
      settled = true;
      reject(new NoAnswer(reason, timedOut));
    };
    const req = httpRequest({ host: '127.0.0.1', port, method, path, headers, agent: false }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('aborted', () => fail('response aborted'));
      res.on('error', (e) => fail(`response error: ${e.message}`));
      res.on('end', () => {
        if (settled) return;
        if (!res.complete) return fail('response incomplete');
        settled = true;
        const text = Buffer.concat(chunks).toString('utf8');
        let body: unknown = undefined;
        try {
          body = text ? JSON.parse(text) : undefined;
        } catch {
          body = undefined;
        }
        resolve({ status: res.statusCode ?? 0, text, body, headers: res.headers });
      });
    });
    req.setTimeout(opts.timeoutMs ?? 45_000, () => {
      fail('client timeout', true);
      req.destroy();
    });
    req.on('error', (e) => fail(`${(e as NodeJS.ErrnoException).code ?? ''} ${e.message}`.trim()));
    if (payload !== undefined) req.write(payload);
    req.end();
  });
}

export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));
