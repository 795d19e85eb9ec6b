/**
 * The agent's tunnel for the access portal, both sides (src/host-agent/tunnel.ts,
 * src/hypervisor/tunnel.ts) against a real agent server and a real QEMU (a
 * blank disk: no guest answers): the token, the VM's state and its declared
 * ports are checked before anything is connected, and a web port is forwarded
 * from loopback only. The whole path into a real guest's app is in
 * portal-e2e.test.ts.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import type { AddressInfo } from 'node:net';
import type { FastifyInstance } from 'fastify';
import { buildAgentApp } from '../../src/host-agent/server.js';
import { TemplateStore } from '../../src/host-agent/templates.js';
import { VmManager } from '../../src/host-agent/vms.js';
import { openTunnel, TunnelError } from '../../src/hypervisor/tunnel.js';
import { genisoimage, qemu, qemuImg } from './qemu-helpers.js';
import { qemuPidsUnder, workDir } from './real-vms.js';

const TOKEN = 'agent-tunnel-token-'.padEnd(40, 't');
const KEY = 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl me@laptop';

describe('the agent tunnel', { skip: qemu.skip || qemuImg.skip || genisoimage.skip }, () => {
  let dir: string;
  let vms: VmManager;
  let app: FastifyInstance;
  let url: string;
  const id = randomUUID();

  const refusedWith = async (p: Promise<unknown>, status: number, code: string) => {
    await assert.rejects(p, (err: unknown) => {
      assert.ok(err instanceof TunnelError, String(err));
      assert.equal(err.status, status, err.message);
      assert.equal(err.code, code);
      return true;
    });
  };

  before(async () => {
    for (const tool of [qemu, qemuImg, genisoimage]) tool.ensure();
    dir = workDir('tun');
    const base = join(dir, 'base.raw');
    execFileSync('qemu-img', ['create', '-q', '-f', 'raw', base, '1M']);
    const templates = new TemplateStore(join(dir, 'd', 'templates'));
    await templates.add(102, base, 'root');
    vms = new VmManager(
      {
        dataDir: join(dir, 'd'),
        accel: 'tcg',
        publicHost: '127.0.0.1',
        forwardHost: '127.0.0.1',
        sshPorts: { from: 43500, to: 43520 },
        fakeGpus: 1,
      },
      templates,
    );
    await vms.load();
    app = await buildAgentApp(vms, templates, { token: TOKEN, accel: 'tcg', publicHost: '127.0.0.1' });
    await app.listen({ port: 0, host: '127.0.0.1' });
    url = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`;
    await vms.provision(id, {
      vmid: 7000,
      template_vmid: 102,
      cpu_cores: 1,
      ram_mb: 128,
      storage_gb: 1,
      gpu_count: 0,
      auth_method: 'ssh_key',
      ssh_public_key: KEY,
      password: null,
      web_ports: [8888, 7860],
    });
  });

  after(async () => {
    await app?.close();
    vms?.close();
    if (dir) for (const pid of qemuPidsUnder(dir)) process.kill(pid, 'SIGKILL');
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  test('refused before anything is connected: a wrong token, an unknown VM, a stopped VM, an undeclared port', async () => {
    await refusedWith(openTunnel({ url, token: `${TOKEN}x` }, id, 7860), 401, 'unauthorized');
    await refusedWith(openTunnel({ url, token: TOKEN }, randomUUID(), 7860), 404, 'not_found');
    await refusedWith(openTunnel({ url, token: TOKEN }, 'not-a-uuid', 7860), 404, 'not_found');
    await refusedWith(openTunnel({ url, token: TOKEN }, id, 7860), 409, 'not_running');
    await refusedWith(openTunnel({ url, token: TOKEN }, id, 22), 403, 'port_not_declared');
    // Without the upgrade, the route does not exist at all.
    const plain = await fetch(`${url}/v1/vms/${id}/tunnel?port=7860`, {
      headers: { authorization: `Bearer ${TOKEN}` },
    });
    assert.equal(plain.status, 404);
  });

  test("a running VM's web ports are forwarded from 127.0.0.1 only, and the tunnel reaches them", async () => {
    const started = await vms.start(id);
    assert.notEqual(started.state, 'stopped');
    const rec = JSON.parse(readFileSync(join(dir, 'd', 'vms', '7000', 'vm.json'), 'utf8')) as {
      web_ports: number[];
      web_forwards: { guest: number; host: number }[];
    };
    assert.deepEqual(rec.web_ports, [7860, 8888]);
    assert.deepEqual(
      rec.web_forwards.map((f) => f.guest),
      [7860, 8888],
    );
    const [pid] = qemuPidsUnder(join(dir, 'd'));
    const cmdline = readFileSync(`/proc/${pid}/cmdline`, 'utf8');
    for (const f of rec.web_forwards)
      assert.ok(cmdline.includes(`hostfwd=tcp:127.0.0.1:${f.host}-:${f.guest}`), cmdline);
    assert.ok(!/hostfwd=tcp:0\.0\.0\.0/.test(cmdline));
    // QEMU's user networking accepts for the guest: the tunnel opens (the blank guest then drops it).
    const socket = await openTunnel({ url, token: TOKEN }, id, 7860);
    assert.ok(socket.readable);
    socket.destroy();
    await refusedWith(openTunnel({ url, token: TOKEN }, id, 8080), 403, 'port_not_declared');
    await vms.stop(id, 0);
    await refusedWith(openTunnel({ url, token: TOKEN }, id, 7860), 409, 'not_running');
  });
});
