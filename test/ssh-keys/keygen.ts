/**
 * Real OpenSSH keys for the SSH key tests, made and fingerprinted by the
 * system's ssh-keygen (so the service is compared with the reference tool).
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';

export interface GeneratedKey {
  /** The .pub line as ssh-keygen wrote it (with the trailing newline). */
  line: string;
  type: string;
  /** The base64 key data (the part that must never come back from the API). */
  data: string;
  comment: string;
  /** `SHA256:...` as printed by `ssh-keygen -l -E sha256`. */
  fingerprint: string;
  bits: number;
}

let dir: string | undefined;
let n = 0;
function workDir(): string {
  dir ??= mkdtempSync(join(tmpdir(), 'gpucloud-sshkeys-'));
  return dir;
}

/** Cleans up the generated files (call from an after hook). */
export function cleanupKeys(): void {
  if (dir) rmSync(dir, { recursive: true, force: true });
  dir = undefined;
}

/** What `ssh-keygen -l -E sha256 -f <file>` says: bits and fingerprint. */
export function keygenFingerprint(pubFile: string): { bits: number; fingerprint: string } {
  const out = execFileSync('ssh-keygen', ['-l', '-E', 'sha256', '-f', pubFile], { encoding: 'utf8' });
  const m = /^(\d+) (SHA256:[A-Za-z0-9+/]+) /.exec(out);
  if (!m) throw new Error(`unexpected ssh-keygen -l output: ${out}`);
  return { bits: Number(m[1]), fingerprint: m[2]! };
}

function describe(file: string): GeneratedKey {
  const line = readFileSync(file, 'utf8');
  const [type, data, ...rest] = line.trim().split(' ');
  return { line, type: type!, data: data!, comment: rest.join(' '), ...keygenFingerprint(file) };
}

/** `ssh-keygen -q -t <type> [-b bits] -N '' -C <comment> -f <tmp>`. */
export function generateKey(
  type: 'ed25519' | 'rsa' | 'ecdsa' = 'ed25519',
  opts: { bits?: number; comment?: string } = {},
): GeneratedKey {
  const file = join(workDir(), `k${++n}`);
  const args = ['-q', '-t', type, '-N', '', '-C', opts.comment ?? 'me@laptop', '-f', file];
  if (opts.bits) args.push('-b', String(opts.bits));
  execFileSync('ssh-keygen', args);
  return describe(`${file}.pub`);
}

const sshString = (b: Buffer | string) => {
  const buf = Buffer.isBuffer(b) ? b : Buffer.from(b, 'latin1');
  const len = Buffer.alloc(4);
  len.writeUInt32BE(buf.length);
  return Buffer.concat([len, buf]);
};

/**
 * A security-key (FIDO) ed25519 public key, built by hand since no token is
 * attached here, and fingerprinted by ssh-keygen all the same.
 */
export function skEd25519Key(comment = 'yubikey'): GeneratedKey {
  const type = 'sk-ssh-ed25519@openssh.com';
  const blob = Buffer.concat([sshString(type), sshString(randomBytes(32)), sshString('ssh:')]);
  const file = join(workDir(), `sk${++n}.pub`);
  writeFileSync(file, `${type} ${blob.toString('base64')} ${comment}\n`);
  return describe(file);
}
