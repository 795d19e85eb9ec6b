/**
 * What the CLI says when a VM cannot be had or will not do what the user
 * waits for, run as a child process against a real server on both databases:
 * `vm create` on a host agent that lacks the template is refused at once
 * (400 template_unavailable, no VM made), with the API's detail, the default
 * template named when the user gave none, and the templates ready there;
 * `vm create --wait` and `vm wait` of a VM that ends `failed` (the host
 * refused to build it; a simulated provisioning fault) print its
 * `failure_reason`, and `vm show` shows it. And access-info's `notice`: a VM
 * on a simulated node says that nothing answers on its address (`vm create
 * --wait`, `vm show`, `vm ssh --dry-run`), and `vm ssh` refuses to run ssh
 * for it (exit 1); a VM on a host agent has no notice and `vm ssh` runs ssh.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { AddressInfo } from 'node:net';
import { describeEachDb } from '../helpers/app.js';
import { api, type BodyFor } from '../helpers/api.js';
import { createApiKey, createNode, createUser, credit, uploadSshKey, type TestUser } from '../helpers/factories.js';
import { FakeAgent } from '../helpers/fake-agent.js';
import { gpucloudMain } from '../helpers/entry.js';

type VmOut = BodyFor<'/vms/{vm_id}', 'get', 200>;
interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
}

const AGENT_TOKEN = 'agent-token-'.padEnd(40, 'a');

describeEachDb('gpucloud: why a VM failed, and a simulated VM nobody answers on', (t) => {
  let port: number;
  let admin: TestUser;
  let user: TestUser;
  let key: string;
  let simNode: string;
  let agentNode: string;
  let agent: FakeAgent;
  let home: string;
  /** Holds a stand-in ssh that writes the arguments it is given to `sshLog`. */
  let fakeBin: string;
  let sshLog: string;

  before(async () => {
    await t().app.listen({ port: 0, host: '127.0.0.1' });
    port = (t().app.server.address() as AddressInfo).port;
    admin = await createUser(t(), { admin: true });
    user = await createUser(t());
    await credit(t(), admin.token, user.id, 500);
    await uploadSshKey(t(), user.token);
    key = await createApiKey(t(), user.token, 'read_write', 'cli');
    simNode = (await createNode(t(), admin.token, { gpu_type: '4090', gpu_count: 8 })).node;
    // A host agent with template 100 only: the default template, 101, is not on it.
    agent = new FakeAgent(AGENT_TOKEN);
    agent.hostGpus = 4;
    await agent.start();
    t().forbidSecret(AGENT_TOKEN);
    agentNode = (
      await createNode(t(), admin.token, {
        gpu_type: '4090',
        gpu_count: 4,
        agent_url: agent.url,
        agent_token: AGENT_TOKEN,
        ram_gb: 8,
        cpu_cores: 8,
      })
    ).node;
    home = mkdtempSync(join(tmpdir(), 'gpucloud-cli-failures-'));
    fakeBin = join(home, 'bin');
    sshLog = join(home, 'ssh-args.txt');
    mkdirSync(fakeBin);
    writeFileSync(join(fakeBin, 'ssh'), `#!/bin/sh\nprintf '%s\\n' "$@" > '${sshLog}'\n`);
    chmodSync(join(fakeBin, 'ssh'), 0o755);
  });
  after(async () => {
    await agent.stop();
    rmSync(home, { recursive: true, force: true });
  });

  /** Runs `gpucloud ARGS`; `during` runs every 100 ms while it does (to move the manual clock). */
  function cli(args: string[], during?: () => Promise<unknown>): Promise<Run> {
    const env: NodeJS.ProcessEnv = {
      ...process.env,
      PATH: `${fakeBin}:${process.env.PATH}`,
      XDG_CONFIG_HOME: home,
      GPUCLOUD_API_URL: `http://127.0.0.1:${port}`,
      GPUCLOUD_API_KEY: key,
      GPUCLOUD_POLL_MS: '50',
    };
    const child = spawn(process.execPath, [gpucloudMain(), ...args], { env, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => (stderr += d));
    let done = false;
    const exited = new Promise<number | null>((resolve) => child.on('close', (code) => ((done = true), resolve(code))));
    const timer = setTimeout(() => child.kill('SIGKILL'), 60_000);
    return (async () => {
      while (during && !done) {
        await during();
        await new Promise((r) => setTimeout(r, 100));
      }
      const code = await exited;
      clearTimeout(timer);
      return { code, stdout, stderr };
    })();
  }
  const show = (r: Run) => `exit ${r.code}\nstdout: ${r.stdout}\nstderr: ${r.stderr}`;
  const ok = (r: Run) => assert.equal(r.code, 0, show(r));
  const tick = () => t().services.clock.advance(1);

  async function vmOf(id: string): Promise<VmOut> {
    const r = await api(t(), user.token).get('/vms/{vm_id}', { params: { vm_id: id } });
    assert.equal(r.status, 200, r.text);
    return r.body;
  }
  /** The VM `vm create` printed it made ("Created VM 1000 (uuid) on ..."). */
  async function createdVm(r: Run): Promise<VmOut> {
    const m = /^Created VM \d+ \(([0-9a-f-]{36})\)/m.exec(r.stdout);
    assert.ok(m, show(r));
    return vmOf(m[1]!);
  }

  test('vm create on a host without the default template: refused at once, the API’s detail, 101 named as the default', async () => {
    const r = await cli(['vm', 'create', '--node', agentNode, '--gpu', '4090', '--wait'], tick);
    assert.equal(r.code, 1, show(r));
    assert.equal(r.stdout, '', 'no VM was made');
    assert.match(
      r.stderr,
      new RegExp(`^Error: Template 101 \\(ubuntu-24\\.04\\) is not ready on node ${agentNode}`),
      'the API’s detail',
    );
    assert.match(
      r.stderr,
      /\nNo --template was given, so it used the default, template 101 \(ubuntu-24\.04\); choose another with --template/,
    );
    assert.match(r.stderr, new RegExp(`\\nReady on ${agentNode}: 100 \\(ubuntu-22\\.04\\)\\.`));
    const vms = await api(t(), admin.token).get('/admin/vms', {
      query: { node: agentNode, include_destroyed: true },
    });
    assert.equal(vms.status, 200, vms.text);
    assert.deepEqual(vms.body, [], 'no VM on that node, failed or otherwise');

    // A template named by the user: the same refusal, no word of a default.
    const named = await cli(['vm', 'create', '--node', agentNode, '--gpu', '4090', '--template', 'comfyui']);
    assert.equal(named.code, 1, show(named));
    assert.match(named.stderr, /^Error: Template 103 \(comfyui\) is not ready on node/);
    assert.doesNotMatch(named.stderr, /default/);

    // The help states the default.
    const help = await cli(['vm', 'create', '--help']);
    ok(help);
    assert.match(help.stdout.replace(/\s+/g, ' '), /--template <T> .*\(default 101 \(ubuntu-24\.04\)\)/);
  });

  test('a VM its host fails to build: vm create --wait, vm wait and vm show give the reason', async () => {
    const why = 'cannot create the VM disk: no space left on device (fake host)';
    agent.failProvision = why;
    let r: Run;
    try {
      r = await cli(['vm', 'create', '--node', agentNode, '--gpu', '4090', '--template', '100', '--wait'], tick);
    } finally {
      agent.failProvision = null;
    }
    assert.equal(r.code, 1, show(r));
    assert.match(r.stdout, /^Created VM \d+ \(\S+\) on \S+, template 100 \(ubuntu-22\.04\): creating$/m);
    const vm = await createdVm(r);
    assert.equal(vm.status, 'failed');
    assert.equal(vm.template_vmid, 100);
    assert.ok(vm.failure_reason, 'the API gives a failed VM its reason');
    assert.ok(vm.failure_reason.includes(why), vm.failure_reason);
    assert.ok(
      r.stderr.includes(`Error: VM ${vm.vmid} failed and will not become running: ${vm.failure_reason}`),
      show(r),
    );
    assert.doesNotMatch(r.stderr, /default/, 'the template was chosen');

    // vm wait says the same; waiting for `failed` itself succeeds, with the reason.
    const wait = await cli(['vm', 'wait', String(vm.vmid)]);
    assert.equal(wait.code, 1, show(wait));
    assert.ok(wait.stderr.includes(vm.failure_reason), show(wait));
    const waitFailed = await cli(['vm', 'wait', vm.id, '--status', 'failed']);
    ok(waitFailed);
    assert.equal(waitFailed.stdout, `VM ${vm.vmid} is failed: ${vm.failure_reason}\n`);

    // vm show: the reason under the status; --json is the API's record, failure_reason included.
    const shown = await cli(['vm', 'show', vm.id]);
    ok(shown);
    assert.ok(shown.stdout.includes(`Failure reason:  ${vm.failure_reason}\n`), show(shown));
    assert.match(shown.stdout, /^Status:\s+failed\nFailure reason:/m);
    assert.match(shown.stdout, /^Template:\s+100 \(ubuntu-22\.04\)$/m);
    assert.equal(
      (JSON.parse((await cli(['vm', 'show', vm.id, '--json'])).stdout) as VmOut).failure_reason,
      vm.failure_reason,
    );
  });

  test('vm create --wait of a simulated provisioning fault: the simulator’s reason, no word of a default', async () => {
    const fault = await api(t(), admin.token).post('/admin/simulator/faults', {
      body: { node: simNode, action: 'provision', count: 1 },
    });
    assert.equal(fault.status, 200, fault.text);
    const r = await cli(
      ['vm', 'create', '--node', simNode, '--gpu', '4090', '--template', 'ubuntu-22.04', '--wait'],
      tick,
    );
    assert.equal(r.code, 1, show(r));
    const vm = await createdVm(r);
    assert.equal(vm.status, 'failed');
    assert.ok(vm.failure_reason);
    assert.match(vm.failure_reason, new RegExp(`simulated provision failure on ${simNode}`));
    assert.ok(r.stderr.includes(`failed and will not become running: ${vm.failure_reason}`), show(r));
    assert.doesNotMatch(r.stderr, /default/, 'the template was chosen');
    const shown = await cli(['vm', 'show', String(vm.vmid)]);
    ok(shown);
    assert.ok(shown.stdout.includes(`Failure reason:  ${vm.failure_reason}`), show(shown));
  });

  test('a simulated VM: the notice on stderr, and vm ssh does not run ssh (exit 1)', async () => {
    const created = await cli(['vm', 'create', '--node', simNode, '--gpu', '4090', '--wait'], tick);
    ok(created);
    const vm = await createdVm(created);
    assert.equal(vm.status, 'running');
    const info = await api(t(), user.token).get('/vms/{vm_id}/access-info', { params: { vm_id: vm.id } });
    assert.equal(info.status, 200, info.text);
    const notice = info.body.notice;
    assert.ok(notice, 'access-info says the VM is simulated');
    const note = `Note: ${notice}\n`;
    assert.ok(created.stderr.includes(note), show(created));
    assert.match(created.stdout, new RegExp(`connect with: gpucloud vm ssh ${vm.vmid}`));

    const shown = await cli(['vm', 'show', String(vm.vmid)]);
    ok(shown);
    assert.ok(shown.stderr.endsWith(note), show(shown));
    assert.doesNotMatch(shown.stdout, /Failure reason/, 'a running VM has none');

    const dry = await cli(['vm', 'ssh', String(vm.vmid), '--dry-run']);
    ok(dry);
    const { host, port: sshPort, username } = info.body.ssh;
    assert.equal(dry.stdout, `ssh -p ${sshPort} ${username}@${host}\n`);
    assert.equal(dry.stderr, note);

    rmSync(sshLog, { force: true });
    const ssh = await cli(['vm', 'ssh', String(vm.vmid)]);
    assert.equal(ssh.code, 1, show(ssh));
    assert.equal(ssh.stdout, '');
    assert.ok(ssh.stderr.startsWith(note), show(ssh));
    assert.match(ssh.stderr, /Not running ssh \(--dry-run prints the command\)/);
    assert.equal(existsSync(sshLog), false, 'ssh was not run');
  });

  test('a VM on a host agent: no notice, and vm ssh runs ssh with its arguments', async () => {
    const created = await cli(
      ['vm', 'create', '--node', agentNode, '--gpu', '4090', '--template', '100', '--wait'],
      tick,
    );
    ok(created);
    assert.match(created.stdout, /template 100 \(ubuntu-22\.04\): creating/);
    assert.doesNotMatch(created.stderr, /Note:/);
    const vm = await createdVm(created);
    const info = await api(t(), user.token).get('/vms/{vm_id}/access-info', { params: { vm_id: vm.id } });
    assert.equal(info.status, 200, info.text);
    assert.equal(info.body.notice, null);
    const shown = await cli(['vm', 'show', vm.id]);
    ok(shown);
    assert.equal(shown.stderr, '');

    rmSync(sshLog, { force: true });
    const ssh = await cli(['vm', 'ssh', String(vm.vmid), '--', 'nvidia-smi', '-L']);
    ok(ssh);
    assert.equal(ssh.stderr, '');
    const { host, port: sshPort, username } = info.body.ssh;
    assert.deepEqual(readFileSync(sshLog, 'utf8').trim().split('\n'), [
      '-p',
      String(sshPort),
      `${username}@${host}`,
      'nvidia-smi',
      '-L',
    ]);
  });
});
