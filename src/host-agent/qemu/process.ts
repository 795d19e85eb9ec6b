/**
 * Starting QEMU and telling whether a VM's process still runs. Rules:
 *
 * - `launchQemu` only starts daemonizing QEMU (`-daemonize` must be in the
 *   argv): QEMU's first process exits 0 once the VM is set up and QMP
 *   listens, or non-zero with its reason on stderr, which becomes the
 *   rejection's message. The argv is passed as an array, never to a shell.
 *   After `timeoutMs` (default 30 s) the launcher is killed and it rejects.
 * - Liveness comes from `/proc/PID/stat`, not `kill(pid, 0)`: a killed QEMU
 *   lingers as a zombie (state Z) for a second or two, and that is dead.
 *   Pid files outlive their process and pids get reused, so `isAlive` can
 *   also demand that one argv element of the process equals `expectArg`
 *   (for instance the `-qmp` value, which names the VM's directory).
 * - `hostAccel` says whether /dev/kvm can be opened read-write. A usable
 *   device does not prove guests run on it (nested KVM may hang them), so
 *   it is a default for the caller to override, not a decision.
 */
import { spawn } from 'node:child_process';
import { accessSync, closeSync, constants, openSync, readFileSync, statSync } from 'node:fs';
import { delimiter, join } from 'node:path';
import { DEFAULT_QEMU_BINARY } from './command.js';

const STDERR_CAP = 64 * 1024;
const PID_MAX = 4_194_304;

export async function launchQemu(args: string[], opts: { binary?: string; timeoutMs?: number } = {}): Promise<void> {
  const binary = opts.binary ?? DEFAULT_QEMU_BINARY;
  const timeoutMs = opts.timeoutMs ?? 30_000;
  if (!args.includes('-daemonize')) throw new Error('launchQemu: the argv must contain -daemonize');
  await new Promise<void>((resolve, reject) => {
    const child = spawn(binary, args, { stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    let settled = false;
    const finish = (err: Error | null): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      if (err) reject(err);
      else resolve();
    };
    child.stderr.setEncoding('utf8');
    child.stderr.on('data', (d: string) => {
      if (stderr.length < STDERR_CAP) stderr += d;
    });
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      finish(new Error(`${binary}: did not daemonize within ${timeoutMs} ms`));
    }, timeoutMs);
    child.on('error', (err: NodeJS.ErrnoException) => {
      finish(
        new Error(
          err.code === 'ENOENT' ? `${binary}: not found (Debian package qemu-system-x86)` : `${binary}: ${err.message}`,
        ),
      );
    });
    child.on('exit', (code, signal) => {
      if (code === 0) return finish(null);
      // Let the rest of stderr arrive, but do not wait on a pipe something else may hold.
      const fail = (): void => finish(new Error(stderr.trim() || `${binary} exited with ${signal ?? `code ${code}`}`));
      if (child.stderr.closed) return fail();
      const grace = setTimeout(fail, 500);
      child.stderr.once('close', () => {
        clearTimeout(grace);
        fail();
      });
    });
  });
}

/** The pid in a pid file, or null when the file is missing or holds anything but a pid. */
export function readPid(pidFile: string): number | null {
  let text: string;
  try {
    text = readFileSync(pidFile, 'utf8');
  } catch {
    return null;
  }
  const t = text.trim();
  if (!/^[0-9]{1,7}$/.test(t)) return null;
  const pid = Number(t);
  return pid > 0 && pid <= PID_MAX ? pid : null;
}

/** True if `pid` runs and is not a zombie (and, given `expectArg`, has that exact argv element). */
export function isAlive(pid: number, expectArg?: string): boolean {
  if (!Number.isInteger(pid) || pid <= 0 || pid > PID_MAX) return false;
  let stat: string;
  try {
    stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  } catch {
    return false;
  }
  // "PID (comm) S ...": comm may contain spaces and parentheses, so split at the last ')'.
  const state = stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3);
  if (!state || state === 'Z' || state === 'X' || state === 'x') return false;
  if (expectArg === undefined) return true;
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').includes(expectArg);
  } catch {
    return false;
  }
}

/** True if the binary (a name looked up in PATH, or a path) exists and is executable. */
export function qemuAvailable(binary: string = DEFAULT_QEMU_BINARY): boolean {
  const candidates = binary.includes('/')
    ? [binary]
    : (process.env.PATH ?? '')
        .split(delimiter)
        .filter(Boolean)
        .map((d) => join(d, binary));
  return candidates.some((p) => {
    try {
      accessSync(p, constants.X_OK);
      return statSync(p).isFile();
    } catch {
      return false;
    }
  });
}

/** 'kvm' when /dev/kvm opens read-write, else 'tcg'. */
export function hostAccel(): 'kvm' | 'tcg' {
  try {
    closeSync(openSync('/dev/kvm', 'r+'));
    return 'kvm';
  } catch {
    return 'tcg';
  }
}
