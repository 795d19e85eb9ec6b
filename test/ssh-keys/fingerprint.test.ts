import { after, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { createECDH, createPrivateKey, createPublicKey, randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { parseSshPublicKey, SshKeyParseError, type ParsedSshKey } from '../../src/modules/ssh-keys/fingerprint.js';

// ---------------------------------------------------------------------------
// helpers
// ---------------------------------------------------------------------------

const COMMENT = 'comment with spaces';

interface KeygenListing {
  bits: number;
  fingerprint: string;
  comment: string;
  type: string;
}

/** Run `ssh-keygen -l -E sha256 -f path` and parse "BITS SHA256:xxx comment (TYPE)". */
function sshKeygenList(path: string): KeygenListing {
  const out = execFileSync('ssh-keygen', ['-l', '-E', 'sha256', '-f', path], { encoding: 'utf8' }).trim();
  const m = /^(\d+) (SHA256:[A-Za-z0-9+/]+) (.*) \(([A-Z0-9-]+)\)$/.exec(out);
  assert.ok(m, `unexpected ssh-keygen -l output: ${out}`);
  return { bits: Number(m[1]), fingerprint: m[2]!, comment: m[3]!, type: m[4]! };
}

/** SSH wire "string": uint32 length + bytes. */
function sshString(value: string | Buffer): Buffer {
  const body = typeof value === 'string' ? Buffer.from(value, 'latin1') : value;
  const len = Buffer.alloc(4);
  len.writeUInt32BE(body.length);
  return Buffer.concat([len, body]);
}

/** SSH wire "mpint" for a non-negative big-endian magnitude. */
function sshMpint(magnitude: Buffer): Buffer {
  let start = 0;
  while (start < magnitude.length && magnitude[start] === 0) start++;
  let body = magnitude.subarray(start);
  if (body.length > 0 && (body[0]! & 0x80) !== 0) body = Buffer.concat([Buffer.from([0]), body]);
  return sshString(body);
}

function blob(...parts: Array<string | Buffer>): Buffer {
  return Buffer.concat(parts.map((p) => sshString(p)));
}

function line(type: string, keyBlob: Buffer, comment?: string): string {
  return `${type} ${keyBlob.toString('base64')}${comment === undefined ? '' : ` ${comment}`}`;
}

// Keys are made without generateKeyPairSync: on Node 20 a garbage collection during a JWK export of a generated key
// can finalize the key's generation job, which waits on the lock the export holds, and the test process hangs.

function ed25519Raw(): Buffer {
  // A random seed as a PKCS#8 private key; the public key is the last 32 bytes of its SPKI form.
  const pkcs8 = Buffer.concat([Buffer.from('302e020100300506032b657004220420', 'hex'), randomBytes(32)]);
  const spki = createPublicKey(createPrivateKey({ key: pkcs8, format: 'der', type: 'pkcs8' })).export({
    type: 'spki',
    format: 'der',
  });
  return spki.subarray(spki.length - 32);
}

const ECDH_CURVES = { 'P-256': 'prime256v1', 'P-384': 'secp384r1', 'P-521': 'secp521r1' } as const;

/** A real point of the curve, uncompressed (0x04 || X || Y). */
function ecPoint(namedCurve: 'P-256' | 'P-384' | 'P-521'): Buffer {
  return createECDH(ECDH_CURVES[namedCurve]).generateKeys();
}

/** An ssh-rsa blob built here (e, n as mpints) from an RSA key ssh-keygen made (written as PKCS#8). */
function rsaBlob(modulusLength: number): Buffer {
  const dir = mkdtempSync(join(tmpdir(), 'gpucloud-sshfp-rsa-'));
  try {
    const file = join(dir, 'id');
    execFileSync('ssh-keygen', ['-q', '-t', 'rsa', '-b', String(modulusLength), '-m', 'PKCS8', '-N', '', '-f', file], {
      stdio: 'pipe',
    });
    const jwk = createPublicKey(createPrivateKey(readFileSync(file, 'utf8'))).export({ format: 'jwk' });
    assert.ok(jwk.n && jwk.e, 'an RSA JWK has n and e');
    const n = Buffer.from(jwk.n, 'base64url');
    const e = Buffer.from(jwk.e, 'base64url');
    return Buffer.concat([sshString('ssh-rsa'), sshMpint(e), sshMpint(n)]);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** An ssh-rsa blob of a random odd modulus of `bits` bits and e = 65537 (no key made): what counts bits reads it. */
function syntheticRsaBlob(bits: number): Buffer {
  const n = randomBytes(bits / 8);
  n[0]! |= 0x80;
  n[n.length - 1]! |= 1;
  return Buffer.concat([sshString('ssh-rsa'), sshMpint(Buffer.from([1, 0, 1])), sshMpint(n)]);
}

function ed25519Blob(raw: Buffer = ed25519Raw()): Buffer {
  return blob('ssh-ed25519', raw);
}

function expectReject(input: string, message: RegExp): void {
  let caught: unknown;
  assert.throws(
    () => parseSshPublicKey(input),
    (err: unknown) => {
      caught = err;
      return true;
    },
  );
  assert.ok(caught instanceof SshKeyParseError, `expected SshKeyParseError, got ${String(caught)}`);
  assert.ok(caught instanceof Error);
  assert.equal(caught.name, 'SshKeyParseError');
  assert.match(caught.message, message);
}

// ---------------------------------------------------------------------------
// tests
// ---------------------------------------------------------------------------

describe('parseSshPublicKey', () => {
  const dir = mkdtempSync(join(tmpdir(), 'gpucloud-sshfp-'));
  let fileCounter = 0;

  after(() => {
    rmSync(dir, { recursive: true, force: true });
  });

  function keygen(type: string, bits?: number, comment = COMMENT): string {
    const path = join(dir, `key${fileCounter++}`);
    const args = ['-q', '-t', type, '-N', '', '-C', comment, '-f', path];
    if (bits !== undefined) args.splice(3, 0, '-b', String(bits));
    execFileSync('ssh-keygen', args, { stdio: 'pipe' });
    return path;
  }

  function writePub(contents: string): string {
    const path = join(dir, `hand${fileCounter++}.pub`);
    writeFileSync(path, `${contents}\n`);
    return path;
  }

  /** Assert the parse result agrees with ssh-keygen on the given .pub file. */
  function assertMatchesKeygen(parsed: ParsedSshKey, pubPath: string, expectedBits: number): void {
    const listing = sshKeygenList(pubPath);
    assert.equal(parsed.fingerprint, listing.fingerprint);
    assert.equal(parsed.bits, listing.bits);
    assert.equal(parsed.bits, expectedBits);
    assert.match(parsed.fingerprint, /^SHA256:[A-Za-z0-9+/]{43}$/);
  }

  describe('keys generated by ssh-keygen', () => {
    const cases = [
      { name: 'ed25519', type: 'ed25519', bits: undefined, keyType: 'ssh-ed25519', expectedBits: 256 },
      { name: 'rsa 2048', type: 'rsa', bits: 2048, keyType: 'ssh-rsa', expectedBits: 2048 },
      { name: 'rsa 4096', type: 'rsa', bits: 4096, keyType: 'ssh-rsa', expectedBits: 4096 },
      { name: 'ecdsa 256', type: 'ecdsa', bits: 256, keyType: 'ecdsa-sha2-nistp256', expectedBits: 256 },
      { name: 'ecdsa 384', type: 'ecdsa', bits: 384, keyType: 'ecdsa-sha2-nistp384', expectedBits: 384 },
      { name: 'ecdsa 521', type: 'ecdsa', bits: 521, keyType: 'ecdsa-sha2-nistp521', expectedBits: 521 },
    ] as const;

    for (const c of cases) {
      test(`${c.name}: fingerprint, bits, type, comment and publicKey match ssh-keygen`, () => {
        const path = keygen(c.type, c.bits);
        const text = readFileSync(`${path}.pub`, 'utf8');
        const parsed = parseSshPublicKey(text);
        assertMatchesKeygen(parsed, `${path}.pub`, c.expectedBits);
        assert.equal(parsed.keyType, c.keyType);
        assert.equal(parsed.comment, COMMENT);
        assert.equal(sshKeygenList(`${path}.pub`).comment, COMMENT);
        const [type, b64] = text.trim().split(' ');
        assert.equal(parsed.publicKey, `${type} ${b64}`);
        assert.equal(parsed.publicKey.split(' ').length, 2);
      });
    }

    test('the private key file of a generated key is rejected', () => {
      const path = keygen('ed25519');
      expectReject(readFileSync(path, 'utf8'), /private key/i);
    });

    test('ssh-keygen RSA 1024 (or a hand-built 1024-bit blob) is rejected with the bit count', () => {
      let text: string;
      const path = join(dir, `rsa1024-${fileCounter++}`);
      const res = spawnSync('ssh-keygen', ['-q', '-t', 'rsa', '-b', '1024', '-N', '', '-C', COMMENT, '-f', path]);
      if (res.status === 0) {
        text = readFileSync(`${path}.pub`, 'utf8');
        assert.equal(sshKeygenList(`${path}.pub`).bits, 1024);
      } else {
        text = line('ssh-rsa', syntheticRsaBlob(1024), COMMENT);
      }
      expectReject(text, /^RSA keys must be at least 2048 bits \(this one has 1024\)$/);
    });
  });

  describe('hand-built blobs agree with ssh-keygen', () => {
    test('sk-ssh-ed25519@openssh.com', () => {
      const keyBlob = blob('sk-ssh-ed25519@openssh.com', ed25519Raw(), 'ssh:');
      const text = line('sk-ssh-ed25519@openssh.com', keyBlob, 'my yubikey');
      const parsed = parseSshPublicKey(text);
      const pub = writePub(text);
      assertMatchesKeygen(parsed, pub, 256);
      assert.equal(sshKeygenList(pub).type, 'ED25519-SK');
      assert.equal(parsed.keyType, 'sk-ssh-ed25519@openssh.com');
      assert.equal(parsed.comment, 'my yubikey');
      assert.equal(parsed.publicKey, `sk-ssh-ed25519@openssh.com ${keyBlob.toString('base64')}`);
    });

    test('sk-ecdsa-sha2-nistp256@openssh.com (real P-256 point)', () => {
      const point = ecPoint('P-256');
      assert.equal(point.length, 65);
      const keyBlob = blob('sk-ecdsa-sha2-nistp256@openssh.com', 'nistp256', point, 'ssh:');
      const text = line('sk-ecdsa-sha2-nistp256@openssh.com', keyBlob, 'solo key');
      const parsed = parseSshPublicKey(text);
      const pub = writePub(text);
      assertMatchesKeygen(parsed, pub, 256);
      assert.equal(sshKeygenList(pub).type, 'ECDSA-SK');
      assert.equal(parsed.keyType, 'sk-ecdsa-sha2-nistp256@openssh.com');
      assert.equal(parsed.comment, 'solo key');
    });

    test("ssh-rsa built here from an RSA 2048 key's e and n (the encoding of the 1024 fallback)", () => {
      const text = line('ssh-rsa', rsaBlob(2048), 'built rsa');
      const parsed = parseSshPublicKey(text);
      assertMatchesKeygen(parsed, writePub(text), 2048);
    });

    test('ssh-ed25519 and ecdsa built from node keys', () => {
      const ed = line('ssh-ed25519', ed25519Blob(), 'node ed');
      assertMatchesKeygen(parseSshPublicKey(ed), writePub(ed), 256);
      for (const [crv, name, bits] of [
        ['P-384', 'nistp384', 384],
        ['P-521', 'nistp521', 521],
      ] as const) {
        const text = line(`ecdsa-sha2-${name}`, blob(`ecdsa-sha2-${name}`, name, ecPoint(crv)), 'node ec');
        assertMatchesKeygen(parseSshPublicKey(text), writePub(text), bits);
      }
    });

    test('fingerprint has no base64 padding', () => {
      const parsed = parseSshPublicKey(line('ssh-ed25519', ed25519Blob()));
      assert.ok(!parsed.fingerprint.includes('='));
      assert.equal(parsed.fingerprint.length, 'SHA256:'.length + 43);
    });
  });

  describe('input format', () => {
    const keyBlob = ed25519Blob();
    const b64 = keyBlob.toString('base64');
    const normalized = `ssh-ed25519 ${b64}`;

    test('no comment gives comment null', () => {
      const parsed = parseSshPublicKey(normalized);
      assert.equal(parsed.comment, null);
      assert.equal(parsed.publicKey, normalized);
      assert.equal(parsed.keyType, 'ssh-ed25519');
      assert.equal(parsed.bits, 256);
    });

    test('leading/trailing whitespace and trailing newline (LF and CRLF) are accepted', () => {
      const base = parseSshPublicKey(normalized);
      for (const text of [`  ${normalized} hello\n`, `\t${normalized} hello\r\n`, `\n${normalized} hello   \n\n`]) {
        const parsed = parseSshPublicKey(text);
        assert.equal(parsed.comment, 'hello');
        assert.equal(parsed.publicKey, normalized);
        assert.equal(parsed.fingerprint, base.fingerprint);
      }
      assert.equal(parseSshPublicKey(`${normalized}\n`).comment, null);
      assert.equal(parseSshPublicKey(`${normalized}   \n`).comment, null);
    });

    test('comment may contain spaces and is returned verbatim (internal spacing kept)', () => {
      assert.equal(parseSshPublicKey(`${normalized} alice@laptop work  key`).comment, 'alice@laptop work  key');
      assert.equal(parseSshPublicKey(`${normalized}    spaced out `).comment, 'spaced out');
      assert.equal(parseSshPublicKey(`${normalized} üñíçødé ключ`).comment, 'üñíçødé ключ');
    });

    test('tabs and multiple spaces between fields are accepted and normalized away', () => {
      const parsed = parseSshPublicKey(`ssh-ed25519\t\t${b64}\tcomment here`);
      assert.equal(parsed.publicKey, normalized);
      assert.equal(parsed.comment, 'comment here');
      assert.equal(parseSshPublicKey(`ssh-ed25519    ${b64}`).publicKey, normalized);
    });

    test('fingerprint does not depend on the comment', () => {
      assert.equal(
        parseSshPublicKey(`${normalized} a`).fingerprint,
        parseSshPublicKey(`${normalized} completely different`).fingerprint,
      );
    });

    test('input of exactly 16 KiB is accepted', () => {
      const prefix = `${normalized} `;
      const text = prefix + 'c'.repeat(16 * 1024 - prefix.length);
      assert.equal(Buffer.byteLength(text), 16 * 1024);
      assert.equal(parseSshPublicKey(text).comment?.length, 16 * 1024 - prefix.length);
    });
  });

  describe('rejections', () => {
    const edBlob = ed25519Blob();
    const edLine = line('ssh-ed25519', edBlob, 'x');

    test('empty and whitespace-only input', () => {
      expectReject('', /empty/);
      expectReject('   \n\t  ', /empty/);
    });

    test('over-long input (> 16 KiB)', () => {
      const prefix = `${edLine} `;
      expectReject(prefix + 'c'.repeat(16 * 1024 - prefix.length + 1), /too long/);
      // multi-byte characters count as bytes, not UTF-16 units
      expectReject(prefix + 'é'.repeat(9000), /too long/);
      expectReject('A'.repeat(100_000), /too long/);
    });

    test('ssh-dss (hand-built blob)', () => {
      const big = (n: number): Buffer => Buffer.concat([Buffer.from([0x7f]), Buffer.alloc(n - 1, 0x11)]);
      const dss = Buffer.concat([
        sshString('ssh-dss'),
        sshMpint(big(128)),
        sshMpint(big(20)),
        sshMpint(big(128)),
        sshMpint(big(128)),
      ]);
      expectReject(line('ssh-dss', dss, 'old key'), /DSA.*not supported/);
    });

    test('unknown types and certificates', () => {
      expectReject(line('ssh-foo', blob('ssh-foo', Buffer.alloc(32))), /Unsupported SSH key type "ssh-foo"/);
      expectReject(line('ssh-ed25519-cert-v01@openssh.com', edBlob), /Unsupported SSH key type/);
      expectReject(line('rsa-sha2-256', rsaBlob(2048)), /Unsupported SSH key type/);
      expectReject(line('SSH-ED25519', edBlob), /Unsupported SSH key type/);
    });

    test('garbage', () => {
      expectReject('hello world', /Unsupported SSH key type "hello"/);
      expectReject('AAAAC3NzaC1lZDI1NTE5AAAAIH2aPr1abrYS2dMYesN4IAvCpjkKG8EevUqSSyzVH1vn', /Unsupported/);
      expectReject('\u0000\u0001\u0002', /control characters/);
      expectReject('{"kty":"OKP"}', /Unsupported/);
    });

    test('private keys and PEM/RFC 4716 blocks', () => {
      expectReject(
        '-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\n',
        /private key/i,
      );
      expectReject('-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA\n-----END RSA PRIVATE KEY-----', /private key/i);
      expectReject('-----BEGIN PRIVATE KEY-----', /private key/i);
      expectReject('PuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none', /private key/i);
      expectReject('---- BEGIN SSH2 PUBLIC KEY ----\nComment: "x"\nAAAA\n---- END SSH2 PUBLIC KEY ----', /one-line/);
      expectReject('-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEA\n-----END PUBLIC KEY-----', /one-line/);
    });

    test('multiple lines', () => {
      const other = line('ssh-ed25519', ed25519Blob(), 'y');
      expectReject(`${edLine}\n${other}`, /single line/);
      expectReject(`${edLine}\r\n${other}\r\n`, /single line/);
      expectReject(`ssh-ed25519\n${edBlob.toString('base64')}`, /single line/);
      expectReject(`${edLine}\rmore`, /single line/);
    });

    test('authorized_keys options prefixes', () => {
      expectReject(`no-pty ${edLine}`, /options/);
      expectReject(`command="echo hi" ${edLine}`, /options/);
      expectReject(`from="10.0.0.1",no-agent-forwarding ${edLine}`, /options/);
      expectReject(`restrict,port-forwarding ${line('ssh-rsa', rsaBlob(2048))}`, /options/);
    });

    test('RSA below 2048 bits (hand-built from node keys)', () => {
      expectReject(line('ssh-rsa', rsaBlob(1024)), /^RSA keys must be at least 2048 bits \(this one has 1024\)$/);
      expectReject(line('ssh-rsa', rsaBlob(1536)), /\(this one has 1536\)/);
    });

    test('RSA with a negative, zero or even exponent / modulus', () => {
      const n = Buffer.concat([Buffer.from([0xc1]), Buffer.alloc(255, 0x35)]); // 2048-bit odd
      const e = Buffer.from([0x01, 0x00, 0x01]);
      const ok = Buffer.concat([sshString('ssh-rsa'), sshMpint(e), sshMpint(n)]);
      assert.equal(parseSshPublicKey(line('ssh-rsa', ok)).bits, 2048);
      // modulus without the leading zero byte => negative mpint
      expectReject(line('ssh-rsa', Buffer.concat([sshString('ssh-rsa'), sshMpint(e), sshString(n)])), /negative/);
      expectReject(
        line('ssh-rsa', Buffer.concat([sshString('ssh-rsa'), sshString(Buffer.alloc(0)), sshMpint(n)])),
        /zero/,
      );
      const evenE = Buffer.concat([sshString('ssh-rsa'), sshMpint(Buffer.from([0x01, 0x00, 0x00])), sshMpint(n)]);
      expectReject(line('ssh-rsa', evenE), /exponent/);
      const evenN = Buffer.from(n);
      evenN[evenN.length - 1] = 0x34;
      expectReject(line('ssh-rsa', Buffer.concat([sshString('ssh-rsa'), sshMpint(e), sshMpint(evenN)])), /modulus/);
    });

    test('inner type name differs from the outer one', () => {
      expectReject(line('ssh-rsa', edBlob), /says it is "ssh-rsa" but its data is "ssh-ed25519"/);
      expectReject(line('ssh-ed25519', rsaBlob(2048)), /but its data is "ssh-rsa"/);
      const p384 = blob('ecdsa-sha2-nistp384', 'nistp384', ecPoint('P-384'));
      expectReject(line('ecdsa-sha2-nistp256', p384), /but its data is "ecdsa-sha2-nistp384"/);
      const sk = blob('sk-ssh-ed25519@openssh.com', ed25519Raw(), 'ssh:');
      expectReject(line('ssh-ed25519', sk), /but its data is "sk-ssh-ed25519@openssh.com"/);
      expectReject(line('sk-ssh-ed25519@openssh.com', edBlob), /but its data is "ssh-ed25519"/);
    });

    test('truncated blobs', () => {
      for (const cut of [1, 2, 4, 5, 20, edBlob.length - 1]) {
        expectReject(line('ssh-ed25519', edBlob.subarray(0, cut)), /truncated/);
      }
      const rsa = rsaBlob(2048);
      expectReject(line('ssh-rsa', rsa.subarray(0, rsa.length - 10)), /truncated/);
      expectReject(line('ssh-rsa', sshString('ssh-rsa')), /truncated/);
      const sk = blob('sk-ecdsa-sha2-nistp256@openssh.com', 'nistp256', ecPoint('P-256'));
      expectReject(line('sk-ecdsa-sha2-nistp256@openssh.com', sk), /truncated: missing security key application/);
      expectReject(line('sk-ssh-ed25519@openssh.com', blob('sk-ssh-ed25519@openssh.com', ed25519Raw())), /truncated/);
    });

    test('trailing bytes in the blob', () => {
      expectReject(line('ssh-ed25519', Buffer.concat([edBlob, Buffer.from([0])])), /1 unexpected trailing byte/);
      expectReject(line('ssh-rsa', Buffer.concat([rsaBlob(2048), sshString('extra')])), /trailing/);
      const ec = blob('ecdsa-sha2-nistp256', 'nistp256', ecPoint('P-256'), 'junk');
      expectReject(line('ecdsa-sha2-nistp256', ec), /trailing/);
      const sk = blob('sk-ssh-ed25519@openssh.com', ed25519Raw(), 'ssh:', '');
      expectReject(line('sk-ssh-ed25519@openssh.com', sk), /trailing/);
    });

    test('wrong ed25519 key length', () => {
      expectReject(line('ssh-ed25519', blob('ssh-ed25519', Buffer.alloc(31, 1))), /32 bytes \(got 31\)/);
      expectReject(line('ssh-ed25519', blob('ssh-ed25519', Buffer.alloc(33, 1))), /32 bytes \(got 33\)/);
      expectReject(line('ssh-ed25519', blob('ssh-ed25519', Buffer.alloc(0))), /32 bytes \(got 0\)/);
      expectReject(
        line('sk-ssh-ed25519@openssh.com', blob('sk-ssh-ed25519@openssh.com', Buffer.alloc(64, 1), 'ssh:')),
        /32 bytes/,
      );
    });

    test('ecdsa curve name not matching the type', () => {
      const p256 = ecPoint('P-256');
      expectReject(
        line('ecdsa-sha2-nistp256', blob('ecdsa-sha2-nistp256', 'nistp384', p256)),
        /curve "nistp384" does not match/,
      );
      expectReject(
        line('ecdsa-sha2-nistp384', blob('ecdsa-sha2-nistp384', 'nistp256', ecPoint('P-384'))),
        /does not match/,
      );
      expectReject(line('ecdsa-sha2-nistp256', blob('ecdsa-sha2-nistp256', 'secp256r1', p256)), /does not match/);
      const sk = blob('sk-ecdsa-sha2-nistp256@openssh.com', 'nistp384', p256, 'ssh:');
      expectReject(line('sk-ecdsa-sha2-nistp256@openssh.com', sk), /does not match/);
    });

    test('ecdsa point of wrong length or not in uncompressed form', () => {
      const p256 = ecPoint('P-256');
      expectReject(
        line('ecdsa-sha2-nistp256', blob('ecdsa-sha2-nistp256', 'nistp256', p256.subarray(0, 64))),
        /65 bytes \(got 64\)/,
      );
      expectReject(
        line('ecdsa-sha2-nistp256', blob('ecdsa-sha2-nistp256', 'nistp256', Buffer.concat([p256, Buffer.from([0])]))),
        /65 bytes \(got 66\)/,
      );
      // compressed form: 0x02/0x03 || X
      const compressed = Buffer.concat([Buffer.from([0x02 | (p256[64]! & 1)]), p256.subarray(1, 33)]);
      expectReject(
        line('ecdsa-sha2-nistp256', blob('ecdsa-sha2-nistp256', 'nistp256', compressed)),
        /65 bytes \(got 33\)/,
      );
      const wrongPrefix = Buffer.from(p256);
      wrongPrefix[0] = 0x03;
      expectReject(line('ecdsa-sha2-nistp256', blob('ecdsa-sha2-nistp256', 'nistp256', wrongPrefix)), /uncompressed/);
      // a P-256 point inside a nistp384 key
      expectReject(line('ecdsa-sha2-nistp384', blob('ecdsa-sha2-nistp384', 'nistp384', p256)), /97 bytes \(got 65\)/);
      expectReject(
        line('ecdsa-sha2-nistp521', blob('ecdsa-sha2-nistp521', 'nistp521', ecPoint('P-384'))),
        /133 bytes \(got 97\)/,
      );
      const skShort = blob('sk-ecdsa-sha2-nistp256@openssh.com', 'nistp256', p256.subarray(0, 33), 'ssh:');
      expectReject(line('sk-ecdsa-sha2-nistp256@openssh.com', skShort), /65 bytes/);
    });

    test('ecdsa point not on the curve', () => {
      const p256 = ecPoint('P-256');
      p256[64] = p256[64]! ^ 1;
      expectReject(
        line('ecdsa-sha2-nistp256', blob('ecdsa-sha2-nistp256', 'nistp256', p256)),
        /not on the nistp256 curve/,
      );
    });

    test('invalid or missing base64', () => {
      expectReject('ssh-ed25519', /missing the base64/);
      expectReject('ssh-ed25519   ', /missing the base64/);
      expectReject('ssh-ed25519 AAAA*AAA', /not valid base64/);
      const b64 = edBlob.toString('base64');
      expectReject(`ssh-ed25519 ${b64.slice(0, 24)}-_${b64.slice(26)}`, /not valid base64/); // base64url alphabet
      expectReject(`ssh-ed25519 ${b64.slice(0, -1)}`, /not valid base64/); // bad length
      expectReject(`ssh-ed25519 ${b64}=`, /not valid base64/);
      expectReject('ssh-ed25519 not-a-key comment', /not valid base64/);
    });

    test('security key with empty application', () => {
      const sk = blob('sk-ssh-ed25519@openssh.com', ed25519Raw(), '');
      expectReject(line('sk-ssh-ed25519@openssh.com', sk), /application/);
    });

    test('error messages are SshKeyParseError with readable text', () => {
      try {
        parseSshPublicKey(line('ssh-rsa', rsaBlob(1024)));
        assert.fail('should have thrown');
      } catch (err) {
        assert.ok(err instanceof SshKeyParseError);
        assert.ok(err instanceof Error);
        assert.equal(err.message, 'RSA keys must be at least 2048 bits (this one has 1024)');
      }
    });
  });
});
