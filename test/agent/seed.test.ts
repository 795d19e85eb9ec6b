/**
 * The NoCloud seed: the exact cloud-config for key and password VMs (root and
 * other users), every rejected input, SHA-512 crypt checked against openssl
 * (and mkpasswd when installed), the ISO genisoimage builds, and what the
 * agent writes checked by Debian's cloud-init itself: `cloud-init schema`
 * validates the user-data, its network-config parser reads the bridge
 * network-config (skipped without cloud-init, unless GPUCLOUD_REQUIRE_QEMU=1).
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  bootMarker,
  hashPassword,
  metaData,
  networkConfig,
  normalizeSshKey,
  sha512Crypt,
  userData,
  writeSeed,
  type SeedSpec,
} from '../../src/host-agent/images/seed.js';
import { qemuAvailable } from '../../src/host-agent/qemu/process.js';
import { genisoimage } from './qemu-helpers.js';

const ED = 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAILnnq+zFTLggbcn99O1oJgcyxe0baNT7b4KOwoBiIJCc';
const EC =
  'ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBGQaLRWhXXAjvU22Ss6sM8Q0YKy5FOiKhXCkwBsVGH7kmud1FpPfy+OQSAduvp7T2udtgM73Ln/p9Uy97liNZXY=';
const HASH = '$6$saltstring$svn8UoSVapNtMuq1ukKS4tPQd8iKwSMHWjl/O817G3uBnIFNjnQJuesI68u4OTLiBFdcbYEdFCoEOfaS35inz1';

const keyVm: SeedSpec = {
  instanceId: '8d7c6b5a-4f3e-4d2c-9b1a-0f9e8d7c6b5a',
  hostname: 'gpucloud-123',
  user: 'root',
  authMethod: 'ssh_key',
  sshPublicKeys: [`${ED} alice@laptop`, `  ${EC}   bob key\n`, ED],
  passwordHash: null,
};
const pwVm: SeedSpec = { ...keyVm, authMethod: 'password', sshPublicKeys: [], passwordHash: HASH };

const FINAL = `final_message: "[gpucloud-ready ${keyVm.instanceId}] cloud-init finished after $uptime s"`;
const USER_LINES = [
  '    shell: /bin/bash',
  '    sudo: "ALL=(ALL) NOPASSWD:ALL"',
  '    groups: [adm, audio, cdrom, dialout, dip, floppy, plugdev, sudo, video]',
];

describe('userData / metaData', () => {
  test('key VM as root: exact cloud-config, comments and duplicates dropped, no sudo, shell or groups', () => {
    assert.equal(
      userData(keyVm),
      [
        '#cloud-config',
        'hostname: gpucloud-123',
        'manage_etc_hosts: localhost',
        'disable_root: false',
        'ssh_pwauth: false',
        'users:',
        '  - name: root',
        '    lock_passwd: true',
        '    ssh_authorized_keys:',
        `      - "${ED}"`,
        `      - "${EC}"`,
        FINAL,
        '',
      ].join('\n'),
    );
  });

  test('key VM with another user: bash, passwordless sudo and the default user groups', () => {
    assert.equal(
      userData({ ...keyVm, user: 'debian', sshPublicKeys: [ED] }),
      [
        '#cloud-config',
        'hostname: gpucloud-123',
        'manage_etc_hosts: localhost',
        'disable_root: false',
        'ssh_pwauth: false',
        'users:',
        '  - name: debian',
        '    lock_passwd: true',
        ...USER_LINES,
        '    ssh_authorized_keys:',
        `      - "${ED}"`,
        FINAL,
        '',
      ].join('\n'),
    );
  });

  test('password VM: exact cloud-config', () => {
    assert.equal(
      userData({ ...pwVm, user: 'ubuntu' }),
      [
        '#cloud-config',
        'hostname: gpucloud-123',
        'manage_etc_hosts: localhost',
        'disable_root: false',
        'ssh_pwauth: true',
        'users:',
        '  - name: ubuntu',
        '    lock_passwd: false',
        ...USER_LINES,
        `    hashed_passwd: "${HASH}"`,
        FINAL,
        '',
      ].join('\n'),
    );
  });

  test("password VM as root: sshd's drop-in lets root log in with the password", () => {
    assert.equal(
      userData(pwVm),
      [
        '#cloud-config',
        'hostname: gpucloud-123',
        'manage_etc_hosts: localhost',
        'disable_root: false',
        'ssh_pwauth: true',
        'users:',
        '  - name: root',
        '    lock_passwd: false',
        `    hashed_passwd: "${HASH}"`,
        'write_files:',
        '  - path: /etc/ssh/sshd_config.d/01-gpucloud-root-login.conf',
        '    content: "PermitRootLogin yes\\n"',
        '    owner: "root:root"',
        '    permissions: "0644"',
        FINAL,
        '',
      ].join('\n'),
    );
  });

  test('the final message starts with the boot marker of the instance', () => {
    assert.equal(bootMarker(keyVm.instanceId), `[gpucloud-ready ${keyVm.instanceId}]`);
    assert.ok(FINAL.includes(bootMarker(keyVm.instanceId)));
  });

  test('meta-data', () => {
    assert.equal(metaData(keyVm), 'instance-id: 8d7c6b5a-4f3e-4d2c-9b1a-0f9e8d7c6b5a\nlocal-hostname: gpucloud-123\n');
  });

  const rejected: Array<[string, Partial<SeedSpec> & Record<string, unknown>]> = [
    ['user upper case', { user: 'Root' }],
    ['user starting with a digit', { user: '1abc' }],
    ['user too long', { user: 'a'.repeat(33) }],
    ['user with colon', { user: 'a:b' }],
    ['user YAML boolean', { user: 'no' }],
    ['user YAML null', { user: 'null' }],
    ['hostname upper case', { hostname: 'GPU' }],
    ['hostname with dot', { hostname: 'a.b' }],
    ['hostname too long', { hostname: 'a'.repeat(64) }],
    ['hostname empty', { hostname: '' }],
    ['hostname leading hyphen', { hostname: '-abc' }],
    ['hostname trailing hyphen', { hostname: 'abc-' }],
    ['hostname YAML integer', { hostname: '123' }],
    ['hostname YAML hex', { hostname: '0x1f' }],
    ['hostname YAML boolean', { hostname: 'off' }],
    ['hostname YAML date', { hostname: '2024-01-02' }],
    ['instanceId empty', { instanceId: '' }],
    ['instanceId with space', { instanceId: 'a b' }],
    ['instanceId with newline', { instanceId: 'a\nhostname: x' }],
    ['instanceId YAML float', { instanceId: '1.5' }],
    ['key with options', { sshPublicKeys: [`command="sh" ${ED}`] }],
    ['key of unknown type', { sshPublicKeys: ['ssh-dss AAAAB3NzaC1kc3MAAACBAP'] }],
    ['key with quote', { sshPublicKeys: ['ssh-ed25519 AAAA"AAAA'] }],
    ['key on two lines', { sshPublicKeys: [`${ED}\n${EC}`] }],
    ['key claiming another type', { sshPublicKeys: [`ssh-rsa ${ED.split(' ')[1]}`] }],
    ['key blob not a key', { sshPublicKeys: ['ssh-ed25519 AAAA'] }],
    ['key not a string', { sshPublicKeys: [42 as unknown as string] }],
    ['keys not an array', { sshPublicKeys: ED as unknown as string[] }],
    ['too many keys', { sshPublicKeys: Array<string>(101).fill(ED) }],
    ['key VM without keys', { sshPublicKeys: [] }],
    ['key VM with a password hash', { passwordHash: HASH }],
    ['unknown auth method', { authMethod: 'both' as SeedSpec['authMethod'] }],
  ];
  for (const [what, patch] of rejected) {
    test(`rejects: ${what}`, () => {
      assert.throws(() => userData({ ...keyVm, ...patch } as SeedSpec), TypeError);
      assert.throws(() => metaData({ ...keyVm, ...patch } as SeedSpec), TypeError);
    });
  }
  const rejectedPw: Array<[string, Partial<SeedSpec>]> = [
    ['password VM without hash', { passwordHash: null }],
    ['password VM with keys', { sshPublicKeys: [ED] }],
    ['MD5 hash', { passwordHash: '$1$saltsalt$qjXMvbEw8oaL.CzflDugX/' }],
    ['hash with rounds', { passwordHash: HASH.replace('$6$', '$6$rounds=5000$') }],
    ['hash with quote', { passwordHash: HASH.slice(0, -1) + '"' }],
    ['hash too short', { passwordHash: HASH.slice(0, -1) }],
  ];
  for (const [what, patch] of rejectedPw) {
    test(`rejects: ${what}`, () => assert.throws(() => userData({ ...pwVm, ...patch }), TypeError));
  }

  test('normalizeSshKey keeps type and blob', () => {
    assert.equal(normalizeSshKey(`${EC} bob key`), EC);
    assert.equal(normalizeSshKey(`\t${ED}\t`), ED);
  });
});

describe('SHA-512 crypt', () => {
  const passwords = [
    'Hello world!',
    'password',
    'a',
    'twelve-chars',
    'pässwörd 🔑 日本語パスワード',
    'x'.repeat(63) + 'y',
    'z'.repeat(65),
    'Long password with spaces, symbols !@#$%^&*() and more '.repeat(4).slice(0, 200),
  ];
  const salts = ['saltstring', 'abcdefghijklmnop', 'a', './Z9'];

  test('the reference vector from the specification', () => {
    assert.equal(sha512Crypt('Hello world!', 'saltstring'), HASH);
    assert.equal(passwords[3]!.length, 12);
    assert.equal(passwords[7]!.length, 200);
  });

  test('matches openssl passwd -6', () => {
    let checked = 0;
    for (const pw of passwords) {
      for (const salt of salts) {
        const r = spawnSync('openssl', ['passwd', '-6', '-salt', salt, pw], { encoding: 'utf8' });
        assert.equal(r.status, 0, r.stderr);
        assert.equal(sha512Crypt(pw, salt), r.stdout.trim(), `${JSON.stringify(pw)} / ${salt}`);
        checked++;
      }
    }
    assert.equal(checked, passwords.length * salts.length);
  });

  test(
    'matches mkpasswd (glibc crypt)',
    { skip: qemuAvailable('mkpasswd') ? false : 'mkpasswd not found: apt-get install whois' },
    () => {
      for (const pw of passwords) {
        for (const salt of ['saltstring', 'abcdefghijklmnop', 'ABCDEFGH']) {
          const r = spawnSync('mkpasswd', ['-m', 'sha-512', '-S', salt, pw], { encoding: 'utf8' });
          assert.equal(r.status, 0, r.stderr);
          assert.equal(sha512Crypt(pw, salt), r.stdout.trim(), `${JSON.stringify(pw)} / ${salt}`);
        }
      }
    },
  );

  test('hashPassword: fresh 16-char salts, verifiable, accepted by userData', async () => {
    const a = await hashPassword('correct horse');
    const b = await hashPassword('correct horse');
    assert.notEqual(a, b);
    for (const h of [a, b]) {
      const m = /^\$6\$([./0-9A-Za-z]{16})\$[./0-9A-Za-z]{86}$/.exec(h);
      assert.ok(m, h);
      assert.equal(sha512Crypt('correct horse', m[1]!), h);
      const r = spawnSync('openssl', ['passwd', '-6', '-salt', m[1]!, 'correct horse'], { encoding: 'utf8' });
      assert.equal(r.stdout.trim(), h);
      assert.match(userData({ ...pwVm, passwordHash: h }), /hashed_passwd: "\$6\$/);
    }
  });

  test('refuses empty, NUL and over-long passwords and bad salts', async () => {
    await assert.rejects(hashPassword(''), TypeError);
    await assert.rejects(hashPassword('a\0b'), TypeError);
    await assert.rejects(hashPassword('x'.repeat(1025)), TypeError);
    assert.ok(sha512Crypt('x'.repeat(1024), 'salt'));
    assert.throws(() => sha512Crypt('pw', ''), TypeError);
    assert.throws(() => sha512Crypt('pw', 'a'.repeat(17)), TypeError);
    assert.throws(() => sha512Crypt('pw', 'sa$lt'), TypeError);
  });
});

describe('writeSeed', { skip: genisoimage.skip }, () => {
  let dir: string;
  before(() => {
    genisoimage.ensure();
    dir = mkdtempSync(join(tmpdir(), 'gc-seed-'));
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  test('a cidata ISO with user-data and meta-data, private files', async () => {
    const iso = await writeSeed(dir, pwVm);
    assert.equal(iso, join(dir, 'seed.iso'));
    assert.equal(readFileSync(join(dir, 'user-data'), 'utf8'), userData(pwVm));
    assert.equal(readFileSync(join(dir, 'meta-data'), 'utf8'), metaData(pwVm));
    for (const f of ['user-data', 'meta-data', 'seed.iso']) assert.equal(statSync(join(dir, f)).mode & 0o777, 0o600, f);
    const bytes = readFileSync(iso);
    // Primary volume descriptor at sector 16; the volume id starts at byte 40 of it.
    assert.equal(bytes.subarray(0x8001, 0x8006).toString('latin1'), 'CD001');
    assert.equal(
      bytes
        .subarray(0x8028, 0x8028 + 32)
        .toString('latin1')
        .trimEnd(),
      'cidata',
    );
    const text = bytes.toString('latin1');
    assert.ok(text.includes(userData(pwVm)), 'user-data inside');
    assert.ok(text.includes(metaData(pwVm)), 'meta-data inside');
    assert.ok(text.includes('user-data') && text.includes('meta-data'), 'Rock Ridge names');
  });

  test('rewriting replaces the ISO; invalid specs write nothing', async () => {
    const iso = await writeSeed(dir, keyVm);
    assert.ok(readFileSync(iso).toString('latin1').includes(userData(keyVm)));
    const fresh = mkdtempSync(join(dir, 'x-'));
    await assert.rejects(writeSeed(fresh, { ...keyVm, hostname: 'BAD' }), TypeError);
    assert.throws(() => statSync(join(fresh, 'user-data')));
  });

  test('a missing genisoimage rejects with the package name', async () => {
    await assert.rejects(
      writeSeed(dir, keyVm, { binary: 'no-such-genisoimage' }),
      /not found \(Debian package genisoimage\)/,
    );
  });
});

// Debian's cloud-init validates what the agent writes, offline. Without it the tests skip, unless
// GPUCLOUD_REQUIRE_QEMU=1 (CI installs it): then they fail.
const cloudInitMissing = qemuAvailable('cloud-init') ? false : 'cloud-init not found: apt-get install cloud-init';
const requireTools = process.env.GPUCLOUD_REQUIRE_QEMU === '1';

describe("cloud-init's own checks of the seed", { skip: requireTools ? false : cloudInitMissing }, () => {
  let dir: string;
  let python: string;
  before(() => {
    if (cloudInitMissing) throw new Error(`GPUCLOUD_REQUIRE_QEMU=1 but ${cloudInitMissing}`);
    dir = mkdtempSync(join(tmpdir(), 'gc-schema-'));
    // cloud-init's Python, for its network-config parser.
    const which = spawnSync('sh', ['-c', 'command -v cloud-init'], { encoding: 'utf8' }).stdout.trim();
    python = /^#!\s*(\S+)/.exec(readFileSync(which, 'utf8'))?.[1] ?? 'python3';
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  /** `cloud-init schema -c FILE` (plus args): status and output. */
  const schema = (text: string, args: string[] = []) => {
    const file = join(dir, `f-${Math.random().toString(36).slice(2)}`);
    writeFileSync(file, text);
    const r = spawnSync('cloud-init', ['schema', ...args, '-c', file], { encoding: 'utf8' });
    return { status: r.status, out: `${r.stdout}${r.stderr}` };
  };
  const valid = (what: string, text: string) => {
    const r = schema(text);
    assert.equal(r.status, 0, `${what}: ${r.out}`);
    assert.match(r.out, /Valid cloud-config/, what);
    assert.doesNotMatch(r.out, /deprecations: \S/i, `${what}: nothing deprecated`);
  };

  test('the user-data of every kind of VM is valid cloud-config, with nothing deprecated', () => {
    valid('key VM, root', userData(keyVm));
    valid('key VM, another user', userData({ ...keyVm, user: 'debian' }));
    valid('password VM, another user', userData({ ...pwVm, user: 'ubuntu' }));
    valid('password VM, root', userData(pwVm));
  });

  test('the check itself refuses a wrong type', () => {
    const broken = userData({ ...keyVm, user: 'debian' }).replace('lock_passwd: true', 'lock_passwd: [1]');
    const r = schema(broken);
    assert.notEqual(r.status, 0, r.out);
  });

  test("the bridge network-config: read by cloud-init's parser (and its schema where it has one)", () => {
    const text = networkConfig({
      mac: '52:54:00:0a:58:05',
      address: '10.88.0.5/16',
      gateway: '10.88.0.1',
      nameservers: ['1.1.1.1', '9.9.9.9'],
    });
    const file = join(dir, 'network-config');
    writeFileSync(file, text);
    // Newer cloud-init validates network-config too; Debian 12's (22.4) has no --schema-type.
    const help = spawnSync('cloud-init', ['schema', '--help'], { encoding: 'utf8' }).stdout;
    if (help.includes('--schema-type')) {
      const r = schema(text, ['--schema-type', 'network-config']);
      assert.equal(r.status, 0, r.out);
    }
    // What a distro without netplan does with it: cloud-init's network state, rendered for systemd-networkd.
    const script = [
      'import sys, yaml',
      'from cloudinit.net.network_state import parse_net_config_data',
      'from cloudinit.net import networkd',
      'state = parse_net_config_data(yaml.safe_load(open(sys.argv[1])), skip_broken=False)',
      'for name, text in networkd.Renderer({})._render_content(state).items(): print(name); print(text)',
    ].join('\n');
    const r = spawnSync(python, ['-c', script, file], { encoding: 'utf8' });
    assert.equal(r.status, 0, r.stderr);
    for (const want of [
      /^eth0$/m,
      /^MACAddress=52:54:00:0a:58:05$/m,
      /^Address=10\.88\.0\.5\/16$/m,
      /^Destination=0\.0\.0\.0\/0$/m,
      /^Gateway=10\.88\.0\.1$/m,
      /^DNS=1\.1\.1\.1 9\.9\.9\.9$/m,
    ])
      assert.match(r.stdout, want);
  });
});
