/**
 * One host, many operations at once: whatever two VMs must not share (a
 * vmid, an SSH port, a GPU) is never given to both, however the control
 * plane's concurrent calls interleave. Provisions race each other and
 * destroys over the agent's HTTP API; starts race for GPUs with real QEMU
 * processes (a blank disk: the firmware runs, no guest boots). A stopped or
 * crashed VM gives its GPUs back, and so does a VM whose QEMU ended while no
 * agent ran.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { FastifyInstance } from 'fastify';
import { buildAgentApp } from '../../src/host-agent/server.js';
import { TemplateStore } from '../../src/host-agent/templates.js';
import { VmManager } from '../../src/host-agent/vms.js';
import { genisoimage, qemu, qemuImg } from './qemu-helpers.js';
import { qemuPidsUnder, workDir } from './real-vms.js';

const TOKEN = 'agent-concurrency-token-'.padEnd(40, 'c');
const KEY = 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl me@laptop';
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

interface Answer {
  status: number;
  body: { id: string; state: string; gpus: string[]; ssh: { port: number }; code?: string; detail?: string };
}

describe('one agent, concurrent operations', { skip: qemu.skip || qemuImg.skip || genisoimage.skip }, () => {
  let dir: string;
  let templates: TemplateStore;
  let vms: VmManager;
  let app: FastifyInstance;
  const PORTS = { from: 42000 + Math.floor(Math.random() * 200) * 20, to: 0 };
  PORTS.to = PORTS.from + 15;

  const call = async (method: string, url: string, body?: unknown): Promise<Answer> => {
    const r = await app.inject({
      method: method as 'GET',
      url,
      headers: { authorization: `Bearer ${TOKEN}` },
      ...(body === undefined ? {} : { payload: body as object }),
    });
    return { status: r.statusCode, body: r.body ? JSON.parse(r.body) : undefined };
  };
  const spec = (vmid: number, gpuCount = 1) => ({
    vmid,
    template_vmid: 100,
    cpu_cores: 1,
    ram_mb: 128,
    storage_gb: 1,
    gpu_count: gpuCount,
    auth_method: 'ssh_key',
    ssh_public_key: KEY,
    password: null,
  });
  const manager = () =>
    new VmManager(
      {
        dataDir: join(dir, 'd'),
        accel: 'tcg',
        publicHost: '127.0.0.1',
        forwardHost: '127.0.0.1',
        sshPorts: PORTS,
        fakeGpus: 2,
      },
      templates,
    );
  const hostGpus = async () =>
    (
      (await app.inject({ url: '/v1/host', headers: { authorization: `Bearer ${TOKEN}` } })).json() as {
        host_gpus: { pci_address: string; vm_id: string | null }[];
      }
    ).host_gpus;

  before(async () => {
    for (const tool of [qemu, qemuImg, genisoimage]) tool.ensure();
    dir = workDir('cc');
    const base = join(dir, 'base.raw');
    execFileSync('qemu-img', ['create', '-q', '-f', 'raw', base, '1M']);
    templates = new TemplateStore(join(dir, 'd', 'templates'));
    await templates.add(100, base, 'root');
    vms = manager();
    await vms.load();
    app = await buildAgentApp(vms, templates, { token: TOKEN, accel: 'tcg', publicHost: '127.0.0.1' });
  });

  after(async () => {
    await app?.close();
    vms?.close();
    if (dir) for (const pid of qemuPidsUnder(dir)) process.kill(pid, 'SIGKILL');
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  test('provisions at once never share a port or a vmid; provisions beside destroys leave exactly the survivors', async () => {
    // Twelve at once, the same vmid asked twice by two VMs, each request sent twice.
    const ids: string[] = Array.from({ length: 12 }, () => randomUUID());
    const asks = ids.flatMap((id, i) => [
      call('PUT', `/v1/vms/${id}`, spec(3000 + i)),
      call('PUT', `/v1/vms/${id}`, spec(3000 + i)),
    ]);
    const twin = randomUUID();
    asks.push(call('PUT', `/v1/vms/${twin}`, spec(3000)));
    const answers = await Promise.all(asks);
    const made = answers.filter((a) => a.status === 200);
    const refused = answers.filter((a) => a.status !== 200);
    assert.equal(refused.length, 1, JSON.stringify(refused.map((r) => r.body)));
    assert.equal(refused[0]!.status, 409);
    assert.equal(refused[0]!.body.code, 'conflict');
    const byId = new Map(made.map((a) => [a.body.id, a.body.ssh.port]));
    assert.equal(byId.size, 12, 'the twelve VMs exist once each, the second vmid 3000 was refused');
    for (const a of made) assert.equal(byId.get(a.body.id), a.body.ssh.port, 'a repeated PUT answers the same VM');
    const ports = [...byId.values()];
    assert.equal(new Set(ports).size, 12, `twelve different ports: ${ports.join(' ')}`);
    for (const p of ports) assert.ok(p >= PORTS.from && p <= PORTS.to);

    // Destroy half while eight more are provisioned: the freed ports may be reused, never doubled.
    const gone = ids.slice(0, 6);
    const more = Array.from({ length: 8 }, () => randomUUID());
    const mixed = await Promise.all([
      ...gone.map((id) => call('DELETE', `/v1/vms/${id}`)),
      ...more.map((id, i) => call('PUT', `/v1/vms/${id}`, spec(4000 + i, 0))),
    ]);
    const puts = mixed.slice(gone.length);
    assert.ok(
      mixed.slice(0, gone.length).every((a) => a.status === 204),
      'every destroy went through',
    );
    const listed = vms.list().map((v) => v.ssh.port);
    const madeMore = puts.filter((a) => a.status === 200).length;
    const noPorts = puts.filter((a) => a.status === 409 && a.body.code === 'no_ports').length;
    assert.equal(madeMore + noPorts, 8, JSON.stringify(puts.map((p) => p.body)));
    assert.equal(listed.length, 6 + madeMore);
    assert.equal(new Set(listed).size, listed.length, `no port twice: ${listed.join(' ')}`);
    const folders = readdirSync(join(dir, 'd', 'vms')).sort();
    assert.deepEqual(
      folders,
      vms
        .list()
        .map((v) => String(JSON.parse(readFileSync(join(dir, 'd', 'vms', vmidOf(v.id), 'vm.json'), 'utf8')).vmid))
        .sort(),
      'a folder for each VM, nothing left of the destroyed ones or of refused provisions',
    );
    for (const v of vms.list()) await call('DELETE', `/v1/vms/${v.id}`);
    assert.deepEqual(readdirSync(join(dir, 'd', 'vms')), []);
  });

  /** The vmid folder of a VM (its vm.json names its id). */
  function vmidOf(id: string): string {
    for (const f of readdirSync(join(dir, 'd', 'vms'))) {
      const rec = JSON.parse(readFileSync(join(dir, 'd', 'vms', f, 'vm.json'), 'utf8')) as { id: string };
      if (rec.id === id) return f;
    }
    throw new Error(`no folder for ${id}`);
  }

  test('starts at once never share a GPU; a stop, a crash and an agent restart give devices back', async () => {
    const ids: string[] = [randomUUID(), randomUUID(), randomUUID()];
    for (const [i, id] of ids.entries()) assert.equal((await call('PUT', `/v1/vms/${id}`, spec(5000 + i))).status, 200);
    assert.deepEqual(
      (await hostGpus()).map((g) => g.vm_id),
      [null, null],
      'provisioned VMs hold no device',
    );

    // Three one-GPU VMs start at once on a two-GPU host: two run, one is refused, no device twice.
    const starts = await Promise.all(ids.map((id) => call('POST', `/v1/vms/${id}/start`)));
    const up = starts.filter((s) => s.status === 200);
    const no = starts.filter((s) => s.status !== 200);
    assert.equal(up.length, 2, JSON.stringify(starts.map((s) => s.body)));
    assert.equal(no[0]!.status, 409);
    assert.equal(no[0]!.body.code, 'gpus_unavailable');
    assert.match(no[0]!.body.detail!, /1 GPU\(s\) asked, 0 free on this host/);
    assert.deepEqual(up.map((s) => s.body.gpus[0]).sort(), ['fake:0', 'fake:1']);
    assert.deepEqual(
      (await hostGpus()).map((g) => g.vm_id).sort(),
      up.map((s) => s.body.id).sort(),
      'the host names the VM holding each device',
    );
    const waitingId = ids[starts.findIndex((s) => s.status !== 200)]!;
    assert.equal((await call('GET', `/v1/vms/${waitingId}`)).body.state, 'stopped');
    assert.deepEqual((await call('GET', `/v1/vms/${waitingId}`)).body.gpus, []);

    // A stop gives its device back; the waiting VM starts on it.
    const [first, second] = up.map((s) => s.body);
    const stopped = await call('POST', `/v1/vms/${first!.id}/stop`, { timeout_s: 0 });
    assert.equal(stopped.body.state, 'stopped');
    assert.deepEqual(stopped.body.gpus, [], 'a stopped VM holds no device');
    const third = await call('POST', `/v1/vms/${waitingId}/start`);
    assert.equal(third.status, 200, JSON.stringify(third.body));
    assert.deepEqual(third.body.gpus, first!.gpus);

    // A QEMU that dies gives its device back too.
    const pidOf = (vmid: number) => Number(readFileSync(join(dir, 'd', 'vms', String(vmid), 'qemu.pid'), 'utf8'));
    const secondVmid = 5000 + ids.indexOf(second!.id);
    process.kill(pidOf(secondVmid), 'SIGKILL');
    for (let i = 0; i < 100 && (await call('GET', `/v1/vms/${second!.id}`)).body.state !== 'stopped'; i++)
      await sleep(100);
    const crashed = await call('GET', `/v1/vms/${second!.id}`);
    assert.equal(crashed.body.state, 'stopped');
    assert.deepEqual(crashed.body.gpus, [], 'a crashed VM holds no device');

    // The agent stops while a VM runs, and its QEMU ends meanwhile: the next agent frees its device.
    const thirdVmid = 5000 + ids.indexOf(waitingId);
    vms.close();
    await app.close();
    process.kill(pidOf(thirdVmid), 'SIGKILL');
    await sleep(300);
    vms = manager();
    await vms.load();
    app = await buildAgentApp(vms, templates, { token: TOKEN, accel: 'tcg', publicHost: '127.0.0.1' });
    assert.deepEqual(
      (await hostGpus()).map((g) => g.vm_id),
      [null, null],
    );
    assert.deepEqual(
      JSON.parse(readFileSync(join(dir, 'd', 'vms', String(thirdVmid), 'vm.json'), 'utf8')).gpus,
      [],
      'the record says so too',
    );

    // A record of an older agent (GPUs held from provisioning, no gpu_count) is read as before.
    const oldFile = join(dir, 'd', 'vms', String(secondVmid), 'vm.json');
    const old = JSON.parse(readFileSync(oldFile, 'utf8')) as Record<string, unknown>;
    delete old.gpu_count;
    old.gpus = ['fake:1'];
    writeFileSync(oldFile, JSON.stringify(old));
    vms.close();
    await app.close();
    vms = manager();
    await vms.load();
    app = await buildAgentApp(vms, templates, { token: TOKEN, accel: 'tcg', publicHost: '127.0.0.1' });
    assert.deepEqual((await call('GET', `/v1/vms/${second!.id}`)).body.gpus, [], 'not running: nothing held');
    const again = await call('POST', `/v1/vms/${second!.id}/start`);
    assert.equal(again.status, 200, JSON.stringify(again.body));
    assert.equal(again.body.gpus.length, 1, 'it still asks for one GPU');

    await Promise.all(ids.map((id) => call('DELETE', `/v1/vms/${id}`)));
    assert.deepEqual(qemuPidsUnder(join(dir, 'd')), []);
    assert.deepEqual(
      (await hostGpus()).map((g) => g.vm_id),
      [null, null],
    );
  });
});
