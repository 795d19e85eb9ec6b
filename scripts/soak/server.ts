/** The server under test: a child process on a fresh database, and its RSS. */
import { spawn, type ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { createScratchDatabase as createScratch, type ScratchDatabase } from '../scratch-db.js';
export type { ScratchDatabase };

export const REPO_ROOT = fileURLToPath(new URL('../../', import.meta.url));

export interface ChildServer {
  url: string;
  pid: number;
  /** Set once the process has exited (code or signal). */
  exit: { code: number | null; signal: NodeJS.Signals | null } | undefined;
  /** The last lines the server wrote after its banner (stdout and stderr). */
  tail: string[];
  stop(): Promise<void>;
}

/**
 * `node --import tsx src/main.ts serve` with the given environment added to a
 * copy of ours from which every server setting was removed (so a DATABASE_URL
 * or GPUCLOUD_* of the caller cannot leak in). The server runs in the child
 * process itself (tsx is a loader), so the child's pid is the server's.
 * `command` starts something else that prints the same banner line (the
 * bench starts the service as `npm start` does, and its baseline servers).
 */
export async function startChildServer(
  env: Record<string, string>,
  startTimeoutMs: number,
  onLine: (line: string) => void,
  command: { args: string[]; cwd: string } = { args: ['--import', 'tsx', 'src/main.ts', 'serve'], cwd: REPO_ROOT },
): Promise<ChildServer> {
  const base: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(process.env)) {
    if (k.startsWith('GPUCLOUD_') || ['DATABASE_URL', 'PORT', 'HOST', 'LOG_LEVEL', 'NODE_OPTIONS'].includes(k))
      continue;
    base[k] = v;
  }
  const child: ChildProcess = spawn(process.execPath, command.args, {
    cwd: command.cwd,
    env: { ...base, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const tail: string[] = [];
  const before: string[] = [];
  let url: string | undefined;
  const server: ChildServer = {
    url: '',
    pid: child.pid ?? 0,
    exit: undefined,
    tail,
    stop: async () => {
      if (server.exit) return;
      const exited = new Promise<void>((r) => child.once('exit', () => r()));
      child.kill('SIGTERM');
      const t = setTimeout(() => child.kill('SIGKILL'), 15_000);
      await exited;
      clearTimeout(t);
    },
  };
  // Last resort if this process dies first: do not leave a server behind.
  const killOnExit = () => child.kill('SIGKILL');
  process.once('exit', killOnExit);

  let banner: (u: string) => void = () => {};
  let failed: (e: Error) => void = () => {};
  const ready = new Promise<string>((res, rej) => {
    banner = res;
    failed = rej;
  });
  const lines = (stream: NodeJS.ReadableStream, name: string) => {
    let buf = '';
    stream.setEncoding('utf8');
    stream.on('data', (chunk: string) => {
      buf += chunk;
      let i;
      while ((i = buf.indexOf('\n')) >= 0) {
        const line = buf.slice(0, i);
        buf = buf.slice(i + 1);
        if (url === undefined) {
          before.push(`${name}: ${line}`);
          const m = /^\s*API:\s+(https?:\/\/\S+)\s*$/.exec(line);
          if (m) {
            url = m[1]!;
            banner(url);
          }
          continue;
        }
        // The rest of the banner, then anything the server says while it runs.
        if (/^\s*(Docs|Web console|Role|Database|gpucloud is running):?/.test(line) || line.trim() === '') continue;
        tail.push(`${name}: ${line}`);
        if (tail.length > 50) tail.shift();
        onLine(`${name}: ${line}`);
      }
    });
  };
  lines(child.stdout!, 'stdout');
  lines(child.stderr!, 'stderr');
  child.once('exit', (code, signal) => {
    server.exit = { code, signal };
    process.removeListener('exit', killOnExit);
    failed(
      new Error(`the server exited (code ${code}, signal ${signal}) before printing its URL:\n${before.join('\n')}`),
    );
  });
  const timer = setTimeout(
    () =>
      failed(
        new Error(
          `the server printed no "API: http://..." line within ${startTimeoutMs / 1000} s:\n${before.join('\n')}`,
        ),
      ),
    startTimeoutMs,
  );
  try {
    server.url = await ready;
  } catch (err) {
    await server.stop();
    throw err;
  } finally {
    clearTimeout(timer);
  }
  return server;
}

/**
 * Every rate-limit variable of the server: the known ones, and any other
 * GPUCLOUD_RATE_LIMIT_* that src/config.ts reads (limits get added; a soak
 * must not trip over a new one).
 */
export function rateLimitVariables(): string[] {
  const names = new Set([
    'GPUCLOUD_RATE_LIMIT_LOGIN',
    'GPUCLOUD_RATE_LIMIT_LOGIN_IP',
    'GPUCLOUD_RATE_LIMIT_LOGIN_GLOBAL',
    'GPUCLOUD_RATE_LIMIT_AUTH',
    'GPUCLOUD_RATE_LIMIT_VM_MUTATIONS',
    'GPUCLOUD_RATE_LIMIT_DEFAULT',
  ]);
  try {
    for (const m of readFileSync(`${REPO_ROOT}src/config.ts`, 'utf8').matchAll(/'(GPUCLOUD_RATE_LIMIT_[A-Z_]+)'/g))
      names.add(m[1]!);
  } catch {
    // The known ones then.
  }
  return [...names].sort();
}

/** VmRSS of a process in MB (MiB), from /proc; undefined when it cannot be read (gone, not Linux). */
export function readRssMb(pid: number): number | undefined {
  try {
    const m = /^VmRSS:\s+(\d+)\s+kB/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) / 1024 : undefined;
  } catch {
    return undefined;
  }
}

/** A fresh database soak_<random> on the server of `baseUrl`; drop() removes it (and ends its sessions). */
export function createScratchDatabase(baseUrl: string): Promise<ScratchDatabase> {
  return createScratch(baseUrl, 'soak');
}
