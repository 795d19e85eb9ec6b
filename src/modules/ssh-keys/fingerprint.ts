/**
 * OpenSSH one-line public key parsing and SHA-256 fingerprinting.
 *
 * Pure module: depends on node built-ins only. Accepts exactly one line of the
 * form "<type> <base64> [comment]" and validates the decoded wire-format blob
 * the same way OpenSSH would, rejecting anything we do not want to store.
 *
 * The fingerprint is "SHA256:" + unpadded base64 of sha256(blob), which is
 * byte-identical to the second field of `ssh-keygen -l -E sha256 -f key.pub`.
 */
import { createHash, createPublicKey } from 'node:crypto';

export interface ParsedSshKey {
  /** Key type as written in the key, e.g. "ssh-ed25519". */
  keyType: string;
  /** "SHA256:<unpadded base64>" exactly as printed by ssh-keygen -l -E sha256. */
  fingerprint: string;
  /** Comment after the key material (may contain spaces), or null when absent. */
  comment: string | null;
  /** RSA modulus bit length, 256 for ed25519, 256/384/521 for ECDSA. */
  bits: number | null;
  /** Normalized "type base64" without the comment. */
  publicKey: string;
}

export class SshKeyParseError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'SshKeyParseError';
  }
}

/** Maximum accepted input size in bytes (UTF-8): 16 KiB, enough for the largest RSA key accepted. */
export const MAX_SSH_KEY_INPUT_BYTES = 16 * 1024;

/** Minimum RSA modulus size in bits. */
export const MIN_RSA_BITS = 2048;

/** Largest RSA modulus OpenSSH itself accepts (SSHBUF_MAX_BIGNUM * 8). */
const MAX_RSA_BITS = 16384;

/** Key types accepted by parseSshPublicKey, in display order. */
export const SUPPORTED_SSH_KEY_TYPES = [
  'ssh-ed25519',
  'ssh-rsa',
  'ecdsa-sha2-nistp256',
  'ecdsa-sha2-nistp384',
  'ecdsa-sha2-nistp521',
  'sk-ssh-ed25519@openssh.com',
  'sk-ecdsa-sha2-nistp256@openssh.com',
] as const;

type SupportedType = (typeof SUPPORTED_SSH_KEY_TYPES)[number];

/** Well-known OpenSSH key type names that we recognise but do not accept. */
const KNOWN_UNSUPPORTED_TYPES: ReadonlyMap<string, string> = new Map([
  [
    'ssh-dss',
    'DSA (ssh-dss) keys are not supported: they are insecure and deprecated by OpenSSH. Please use an ed25519 key (ssh-keygen -t ed25519)',
  ],
  ['ssh-ed448', 'ed448 keys are not supported. Please use an ed25519 key (ssh-keygen -t ed25519)'],
]);

interface CurveInfo {
  /** Curve identifier inside the blob. */
  sshName: string;
  /** JOSE curve name, for on-curve validation via node:crypto. */
  jwkCrv: string;
  /** Field element size in bytes. */
  coordBytes: number;
  bits: number;
}

const CURVES: Readonly<Record<'nistp256' | 'nistp384' | 'nistp521', CurveInfo>> = {
  nistp256: { sshName: 'nistp256', jwkCrv: 'P-256', coordBytes: 32, bits: 256 },
  nistp384: { sshName: 'nistp384', jwkCrv: 'P-384', coordBytes: 48, bits: 384 },
  nistp521: { sshName: 'nistp521', jwkCrv: 'P-521', coordBytes: 66, bits: 521 },
};

const ED25519_KEY_BYTES = 32;

function isSupportedType(type: string): type is SupportedType {
  return (SUPPORTED_SSH_KEY_TYPES as readonly string[]).includes(type);
}

/** Types that look like an OpenSSH key type (used to spot authorized_keys options). */
function looksLikeKnownKeyType(token: string): boolean {
  return (
    isSupportedType(token) ||
    KNOWN_UNSUPPORTED_TYPES.has(token) ||
    /^(ssh|ecdsa|sk-ssh|sk-ecdsa|rsa-sha2)-[A-Za-z0-9@.-]+$/.test(token)
  );
}

/** Render an untrusted token for inclusion in an error message. */
function show(token: string): string {
  const clean = token.replace(/[^\x20-\x7e]/g, '?');
  return JSON.stringify(clean.length > 64 ? `${clean.slice(0, 64)}...` : clean);
}

/** Cursor over an SSH wire-format buffer (RFC 4251 section 5). */
class WireReader {
  private offset = 0;

  constructor(private readonly buf: Buffer) {}

  get remaining(): number {
    return this.buf.length - this.offset;
  }

  /** Read a length-prefixed "string"; `what` names the field for error messages. */
  readString(what: string): Buffer {
    if (this.remaining < 4) {
      throw new SshKeyParseError(`SSH public key is truncated: missing ${what}`);
    }
    const len = this.buf.readUInt32BE(this.offset);
    this.offset += 4;
    if (len > this.remaining) {
      throw new SshKeyParseError(`SSH public key is truncated: ${what} is cut short`);
    }
    const out = this.buf.subarray(this.offset, this.offset + len);
    this.offset += len;
    return out;
  }

  /** Read a positive "mpint" and return its magnitude without leading zero bytes. */
  readPositiveMpint(what: string): Buffer {
    const raw = this.readString(what);
    if (raw.length > 0 && (raw[0]! & 0x80) !== 0) {
      throw new SshKeyParseError(`SSH public key is invalid: ${what} is negative`);
    }
    let start = 0;
    while (start < raw.length && raw[start] === 0) start++;
    const magnitude = raw.subarray(start);
    if (magnitude.length === 0) {
      throw new SshKeyParseError(`SSH public key is invalid: ${what} is zero`);
    }
    return magnitude;
  }

  expectEnd(): void {
    if (this.remaining !== 0) {
      throw new SshKeyParseError(
        `SSH public key is invalid: ${this.remaining} unexpected trailing byte(s) after the key data`,
      );
    }
  }
}

/** Bit length of a big-endian magnitude with no leading zero bytes. */
function bitLength(magnitude: Buffer): number {
  const top = magnitude[0] ?? 0;
  return (magnitude.length - 1) * 8 + (32 - Math.clz32(top));
}

function decodeBase64Strict(data: string): Buffer {
  if (data.length === 0 || data.length % 4 !== 0 || !/^[A-Za-z0-9+/]+={0,2}$/.test(data)) {
    throw new SshKeyParseError('SSH public key data is not valid base64');
  }
  const blob = Buffer.from(data, 'base64');
  // Reject non-canonical encodings (non-zero padding bits etc.).
  if (blob.toString('base64') !== data) {
    throw new SshKeyParseError('SSH public key data is not valid base64');
  }
  return blob;
}

function checkEcPoint(point: Buffer, curve: CurveInfo): void {
  const expected = 1 + 2 * curve.coordBytes;
  if (point.length !== expected) {
    throw new SshKeyParseError(
      `SSH public key is invalid: ECDSA ${curve.sshName} point must be ${expected} bytes (got ${point.length})`,
    );
  }
  if (point[0] !== 0x04) {
    throw new SshKeyParseError('SSH public key is invalid: ECDSA point must be in uncompressed form (0x04 prefix)');
  }
  const x = point.subarray(1, 1 + curve.coordBytes);
  const y = point.subarray(1 + curve.coordBytes);
  try {
    createPublicKey({
      key: { kty: 'EC', crv: curve.jwkCrv, x: x.toString('base64url'), y: y.toString('base64url') },
      format: 'jwk',
    });
  } catch {
    throw new SshKeyParseError(`SSH public key is invalid: ECDSA point is not on the ${curve.sshName} curve`);
  }
}

function readEcdsaBody(r: WireReader, curve: CurveInfo): void {
  const curveName = r.readString('ECDSA curve name');
  if (curveName.toString('latin1') !== curve.sshName) {
    throw new SshKeyParseError(
      `SSH public key is invalid: ECDSA curve ${show(curveName.toString('latin1'))} does not match the key type (expected "${curve.sshName}")`,
    );
  }
  checkEcPoint(r.readString('ECDSA public point'), curve);
}

function readEd25519Body(r: WireReader): void {
  const pk = r.readString('ed25519 public key');
  if (pk.length !== ED25519_KEY_BYTES) {
    throw new SshKeyParseError(
      `SSH public key is invalid: ed25519 public key must be ${ED25519_KEY_BYTES} bytes (got ${pk.length})`,
    );
  }
}

function readSkApplication(r: WireReader): void {
  const app = r.readString('security key application');
  if (app.length === 0) {
    throw new SshKeyParseError('SSH public key is invalid: security key application is empty');
  }
}

/** Validate the blob body for `type` (after the type string); returns the key size in bits. */
function validateBlobBody(type: SupportedType, r: WireReader): number {
  switch (type) {
    case 'ssh-ed25519':
      readEd25519Body(r);
      return 256;
    case 'sk-ssh-ed25519@openssh.com':
      readEd25519Body(r);
      readSkApplication(r);
      return 256;
    case 'ssh-rsa': {
      const e = r.readPositiveMpint('RSA public exponent');
      const n = r.readPositiveMpint('RSA modulus');
      const bits = bitLength(n);
      if (bits < MIN_RSA_BITS) {
        throw new SshKeyParseError(`RSA keys must be at least ${MIN_RSA_BITS} bits (this one has ${bits})`);
      }
      if (bits > MAX_RSA_BITS) {
        throw new SshKeyParseError(`RSA keys must be at most ${MAX_RSA_BITS} bits (this one has ${bits})`);
      }
      const eIsOdd = ((e[e.length - 1] ?? 0) & 1) === 1;
      if (!eIsOdd || (e.length === 1 && e[0] === 1)) {
        throw new SshKeyParseError('SSH public key is invalid: RSA public exponent is not valid');
      }
      if (((n[n.length - 1] ?? 0) & 1) === 0) {
        throw new SshKeyParseError('SSH public key is invalid: RSA modulus is not valid');
      }
      return bits;
    }
    case 'ecdsa-sha2-nistp256':
      readEcdsaBody(r, CURVES.nistp256);
      return 256;
    case 'ecdsa-sha2-nistp384':
      readEcdsaBody(r, CURVES.nistp384);
      return 384;
    case 'ecdsa-sha2-nistp521':
      readEcdsaBody(r, CURVES.nistp521);
      return 521;
    case 'sk-ecdsa-sha2-nistp256@openssh.com':
      readEcdsaBody(r, CURVES.nistp256);
      readSkApplication(r);
      return 256;
  }
}

/** "SHA256:" + unpadded base64 of sha256(blob), as printed by ssh-keygen. */
function fingerprintOf(blob: Buffer): string {
  return `SHA256:${createHash('sha256').update(blob).digest('base64').replace(/=+$/, '')}`;
}

/**
 * Parse one OpenSSH public key line ("<type> <base64> [comment]").
 * Throws SshKeyParseError with a human-readable message on any problem.
 */
export function parseSshPublicKey(text: string): ParsedSshKey {
  if (typeof text !== 'string') {
    throw new SshKeyParseError('SSH public key must be a string');
  }
  if (Buffer.byteLength(text, 'utf8') > MAX_SSH_KEY_INPUT_BYTES) {
    throw new SshKeyParseError(`SSH public key is too long (maximum ${MAX_SSH_KEY_INPUT_BYTES} bytes)`);
  }
  const line = text.trim();
  if (line.length === 0) {
    throw new SshKeyParseError('SSH public key is empty');
  }
  if (/-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----/.test(line) || /^PuTTY-User-Key-File-/.test(line)) {
    throw new SshKeyParseError(
      'This looks like a private key. Never share it: paste the public key (the .pub file) instead',
    );
  }
  if (/^-+ ?BEGIN /.test(line)) {
    throw new SshKeyParseError(
      'Only OpenSSH one-line public keys ("ssh-ed25519 AAAA... comment") are supported, not PEM/RFC 4716 blocks',
    );
  }
  if (/[\r\n]/.test(line)) {
    throw new SshKeyParseError('SSH public key must be a single line (paste exactly one key)');
  }
  // eslint-disable-next-line no-control-regex
  if (/[\x00-\x08\x0b-\x1f\x7f]/.test(line)) {
    throw new SshKeyParseError('SSH public key contains control characters');
  }

  const match = /^(\S+)[ \t]+(\S+)(?:[ \t]+(.*))?$/.exec(line);
  const type = match?.[1] ?? line.split(/[ \t]/)[0] ?? '';

  if (!isSupportedType(type)) {
    const unsupported = KNOWN_UNSUPPORTED_TYPES.get(type);
    if (unsupported !== undefined) throw new SshKeyParseError(unsupported);
    if (
      !looksLikeKnownKeyType(type) &&
      line
        .split(/[ \t]+/)
        .slice(1)
        .some(looksLikeKnownKeyType)
    ) {
      throw new SshKeyParseError(
        'authorized_keys options (e.g. from="...", command="...") are not allowed: paste only "<type> <base64> [comment]"',
      );
    }
    throw new SshKeyParseError(
      `Unsupported SSH key type ${show(type)}. Supported types: ${SUPPORTED_SSH_KEY_TYPES.join(', ')}`,
    );
  }
  if (match === null) {
    throw new SshKeyParseError(`SSH public key is missing the base64 key data after ${show(type)}`);
  }
  const data = match[2] ?? '';
  const rawComment = (match[3] ?? '').trim();

  const blob = decodeBase64Strict(data);
  const r = new WireReader(blob);
  const innerType = r.readString('key type');
  if (innerType.toString('latin1') !== type) {
    throw new SshKeyParseError(
      `SSH public key is invalid: the key says it is ${show(type)} but its data is ${show(innerType.toString('latin1'))}`,
    );
  }
  const bits = validateBlobBody(type, r);
  r.expectEnd();

  return {
    keyType: type,
    fingerprint: fingerprintOf(blob),
    comment: rawComment.length > 0 ? rawComment : null,
    bits,
    publicKey: `${type} ${data}`,
  };
}
