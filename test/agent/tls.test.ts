/**
 * The agent over TLS (--tls-cert/--tls-key): it serves https only, and the
 * control plane trusts a private certificate the documented way
 * (NODE_EXTRA_CA_CERTS); an untrusted certificate is refused.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile, execFileSync } from 'node:child_process';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { startAgent, type RunningAgent } from '../../src/host-agent/main.js';
import { parseAgentOptions } from '../../src/host-agent/options.js';
import { qemu } from './qemu-helpers.js';
import { workDir } from './real-vms.js';

const TOKEN = 'tls-agent-token-'.padEnd(40, 't');

/** GET /v1/host from another process, as the control plane would, with this environment. */
function fetchHost(url: string, env: Record<string, string>): Promise<string> {
  const script = `fetch(process.argv[1] + '/v1/host', { headers: { authorization: 'Bearer ${TOKEN}' } })
    .then((r) => r.json()).then((j) => console.log('ok', j.accel), (e) => console.log('error', e.cause?.code ?? e.message))`;
  return new Promise((resolve) =>
    execFile(process.execPath, ['-e', script, url], { env: { ...process.env, ...env } }, (_e, out) =>
      resolve(out.trim()),
    ),
  );
}

describe('agent over TLS', { skip: qemu.skip }, () => {
  let dir: string;
  let agent: RunningAgent;
  before(async () => {
    dir = workDir('tls');
    execFileSync(
      'openssl',
      [
        'req',
        '-x509',
        '-newkey',
        'ec',
        '-pkeyopt',
        'ec_paramgen_curve:prime256v1',
        '-nodes',
        '-days',
        '2',
        '-subj',
        '/CN=127.0.0.1',
        '-addext',
        'subjectAltName=IP:127.0.0.1',
        '-keyout',
        join(dir, 'key.pem'),
        '-out',
        join(dir, 'cert.pem'),
      ],
      { stdio: 'ignore' },
    );
    const options = parseAgentOptions(
      [
        '--listen',
        '127.0.0.1:0',
        '--data-dir',
        join(dir, 'a'),
        '--token',
        TOKEN,
        '--accel',
        'tcg',
        '--fake-gpus',
        '1',
        '--tls-cert',
        join(dir, 'cert.pem'),
        '--tls-key',
        join(dir, 'key.pem'),
      ],
      {},
    );
    agent = await startAgent(options, false);
  });
  after(async () => {
    await agent?.close();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  test('serves https; a client trusting the certificate gets through, others do not, plain http gets nothing', async () => {
    assert.match(agent.url, /^https:\/\/127\.0\.0\.1:\d+$/);
    assert.equal(await fetchHost(agent.url, { NODE_EXTRA_CA_CERTS: join(dir, 'cert.pem') }), 'ok tcg');
    assert.equal(await fetchHost(agent.url, {}), 'error DEPTH_ZERO_SELF_SIGNED_CERT');
    assert.match(await fetchHost(agent.url.replace('https:', 'http:'), {}), /^error/);
  });
});
