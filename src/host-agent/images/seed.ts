/**
 * The NoCloud seed a VM reads at first boot: `user-data` (cloud-config),
 * `meta-data`, packed into an ISO9660 image with volume id `cidata`. Rules:
 *
 * - The cloud-config has one fixed shape (real cloud images read it, and the
 *   test image parses exactly these lines), so it is written line by line,
 *   never by a YAML library. Every value is validated against a narrow
 *   pattern first; values that YAML would not read back as plain strings
 *   (`no`, `null`, `123`, `0x1f`, `2024-01-02`, ...) are refused too.
 * - Key VMs: `ssh_pwauth: false`, `lock_passwd: true`, at least one key and
 *   no password hash. Password VMs: `ssh_pwauth: true`, `lock_passwd: false`,
 *   a SHA-512 crypt hash and no keys. Anything in between throws.
 * - A user other than root is what a cloud image's default user is: created
 *   with `/bin/bash`, passwordless sudo (`ALL=(ALL) NOPASSWD:ALL`, written by
 *   cloud-init to /etc/sudoers.d) and the groups Debian and Ubuntu give their
 *   default user that every Debian or Ubuntu system has (base-passwd's static
 *   groups; cloud-init creates a listed group an image lacks). cloud-init
 *   applies these only when it creates the user: a user the image already has
 *   keeps its own shell and groups (it still gets the sudo rule and the keys).
 * - Root gets no sudo rule, shell or groups. A root password VM also gets an
 *   sshd drop-in `PermitRootLogin yes` (write_files, cloud-init's init stage,
 *   before sshd first starts): sshd's default `prohibit-password` refuses a
 *   root password. Its name sorts before cloud-init's own drop-in and the
 *   images' ones, as sshd keeps the first value it reads.
 * - `manage_etc_hosts: localhost`: cloud-init maps the hostname to 127.0.1.1
 *   in /etc/hosts (and leaves the rest of the file alone), so sudo does not
 *   wait for a DNS answer about it.
 * - `final_message` is the boot marker (`bootMarker`): cloud-init prints it
 *   on the console at the very end of its final stage, after sshd's restarts,
 *   and the agent waits for it before it calls the VM running.
 * - Keys are reduced to `type base64` (the comment is dropped), the blob
 *   must decode to the same key type it claims, and duplicates are dropped.
 * - Passwords are only stored as SHA-512 crypt (`$6$`, 5000 rounds, 16-char
 *   random salt), computed here with node:crypto (glibc's algorithm).
 * - `writeSeed` runs genisoimage with an argv array, never a shell; the
 *   files are written mode 0600 as they carry the password hash.
 */
import { spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { chmod, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';

export interface SeedSpec {
  instanceId: string;
  hostname: string;
  user: string;
  authMethod: 'ssh_key' | 'password';
  sshPublicKeys: string[];
  passwordHash: string | null;
  /** A static address on the host's bridge (bridge networking); without it the guest takes DHCP. */
  network?: SeedNetwork;
}

export interface SeedNetwork {
  mac: string;
  /** CIDR, like 10.88.0.5/16 */
  address: string;
  gateway: string;
  nameservers: string[];
}

const IPV4 = /^(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}$/;
const MAC_RE = /^[0-9a-f]{2}(:[0-9a-f]{2}){5}$/;

/**
 * The NoCloud `network-config` (version 2) of a VM with a static address:
 * one NIC matched by its MAC, its address, a default route via the bridge,
 * and name servers. Real cloud images read it; the test image parses it.
 */
export function networkConfig(n: SeedNetwork): string {
  const [ip, prefix] = n.address.split('/');
  if (!MAC_RE.test(n.mac)) throw new TypeError(`bad MAC address: ${JSON.stringify(n.mac)}`);
  if (!IPV4.test(ip ?? '') || !/^\d{1,2}$/.test(prefix ?? '') || Number(prefix) < 8 || Number(prefix) > 30)
    throw new TypeError(`bad address: ${JSON.stringify(n.address)}`);
  if (!IPV4.test(n.gateway)) throw new TypeError(`bad gateway: ${JSON.stringify(n.gateway)}`);
  for (const ns of n.nameservers) if (!IPV4.test(ns)) throw new TypeError(`bad name server: ${JSON.stringify(ns)}`);
  const lines = [
    'version: 2',
    'ethernets:',
    '  eth0:',
    '    match:',
    `      macaddress: "${n.mac}"`,
    '    set-name: eth0',
    '    addresses:',
    `      - ${n.address}`,
    '    routes:',
    // Not `to: default`: Debian 12's cloud-init (22.4) refuses it unless netplan renders the network.
    '      - to: 0.0.0.0/0',
    `        via: ${n.gateway}`,
  ];
  if (n.nameservers.length)
    lines.push('    nameservers:', '      addresses:', ...n.nameservers.map((a) => `        - ${a}`));
  return lines.join('\n') + '\n';
}

const USER = /^[a-z_][a-z0-9_-]{0,31}$/;
const HOSTNAME = /^[a-z0-9-]{1,63}$/;
const INSTANCE_ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;
const HASH = /^\$6\$[./0-9A-Za-z]{1,16}\$[./0-9A-Za-z]{86}$/;
const KEY =
  /^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)|sk-ssh-ed25519@openssh\.com|sk-ecdsa-sha2-nistp256@openssh\.com) [A-Za-z0-9+/]+=*$/;
const MAX_KEYS = 100;

/** The shell, sudo rule and groups of a template's user other than root. */
export const USER_SHELL = '/bin/bash';
export const USER_SUDO = 'ALL=(ALL) NOPASSWD:ALL';
export const USER_GROUPS = ['adm', 'audio', 'cdrom', 'dialout', 'dip', 'floppy', 'plugdev', 'sudo', 'video'];
/** The sshd drop-in of a root password VM. */
export const ROOT_LOGIN_DROP_IN = '/etc/ssh/sshd_config.d/01-gpucloud-root-login.conf';

/**
 * What the console shows once cloud-init has finished this VM's boot: its
 * final message starts with it. Only the current run's console counts, as
 * cloud-init prints it at every boot.
 */
export function bootMarker(instanceId: string): string {
  return `[gpucloud-ready ${plain(instanceId, INSTANCE_ID, 'instanceId')}]`;
}

export function userData(spec: SeedSpec): string {
  const v = validate(spec);
  const root = v.user === 'root';
  const lines = [
    '#cloud-config',
    `hostname: ${v.hostname}`,
    'manage_etc_hosts: localhost',
    'disable_root: false',
    `ssh_pwauth: ${v.password ? 'true' : 'false'}`,
    'users:',
    `  - name: ${v.user}`,
    `    lock_passwd: ${v.password ? 'false' : 'true'}`,
  ];
  if (!root)
    lines.push(`    shell: ${USER_SHELL}`, `    sudo: "${USER_SUDO}"`, `    groups: [${USER_GROUPS.join(', ')}]`);
  if (v.password) {
    lines.push(`    hashed_passwd: "${v.password}"`);
  } else {
    lines.push('    ssh_authorized_keys:', ...v.keys.map((k) => `      - "${k}"`));
  }
  if (root && v.password) {
    lines.push(
      'write_files:',
      `  - path: ${ROOT_LOGIN_DROP_IN}`,
      '    content: "PermitRootLogin yes\\n"',
      '    owner: "root:root"',
      '    permissions: "0644"',
    );
  }
  // Printed by cloud-init as the last thing it does ($uptime: seconds since the guest's kernel started).
  lines.push(`final_message: "${bootMarker(v.instanceId)} cloud-init finished after $uptime s"`);
  return lines.join('\n') + '\n';
}

export function metaData(spec: SeedSpec): string {
  const v = validate(spec);
  return `instance-id: ${v.instanceId}\nlocal-hostname: ${v.hostname}\n`;
}

/** Writes user-data and meta-data into `dir` and packs them into `dir/seed.iso`; returns its path. */
export async function writeSeed(dir: string, spec: SeedSpec, opts: { binary?: string } = {}): Promise<string> {
  const ud = userData(spec);
  const md = metaData(spec);
  const abs = resolve(dir);
  const iso = join(abs, 'seed.iso');
  await writeFile(join(abs, 'user-data'), ud, { mode: 0o600 });
  await writeFile(join(abs, 'meta-data'), md, { mode: 0o600 });
  const files = ['user-data', 'meta-data'];
  if (spec.network) {
    await writeFile(join(abs, 'network-config'), networkConfig(spec.network), { mode: 0o600 });
    files.push('network-config');
  }
  const binary = opts.binary ?? 'genisoimage';
  await new Promise<void>((res, rej) => {
    const child = spawn(binary, ['-output', iso, '-volid', 'cidata', '-joliet', '-rock', ...files], {
      cwd: abs,
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    let stderr = '';
    child.stderr.setEncoding('utf8');
    child.stderr.on('data', (d: string) => {
      if (stderr.length < 64 * 1024) stderr += d;
    });
    child.on('error', (err: NodeJS.ErrnoException) =>
      rej(
        new Error(
          err.code === 'ENOENT' ? `${binary}: not found (Debian package genisoimage)` : `${binary}: ${err.message}`,
        ),
      ),
    );
    child.on('close', (code, signal) => {
      if (code === 0) res();
      else rej(new Error(`${binary} failed (${signal ?? `code ${code}`}): ${stderr.trim()}`));
    });
  });
  await chmod(iso, 0o600);
  return iso;
}

/** SHA-512 crypt of a password with a fresh random salt. */
export async function hashPassword(password: string): Promise<string> {
  const bytes = randomBytes(16);
  const salt = Array.from(bytes, (b) => B64[b & 63]).join('');
  return sha512Crypt(password, salt);
}

/** Reduces one OpenSSH public key line (surrounding whitespace allowed) to `type base64`, or throws. */
export function normalizeSshKey(line: string): string {
  const text = typeof line === 'string' ? line.trim() : null;
  // eslint-disable-next-line no-control-regex -- control characters are what this looks for
  if (text === null || /[\u0000-\u0008\u000a-\u001f\u007f]/.test(text))
    throw new TypeError('bad SSH public key: not a single line');
  const [type = '', blob = ''] = text.split(/[ \t]+/);
  const key = `${type} ${blob}`;
  if (!KEY.test(key)) throw new TypeError(`bad SSH public key: ${JSON.stringify(line.slice(0, 40))}`);
  const raw = Buffer.from(blob, 'base64');
  const len = raw.length >= 4 ? raw.readUInt32BE(0) : -1;
  if (len <= 0 || len > raw.length - 4 || raw.subarray(4, 4 + len).toString('latin1') !== type) {
    throw new TypeError(`bad SSH public key: the blob is not a ${type} key`);
  }
  return key;
}

// ---- SHA-512 crypt (Ulrich Drepper's specification, as in glibc) ----

const B64 = './0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz';
const ROUNDS = 5000;
const MAX_PASSWORD_BYTES = 1024;
/** Byte order of the final digest in the output, three bytes per group of four characters. */
const ORDER = [
  [0, 21, 42],
  [22, 43, 1],
  [44, 2, 23],
  [3, 24, 45],
  [25, 46, 4],
  [47, 5, 26],
  [6, 27, 48],
  [28, 49, 7],
  [50, 8, 29],
  [9, 30, 51],
  [31, 52, 10],
  [53, 11, 32],
  [12, 33, 54],
  [34, 55, 13],
  [56, 14, 35],
  [15, 36, 57],
  [37, 58, 16],
  [59, 17, 38],
  [18, 39, 60],
  [40, 61, 19],
  [62, 20, 41],
] as const;

/**
 * `$6$SALT$HASH` for a password (UTF-8) and a salt of 1-16 characters from
 * `./0-9A-Za-z`, 5000 rounds. Same output as glibc crypt() and
 * `openssl passwd -6 -salt SALT`.
 */
export function sha512Crypt(password: string, salt: string): string {
  if (typeof password !== 'string' || password.length === 0 || password.includes('\0'))
    throw new TypeError('password must be a non-empty string without NUL');
  if (!/^[./0-9A-Za-z]{1,16}$/.test(salt)) throw new TypeError('salt must be 1-16 characters of ./0-9A-Za-z');
  const p = Buffer.from(password, 'utf8');
  if (p.length > MAX_PASSWORD_BYTES) throw new TypeError(`password longer than ${MAX_PASSWORD_BYTES} bytes`);
  const s = Buffer.from(salt, 'latin1');
  const sha = (...parts: Buffer[]): Buffer => {
    const h = createHash('sha512');
    for (const part of parts) h.update(part);
    return h.digest();
  };

  const b = sha(p, s, p);
  const a = createHash('sha512').update(p).update(s).update(repeatTo(b, p.length));
  for (let n = p.length; n > 0; n >>= 1) a.update(n & 1 ? b : p);
  let c = a.digest();

  const pBytes = repeatTo(sha(...Array<Buffer>(p.length).fill(p)), p.length);
  const sBytes = repeatTo(sha(...Array<Buffer>(16 + c[0]!).fill(s)), s.length);

  for (let i = 0; i < ROUNDS; i++) {
    const h = createHash('sha512');
    h.update(i & 1 ? pBytes : c);
    if (i % 3) h.update(sBytes);
    if (i % 7) h.update(pBytes);
    h.update(i & 1 ? c : pBytes);
    c = h.digest();
  }

  let out = '';
  const put = (w: number, chars: number): void => {
    for (let k = 0; k < chars; k++, w >>= 6) out += B64[w & 63];
  };
  for (const [x, y, z] of ORDER) put((c[x]! << 16) | (c[y]! << 8) | c[z]!, 4);
  put(c[63]!, 2);
  return `$6$${salt}$${out}`;
}

/** `buf` repeated and cut to `len` bytes. */
function repeatTo(buf: Buffer, len: number): Buffer {
  const out = Buffer.alloc(len);
  for (let off = 0; off < len; off += buf.length) buf.copy(out, off, 0, Math.min(buf.length, len - off));
  return out;
}

// ---- validation ----

interface Valid {
  instanceId: string;
  hostname: string;
  user: string;
  password: string | null;
  keys: string[];
}

function validate(spec: SeedSpec): Valid {
  if (typeof spec !== 'object' || spec === null) throw new TypeError('seed spec must be an object');
  const instanceId = plain(spec.instanceId, INSTANCE_ID, 'instanceId');
  const hostname = plain(spec.hostname, HOSTNAME, 'hostname');
  if (hostname.startsWith('-') || hostname.endsWith('-')) throw new TypeError(`bad hostname: ${hostname}`);
  const user = plain(spec.user, USER, 'user');
  if (!Array.isArray(spec.sshPublicKeys)) throw new TypeError('sshPublicKeys must be an array');
  if (spec.sshPublicKeys.length > MAX_KEYS) throw new TypeError(`at most ${MAX_KEYS} SSH keys`);
  const keys = [...new Set(spec.sshPublicKeys.map(normalizeSshKey))];
  if (spec.authMethod === 'ssh_key') {
    if (keys.length === 0) throw new TypeError('an ssh_key VM needs at least one SSH public key');
    if (spec.passwordHash !== null) throw new TypeError('an ssh_key VM takes no password hash');
    return { instanceId, hostname, user, password: null, keys };
  }
  if (spec.authMethod === 'password') {
    if (typeof spec.passwordHash !== 'string' || !HASH.test(spec.passwordHash))
      throw new TypeError('a password VM needs a SHA-512 crypt ($6$) password hash');
    if (keys.length > 0) throw new TypeError('a password VM takes no SSH keys');
    return { instanceId, hostname, user, password: spec.passwordHash, keys: [] };
  }
  throw new TypeError(`bad authMethod: ${JSON.stringify((spec as { authMethod?: unknown }).authMethod)}`);
}

/** Matches `re` and would be read back by YAML 1.1 as a plain string. */
function plain(v: unknown, re: RegExp, what: string): string {
  if (typeof v !== 'string' || !re.test(v) || !isYamlPlainString(v))
    throw new TypeError(`bad ${what}: ${JSON.stringify(v)}`);
  return v;
}

function isYamlPlainString(s: string): boolean {
  return !(
    /^(y|n|yes|no|on|off|true|false|null)$/i.test(s) ||
    /^[-+]?(0b[01_]+|0x[0-9a-f_]+|0o?[0-7_]+|[0-9][0-9_]*)$/i.test(s) ||
    /^[-+]?([0-9][0-9_]*)?\.[0-9._]*(e[-+]?[0-9]+)?$/i.test(s) ||
    /^[-+]?\.(inf|nan)$/i.test(s) ||
    /^[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}/.test(s)
  );
}
