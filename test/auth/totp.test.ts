import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash, randomBytes as cryptoRandomBytes } from 'node:crypto';
import {
  base32Decode,
  base32Encode,
  generateRecoveryCodes,
  generateTotpSecret,
  normalizeRecoveryCode,
  otpauthUrl,
  stepAt,
  totpAt,
  verifyTotp,
} from '../../src/modules/auth/totp.js';

const RFC_SECRET = base32Encode(Buffer.from('12345678901234567890', 'ascii'));

/** A deterministic randomness source: SHA-256 of (seed, counter). */
function fakeRandom(seed = 0): (n: number) => Buffer {
  let counter = 0;
  return (n: number) => {
    const chunks: Buffer[] = [];
    let len = 0;
    while (len < n) {
      const h = createHash('sha256').update(`${seed}:${counter++}`).digest();
      chunks.push(h);
      len += h.length;
    }
    return Buffer.concat(chunks).subarray(0, n);
  };
}

describe('base32', () => {
  const vectors: Array<[string, string]> = [
    ['', ''],
    ['f', 'MY'],
    ['fo', 'MZXQ'],
    ['foo', 'MZXW6'],
    ['foob', 'MZXW6YQ'],
    ['fooba', 'MZXW6YTB'],
    ['foobar', 'MZXW6YTBOI'],
  ];

  test('RFC 4648 vectors encode without padding', () => {
    for (const [plain, encoded] of vectors) {
      assert.equal(base32Encode(Buffer.from(plain, 'ascii')), encoded);
    }
  });

  test('RFC 4648 vectors decode, with or without padding, any case', () => {
    const padded: Record<string, string> = {
      f: 'MY======',
      fo: 'MZXQ====',
      foo: 'MZXW6===',
      foob: 'MZXW6YQ=',
      fooba: 'MZXW6YTB',
      foobar: 'MZXW6YTBOI======',
    };
    for (const [plain, encoded] of vectors) {
      assert.equal(base32Decode(encoded).toString('ascii'), plain);
      assert.equal(base32Decode(encoded.toLowerCase()).toString('ascii'), plain);
      const p = padded[plain];
      if (p !== undefined) assert.equal(base32Decode(p).toString('ascii'), plain);
    }
  });

  test('decode ignores spaces', () => {
    assert.equal(base32Decode('mzxw 6ytb oi').toString('ascii'), 'foobar');
    assert.equal(base32Decode(' MZXW6\tYTBOI== ').toString('ascii'), 'foobar');
  });

  test('decode throws on invalid characters', () => {
    assert.throws(() => base32Decode('MZXW1'));
    assert.throws(() => base32Decode('MZXW8'));
    assert.throws(() => base32Decode('MZ-XW'));
    assert.throws(() => base32Decode('ÀBCD'));
  });

  test('round trips random buffers of every length 0..64', () => {
    for (let len = 0; len <= 64; len++) {
      const buf = cryptoRandomBytes(len);
      const enc = base32Encode(buf);
      assert.match(enc, /^[A-Z2-7]*$/);
      assert.equal(enc.length, Math.ceil((len * 8) / 5));
      assert.deepEqual(base32Decode(enc), buf);
    }
  });
});

describe('generateTotpSecret', () => {
  test('is a 20-byte secret, base32 encoded, from the injected source', () => {
    const requested: number[] = [];
    const secret = generateTotpSecret((n) => {
      requested.push(n);
      return Buffer.alloc(n, 0xab);
    });
    assert.deepEqual(requested, [20]);
    assert.equal(secret.length, 32);
    assert.match(secret, /^[A-Z2-7]{32}$/);
    assert.deepEqual(base32Decode(secret), Buffer.alloc(20, 0xab));
  });

  test('different randomness gives different secrets', () => {
    const a = generateTotpSecret(cryptoRandomBytes);
    const b = generateTotpSecret(cryptoRandomBytes);
    assert.notEqual(a, b);
  });
});

describe('RFC 6238 Appendix B (SHA-1), last 6 digits', () => {
  const vectors: Array<[number, string]> = [
    [59, '287082'], // 94287082
    [1111111109, '081804'], // 07081804
    [1111111111, '050471'], // 14050471
    [1234567890, '005924'], // 89005924
    [2000000000, '279037'], // 69279037
    [20000000000, '353130'], // 65353130
  ];

  for (const [seconds, code] of vectors) {
    test(`T=${seconds} -> ${code}`, () => {
      const nowMs = seconds * 1000;
      assert.equal(totpAt(RFC_SECRET, stepAt(nowMs)), code);
      assert.equal(verifyTotp(RFC_SECRET, code, nowMs, null), stepAt(nowMs));
    });
  }

  test('the secret is accepted in lowercase with spaces', () => {
    const spaced = RFC_SECRET.toLowerCase().replace(/(.{4})/g, '$1 ');
    assert.equal(totpAt(spaced, stepAt(59_000)), '287082');
  });
});

describe('stepAt', () => {
  test('is floor(nowMs / 30 s)', () => {
    assert.equal(stepAt(0), 0);
    assert.equal(stepAt(29_999), 0);
    assert.equal(stepAt(30_000), 1);
    assert.equal(stepAt(59_000), 1);
    assert.equal(stepAt(1111111109_000), 37037036);
  });
});

describe('totpAt', () => {
  test('always 6 zero-padded digits', () => {
    for (let step = 0; step < 200; step++) {
      assert.match(totpAt(RFC_SECRET, step), /^[0-9]{6}$/);
    }
  });

  test('rejects invalid steps', () => {
    assert.throws(() => totpAt(RFC_SECRET, -1));
    assert.throws(() => totpAt(RFC_SECRET, 1.5));
    assert.throws(() => totpAt(RFC_SECRET, Number.NaN));
  });
});

describe('verifyTotp', () => {
  const secret = generateTotpSecret(fakeRandom(7));
  const nowMs = 1_700_000_015_000;
  const current = stepAt(nowMs);

  test('accepts the current step and returns it', () => {
    assert.equal(verifyTotp(secret, totpAt(secret, current), nowMs, null), current);
  });

  test('accepts one step of drift in both directions', () => {
    assert.equal(verifyTotp(secret, totpAt(secret, current - 1), nowMs, null), current - 1);
    assert.equal(verifyTotp(secret, totpAt(secret, current + 1), nowMs, null), current + 1);
  });

  test('refuses two steps of drift in either direction', () => {
    const early = totpAt(secret, current - 2);
    const late = totpAt(secret, current + 2);
    // Guard against an (unlikely) collision with an accepted window code.
    for (const c of [early, late]) {
      const inWindow = [current - 1, current, current + 1].some((s) => totpAt(secret, s) === c);
      if (!inWindow) assert.equal(verifyTotp(secret, c, nowMs, null), null);
    }
    assert.equal(verifyTotp(RFC_SECRET, '287082', 59_000 + 2 * 30_000, null), null);
    assert.equal(verifyTotp(RFC_SECRET, '287082', 59_000 + 30_000, null), 1);
    assert.equal(verifyTotp(RFC_SECRET, '287082', 0, null), 1);
  });

  test('refuses replay of the same step (lastUsedStep)', () => {
    const code = totpAt(secret, current);
    const used = verifyTotp(secret, code, nowMs, null);
    assert.equal(used, current);
    assert.equal(verifyTotp(secret, code, nowMs, used), null);
    assert.equal(verifyTotp(secret, code, nowMs + 10_000, used), null);
  });

  test('refuses an earlier step after a later one has been used', () => {
    const used = verifyTotp(secret, totpAt(secret, current + 1), nowMs, null);
    assert.equal(used, current + 1);
    assert.equal(verifyTotp(secret, totpAt(secret, current), nowMs, used), null);
    assert.equal(verifyTotp(secret, totpAt(secret, current - 1), nowMs, used), null);
  });

  test('accepts a later step after an earlier one', () => {
    const used = verifyTotp(secret, totpAt(secret, current - 1), nowMs, null);
    assert.equal(used, current - 1);
    assert.equal(verifyTotp(secret, totpAt(secret, current), nowMs, used), current);
  });

  test('accepts surrounding whitespace', () => {
    assert.equal(verifyTotp(secret, ` ${totpAt(secret, current)}\n`, nowMs, null), current);
  });

  test('refuses malformed codes', () => {
    const good = totpAt(secret, current);
    const malformed = [
      '',
      '      ',
      good.slice(0, 5),
      `${good}0`,
      `0${good}`,
      `${good.slice(0, 3)} ${good.slice(3)}`,
      `${good.slice(0, 3)}-${good.slice(3)}`,
      'abcdef',
      '12345a',
      '+12345',
      '-12345',
      '1e5000',
      '１２３４５６', // full-width digits
      '١٢٣٤٥٦', // Arabic-Indic digits
    ];
    for (const code of malformed) {
      assert.equal(verifyTotp(secret, code, nowMs, null), null, JSON.stringify(code));
    }
  });

  test('refuses a wrong code', () => {
    const window = new Set([current - 1, current, current + 1].map((s) => totpAt(secret, s)));
    let wrong = '000000';
    for (let i = 0; window.has(wrong); i++) wrong = String(i).padStart(6, '0');
    assert.equal(verifyTotp(secret, wrong, nowMs, null), null);
  });

  test('refuses a code for another secret', () => {
    const other = generateTotpSecret(fakeRandom(99));
    const code = totpAt(other, current);
    const window = [current - 1, current, current + 1].map((s) => totpAt(secret, s));
    if (!window.includes(code)) assert.equal(verifyTotp(secret, code, nowMs, null), null);
  });
});

describe('otpauthUrl', () => {
  test('has the expected shape', () => {
    const url = otpauthUrl('JBSWY3DPEHPK3PXP', 'alice+gpu@example.com');
    assert.equal(
      url,
      'otpauth://totp/gpucloud:alice%2Bgpu%40example.com?secret=JBSWY3DPEHPK3PXP&issuer=gpucloud&algorithm=SHA1&digits=6&period=30',
    );
  });

  test('parses back with URL and encodes a custom issuer', () => {
    const url = new URL(otpauthUrl('JBSWY3DPEHPK3PXP', 'bob@example.com', 'GPU Cloud & Co'));
    assert.equal(url.protocol, 'otpauth:');
    assert.equal(url.host, 'totp');
    assert.equal(decodeURIComponent(url.pathname), '/GPU Cloud & Co:bob@example.com');
    assert.equal(url.searchParams.get('secret'), 'JBSWY3DPEHPK3PXP');
    assert.equal(url.searchParams.get('issuer'), 'GPU Cloud & Co');
    assert.equal(url.searchParams.get('algorithm'), 'SHA1');
    assert.equal(url.searchParams.get('digits'), '6');
    assert.equal(url.searchParams.get('period'), '30');
  });
});

describe('recovery codes', () => {
  test('10 distinct codes of the form abcd-efgh-ijkl by default', () => {
    const codes = generateRecoveryCodes(cryptoRandomBytes);
    assert.equal(codes.length, 10);
    assert.equal(new Set(codes).size, 10);
    for (const c of codes) assert.match(c, /^[a-z2-7]{4}-[a-z2-7]{4}-[a-z2-7]{4}$/);
  });

  test('at least 60 bits of entropy: 12 chars from a 32-letter alphabet', () => {
    const codes = generateRecoveryCodes(cryptoRandomBytes, 3);
    assert.equal(codes.length, 3);
    for (const c of codes) {
      const n = normalizeRecoveryCode(c);
      assert.equal(n.length, 12);
      assert.ok(n.length * Math.log2(32) >= 60);
    }
  });

  test('uses the injected randomness deterministically', () => {
    assert.deepEqual(generateRecoveryCodes(fakeRandom(1)), generateRecoveryCodes(fakeRandom(1)));
    assert.notDeepEqual(generateRecoveryCodes(fakeRandom(1)), generateRecoveryCodes(fakeRandom(2)));
    // Byte 0 maps to 'a', byte 31 (and 63, 255...) to '7': only the low 5 bits count.
    assert.deepEqual(
      generateRecoveryCodes((n) => Buffer.alloc(n, 0), 1),
      ['aaaa-aaaa-aaaa'],
    );
    assert.deepEqual(
      generateRecoveryCodes((n) => Buffer.alloc(n, 255), 1),
      ['7777-7777-7777'],
    );
  });

  test('duplicates from the source are replaced; a constant source fails', () => {
    let calls = 0;
    const codes = generateRecoveryCodes((n) => Buffer.alloc(n, calls++ < 2 ? 0 : calls), 3);
    assert.equal(new Set(codes).size, 3);
    assert.throws(() => generateRecoveryCodes((n) => Buffer.alloc(n, 5), 2));
  });

  test('normalizeRecoveryCode lowercases and strips spaces and dashes', () => {
    assert.equal(normalizeRecoveryCode('ABCD-EFGH-IJKL'), 'abcdefghijkl');
    assert.equal(normalizeRecoveryCode('  abcd efgh - ijkl '), 'abcdefghijkl');
    assert.equal(normalizeRecoveryCode('abcdefghijkl'), 'abcdefghijkl');
    for (const c of generateRecoveryCodes(cryptoRandomBytes)) {
      const n = normalizeRecoveryCode(c);
      assert.equal(n, c.replace(/-/g, ''));
      assert.equal(normalizeRecoveryCode(c.toUpperCase().replace(/-/g, ' ')), n);
    }
  });
});
