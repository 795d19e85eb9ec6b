// The host side of scripts/test-image.mjs: running tools (each in its own process group, stopped on an interrupt),
// the build's errors and log lines, and the check for the host tools it needs.
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';

export const MBR_BIN = ['/usr/lib/syslinux/mbr/mbr.bin', '/usr/lib/SYSLINUX/mbr.bin', '/usr/share/syslinux/mbr.bin'];
export const MiB = 1024 * 1024;

export class BuildError extends Error {}
export const fail = (msg) => {
  throw new BuildError(msg);
};
export const log = (msg) => console.log(`test-image: ${msg}`);

const children = new Set();
let interrupted = false;
/** Runs cmd; resolves to { status, stdout, stderr } (strings, or Buffers with raw). */
export function run(cmd, args, { cwd, input, allowFail = false, raw = false } = {}) {
  return new Promise((resolveRun, reject) => {
    // Own process group, so that an interrupt can stop a tool and all its helpers (dpkg-deb's tar).
    const child = spawn(cmd, args, { cwd, stdio: ['pipe', 'pipe', 'pipe'], detached: true });
    children.add(child);
    const out = [];
    const err = [];
    child.stdout.on('data', (d) => out.push(d));
    child.stderr.on('data', (d) => err.push(d));
    child.stdin.on('error', () => {});
    child.stdin.end(input ?? '');
    child.on('error', (e) => {
      children.delete(child);
      reject(new BuildError(e.code === 'ENOENT' ? `${cmd} is not installed (${hint(cmd)})` : `${cmd}: ${e.message}`));
    });
    child.on('close', (code, signal) => {
      children.delete(child);
      if (interrupted) return; // the signal handler reports and exits
      const stdout = raw ? Buffer.concat(out) : Buffer.concat(out).toString('utf8');
      const stderr = Buffer.concat(err).toString('utf8');
      if (code !== 0 && !allowFail) {
        const text = `${stderr}${raw ? '' : stdout}`.trim().split('\n').slice(-15).join('\n');
        reject(
          new BuildError(
            `${cmd} ${args.join(' ')} failed (${signal ? `signal ${signal}` : `exit ${code}`})${text ? `:\n${text}` : ''}`,
          ),
        );
        return;
      }
      resolveRun({ status: code, stdout, stderr });
    });
  });
}

/**
 * On SIGINT, SIGTERM or SIGHUP: kills the running tools' process groups, waits (at most 3 s) for them to die, then
 * runs cleanup and exits with 128 + the signal's number.
 */
export function onInterrupt(cleanup) {
  for (const [sig, code] of [
    ['SIGINT', 130],
    ['SIGTERM', 143],
    ['SIGHUP', 129],
  ]) {
    process.on(sig, async () => {
      if (interrupted) return;
      interrupted = true;
      const running = [...children];
      for (const child of running) {
        try {
          process.kill(-child.pid, 'SIGKILL');
        } catch {
          /* already gone */
        }
      }
      // Let them die before removing the files they write.
      await Promise.race([
        Promise.all(
          running.map((c) =>
            c.exitCode !== null || c.signalCode !== null ? null : new Promise((r) => c.once('close', r)),
          ),
        ),
        new Promise((r) => setTimeout(r, 3000)),
      ]);
      await new Promise((r) => setTimeout(r, 100));
      cleanup();
      console.error(`test-image: interrupted (${sig}); removed the temporary files`);
      process.exit(code);
    });
  }
}

const TOOL_PACKAGES = {
  'apt-get': 'apt',
  'apt-cache': 'apt',
  'dpkg-deb': 'dpkg',
  depmod: 'kmod',
  sfdisk: 'fdisk',
  'mkfs.vfat': 'dosfstools',
  mcopy: 'mtools',
  syslinux: 'syslinux',
  'qemu-img': 'qemu-utils',
  xz: 'xz-utils',
  zstd: 'zstd',
};
function hint(cmd) {
  return TOOL_PACKAGES[cmd] ? `apt-get install ${TOOL_PACKAGES[cmd]}` : 'install it';
}
export function checkTools() {
  const missing = [];
  for (const tool of [
    'apt-get',
    'apt-cache',
    'dpkg-deb',
    'depmod',
    'sfdisk',
    'mkfs.vfat',
    'mcopy',
    'syslinux',
    'qemu-img',
  ]) {
    if (!which(tool)) missing.push(tool);
  }
  if (!MBR_BIN.some((p) => existsSync(p))) missing.push('mbr.bin (syslinux-common)');
  if (missing.length) {
    const pkgs = [...new Set(missing.map((t) => TOOL_PACKAGES[t] ?? t.replace(/.*\((.*)\)/, '$1')))];
    fail(`missing host tools: ${missing.join(', ')}; apt-get install ${pkgs.join(' ')}`);
  }
}
function which(cmd) {
  const dirs = (process.env.PATH ?? '').split(':').concat(['/usr/sbin', '/sbin']);
  return dirs.some((d) => d && existsSync(join(d, cmd)));
}
export function sbinPath() {
  const p = (process.env.PATH ?? '').split(':');
  for (const d of ['/usr/sbin', '/sbin']) if (!p.includes(d)) p.push(d);
  process.env.PATH = p.join(':');
}
