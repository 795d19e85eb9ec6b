/**
 * `gpucloud agent` options: defaults, flags over environment variables, and
 * every refusal naming the option (the agent does not start without a token).
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { resolve } from 'node:path';
import { AgentOptionError, parseAgentOptions } from '../../src/host-agent/options.js';
import { cli } from './real-vms.js';

const TOKEN = 't'.repeat(32);

describe('gpucloud agent options', () => {
  test('defaults', () => {
    const o = parseAgentOptions([], { GPUCLOUD_AGENT_TOKEN: TOKEN });
    assert.deepEqual(o, {
      listenHost: '127.0.0.1',
      listenPort: 7070,
      dataDir: resolve('./agent-data'),
      token: TOKEN,
      publicHost: '127.0.0.1',
      sshPorts: { from: 22000, to: 22999 },
      accel: 'auto',
      fakeGpus: 0,
      tls: null,
      network: 'user',
      vmSubnet: '10.88.0.0/16',
      downloadLimitMbps: null,
    });
  });

  test('every option from its variable; a flag wins over the variable', () => {
    const env = {
      GPUCLOUD_AGENT_LISTEN: '0.0.0.0:7171',
      GPUCLOUD_AGENT_DATA_DIR: '/var/lib/gc',
      GPUCLOUD_AGENT_TOKEN: TOKEN,
      GPUCLOUD_AGENT_PUBLIC_HOST: 'gpu7.example.com',
      GPUCLOUD_AGENT_SSH_PORTS: '30000-30099',
      GPUCLOUD_AGENT_ACCEL: 'tcg',
      GPUCLOUD_AGENT_FAKE_GPUS: '4',
    };
    const o = parseAgentOptions([], env);
    assert.deepEqual(
      [o.listenHost, o.listenPort, o.dataDir, o.publicHost, o.sshPorts, o.accel, o.fakeGpus],
      ['0.0.0.0', 7171, '/var/lib/gc', 'gpu7.example.com', { from: 30000, to: 30099 }, 'tcg', 4],
    );
    const f = parseAgentOptions(
      ['--listen', '[::1]:8000', '--accel', 'kvm', '--fake-gpus', '0', '--token', 'u'.repeat(40)],
      env,
    );
    assert.deepEqual(
      [f.listenHost, f.listenPort, f.accel, f.fakeGpus, f.token, f.publicHost],
      ['::1', 8000, 'kvm', 0, 'u'.repeat(40), 'gpu7.example.com'],
    );
    // Listening on every address: the public host defaults to loopback, not 0.0.0.0.
    assert.equal(parseAgentOptions(['--listen', '0.0.0.0:7070', '--token', TOKEN], {}).publicHost, '127.0.0.1');
  });

  test('the download limit: megabytes a second from its variable or flag, unlimited by default', () => {
    const env = { GPUCLOUD_AGENT_TOKEN: TOKEN, GPUCLOUD_AGENT_DOWNLOAD_LIMIT_MBPS: '50' };
    assert.equal(parseAgentOptions([], env).downloadLimitMbps, 50);
    assert.equal(parseAgentOptions(['--download-limit', '2.5'], env).downloadLimitMbps, 2.5);
    assert.equal(parseAgentOptions([], { GPUCLOUD_AGENT_TOKEN: TOKEN }).downloadLimitMbps, null);
  });

  const refusals: [string, string[], Record<string, string>, RegExp][] = [
    ['no token', [], {}, /--token: is required/],
    ['a short token', ['--token', 'x'.repeat(31)], {}, /--token: must be at least 32/],
    [
      'a short token from the environment',
      [],
      { GPUCLOUD_AGENT_TOKEN: 'short' },
      /GPUCLOUD_AGENT_TOKEN: must be at least 32/,
    ],
    ['a token with a space', ['--token', `${'x'.repeat(32)} y`], {}, /printable ASCII/],
    [
      'listen without a port',
      ['--listen', '127.0.0.1'],
      { GPUCLOUD_AGENT_TOKEN: TOKEN },
      /--listen: .* must be HOST:PORT/,
    ],
    [
      'listen on a bad port',
      ['--listen', '127.0.0.1:70000'],
      { GPUCLOUD_AGENT_TOKEN: TOKEN },
      /--listen: .*not a port/,
    ],
    ['listen on a bad host', ['--listen', 'bad host:7070'], { GPUCLOUD_AGENT_TOKEN: TOKEN }, /--listen: .*not a host/],
    [
      'a public host with a path',
      ['--public-host', 'h/x'],
      { GPUCLOUD_AGENT_TOKEN: TOKEN },
      /--public-host: .*not a host/,
    ],
    ['ssh ports not a range', ['--ssh-ports', '22000'], { GPUCLOUD_AGENT_TOKEN: TOKEN }, /--ssh-ports: .*FROM-TO/],
    ['ssh ports backwards', ['--ssh-ports', '23000-22000'], { GPUCLOUD_AGENT_TOKEN: TOKEN }, /ends before it starts/],
    [
      'ssh ports below 1024',
      ['--ssh-ports', '22-80'],
      { GPUCLOUD_AGENT_TOKEN: TOKEN },
      /--ssh-ports: .*not a port \(1024-65535\)/,
    ],
    [
      "ssh ports holding the agent's own port",
      ['--ssh-ports', '7000-7100'],
      { GPUCLOUD_AGENT_TOKEN: TOKEN },
      /agent's own port 7070/,
    ],
    [
      'an unknown accelerator',
      ['--accel', 'hvf'],
      { GPUCLOUD_AGENT_TOKEN: TOKEN },
      /--accel: must be kvm, tcg or auto/,
    ],
    [
      'fake GPUs not a number',
      ['--fake-gpus', 'two'],
      { GPUCLOUD_AGENT_TOKEN: TOKEN },
      /--fake-gpus: must be a number/,
    ],
    [
      'too many fake GPUs',
      [],
      { GPUCLOUD_AGENT_TOKEN: TOKEN, GPUCLOUD_AGENT_FAKE_GPUS: '65' },
      /GPUCLOUD_AGENT_FAKE_GPUS/,
    ],
    [
      'a certificate without a key',
      ['--tls-cert', '/etc/hostname'],
      { GPUCLOUD_AGENT_TOKEN: TOKEN },
      /--tls-key: TLS needs both/,
    ],
    [
      'a missing certificate file',
      ['--tls-cert', '/nonexistent.pem', '--tls-key', '/nonexistent.key'],
      { GPUCLOUD_AGENT_TOKEN: TOKEN },
      /does not exist/,
    ],
    [
      'an unknown network',
      ['--network', 'macvtap'],
      { GPUCLOUD_AGENT_TOKEN: TOKEN },
      /--network: must be user or bridge/,
    ],
    [
      'a subnet that is not one',
      ['--vm-subnet', '10.88.0.1/16'],
      { GPUCLOUD_AGENT_TOKEN: TOKEN },
      /--vm-subnet: .*not the start of a \/16/,
    ],
    [
      'a subnet too large',
      [],
      { GPUCLOUD_AGENT_TOKEN: TOKEN, GPUCLOUD_AGENT_VM_SUBNET: '10.0.0.0/8' },
      /GPUCLOUD_AGENT_VM_SUBNET: .*\/16 to \/28/,
    ],
    [
      'a download limit that is not a number',
      ['--download-limit', '10MB'],
      { GPUCLOUD_AGENT_TOKEN: TOKEN },
      /--download-limit: must be megabytes a second/,
    ],
    [
      'a download limit of 0',
      [],
      { GPUCLOUD_AGENT_TOKEN: TOKEN, GPUCLOUD_AGENT_DOWNLOAD_LIMIT_MBPS: '0' },
      /GPUCLOUD_AGENT_DOWNLOAD_LIMIT_MBPS: must be megabytes a second/,
    ],
    ['a stray argument', ['serve'], { GPUCLOUD_AGENT_TOKEN: TOKEN }, /unexpected argument "serve"/],
  ];
  for (const [name, args, env, message] of refusals) {
    test(`refused: ${name}`, () => {
      assert.throws(
        () => parseAgentOptions(args, env),
        (err: unknown) => {
          assert.ok(err instanceof AgentOptionError, String(err));
          assert.match(err.message, message);
          return true;
        },
      );
    });
  }

  test('the command refuses to start without a token, exit 2, naming the option; --help lists every option', () => {
    const env = { GPUCLOUD_AGENT_TOKEN: '' };
    const r = cli(['agent', '--listen', '127.0.0.1:0'], env);
    assert.equal(r.status, 2, r.stdout + r.stderr);
    assert.match(r.stderr, /--token: is required/);
    const help = cli(['agent', '--help']);
    assert.equal(help.status, 0);
    for (const o of [
      '--listen',
      '--data-dir',
      '--token',
      '--public-host',
      '--ssh-ports',
      '--accel',
      '--fake-gpus',
      '--network',
      '--vm-subnet',
      '--tls-cert',
      '--download-limit',
      'template add',
    ])
      assert.ok(help.stdout.includes(o), o);
    const bad = cli(['agent', 'template', 'add', 'x', '/nonexistent']);
    assert.equal(bad.status, 2);
    assert.match(bad.stderr, /VMID must be a positive whole number/);
  });
});
