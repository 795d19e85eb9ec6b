/**
 * Bridge networking, for real, on a host of the test's own: a network
 * namespace joined to this one by a veth pair, with the agent inside it
 * (`--network bridge`: a tap per VM on bridge gcbr0, a static address from
 * the seed, the SSH port forwarded by nftables). SSH from outside reaches the
 * guest through the public host's port; what the guest receives is counted on
 * its tap and reaches the VM's network_bytes; destroy removes the tap and the
 * forward.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { randomInt } from 'node:crypto';
import { readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { buildTestApp, type TestApp } from '../helpers/app.js';
import { api } from '../helpers/api.js';
import { DB_KINDS } from '../helpers/db.js';
import { advance, createNode, createUser, credit, type TestUser } from '../helpers/factories.js';
import { genisoimage, qemu, qemuImg } from './qemu-helpers.js';
import { cli, kill, qemuPidsUnder, ssh, startAgentProcess, testImage, workDir, type AgentProcess } from './real-vms.js';

const TOKEN = 'bridge-agent-token-'.padEnd(48, 'b');
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const has = (bin: string) => spawnSync('sh', ['-c', `command -v ${bin}`]).status === 0;
const root = process.getuid?.() === 0;
const required = process.env.GPUCLOUD_REQUIRE_QEMU === '1';
const missing = !root
  ? 'needs root (network namespaces, a bridge, taps)'
  : !has('nft')
    ? 'nft not found: apt-get install nftables'
    : false;
const skip = qemu.skip || qemuImg.skip || genisoimage.skip || (required ? false : missing);

describe('bridge networking with counted traffic (a network namespace as the host)', { skip }, () => {
  const ns = `gcns${randomInt(1e6)}`;
  const hostIf = `gch${randomInt(1e6)}`;
  const nsIf = `gcn${randomInt(1e6)}`;
  const a = 200 + randomInt(50);
  const b = randomInt(256);
  const hostIp = `10.${a}.${b}.1`;
  const agentIp = `10.${a}.${b}.2`;
  let dir: string;
  let t: TestApp;
  let agent: AgentProcess | undefined;
  let admin: TestUser;
  let renter: TestUser;
  let node: string;
  const inNs = (...args: string[]) => spawnSync('ip', ['netns', 'exec', ns, ...args], { encoding: 'utf8' });

  before(async () => {
    if (missing) throw new Error(`GPUCLOUD_REQUIRE_QEMU=1 but the bridge test ${missing}`);
    qemu.ensure();
    const image = testImage();
    dir = workDir('br');
    execFileSync('ip', ['netns', 'add', ns]);
    execFileSync('ip', ['link', 'add', hostIf, 'type', 'veth', 'peer', 'name', nsIf]);
    execFileSync('ip', ['link', 'set', nsIf, 'netns', ns]);
    execFileSync('ip', ['addr', 'add', `${hostIp}/30`, 'dev', hostIf]);
    execFileSync('ip', ['link', 'set', hostIf, 'up']);
    for (const args of [
      ['ip', 'addr', 'add', `${agentIp}/30`, 'dev', nsIf],
      ['ip', 'link', 'set', nsIf, 'up'],
      ['ip', 'link', 'set', 'lo', 'up'],
    ]) {
      const r = inNs(...args);
      assert.equal(r.status, 0, r.stderr);
    }
    const dataDir = join(dir, 'a');
    assert.equal(cli(['agent', 'template', 'add', '100', image, '--data-dir', dataDir]).status, 0);
    agent = await startAgentProcess(
      [
        '--listen',
        `${agentIp}:7070`,
        '--public-host',
        agentIp,
        '--network',
        'bridge',
        '--vm-subnet',
        '10.89.0.0/24',
        '--data-dir',
        dataDir,
        '--token',
        TOKEN,
        '--accel',
        'tcg',
        '--fake-gpus',
        '1',
        '--ssh-ports',
        '22000-22009',
      ],
      { netns: ns },
    );
    t = await buildTestApp(DB_KINDS[0]!, {
      env: { GPUCLOUD_AGENT_HEARTBEAT_S: '1', GPUCLOUD_AGENT_STOP_TIMEOUT_S: '20' },
    });
    admin = await createUser(t, { admin: true });
    renter = await createUser(t);
    await credit(t, admin.token, renter.id, 100);
    const n = await createNode(t, admin.token, {
      agent_url: agent.url,
      agent_token: TOKEN,
      gpu_count: 1,
      ram_gb: 1,
      cpu_cores: 1,
    });
    assert.equal(n.agent_status, 'online');
    node = n.node;
  });

  after(async () => {
    if (agent) await kill(agent.child);
    if (dir) for (const pid of qemuPidsUnder(dir)) process.kill(pid, 'SIGKILL');
    await t?.close();
    spawnSync('ip', ['netns', 'del', ns]);
    spawnSync('ip', ['link', 'del', hostIf]);
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  test('SSH through the forwarded port, traffic counted on the tap and billed as network_bytes, nothing left after destroy', async () => {
    const keyFile = join(dir, 'id');
    execFileSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-f', keyFile]);
    const client = api(t, renter.token);
    const uploaded = await client.post('/ssh-keys', {
      body: { ssh_public_key: readFileSync(`${keyFile}.pub`, 'utf8') },
    });
    assert.equal(uploaded.status, 201, uploaded.text);
    const c = await client.post('/vms', {
      body: { node, gpu_type: '4090', gpu_count: 1, storage_gb: 50, template_vmid: 100 },
    });
    assert.equal(c.status, 201, c.text);
    await advance(t, admin.token, 5);
    const vm = await client.get('/vms/{vm_id}', { params: { vm_id: c.body.id } });
    assert.equal(vm.status, 200, vm.text);
    assert.equal(vm.body.status, 'running');
    const access = await client.get('/vms/{vm_id}/access-info', { params: { vm_id: c.body.id } });
    assert.equal(access.status, 200, access.text);
    const info = access.body.ssh;
    assert.ok(info, 'a key-authenticated VM has SSH access');
    assert.equal(info.command, `ssh -p 22000 root@${agentIp}`);
    const addr = ssh(info.command, 'ip -4 -o addr show dev eth0', { key: keyFile });
    assert.equal(addr.status, 0, addr.stderr);
    assert.match(addr.stdout, /inet 10\.89\.0\.2\/24/, 'the static address from the seed');
    const tap = `gct${c.body.vmid}`;
    assert.equal(inNs('ip', 'link', 'show', tap).status, 0, 'the VM has its tap');

    // 8 MiB into the guest: the tap counts it (host-side tx = what the guest received).
    const payload = Buffer.alloc(8 * 1024 * 1024, 7);
    const parts = info.command.split(' ').slice(1);
    const sent = spawnSync(
      'ssh',
      [
        '-o',
        'StrictHostKeyChecking=no',
        '-o',
        'UserKnownHostsFile=/dev/null',
        '-o',
        'BatchMode=yes',
        '-o',
        'LogLevel=ERROR',
        '-i',
        keyFile,
        ...parts,
        'cat > /dev/null',
      ],
      {
        input: payload,
        timeout: 120_000,
      },
    );
    assert.equal(sent.status, 0, String(sent.stderr));
    let bytes = 0;
    for (let i = 0; i < 20 && bytes < payload.length; i++) {
      await sleep(600);
      await t.services.hostMonitor.checkDue();
      const r = await t.db.query<{ b: string }>('SELECT network_bytes_total::text AS b FROM vms WHERE id = $1', [
        c.body.id,
      ]);
      bytes = Number(r.rows[0]!.b);
    }
    assert.ok(bytes >= payload.length, `network_bytes_total ${bytes} counts the 8 MiB sent`);
    assert.ok(bytes < payload.length * 1.3, `and not much more: ${bytes}`);

    assert.equal((await client.delete('/vms/{vm_id}', { params: { vm_id: c.body.id } })).status, 200);
    await advance(t, admin.token, 1);
    assert.notEqual(inNs('ip', 'link', 'show', tap).status, 0, 'the tap is gone');
    const rules = inNs('nft', 'list', 'table', 'ip', 'gpucloud');
    assert.equal(rules.status, 0, rules.stderr);
    assert.doesNotMatch(rules.stdout, /dport 22000/, 'the forward is gone');
    assert.deepEqual(qemuPidsUnder(dir), []);
  });
});
