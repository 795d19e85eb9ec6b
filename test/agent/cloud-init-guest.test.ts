/**
 * What the seed gives a real guest, and when it counts as running: the test
 * image (its cloud-init stand-in follows cloud-init for what the seed says)
 * booted by the agent under TCG, through its HTTP API.
 *
 * - A key VM of a template whose user is not root: the VM is running only
 *   after cloud-init's final message (the boot marker) showed on its console;
 *   the user logs in with bash, has the passwordless sudo rule where
 *   cloud-init writes it, and the default user's groups. Stopped and started
 *   again, it waits for the new run's marker (the old one is in the log).
 * - A password VM of a root template: root logs in with the password (the
 *   seed's sshd drop-in), and without that drop-in, as sshd's default, root's
 *   password is refused.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { FastifyInstance } from 'fastify';
import { buildAgentApp } from '../../src/host-agent/server.js';
import { TemplateStore } from '../../src/host-agent/templates.js';
import { VmManager } from '../../src/host-agent/vms.js';
import { bootMarker, hashPassword, userData } from '../../src/host-agent/images/seed.js';
import { genisoimage, qemu, qemuImg } from './qemu-helpers.js';
import { qemuPidsUnder, ssh, testImage, workDir } from './real-vms.js';

const TOKEN = 'agent-cloud-init-token-'.padEnd(40, 'i');
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe('the seed in a real guest (test image, TCG)', { skip: qemu.skip || qemuImg.skip || genisoimage.skip }, () => {
  let dir: string;
  let dataDir: string;
  let vms: VmManager;
  let app: FastifyInstance;
  let keyFile: string;
  const logs: { msg: string; data?: Record<string, unknown> }[] = [];
  const PORTS = { from: 43000 + Math.floor(Math.random() * 200) * 20, to: 0 };
  PORTS.to = PORTS.from + 9;

  const call = async (method: string, url: string, body?: unknown) => {
    const r = await app.inject({
      method: method as 'GET',
      url,
      headers: { authorization: `Bearer ${TOKEN}` },
      ...(body === undefined ? {} : { payload: body as object }),
    });
    assert.ok(r.statusCode < 300, `${method} ${url}: ${r.statusCode} ${r.body}`);
    return r.body ? (JSON.parse(r.body) as { state: string; ssh: { port: number; user: string } }) : null;
  };
  const provision = (id: string, vmid: number, template: number, auth: Record<string, string | null>) =>
    call('PUT', `/v1/vms/${id}`, {
      vmid,
      template_vmid: template,
      cpu_cores: 1,
      ram_mb: 256,
      storage_gb: 1,
      gpu_count: 0,
      ssh_public_key: null,
      password: null,
      ...auth,
    });
  const consoleLog = (vmid: number) => readFileSync(join(dataDir, 'vms', String(vmid), 'console.log'), 'latin1');
  /** Starts the VM and waits until it is running; returns the seconds it took. */
  const boot = async (id: string, vmid: number) => {
    const t0 = Date.now();
    await call('POST', `/v1/vms/${id}/start`);
    for (let i = 0; i < 1200; i++) {
      const v = await call('GET', `/v1/vms/${id}`);
      if (v!.state === 'running') return (Date.now() - t0) / 1000;
      if (v!.state === 'stopped') assert.fail(`the VM stopped while booting:\n${consoleLog(vmid).slice(-3000)}`);
      await sleep(100);
    }
    assert.fail(`not running within 120 s:\n${consoleLog(vmid).slice(-3000)}`);
  };
  const readyLogs = (id: string) => logs.filter((l) => l.msg.startsWith('guest ready') && l.data?.vm === id);
  const command = (port: number, user: string) => `ssh -p ${port} ${user}@127.0.0.1`;

  before(async () => {
    for (const tool of [qemu, qemuImg, genisoimage]) tool.ensure();
    const image = testImage();
    dir = workDir('ci');
    dataDir = join(dir, 'd');
    keyFile = join(dir, 'id');
    execFileSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-C', 'ci', '-f', keyFile]);
    const templates = new TemplateStore(join(dataDir, 'templates'));
    await templates.add(100, image, 'root');
    await templates.add(101, image, 'gpu');
    vms = new VmManager(
      {
        dataDir,
        accel: 'tcg',
        publicHost: '127.0.0.1',
        forwardHost: '127.0.0.1',
        sshPorts: PORTS,
        fakeGpus: 0,
        log: (msg, data) => logs.push({ msg, data }),
      },
      templates,
    );
    await vms.load();
    app = await buildAgentApp(vms, templates, { token: TOKEN, accel: 'tcg', publicHost: '127.0.0.1' });
  });

  after(async () => {
    await app?.close();
    vms?.close();
    if (dir) for (const pid of qemuPidsUnder(dir)) process.kill(pid, 'SIGKILL');
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  test('a user other than root: running after the marker, bash, passwordless sudo, groups; again after a restart', async (t) => {
    const id = randomUUID();
    const vm = await provision(id, 201, 101, {
      auth_method: 'ssh_key',
      ssh_public_key: readFileSync(`${keyFile}.pub`, 'utf8'),
    });
    assert.equal(vm!.ssh.user, 'gpu');
    const seconds = await boot(id, 201);
    t.diagnostic(`start to running: ${seconds.toFixed(1)} s`);
    const marker = bootMarker(id);
    assert.match(consoleLog(201), /cloud-init \(stand-in\) running/);
    assert.ok(consoleLog(201).includes(`${marker} cloud-init finished after `), 'the final message on the console');
    assert.deepEqual(
      readyLogs(id).map((l) => l.data?.how),
      ['cloud-init'],
      'running because cloud-init finished',
    );

    const out = ssh(
      command(vm!.ssh.port, 'gpu'),
      'echo "bash=$BASH_VERSION"; grep "^gpu:" /etc/passwd; id -Gn; ' +
        "stat -c '%a %u %n' /etc/sudoers /etc/sudoers.d/90-cloud-init-users",
      { key: keyFile },
    );
    assert.equal(out.status, 0, out.stderr);
    assert.match(out.stdout, /^bash=5\./m, 'the login shell is bash');
    assert.match(out.stdout, /^gpu:x:\d+:\d+::\/home\/gpu:\/bin\/bash$/m);
    const groups = out.stdout.split('\n')[2]!.split(' ');
    for (const g of ['gpu', 'adm', 'audio', 'cdrom', 'dialout', 'dip', 'floppy', 'plugdev', 'sudo', 'video'])
      assert.ok(groups.includes(g), `in group ${g}: ${groups.join(' ')}`);
    // The rules are root's to read (0440), as cloud-init writes them; the stand-in prints what it wrote.
    assert.match(out.stdout, /^440 0 \/etc\/sudoers\n440 0 \/etc\/sudoers.d\/90-cloud-init-users$/m);
    assert.ok(
      consoleLog(201).includes(
        'sudo for gpu: wrote "gpu ALL=(ALL) NOPASSWD:ALL" to /etc/sudoers.d/90-cloud-init-users',
      ),
    );

    // A new run: the previous run's marker is in the log, yet only the new one makes the VM running.
    await call('POST', `/v1/vms/${id}/stop`, { timeout_s: 0 });
    const before = consoleLog(201).split(marker).length - 1;
    assert.equal(before, 1);
    const again = await boot(id, 201);
    t.diagnostic(`restart to running: ${again.toFixed(1)} s`);
    assert.equal(consoleLog(201).split(marker).length - 1, 2, "the new run's marker came before running");
    assert.deepEqual(
      readyLogs(id).map((l) => l.data?.how),
      ['cloud-init', 'cloud-init'],
    );
    await call('DELETE', `/v1/vms/${id}`);
  });

  test("root with a password logs in with it (the seed's sshd drop-in); without the drop-in it is refused", async () => {
    const password = 'a root password for the test';
    const id = randomUUID();
    const vm = await provision(id, 202, 100, { auth_method: 'password', password });
    await boot(id, 202);
    const ok = ssh(command(vm!.ssh.port, 'root'), 'id -un; cat /etc/ssh/sshd_config.d/01-gpucloud-root-login.conf', {
      password,
      dir,
    });
    assert.equal(ok.status, 0, ok.stderr);
    assert.equal(ok.stdout, 'root\nPermitRootLogin yes\n');
    await call('POST', `/v1/vms/${id}/stop`, { timeout_s: 0 });

    // The same VM with a seed that lacks the drop-in: sshd's default, prohibit-password.
    const vmDir = join(dataDir, 'vms', '202');
    const seedDir = join(dir, 'seed');
    execFileSync('mkdir', ['-p', seedDir]);
    const ud = userData({
      instanceId: id,
      hostname: 'gpucloud-202',
      user: 'root',
      authMethod: 'password',
      sshPublicKeys: [],
      passwordHash: await hashPassword(password),
    });
    const withoutDropIn = ud.replace(/^write_files:\n(?: {2,}.*\n)+/m, '');
    assert.ok(!withoutDropIn.includes('write_files') && withoutDropIn.includes('final_message'));
    writeFileSync(join(seedDir, 'user-data'), withoutDropIn);
    writeFileSync(join(seedDir, 'meta-data'), `instance-id: ${id}\nlocal-hostname: gpucloud-202\n`);
    execFileSync(
      'genisoimage',
      ['-quiet', '-output', join(vmDir, 'seed.iso'), '-volid', 'cidata', '-joliet', '-rock', 'user-data', 'meta-data'],
      { cwd: seedDir },
    );
    await boot(id, 202);
    const refused = ssh(command(vm!.ssh.port, 'root'), 'true', { password, dir });
    assert.notEqual(refused.status, 0, "root's password is refused without PermitRootLogin yes");
    await call('DELETE', `/v1/vms/${id}`);
  });
});
