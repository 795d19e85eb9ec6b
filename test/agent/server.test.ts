/**
 * The agent's HTTP API without booting anything: the token on every call,
 * validation, provisioning (overlay, seed, port, GPUs) and its refusals,
 * idempotency, destroy leaving no file, and the template store.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { existsSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { FastifyInstance } from 'fastify';
import { buildAgentApp } from '../../src/host-agent/server.js';
import { TemplateStore } from '../../src/host-agent/templates.js';
import { VmManager } from '../../src/host-agent/vms.js';
import { genisoimage, qemuImg } from './qemu-helpers.js';
import { workDir } from './real-vms.js';
import { buildSysfs } from './fake-sysfs.js';

const TOKEN = 'agent-server-test-token-'.padEnd(40, 's');
const KEY = 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl me@laptop';

describe('agent HTTP API', { skip: qemuImg.skip || genisoimage.skip }, () => {
  let dir: string;
  let app: FastifyInstance;
  let templates: TemplateStore;
  let vms: VmManager;
  const call = async (method: string, url: string, body?: unknown, token: string | null = TOKEN) => {
    const r = await app.inject({
      method: method as 'GET',
      url,
      headers: token === null ? {} : { authorization: `Bearer ${token}` },
      ...(body === undefined ? {} : { payload: body as object }),
    });
    return { status: r.statusCode, body: r.body ? JSON.parse(r.body) : undefined, headers: r.headers };
  };
  const spec = (over: Record<string, unknown> = {}) => ({
    vmid: 1000,
    template_vmid: 100,
    cpu_cores: 1,
    ram_mb: 512,
    storage_gb: 20,
    gpu_count: 1,
    auth_method: 'ssh_key',
    ssh_public_key: KEY,
    password: null,
    ...over,
  });

  before(async () => {
    qemuImg.ensure();
    genisoimage.ensure();
    dir = workDir('srv');
    const base = join(dir, 'base.raw');
    execFileSync('qemu-img', ['create', '-q', '-f', 'raw', base, '16M']);
    templates = new TemplateStore(join(dir, 'd', 'templates'));
    await templates.add(100, base, 'ubuntu');
    vms = new VmManager(
      {
        dataDir: join(dir, 'd'),
        accel: 'tcg',
        publicHost: 'gpu7.example.com',
        forwardHost: '127.0.0.1',
        sshPorts: { from: 41000, to: 41002 },
        fakeGpus: 2,
      },
      templates,
    );
    await vms.load();
    app = await buildAgentApp(vms, templates, { token: TOKEN, accel: 'tcg', publicHost: 'gpu7.example.com' });
  });

  after(async () => {
    await app?.close();
    vms?.close();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  test('every route but /healthz needs the exact token', async () => {
    assert.equal((await call('GET', '/healthz', undefined, null)).status, 200);
    for (const token of [null, '', 'wrong', TOKEN.slice(0, -1), `${TOKEN}x`, TOKEN.toUpperCase()]) {
      const r = await call('GET', '/v1/host', undefined, token);
      assert.equal(r.status, 401, `token ${JSON.stringify(token)}`);
      assert.equal(r.body.code, 'unauthorized');
      assert.equal(r.headers['www-authenticate'], 'Bearer');
    }
    const put = await call('PUT', `/v1/vms/${randomUUID()}`, spec(), 'wrong');
    assert.equal(put.status, 401);
    assert.equal(readdirSync(join(dir, 'd', 'vms')).length, 0, 'nothing was provisioned');
    const raw = await app.inject({ method: 'GET', url: '/v1/host', headers: { authorization: TOKEN } });
    assert.equal(raw.statusCode, 401, 'the Bearer scheme is part of it');
  });

  test('GET /v1/host: version, accelerator, CPU, GPUs, templates, VMs', async () => {
    const r = await call('GET', '/v1/host');
    assert.equal(r.status, 200);
    assert.deepEqual(Object.keys(r.body).sort(), [
      'accel',
      'agent_version',
      'host_cpu_model',
      'host_gpus',
      'public_host',
      'templates',
      'vms',
    ]);
    assert.equal(r.body.accel, 'tcg');
    assert.equal(r.body.host_gpus.length, 2);
    assert.deepEqual(r.body.templates, [
      {
        vmid: 100,
        user: 'ubuntu',
        sha256: templates.get(100)!.sha256,
        source: 'local',
        state: 'ready',
        bytes_done: templates.get(100)!.size_bytes,
        size_bytes: templates.get(100)!.size_bytes,
        reason: null,
      },
    ]);
    assert.match(templates.get(100)!.sha256!, /^[0-9a-f]{64}$/, 'template add records the SHA-256');
    assert.equal(typeof r.body.host_cpu_model, 'string');
  });

  test('provision: an overlay on the template, a seed, a port from the range, GPUs; repeated, the same VM', async () => {
    const id = randomUUID();
    const r = await call('PUT', `/v1/vms/${id}`, spec());
    assert.equal(r.status, 200, JSON.stringify(r.body));
    assert.deepEqual(r.body, {
      id,
      state: 'stopped',
      ssh: { host: 'gpu7.example.com', port: 41000, user: 'ubuntu' },
      gpus: [],
      exit_reason: null,
      traffic: { rx_bytes: 0, tx_bytes: 0, counted: false },
    });
    const again = await call('PUT', `/v1/vms/${id}`, spec());
    assert.deepEqual(again.body, r.body, 'provisioning is safe to repeat');
    const folder = join(dir, 'd', 'vms', '1000');
    assert.deepEqual(readdirSync(folder).sort(), ['disk.qcow2', 'seed.iso', 'vm.json']);
    assert.equal(statSync(folder).mode & 0o777, 0o700);
    assert.equal(statSync(join(folder, 'vm.json')).mode & 0o777, 0o600);
    const info = JSON.parse(
      execFileSync('qemu-img', ['info', '-U', '--output=json', join(folder, 'disk.qcow2')], { encoding: 'utf8' }),
    );
    assert.equal(info['virtual-size'], 20 * 1024 ** 3, 'grown to storage_gb');
    assert.equal(info['backing-filename'], templates.get(100)!.path);
    const seed = readFileSync(join(folder, 'seed.iso')).toString('latin1');
    assert.ok(
      seed.includes('AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl'),
      'the key is in the seed',
    );
    assert.ok(!seed.includes('me@laptop'), 'without its comment');
    assert.equal((await call('GET', `/v1/vms/${id}`)).body.state, 'stopped');
    const host = await call('GET', '/v1/host');
    assert.deepEqual(
      host.body.vms.map((v: { id: string }) => v.id),
      [id],
    );
  });

  test('a password VM keeps only the hash of its password', async () => {
    const id = randomUUID();
    const password = 'a long password 1234';
    const r = await call(
      'PUT',
      `/v1/vms/${id}`,
      spec({ vmid: 1001, gpu_count: 0, auth_method: 'password', ssh_public_key: null, password }),
    );
    assert.equal(r.status, 200, JSON.stringify(r.body));
    assert.equal(r.body.ssh.port, 41001);
    const folder = join(dir, 'd', 'vms', '1001');
    for (const f of readdirSync(folder)) assert.ok(!readFileSync(join(folder, f)).includes(password), f);
    assert.match(readFileSync(join(folder, 'seed.iso')).toString('latin1'), /hashed_passwd: "\$6\$/);
    assert.equal((await call('DELETE', `/v1/vms/${id}`)).status, 204);
  });

  test('refusals: validation (422), a missing template, no GPUs or ports left (409), a vmid taken, unknown VMs (404)', async () => {
    const id = randomUUID();
    const bad: [unknown, string][] = [
      [{ ...spec(), ram_mb: '512' }, 'ram_mb as a string'],
      [spec({ ram_mb: 10 }), 'ram_mb'],
      [spec({ gpu_count: 17 }), 'gpu_count'],
      [spec({ auth_method: 'telnet' }), 'auth_method'],
      [spec({ extra: 1 }), 'extra'],
      [spec({ ssh_public_key: null }), 'ssh_public_key'],
      [spec({ auth_method: 'password', ssh_public_key: null, password: null }), 'password'],
      [spec({ ssh_public_key: 'ssh-ed25519 AAAA,if=none' }), 'key'],
    ];
    for (const [body, what] of bad) {
      const r = await call('PUT', `/v1/vms/${id}`, { ...(body as object), vmid: 1009 });
      assert.equal(r.status, 422, `${what}: ${JSON.stringify(r.body)}`);
    }
    assert.equal((await call('PUT', `/v1/vms/${id}`, spec({ vmid: 0 }))).status, 422);
    assert.equal((await call('PUT', '/v1/vms/not-a-uuid', spec())).status, 422);
    const missing = await call('PUT', `/v1/vms/${id}`, spec({ vmid: 1002, template_vmid: 555 }));
    assert.equal(missing.status, 409);
    assert.equal(missing.body.code, 'template_unavailable');
    assert.match(missing.body.detail, /template 555 is not on this host/);
    const gpus = await call('PUT', `/v1/vms/${id}`, spec({ vmid: 1002, gpu_count: 3 }));
    assert.equal(gpus.status, 409, JSON.stringify(gpus.body));
    assert.equal(gpus.body.code, 'gpus_unavailable');
    assert.match(gpus.body.detail, /3 GPU\(s\) asked, this host has 2/);
    const taken = await call('PUT', `/v1/vms/${id}`, spec({ vmid: 1000 }));
    assert.equal(taken.status, 409);
    assert.equal(taken.body.code, 'conflict');
    // Ports 41000-41002: one VM holds 41000; fill the rest, then none is left.
    const a = await call('PUT', `/v1/vms/${randomUUID()}`, spec({ vmid: 1003, gpu_count: 0 }));
    const b = await call('PUT', `/v1/vms/${randomUUID()}`, spec({ vmid: 1004, gpu_count: 0 }));
    assert.deepEqual([a.body.ssh.port, b.body.ssh.port], [41001, 41002]);
    const none = await call('PUT', `/v1/vms/${randomUUID()}`, spec({ vmid: 1005, gpu_count: 0 }));
    assert.equal(none.status, 409);
    assert.equal(none.body.code, 'no_ports');
    for (const r of [a, b]) assert.equal((await call('DELETE', `/v1/vms/${r.body.id}`)).status, 204);
    assert.deepEqual(readdirSync(join(dir, 'd', 'vms')).sort(), ['1000'], 'refused VMs left nothing behind');
    assert.equal((await call('GET', `/v1/vms/${randomUUID()}`)).status, 404);
    assert.equal((await call('POST', `/v1/vms/${randomUUID()}/start`)).status, 404);
    assert.equal((await call('POST', `/v1/vms/${randomUUID()}/stop`, { timeout_s: 5 })).status, 404);
    assert.equal(
      (await call('DELETE', `/v1/vms/${randomUUID()}`)).status,
      204,
      'a VM that is not here counts as destroyed',
    );
  });

  test('stop of a stopped VM is a no-op; destroy removes every file; the template cannot go while VMs stand on it', async () => {
    const id = (await call('GET', '/v1/host')).body.vms[0].id as string;
    const stop = await call('POST', `/v1/vms/${id}/stop`, { timeout_s: 0 });
    assert.equal(stop.status, 200);
    assert.equal(stop.body.state, 'stopped');
    assert.equal((await call('POST', `/v1/vms/${id}/stop`, { timeout_s: -1 })).status, 422);
    assert.throws(() => templates.remove(100, vms.templateInUse(100)), /base of VMs/);
    assert.equal((await call('DELETE', `/v1/vms/${id}`)).status, 204);
    assert.deepEqual(readdirSync(join(dir, 'd', 'vms')), []);
    assert.equal((await call('GET', `/v1/vms/${id}`)).status, 404);
    assert.equal(vms.templateInUse(100), false);
  });

  test('templates: qcow2 or raw, a login user that is a Linux name, never replaced', async () => {
    const other = join(dir, 'other.qcow2');
    execFileSync('qemu-img', ['create', '-q', '-f', 'qcow2', other, '8M']);
    const t = await templates.add(200, other);
    assert.equal(t.user, 'root');
    assert.ok(existsSync(t.path));
    await assert.rejects(templates.add(200, other), /exists already/);
    await assert.rejects(templates.add(201, other, 'Root Admin'), /not a Linux user name/);
    await assert.rejects(templates.add(202, join(dir, 'nope.img')), /is not a file/);
    const text = join(dir, 'not-an-image.vmdk');
    execFileSync('qemu-img', ['create', '-q', '-f', 'vmdk', text, '8M']);
    await assert.rejects(templates.add(203, text), /is vmdk; a template must be qcow2 or raw/);
    writeFileSync(join(dir, 'empty'), '');
    assert.deepEqual(
      templates.list().map((x) => x.vmid),
      [100, 200],
    );
    templates.remove(200, false);
    assert.deepEqual(
      templates.list().map((x) => x.vmid),
      [100],
    );
  });

  test('real GPUs: only devices bound to vfio-pci count; a VM asking more than the host can give is refused', async () => {
    const sys = join(dir, 'sys');
    buildSysfs(sys, [
      { addr: '0000:01:00.0', vendor: '0x10de', device: '0x2684', cls: '0x030000', group: 12, driver: 'vfio-pci' },
      { addr: '0000:02:00.0', vendor: '0x10de', device: '0x2684', cls: '0x030000', group: 13, driver: 'vfio-pci' },
      { addr: '0000:03:00.0', vendor: '0x10de', device: '0x2684', cls: '0x030000', group: 14, driver: 'nvidia' },
    ]);
    const real = new VmManager(
      {
        dataDir: join(dir, 'real'),
        accel: 'kvm',
        publicHost: '127.0.0.1',
        forwardHost: '127.0.0.1',
        sshPorts: { from: 41100, to: 41110 },
        fakeGpus: 0,
        sysRoot: sys,
      },
      templates,
    );
    await real.load();
    assert.deepEqual(
      real.gpus.map((g) => [g.pci_address, g.vfio]),
      [
        ['0000:01:00.0', true],
        ['0000:02:00.0', true],
        ['0000:03:00.0', false],
      ],
    );
    const two = await real.provision(randomUUID(), spec({ vmid: 2000, gpu_count: 2 }) as never);
    assert.deepEqual(two.gpus, [], 'devices are bound when the VM starts, not before');
    await assert.rejects(
      real.provision(randomUUID(), spec({ vmid: 2002, gpu_count: 3 }) as never),
      (err: Error & { code?: string }) => {
        assert.equal(err.code, 'gpus_unavailable');
        assert.match(err.message, /3 GPU\(s\) asked, this host has 2 \(1 more are not bound to vfio-pci\)/);
        return true;
      },
    );
    await real.destroy(two.id);
    real.close();
  });
});
