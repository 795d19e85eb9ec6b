/**
 * Real OpenSSH keys for the tests, made and fingerprinted by the system's
 * ssh-keygen (so the service is compared with the reference tool).
 *
 * Two runs of ssh-keygen per key add up to seconds in a file that makes a
 * user with a key per test, so keys come from a pool on disk shared by every
 * test process and run (`<tmpdir>/gpucloud-ssh-key-pool/`): the n-th key a
 * process asks for of a kind (type, bits, comment) is the pool's n-th, made
 * by ssh-keygen the first time any process asks for it. Keys are distinct
 * within a process, which is all a test can see: each test app has a database
 * of its own.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createHash, randomBytes } from 'node:crypto';

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

type KeyType = 'ed25519' | 'rsa' | 'ecdsa';
interface KeyOptions {
  bits?: number;
  comment?: string;
}

/** `make(file)` in a folder of its own, removed afterwards. */
function inScratchDir<T>(make: (file: string) => T): T {
  const dir = mkdtempSync(join(tmpdir(), 'gpucloud-sshkey-'));
  try {
    return make(join(dir, 'k'));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** `ssh-keygen -q -t <type> [-b bits] -N '' -C <comment> -f <tmp>`. */
function freshKey(type: KeyType, opts: KeyOptions): GeneratedKey {
  return inScratchDir((file) => {
    const args = ['-q', '-t', type, '-N', '', '-C', opts.comment ?? 'me@laptop', '-f', file];
    if (opts.bits) args.push('-b', String(opts.bits));
    execFileSync('ssh-keygen', args);
    return describe(`${file}.pub`);
  });
}

const POOL = join(tmpdir(), 'gpucloud-ssh-key-pool');
/** How many keys of each kind this process has taken from the pool. */
const taken = new Map<string, number>();

function isKey(v: unknown): v is GeneratedKey {
  const k = v as Partial<GeneratedKey> | null;
  return (
    typeof k === 'object' &&
    k !== null &&
    [k.line, k.type, k.data, k.comment, k.fingerprint].every((f) => typeof f === 'string') &&
    typeof k.bits === 'number'
  );
}

/** A key ssh-keygen made with these options, different from every other this process got (see above). */
export function generateKey(type: KeyType = 'ed25519', opts: KeyOptions = {}): GeneratedKey {
  const comment = createHash('sha256')
    .update(opts.comment ?? 'me@laptop')
    .digest('hex')
    .slice(0, 12);
  const kind = `${type}-${opts.bits ?? 'default'}-${comment}`;
  const i = taken.get(kind) ?? 0;
  taken.set(kind, i + 1);
  const file = join(POOL, kind, `${i}.json`);
  if (existsSync(file)) {
    try {
      const key: unknown = JSON.parse(readFileSync(file, 'utf8'));
      if (isKey(key)) return key;
    } catch {
      // unreadable: made again below
    }
  }
  const key = freshKey(type, opts);
  mkdirSync(join(POOL, kind), { recursive: true });
  // Written whole under a name of its own, then renamed: a process reading the file never sees half of it. When
  // two processes make the same key at once, the last rename wins; both keys are good.
  const tmp = `${file}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`;
  writeFileSync(tmp, JSON.stringify(key));
  renameSync(tmp, file);
  return key;
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
  return inScratchDir((file) => {
    writeFileSync(file, `${type} ${blob.toString('base64')} ${comment}\n`);
    return describe(file);
  });
}
