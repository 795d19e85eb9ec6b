/**
 * Real VMs end to end: `gpucloud agent` (its own process, QEMU under TCG) and
 * the API on one database. The node is registered with its agent_url; a
 * customer creates a VM with an SSH key, it runs once the guest answers on
 * SSH, and SSH with exactly what access-info says runs a command. Then stop,
 * start, the agent killed and started again (the VM runs on and is managed
 * again), the QEMU process killed (the VM becomes stopped), destroy (no
 * process and no file left), a guest flooding its serial console (capped on
 * the host), a stopped VM's GPUs rented to the next customer, and a VM with
 * auth_method=password.
 *
 * Under the manual clock an advance returns once the due hypervisor work is
 * done, so each step below is settled when its advance returns.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, rmSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { buildTestApp, type TestApp } from '../helpers/app.js';
import { api } from '../helpers/api.js';
import { DB_KINDS } from '../helpers/db.js';
import { advance, createNode, createUser, credit, type TestUser } from '../helpers/factories.js';
import { qemu, qemuImg, genisoimage } from './qemu-helpers.js';
import {
  cli,
  freePort,
  kill,
  qemuPidsUnder,
  ssh,
  startAgentProcess,
  testImage,
  workDir,
  type AgentProcess,
} from './real-vms.js';

const TOKEN = 'e2e-agent-token-'.padEnd(48, 'z');
const skip = qemu.skip || qemuImg.skip || genisoimage.skip;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe('real VMs through gpucloud agent (QEMU, TCG)', { skip }, () => {
  let t: TestApp;
  let dir: string;
  let dataDir: string;
  let agent: AgentProcess;
  let agentArgs: string[];
  let admin: TestUser;
  let renter: TestUser;
  let node: string;
  let keyFile: string;

  const renterApi = () => api(t, renter.token);
  const vm = async (id: string) => {
    const r = await renterApi().get('/vms/{vm_id}', { params: { vm_id: id } });
    assert.equal(r.status, 200, r.text);
    return r.body;
  };
  /** A lifecycle command that must be accepted. */
  const command = async (action: 'start' | 'stop', id: string) => {
    const r = await renterApi().post(`/vms/{vm_id}/${action}`, { params: { vm_id: id } });
    assert.equal(r.status, 200, r.text);
  };
  const destroy = async (id: string) => {
    const r = await renterApi().delete('/vms/{vm_id}', { params: { vm_id: id } });
    assert.equal(r.status, 200, r.text);
  };
  /** The SSH access of a VM (every VM here has it). */
  const sshInfo = async (id: string) => {
    const r = await renterApi().get('/vms/{vm_id}/access-info', { params: { vm_id: id } });
    assert.equal(r.status, 200, r.text);
    assert.ok(r.body.ssh, r.text);
    return r.body.ssh;
  };
  /** Waits until the last lines of the VM's serial console log, as the agent keeps it, hold `text`. */
  const consoleShows = async (vmid: number, text: string) => {
    const file = join(dataDir, 'vms', String(vmid), 'console.log');
    for (let i = 0; i < 120; i++) {
      if (existsSync(file) && readFileSync(file, 'latin1').slice(-4096).includes(text)) return;
      await sleep(250);
    }
    assert.fail(`the console log's last lines do not show ${text}`);
  };
  const vmDirs = () => (existsSync(join(dataDir, 'vms')) ? readdirSync(join(dataDir, 'vms')) : []);
  /** Heartbeats until `check` holds (real time: the agent notices, then the control plane asks). */
  const until = async (what: string, check: () => Promise<boolean>, seconds = 30) => {
    for (let i = 0; i < seconds * 2; i++) {
      await t.services.hostMonitor.checkDue();
      if (await check()) return;
      await sleep(500);
    }
    assert.fail(`${what} within ${seconds} s`);
  };

  before(async () => {
    for (const tool of [qemu, qemuImg, genisoimage]) tool.ensure();
    const image = testImage();
    dir = workDir('e2e');
    dataDir = join(dir, 'a');
    keyFile = join(dir, 'id');
    execFileSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-C', 'e2e', '-f', keyFile]);

    const added = cli(['agent', 'template', 'add', '100', image, '--user', 'root', '--data-dir', dataDir]);
    assert.equal(added.status, 0, added.stderr);
    assert.match(added.stdout, /Template 100 added \(user root/);
    const listed = cli(['agent', 'template', 'list', '--data-dir', dataDir]);
    assert.match(listed.stdout, /^100\tuser root\t/m);

    const port = await freePort();
    const sshFrom = 20000 + Math.floor(Math.random() * 4000) * 10;
    agentArgs = [
      '--listen',
      `127.0.0.1:${port}`,
      '--data-dir',
      dataDir,
      '--token',
      TOKEN,
      '--accel',
      'tcg',
      '--fake-gpus',
      '2',
      '--ssh-ports',
      `${sshFrom}-${sshFrom + 9}`,
    ];
    agent = await startAgentProcess(agentArgs);
    assert.equal(agent.url, `http://127.0.0.1:${port}`);

    t = await buildTestApp(DB_KINDS[DB_KINDS.length - 1]!, {
      env: { GPUCLOUD_AGENT_HEARTBEAT_S: '1', GPUCLOUD_AGENT_STOP_TIMEOUT_S: '30' },
    });
    t.forbidSecret(TOKEN);
    admin = await createUser(t, { admin: true });
    renter = await createUser(t);
    await credit(t, admin.token, renter.id, 100);
    const n = await createNode(t, admin.token, {
      agent_url: agent.url,
      agent_token: TOKEN,
      gpu_count: 2,
      ram_gb: 1,
      cpu_cores: 2,
    });
    node = n.node;
    assert.equal(n.agent_status, 'online');
    assert.equal(n.accel, 'tcg');
    assert.equal((n.host_gpus as unknown[]).length, 2, 'the agent reports its (stand-in) GPUs');
  });

  after(async () => {
    if (agent) await kill(agent.child);
    // Whatever a failed test left running is ended here.
    if (dir) for (const pid of qemuPidsUnder(dir)) process.kill(pid, 'SIGKILL');
    await t?.close();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  test('an SSH-key VM: create, running once SSH answers, ssh in, stop, start, agent restart, crash, destroy', async () => {
    const pub = readFileSync(`${keyFile}.pub`, 'utf8');
    const key = await renterApi().post('/ssh-keys', { body: { ssh_public_key: pub } });
    assert.equal(key.status, 201, key.text);
    const c = await renterApi().post('/vms', {
      body: { node, gpu_type: '4090', gpu_count: 1, storage_gb: 50, template_vmid: 100 },
    });
    assert.equal(c.status, 201, c.text);
    await advance(t, admin.token, 5);
    assert.equal((await vm(c.body.id)).status, 'running', 'running once the guest answers on SSH');

    const info = await sshInfo(c.body.id);
    assert.equal(info.host, '127.0.0.1');
    assert.equal(info.username, 'root');
    assert.equal(info.command, `ssh -p ${info.port} root@127.0.0.1`);
    const out = ssh(info.command, 'echo hello from $(hostname)', { key: keyFile });
    assert.equal(out.status, 0, out.stderr);
    assert.equal(out.stdout.trim(), `hello from gpucloud-${c.body.vmid}`);

    // A guest flooding its serial port fills nothing on the host: at most two files of 1 MiB, the newest kept.
    const flood = ssh(
      info.command,
      "dd if=/dev/zero bs=65536 count=48 2>/dev/null | tr '\\0' A > /dev/ttyS0; echo END-OF-FLOOD > /dev/ttyS0",
      { key: keyFile },
    );
    assert.equal(flood.status, 0, flood.stderr);
    await consoleShows(c.body.vmid, 'END-OF-FLOOD');
    const logFile = join(dataDir, 'vms', String(c.body.vmid), 'console.log');
    for (const f of [logFile, `${logFile}.1`]) assert.ok(statSync(f).size <= 1024 * 1024, `${f}: ${statSync(f).size}`);

    // Stop: an ACPI power-down; QEMU ends.
    await command('stop', c.body.id);
    await advance(t, admin.token, 1);
    assert.equal((await vm(c.body.id)).status, 'stopped');
    assert.deepEqual(qemuPidsUnder(dataDir), [], 'no QEMU process after a stop');

    await command('start', c.body.id);
    await advance(t, admin.token, 1);
    assert.equal((await vm(c.body.id)).status, 'running');
    assert.equal(ssh(info.command, 'true', { key: keyFile }).status, 0, 'the same port after a restart');
    const [pid] = qemuPidsUnder(dataDir);
    assert.ok(pid);

    // The agent dies and comes back: the VM runs on, untouched, and is managed again.
    await kill(agent.child);
    assert.deepEqual(qemuPidsUnder(dataDir), [pid]);
    assert.equal(ssh(info.command, 'true', { key: keyFile }).status, 0, 'the guest answers while no agent runs');
    agent = await startAgentProcess(agentArgs);
    assert.match(agent.output(), /re-attached to a running VM/);
    assert.equal(ssh(info.command, 'echo AFTER-RESTART > /dev/ttyS0', { key: keyFile }).status, 0);
    await consoleShows(c.body.vmid, 'AFTER-RESTART');
    await until('the node is online again', async () => {
      const n = await api(t, admin.token).get('/admin/nodes/{node}', { params: { node } });
      assert.equal(n.status, 200, n.text);
      return n.body.agent_status === 'online';
    });
    assert.equal((await vm(c.body.id)).status, 'running');
    assert.deepEqual(qemuPidsUnder(dataDir), [pid], 'the same QEMU process');
    await command('stop', c.body.id);
    await advance(t, admin.token, 1);
    assert.equal((await vm(c.body.id)).status, 'stopped', 'the new agent stops it');
    assert.deepEqual(qemuPidsUnder(dataDir), []);

    // QEMU killed from outside: noticed within a heartbeat, the VM is stopped.
    await command('start', c.body.id);
    await advance(t, admin.token, 1);
    assert.equal((await vm(c.body.id)).status, 'running');
    const [again] = qemuPidsUnder(dataDir);
    process.kill(again!, 'SIGKILL');
    await until('the killed VM is stopped', async () => (await vm(c.body.id)).status === 'stopped');
    const events = await t.db.query<{ data: { reason: string } }>(
      `SELECT data FROM events WHERE vm_id = $1 AND type = 'vm.status_changed' AND data->>'from' = 'running' AND data->>'to' = 'stopped'`,
      [c.body.id],
    );
    assert.deepEqual(
      events.rows.map((r) => r.data.reason),
      ['crashed'],
    );

    // Destroy: no process, no file of the VM left on the host.
    assert.equal(vmDirs().length, 1);
    await destroy(c.body.id);
    await advance(t, admin.token, 1);
    assert.equal((await vm(c.body.id)).status, 'destroyed');
    assert.deepEqual(vmDirs(), [], 'the disk and seed are gone');
    assert.deepEqual(qemuPidsUnder(dataDir), []);
  });

  test("a stopped VM's GPUs go to the next renter, whose VM runs; the first starts again once they are free", async () => {
    const other = await createUser(t);
    await credit(t, admin.token, other.id, 100);
    const asOther = api(t, other.token);
    const body = {
      node,
      gpu_type: '4090',
      gpu_count: 2,
      storage_gb: 50,
      template_vmid: 100,
      auth_method: 'password',
      password: 'a password for the gpu test',
    } as const;
    const host = async () =>
      (await (await fetch(`${agent.url}/v1/host`, { headers: { authorization: `Bearer ${TOKEN}` } })).json()) as {
        host_gpus: { vm_id: string | null }[];
      };
    const a = await renterApi().post('/vms', { body });
    assert.equal(a.status, 201, a.text);
    await advance(t, admin.token, 5);
    assert.equal((await vm(a.body.id)).status, 'running');
    assert.deepEqual(
      (await host()).host_gpus.map((g) => g.vm_id),
      [a.body.id, a.body.id],
    );
    await command('stop', a.body.id);
    await advance(t, admin.token, 1);
    assert.equal((await vm(a.body.id)).status, 'stopped');
    assert.deepEqual(
      (await host()).host_gpus.map((g) => g.vm_id),
      [null, null],
      'the host gave the devices back',
    );

    const b = await asOther.post('/vms', { body });
    assert.equal(b.status, 201, b.text);
    await advance(t, admin.token, 5);
    const bVm = await asOther.get('/vms/{vm_id}', { params: { vm_id: b.body.id } });
    assert.equal(bVm.status, 200, bVm.text);
    assert.equal(bVm.body.status, 'running', "the next renter's VM runs on the freed GPUs");
    assert.deepEqual(
      (await host()).host_gpus.map((g) => g.vm_id),
      [b.body.id, b.body.id],
    );
    const refused = await renterApi().post('/vms/{vm_id}/start', { params: { vm_id: a.body.id } });
    assert.equal(refused.status, 400, refused.text);

    assert.equal((await asOther.delete('/vms/{vm_id}', { params: { vm_id: b.body.id } })).status, 200);
    await advance(t, admin.token, 1);
    await command('start', a.body.id);
    await advance(t, admin.token, 1);
    assert.equal((await vm(a.body.id)).status, 'running', 'the first VM starts again on the free GPUs');
    await destroy(a.body.id);
    await advance(t, admin.token, 1);
    assert.deepEqual(vmDirs(), []);
  });

  test('a password VM logs in with its password, and not with another', async () => {
    const password = 'correct horse battery staple';
    const c = await renterApi().post('/vms', {
      body: {
        node,
        gpu_type: '4090',
        gpu_count: 1,
        storage_gb: 50,
        template_vmid: 100,
        auth_method: 'password',
        password,
      },
    });
    assert.equal(c.status, 201, c.text);
    t.forbidSecret(password);
    await advance(t, admin.token, 5);
    assert.equal((await vm(c.body.id)).status, 'running');
    const info = await sshInfo(c.body.id);
    const ok = ssh(info.command, 'id -un', { password, dir });
    assert.equal(ok.status, 0, ok.stderr);
    assert.equal(ok.stdout.trim(), 'root');
    const wrong = ssh(info.command, 'true', { password: 'not the password at all', dir });
    assert.notEqual(wrong.status, 0, 'a wrong password is refused');
    // The password reaches the guest only as a hash; nothing on the host keeps it.
    const vmDir = join(dataDir, 'vms', String(c.body.vmid));
    for (const f of readdirSync(vmDir)) {
      if (!statSync(join(vmDir, f)).isFile()) continue; // the QMP socket
      assert.ok(!readFileSync(join(vmDir, f)).includes(password), `${f} holds the password`);
    }
    await destroy(c.body.id);
    await advance(t, admin.token, 1);
    assert.deepEqual(vmDirs(), []);
  });
});
