/**
 * One machine, one command: `gpucloud serve --local-agent` runs the API and
 * a host agent together, registers this host as a node from what the agent
 * found, and rents a real VM on it (system clock, the background loop).
 * The first start gives the agent its options as serve's flags (the names
 * `gpucloud agent` takes: --fake-gpus, --accel, --data-dir, ...); a second
 * start, with the same settings in GPUCLOUD_AGENT_* variables, keeps the
 * node and hands it the new agent token.
 */
import { after, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { readFileSync, rmSync } from 'node:fs';
import { cpus, hostname } from 'node:os';
import { join } from 'node:path';
import { gpuTypeOf, nodeIdFromHostname } from '../../src/local-host-agent.js';
import { genisoimage, qemu, qemuImg } from './qemu-helpers.js';
import { cli, freePort, kill, qemuPidsUnder, ROOT, ssh, testImage, workDir } from './real-vms.js';
import { gpucloudMain } from '../helpers/entry.js';

const ADMIN = { email: 'ops@example.com', password: 'a long admin password' };
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe('node id and GPU type of the local host', () => {
  test('the node id is the host name, made a valid id', () => {
    assert.equal(nodeIdFromHostname('GPU-Box.example.com'), 'gpu-box');
    assert.equal(nodeIdFromHostname('gpu_box 7'), 'gpu-box-7');
    assert.equal(nodeIdFromHostname('---'), 'local');
    assert.equal(nodeIdFromHostname('x'.repeat(80)).length, 63);
  });
  test('the GPU type follows the model, else the setting, else 4090', () => {
    assert.equal(gpuTypeOf(['NVIDIA GeForce RTX 5090'], undefined), '5090');
    assert.equal(gpuTypeOf(['NVIDIA RTX PRO 6000 Blackwell'], undefined), 'pro6000');
    assert.equal(gpuTypeOf(['fake'], 'pro6000'), 'pro6000');
    assert.equal(gpuTypeOf(['fake'], 'h100'), '4090');
  });
});

describe('gpucloud serve --local-agent', { skip: qemu.skip || qemuImg.skip || genisoimage.skip }, () => {
  const dir = workDir('local');
  let server: ChildProcess | undefined;
  after(async () => {
    if (server) await kill(server, 'SIGKILL');
    for (const pid of qemuPidsUnder(dir)) process.kill(pid, 'SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  });

  /** The agent's files: not the default DATA_DIR/agent, so that the flag (or variable) is seen to work. */
  const agentDir = join(dir, 'agent-files');

  const start = async (
    agentPort: number,
    sshFrom: number,
    how: 'flags' | 'variables',
  ): Promise<{ url: string; out: () => string }> => {
    const env: NodeJS.ProcessEnv = { ...process.env };
    for (const k of [
      'DATABASE_URL',
      'GPUCLOUD_REDIS_URL',
      'GPUCLOUD_JWT_SECRET',
      'GPUCLOUD_CLOCK',
      'GPUCLOUD_CLOCK_START',
      'NODE_OPTIONS',
    ])
      delete env[k];
    Object.assign(env, {
      GPUCLOUD_DATA_DIR: join(dir, 'data'),
      PORT: '0',
      LOG_LEVEL: 'silent',
      GPUCLOUD_DEMO: '0',
      GPUCLOUD_ADMIN_EMAIL: ADMIN.email,
      GPUCLOUD_ADMIN_PASSWORD: ADMIN.password,
      GPUCLOUD_AGENT_HEARTBEAT_S: '1',
    });
    const agentOptions = {
      listen: `127.0.0.1:${agentPort}`,
      'ssh-ports': `${sshFrom}-${sshFrom + 4}`,
      accel: 'tcg',
      'fake-gpus': '1',
      'data-dir': agentDir,
    };
    const flags: string[] = [];
    for (const [name, value] of Object.entries(agentOptions)) {
      if (how === 'flags') flags.push(`--${name}`, value);
      else env[`GPUCLOUD_AGENT_${name.toUpperCase().replace('-', '_')}`] = value;
    }
    server = spawn(process.execPath, [gpucloudMain(), 'serve', '--local-agent', ...flags], {
      cwd: ROOT,
      env,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    server.stdout!.on('data', (d) => (out += d));
    server.stderr!.on('data', (d) => (out += d));
    const url = await new Promise<string>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`no banner: ${out}`)), 90_000);
      server!.stdout!.on('data', () => {
        const m = /API:\s+(http:\/\/\S+)/.exec(out);
        if (m && /Local agent:/.test(out)) {
          clearTimeout(timer);
          resolve(m[1]!);
        }
      });
      server!.once('exit', (code) => reject(new Error(`exited ${code}: ${out}`)));
    });
    return { url, out: () => out };
  };

  test("registers this host as a node with the agent's hardware, and rents a real VM on it", async () => {
    qemu.ensure();
    const image = testImage();
    const added = cli(['agent', 'template', 'add', '100', image, '--data-dir', agentDir]);
    assert.equal(added.status, 0, added.stderr);
    const agentPort = await freePort();
    const sshFrom = 24000 + Math.floor(Math.random() * 3000) * 5;
    const s = await start(agentPort, sshFrom, 'flags');
    const node = nodeIdFromHostname(hostname());
    assert.match(s.out(), new RegExp(`Local agent: http://127\\.0\\.0\\.1:${agentPort} \\(node ${node}\\)`));
    assert.ok(s.out().includes(`gpucloud agent template add VMID FILE --data-dir ${agentDir}\n`), s.out());

    const api = async (method: string, path: string, token?: string, body?: unknown) => {
      const r = await fetch(`${s.url}${path}`, {
        method,
        headers: {
          ...(token ? { authorization: `Bearer ${token}` } : {}),
          ...(body ? { 'content-type': 'application/json' } : {}),
        },
        body: body ? JSON.stringify(body) : undefined,
      });
      const text = await r.text();
      return { status: r.status, body: text ? JSON.parse(text) : undefined };
    };
    const login = await api('POST', '/auth/login', undefined, ADMIN);
    assert.equal(login.status, 200);
    const token = login.body.access_token as string;
    const n = await api('GET', `/admin/nodes/${node}`, token);
    assert.equal(n.status, 200, JSON.stringify(n.body));
    assert.equal(n.body.agent_status, 'online');
    assert.equal(n.body.agent_url, `http://127.0.0.1:${agentPort}`);
    assert.equal(n.body.gpu_count, 1);
    assert.equal(n.body.cpu_cores, cpus().length);
    assert.equal(n.body.accel, 'tcg');
    assert.equal(n.body.location, 'local');

    // The operator rents from their own machine: credit, a key, a VM, SSH.
    const me = await api('GET', '/account', token);
    assert.equal(
      (await api('POST', `/admin/users/${me.body.id}/credits`, token, { amount: 10, description: 'own use' })).status,
      201,
    );
    const keyFile = join(dir, 'id');
    execFileSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-f', keyFile]);
    assert.equal(
      (await api('POST', '/ssh-keys', token, { ssh_public_key: readFileSync(`${keyFile}.pub`, 'utf8') })).status,
      201,
    );
    const c = await api('POST', '/vms', token, {
      node,
      gpu_type: n.body.gpu_type,
      gpu_count: 1,
      storage_gb: 50,
      template_vmid: 100,
    });
    assert.equal(c.status, 201, JSON.stringify(c.body));
    let status = '';
    for (let i = 0; i < 240 && status !== 'running'; i++) {
      await sleep(500);
      status = (await api('GET', `/vms/${c.body.id}`, token)).body.status;
      assert.ok(!['failed', 'stopped'].includes(status), `the VM ${status}`);
    }
    assert.equal(status, 'running');
    const info = (await api('GET', `/vms/${c.body.id}/access-info`, token)).body.ssh;
    const r = ssh(info.command, 'hostname', { key: keyFile });
    assert.equal(r.status, 0, r.stderr);
    assert.equal(r.stdout.trim(), `gpucloud-${c.body.vmid}`);
    assert.equal((await api('DELETE', `/vms/${c.body.id}`, token)).status, 200);
    for (let i = 0; i < 60 && status !== 'destroyed'; i++) {
      await sleep(500);
      status = (await api('GET', `/vms/${c.body.id}`, token)).body.status;
    }
    assert.equal(status, 'destroyed');
    // Destroyed at once in the API; the host's work follows within a pass or two.
    for (let i = 0; i < 60 && qemuPidsUnder(dir).length > 0; i++) await sleep(500);
    assert.deepEqual(qemuPidsUnder(dir), [], 'no QEMU left');

    // A second start: the same node, with this start's token.
    await kill(server!, 'SIGTERM');
    const again = await start(agentPort, sshFrom, 'variables');
    assert.ok(again.out().includes(`--data-dir ${agentDir}\n`), again.out());
    const login2 = await fetch(`${again.url}/auth/login`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(ADMIN),
    });
    const token2 = ((await login2.json()) as { access_token: string }).access_token;
    const nodes = (await (
      await fetch(`${again.url}/admin/nodes`, { headers: { authorization: `Bearer ${token2}` } })
    ).json()) as { node: string; agent_status: string }[];
    assert.deepEqual(
      nodes.map((x) => [x.node, x.agent_status]),
      [[node, 'online']],
    );
    await kill(server!, 'SIGTERM');
    server = undefined;
  });
});
