/**
 * Start on another host with real disks: two `gpucloud agent` processes under one control plane,
 * on each database. Only host A holds the template. A customer writes data to VM X's disk, stops
 * it, and A's only GPU is rented to someone else: a plain start is refused; `move: if_needed`
 * copies X's disk to host B (which never had the template), checks it, and X runs there with the
 * same data, its copy on A removed. Then the other way, with the destination killed in the middle
 * of the copy: X is stopped on B, intact, and a retry succeeds.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import type { TestApp } from '../helpers/app.js';
import { api, type BodyFor } from '../helpers/api.js';
import { DB_KINDS } from '../helpers/db.js';
import type { TestUser } from '../helpers/factories.js';
import { cli, kill, ssh, startAgentProcess, testImage } from './real-vms.js';
import { TwoHosts, twoHostsSkip as skip, type Host } from './two-hosts.js';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
type Vm = BodyFor<'/vms/{vm_id}', 'get', 200>;

/** Where in the guest's disk the customer's data goes (past the test image's boot partition). */
const DATA_AT_MIB = 64;

for (const kind of DB_KINDS) {
  describe(`start on another host, two real hosts [${kind}]`, { skip }, () => {
    const env = new TwoHosts();
    const hosts = env.hosts;
    let t: TestApp;
    let admin: TestUser;
    let renter: TestUser;
    let other: TestUser;
    let x: Vm;
    let dataSha = '';

    const as = (u: TestUser) => api(t, u.token);
    const vmOf = async (id: string): Promise<Vm> => {
      const r = await as(renter).get('/vms/{vm_id}', { params: { vm_id: id } });
      assert.equal(r.status, 200, r.text);
      return r.body;
    };
    const advance = async (seconds = 5) => {
      const r = await as(admin).post('/admin/clock/advance', { body: { seconds } });
      assert.equal(r.status, 200, r.text);
    };
    /** Runs `remote` in X over SSH as its access-info says. */
    const inGuest = async (remote: string) => {
      const info = await as(renter).get('/vms/{vm_id}/access-info', { params: { vm_id: x.id } });
      assert.equal(info.status, 200, info.text);
      const out = ssh(info.body.ssh.command, remote, { key: env.keyFile });
      assert.equal(out.status, 0, out.stderr);
      return out.stdout.trim();
    };
    const readData = () =>
      inGuest(`dd if=/dev/vda of=/tmp/r bs=1M skip=${DATA_AT_MIB} count=1 && sha256sum /tmp/r | cut -d' ' -f1`);
    /** Another user's VM on `node`, left `creating`: it holds the node's GPU until destroyed. */
    const takeGpu = async (node: string) => {
      const r = await as(other).post('/vms', {
        body: { node, gpu_type: '4090', gpu_count: 1, storage_gb: 50, template_vmid: 100 },
      });
      assert.equal(r.status, 201, r.text);
      return r.body.id;
    };
    const release = async (id: string) =>
      assert.equal((await as(other).delete('/vms/{vm_id}', { params: { vm_id: id } })).status, 200);
    const stopX = async () => {
      assert.equal((await as(renter).post('/vms/{vm_id}/stop', { params: { vm_id: x.id } })).status, 200);
      await advance();
      assert.equal((await vmOf(x.id)).status, 'stopped');
    };
    const startMoving = (body?: unknown) =>
      t.req('POST', `/vms/${x.id}/start`, {
        token: renter.token,
        ...(body === undefined ? {} : { body: body as Record<string, unknown> }),
      });
    const vmDirs = (h: Host) => (existsSync(join(h.dataDir, 'vms')) ? readdirSync(join(h.dataDir, 'vms')) : []);

    before(async () => {
      // Only host A holds the template: a moved disk needs none.
      await env.start(kind, 'move', (name, dataDir) => {
        if (name !== 'a') return;
        const added = cli(['agent', 'template', 'add', '100', testImage(), '--user', 'root', '--data-dir', dataDir]);
        assert.equal(added.status, 0, added.stderr);
      });
      ({ t, admin } = env);
      renter = await env.customer();
      other = await env.customer();
      for (const h of hosts) await env.register(h, { gpu_type: '4090', cluster_name: `move-${kind}` });
    });

    after(() => env.close());

    test('X, stopped on A whose GPU was rented out, runs on B with the data its customer wrote', async () => {
      const [a, b] = hosts as [Host, Host];
      const c = await as(renter).post('/vms', {
        body: { node: a.name, gpu_type: '4090', gpu_count: 1, storage_gb: 50, template_vmid: 100, instance_label: 'x' },
      });
      assert.equal(c.status, 201, c.text);
      x = await vmOf(c.body.id);
      await advance();
      assert.equal((await vmOf(x.id)).status, 'running');
      // The customer's data: 1 MiB of random bytes written to the disk, flushed.
      dataSha = await inGuest(
        `head -c 1048576 /dev/urandom > /tmp/d && dd if=/tmp/d of=/dev/vda bs=1M seek=${DATA_AT_MIB} conv=fsync && sync && sha256sum /tmp/d | cut -d' ' -f1`,
      );
      assert.match(dataSha, /^[0-9a-f]{64}$/);
      await stopX();
      const before = await vmOf(x.id);

      const taker = await takeGpu(a.name);
      // The default never moves.
      const plain = await startMoving();
      assert.equal(plain.status, 400, plain.text);
      assert.equal((plain.body as { code: string }).code, 'gpu_unavailable');
      const r = await startMoving({ move: 'if_needed' });
      assert.equal(r.status, 200, r.text);
      assert.equal((await vmOf(x.id)).status, 'moving');
      // The taker never boots: its GPU stays taken only until X has left.
      await release(taker);
      await advance();

      const moved = await vmOf(x.id);
      assert.equal(moved.status, 'running', JSON.stringify(moved));
      assert.equal(moved.node, b.name);
      for (const k of ['id', 'vmid', 'instance_label', 'gpu_hourly_rate', 'storage_hourly_rate'] as const)
        assert.deepEqual(moved[k], before[k], k);
      assert.equal(await readData(), dataSha, 'the data the customer wrote came along');
      // B built it from the copy alone, with no template and no backing file.
      const disk = join(b.dataDir, 'vms', String(x.vmid), 'disk.qcow2');
      const info = JSON.parse(
        execFileSync('qemu-img', ['info', '--output=json', '-U', disk], { encoding: 'utf8' }),
      ) as {
        'backing-filename'?: string;
      };
      assert.equal(info['backing-filename'], undefined);
      // A's copy is gone once the move was recorded.
      assert.ok(!vmDirs(a).includes(String(x.vmid)), `A still holds ${vmDirs(a).join(', ')}`);
      const evs = await as(renter).get('/events', { query: { vm_id: x.id, type: ['vm.moved'] } });
      assert.equal(evs.status, 200, evs.text);
      assert.equal(evs.body.length, 1);
      const d = evs.body[0]!.data as { from: string; to: string; bytes: number; seconds: number };
      assert.equal(d.from, a.name);
      assert.equal(d.to, b.name);
      assert.ok(d.bytes > 1 << 20, `bytes ${d.bytes}`);
    });

    test('the destination killed in the middle of the copy: X is stopped on B, intact; a retry succeeds', async () => {
      const [a, b] = hosts as [Host, Host];
      await stopX();
      // B gets the template now, so that another user's VM can take its GPU.
      await kill(b.agent.child);
      const added = cli(['agent', 'template', 'add', '100', testImage(), '--user', 'root', '--data-dir', b.dataDir]);
      assert.equal(added.status, 0, added.stderr);
      b.agent = await startAgentProcess(b.args);
      await t.services.hostMonitor.checkNode(b.name);
      // A downloads slowly now, so that the kill lands in the middle of the copy.
      await kill(a.agent.child);
      a.agent = await startAgentProcess([...a.args, '--download-limit', '2']);
      const taker = await takeGpu(b.name);
      const r = await startMoving({ move: 'if_needed' });
      assert.equal(r.status, 200, r.text);
      assert.equal((await vmOf(x.id)).node, a.name);
      await release(taker);
      // The advance runs the move; meanwhile A is killed once part of the disk has arrived.
      const advancing = advance();
      const partial = () => {
        const found: number[] = [];
        const walk = (d: string) => {
          if (!existsSync(d)) return;
          for (const e of readdirSync(d, { withFileTypes: true })) {
            const p = join(d, e.name);
            if (e.isDirectory()) walk(p);
            else if (e.name.endsWith('.part')) found.push(statSync(p).size);
          }
        };
        walk(join(a.dataDir, 'vms'));
        return found.reduce((s, n) => s + n, 0);
      };
      for (let i = 0; i < 240 && partial() < 2 << 20; i++) await sleep(250);
      assert.ok(partial() >= 2 << 20, 'part of the disk reached A');
      await kill(a.agent.child);
      await advancing;
      const failed = await vmOf(x.id);
      assert.equal(failed.status, 'stopped');
      assert.equal(failed.node, b.name);
      const evs = await as(renter).get('/events', { query: { vm_id: x.id, type: ['vm.move_failed'] } });
      assert.equal(evs.status, 200, evs.text);
      assert.equal(evs.body.length, 1, 'the failure is an event, with its reason');
      assert.match(String(evs.body[0]!.data.error), /unreachable/);
      assert.ok(vmDirs(b).includes(String(x.vmid)), 'B still holds X');

      // A back (at full speed); the retry goes through.
      a.agent = await startAgentProcess(a.args);
      const taker2 = await takeGpu(b.name);
      assert.equal((await startMoving({ move: 'if_needed' })).status, 200);
      await release(taker2);
      await advance();
      const moved = await vmOf(x.id);
      assert.equal(moved.status, 'running', JSON.stringify(moved));
      assert.equal(moved.node, a.name);
      assert.equal(await readData(), dataSha, 'the data is intact after the failed move and the retry');
      assert.ok(!vmDirs(b).includes(String(x.vmid)), 'B no longer holds X');
    });

    test('a snapshot of X, X destroyed, a VM from the image on the other host holds the data', async () => {
      const [a, b] = hosts as [Host, Host];
      await stopX();
      assert.equal((await vmOf(x.id)).node, a.name);
      const r = await t.req('POST', `/vms/${x.id}/snapshots`, { token: renter.token, body: { name: 'with-data' } });
      assert.equal(r.status, 202, r.text);
      const imageId = (r.body as { id: string }).id;
      await advance();
      const img = await as(renter).get('/images/{image_id}', { params: { image_id: imageId } });
      assert.equal(img.status, 200, img.text);
      assert.equal(img.body.state, 'ready', JSON.stringify(img.body));
      assert.ok((img.body.size_bytes ?? 0) > 1 << 20);
      // The export on A is gone once copied; the store holds the image.
      assert.ok(!existsSync(join(a.dataDir, 'vms', String(x.vmid), 'export.qcow2')), 'the export was removed');
      // Another user sees nothing of it.
      assert.equal((await as(other).get('/images/{image_id}', { params: { image_id: imageId } })).status, 404);
      assert.equal((await as(renter).delete('/vms/{vm_id}', { params: { vm_id: x.id } })).status, 200);
      await advance();
      const y = await as(renter).post('/vms', {
        body: { node: b.name, gpu_type: '4090', gpu_count: 1, storage_gb: 50, image_id: imageId },
      });
      assert.equal(y.status, 201, y.text);
      await advance();
      x = await vmOf(y.body.id);
      assert.equal(x.status, 'running', JSON.stringify(x));
      assert.equal(x.node, b.name);
      assert.equal(await readData(), dataSha, 'the file written before the snapshot is in the new VM');
      assert.equal(await inGuest('hostname'), `gpucloud-${x.vmid}`, 'a new instance: its own host name');
    });
  });
}
