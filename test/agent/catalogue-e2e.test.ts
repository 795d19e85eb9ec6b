/**
 * Templates reach real hosts: two `gpucloud agent` processes (separate data
 * directories and ports) under one control plane, on each database. The test
 * image is pushed to the image store as template 105; both hosts download it,
 * check it and report it ready; a VM is rented on each and answers on SSH. One
 * host's copy is corrupted and fetched again; an agent killed in the middle of
 * a download resumes it where it stopped; a deleted template's image leaves
 * the hosts once the last VM built on it is destroyed.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { existsSync, openSync, readdirSync, readFileSync, statSync, writeSync, closeSync } from 'node:fs';
import { join } from 'node:path';
import type { TestApp } from '../helpers/app.js';
import { api } from '../helpers/api.js';
import { DB_KINDS } from '../helpers/db.js';
import { advance, type TestUser } from '../helpers/factories.js';
import { kill, ssh, startAgentProcess, testImage } from './real-vms.js';
import { TwoHosts, twoHostsSkip as skip } from './two-hosts.js';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const sha256 = (b: Buffer) => createHash('sha256').update(b).digest('hex');

for (const kind of DB_KINDS) {
  describe(`templates distributed to two real hosts [${kind}]`, { skip }, () => {
    const env = new TwoHosts();
    const hosts = env.hosts;
    let t: TestApp;
    let admin: TestUser;
    let renter: TestUser;

    const asAdmin = () => api(t, admin.token);
    const asRenter = () => api(t, renter.token);
    const states = async (node: string) => {
      const r = await asAdmin().get('/admin/nodes/{node}/templates', { params: { node } });
      assert.equal(r.status, 200, r.text);
      return r.body;
    };
    const stateOf = async (node: string, vmid: number) => (await states(node)).find((s) => s.template_vmid === vmid);
    /** Heartbeats to every node until `check` holds (the agents work in real time). */
    const until = async (what: string, check: () => Promise<boolean>, seconds = 60) => {
      for (let i = 0; i < seconds * 4; i++) {
        for (const h of hosts) await t.services.hostMonitor.checkNode(h.name);
        if (await check()) return;
        await sleep(250);
      }
      assert.fail(`${what} within ${seconds} s`);
    };
    /** Uploads `file` through the API in ranges of 4 MiB; returns the image's SHA-256. */
    const push = async (file: Buffer, templateVmid: number) => {
      const u = await asAdmin().post('/admin/images/uploads', {
        body: { size_bytes: file.length, sha256: sha256(file), template_vmid: templateVmid },
      });
      assert.equal(u.status, 201, u.text);
      for (let at = 0; at < file.length; at += 4 << 20) {
        const r: { statusCode: number; body: string } = await t.app.inject({
          method: 'PUT',
          url: `/admin/images/uploads/${u.body.id}?offset=${at}`,
          headers: { authorization: `Bearer ${admin.token}`, 'content-type': 'application/octet-stream' },
          payload: file.subarray(at, at + (4 << 20)),
        });
        assert.equal(r.statusCode, 200, r.body);
      }
      const done = await asAdmin().post('/admin/images/uploads/{upload_id}/complete', {
        params: { upload_id: u.body.id },
      });
      assert.equal(done.status, 201, done.text);
      return done.body.sha256;
    };
    const imagesOn = (h: (typeof hosts)[number]) =>
      existsSync(join(h.dataDir, 'images')) ? readdirSync(join(h.dataDir, 'images')) : [];

    before(async () => {
      await env.start(kind, 'cat');
      ({ t, admin } = env);
      renter = await env.customer();
    });

    after(() => env.close());

    test('both hosts download the pushed image, report it ready, and run a VM of it', async () => {
      const c = await asAdmin().post('/admin/templates', {
        body: {
          template_vmid: 105,
          name: 'test-guest',
          description: 'The tests image',
          os: 'Debian 12',
          default_user: 'root',
        },
      });
      assert.equal(c.status, 201, c.text);
      const image = readFileSync(testImage());
      const sha = await push(image, 105);
      for (const h of hosts) await env.register(h);
      for (const h of hosts) {
        await until(`template 105 ready on ${h.name}`, async () => (await stateOf(h.name, 105))?.state === 'ready');
        const s = (await stateOf(h.name, 105))!;
        assert.equal(s.source, 'pulled');
        assert.equal(s.sha256, sha);
        assert.equal(s.progress, 100);
        assert.equal(sha256(readFileSync(join(h.dataDir, 'images', `${sha}.qcow2`))), sha, 'the host holds the image');
      }
      const offers = await api(t).get('/search', { query: { template_vmid: 105 } });
      assert.equal(offers.status, 200, offers.text);
      assert.deepEqual(offers.body.map((o) => o.node).sort(), hosts.map((h) => h.name).sort());

      const vms: string[] = [];
      for (const h of hosts) {
        const v = await asRenter().post('/vms', {
          body: { node: h.name, gpu_type: '4090', gpu_count: 1, storage_gb: 50, template_vmid: 105 },
        });
        assert.equal(v.status, 201, v.text);
        vms.push(v.body.id);
      }
      await advance(t, admin.token, 5);
      for (const [i, id] of vms.entries()) {
        const v = await asRenter().get('/vms/{vm_id}', { params: { vm_id: id } });
        assert.equal(v.status, 200, v.text);
        assert.equal(v.body.status, 'running', `the VM on ${hosts[i]!.name} runs`);
        const info = await asRenter().get('/vms/{vm_id}/access-info', { params: { vm_id: id } });
        assert.equal(info.status, 200, info.text);
        const out = ssh(info.body.ssh.command, 'echo hello from $(hostname)', { key: env.keyFile });
        assert.equal(out.status, 0, out.stderr);
        assert.equal(out.stdout.trim(), `hello from gpucloud-${v.body.vmid}`);
      }

      // One host's copy corrupted on disk: detected, refused, fetched again.
      const a = hosts[0]!;
      const file = join(a.dataDir, 'images', `${sha}.qcow2`);
      const fd = openSync(file, 'r+');
      writeSync(fd, randomBytes(4096), 0, 4096, 1 << 20);
      closeSync(fd);
      assert.notEqual(sha256(readFileSync(file)), sha);
      await until(
        'the corrupted copy fetched again',
        async () =>
          (await stateOf(a.name, 105))?.state === 'ready' && existsSync(file) && sha256(readFileSync(file)) === sha,
      );
      const downloads = a.agent
        .output()
        .split('\n')
        .filter((l) => l.includes(sha) && l.includes('downloading an image'));
      assert.equal(downloads.length, 2, `downloaded again, from its first byte:\n${a.agent.output()}`);
      assert.match(downloads[1]!, /"resume_from":0/);

      // Deleting the template: refused while VMs stand on it; once they are destroyed the hosts remove it.
      const refused = await asAdmin().delete('/admin/templates/{template_vmid}', { params: { template_vmid: 105 } });
      assert.equal(refused.status, 400);
      assert.equal(refused.body.code, 'conflict');
      for (const id of vms)
        assert.equal((await asRenter().delete('/vms/{vm_id}', { params: { vm_id: id } })).status, 200);
      await advance(t, admin.token, 30);
      const d = await asAdmin().delete('/admin/templates/{template_vmid}', { params: { template_vmid: 105 } });
      assert.equal(d.status, 204, d.text);
      await until('both hosts removed the image', async () =>
        hosts.every((h) => !imagesOn(h).some((f) => f.startsWith(sha))),
      );
      for (const h of hosts) assert.equal(await stateOf(h.name, 105), undefined, 'nothing left to report');
    });

    test('an agent killed in the middle of a download resumes it where it stopped', async () => {
      const b = hosts[1]!;
      // Slowed down, so the kill lands in the middle.
      await kill(b.agent.child);
      b.agent = await startAgentProcess([...b.args, '--download-limit', '3']);
      const c = await asAdmin().post('/admin/templates', {
        body: { template_vmid: 106, name: 'big-raw', description: 'x', os: 'none', default_user: 'root' },
      });
      assert.equal(c.status, 201, c.text);
      const raw = randomBytes(24 << 20);
      const sha = await push(raw, 106);
      await until('the download under way', async () => ((await stateOf(b.name, 106))?.bytes_done ?? 0) > 6 << 20);
      await kill(b.agent.child);
      const part = join(b.dataDir, 'images', `${sha}.raw.part`);
      assert.ok(existsSync(part), 'the part stays');
      const had = statSync(part).size;
      assert.ok(had > 0 && had < raw.length, `a part of ${had} bytes`);
      b.agent = await startAgentProcess([...b.args, '--download-limit', '3']);
      await t.services.hostMonitor.checkNode(b.name);
      const first = (await stateOf(b.name, 106))!;
      assert.ok(first.bytes_done >= had, `resumed at ${first.bytes_done} bytes, not from 0 (the part had ${had})`);
      await until(
        'template 106 ready after the restart',
        async () => (await stateOf(b.name, 106))?.state === 'ready',
        30,
      );
      assert.equal(sha256(readFileSync(join(b.dataDir, 'images', `${sha}.raw`))), sha);
      // With no VM on it, deleting the template removes it from both hosts at the next heartbeat.
      const d = await asAdmin().delete('/admin/templates/{template_vmid}', { params: { template_vmid: 106 } });
      assert.equal(d.status, 204, d.text);
      await until('both hosts removed the raw image', async () =>
        hosts.every((h) => !imagesOn(h).some((f) => f.startsWith(sha))),
      );
    });
  });
}
