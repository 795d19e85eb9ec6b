/**
 * A customer's images from `gpucloud`, as the process users run, against a real server on both
 * databases (simulated nodes, the manual clock moved on while the CLI waits): `vm snapshot --wait`
 * until the image is ready, `images` (table and --json), `images show`, `vm create --image` (its
 * template and disk from the image), `images delete` (refused without a terminal or --yes, done
 * with --yes); the refusals (--image with --template, another user's image, a running VM, no
 * --name); and a snapshot that fails: `--wait` exits 1 with the image's error.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describeEachDb } from '../helpers/app.js';
import { api, type BodyFor } from '../helpers/api.js';
import { createApiKey, createNode, createUser, credit, uploadSshKey, type TestUser } from '../helpers/factories.js';
import { cliEnv, fails, gpucloud, ok, type Run } from './harness.js';

type Image = BodyFor<'/images/{image_id}', 'get', 200>;

describeEachDb('gpucloud vm snapshot, images, vm create --image', (t) => {
  let base: string;
  let admin: TestUser;
  let node: string;
  let home: string;

  before(async () => {
    base = await t().app.listen({ port: 0, host: '127.0.0.1' });
    admin = await createUser(t(), { admin: true });
    node = (await createNode(t(), admin.token, { gpu_type: '4090', gpu_count: 8, cluster_name: 'images-cli' })).node;
    home = mkdtempSync(join(tmpdir(), 'gpucloud-cli-images-'));
  });
  after(() => rmSync(home, { recursive: true, force: true }));

  /** A user with credit, an SSH key and an API key for the CLI. */
  async function customer(): Promise<{ u: TestUser; key: string }> {
    const u = await createUser(t());
    await credit(t(), admin.token, u.id, 500);
    await uploadSshKey(t(), u.token);
    return { u, key: await createApiKey(t(), u.token, 'read_write', 'cli') };
  }

  /** Runs the CLI while the manual clock moves on, so the background work it waits for happens. */
  async function cli(key: string, args: string[]): Promise<Run> {
    let done = false;
    const run = gpucloud(args, cliEnv(home, base, key)).finally(() => (done = true));
    while (!done) {
      await t().services.clock.advance(1);
      await new Promise((r) => setTimeout(r, 100));
    }
    return run;
  }

  async function vmOf(u: TestUser, id: string) {
    const r = await api(t(), u.token).get('/vms/{vm_id}', { params: { vm_id: id } });
    assert.equal(r.status, 200, r.text);
    return r.body;
  }

  /** A stopped VM of `u` on `on`, with a 73 GB disk. */
  async function stoppedVm(u: TestUser, on = node) {
    const r = await api(t(), u.token).post('/vms', {
      body: { node: on, gpu_type: '4090', gpu_count: 1, storage_gb: 73, template_vmid: 101 },
    });
    assert.equal(r.status, 201, r.text);
    await t().services.clock.advance(1);
    assert.equal((await api(t(), u.token).post('/vms/{vm_id}/stop', { params: { vm_id: r.body.id } })).status, 200);
    await t().services.clock.advance(1);
    assert.equal((await vmOf(u, r.body.id)).status, 'stopped');
    return r.body;
  }

  async function imagesOf(u: TestUser): Promise<Image[]> {
    const r = await api(t(), u.token).get('/images');
    assert.equal(r.status, 200, r.text);
    return r.body;
  }

  test('snapshot --wait to ready; images, images show (and --json); vm create --image; delete asks, --yes deletes', async () => {
    const { u, key } = await customer();
    const vm = await stoppedVm(u);

    const snap = await cli(key, ['vm', 'snapshot', String(vm.vmid), '--name', 'trained v2', '--wait']);
    ok(snap);
    const [img] = await imagesOf(u);
    assert.ok(img);
    assert.equal(img.state, 'ready');
    assert.equal(img.name, 'trained v2');
    assert.match(snap.stdout, new RegExp(`Saving VM ${vm.vmid} as image "trained v2" \\(${img.id}\\)`));
    assert.match(snap.stdout, /Image "trained v2" is ready: [\d.]+ GB, \$0\.\d+\/h while you keep it/);
    assert.match(
      snap.stdout,
      new RegExp(
        `\\(with a disk of 73 GB or more\\): gpucloud vm create --node NODE --gpu GPU --image ${img.id}$`,
        'm',
      ),
    );
    // Not a terminal: a line when it starts and one when it is done, on stderr.
    assert.match(snap.stderr, /Image "trained v2": creating, copying the disk of VM \d+/);
    assert.match(snap.stderr, /Image "trained v2": ready after \d+s/);

    const list = await cli(key, ['images']);
    ok(list);
    const [head, row] = list.stdout.trim().split('\n');
    assert.match(head!, /^ID\s+NAME\s+STATE\s+SIZE\s+\$\/H\s+SOURCE VM\s+CREATED$/);
    assert.ok(row!.startsWith(img.id), row);
    for (const part of ['trained v2', 'ready', `${img.size_gb!.toFixed(1)} GB`, `$${img.hourly_cost!.toFixed(6)}`])
      assert.ok(row!.includes(part), `${part} in ${row}`);
    assert.match(row!, new RegExp(`\\s${vm.vmid}\\s+${img.created_at}$`));
    const listJson = await cli(key, ['images', '--json']);
    ok(listJson);
    assert.deepEqual(JSON.parse(listJson.stdout), [img]);

    const show = await cli(key, ['images', 'show', img.id]);
    ok(show);
    assert.match(show.stdout, /^State:\s+ready$/m);
    assert.match(show.stdout, new RegExp(`^Source VM:\\s+${vm.vmid} \\(${vm.id}\\)$`, 'm'));
    assert.match(show.stdout, /^Template:\s+101 \(ubuntu-24\.04\)$/m);
    assert.match(show.stdout, /^Disk:\s+73 GB/m);
    assert.match(
      show.stdout,
      new RegExp(`^Hourly cost:\\s+\\$${img.hourly_cost!.toFixed(6).replace('.', '\\.')}/h$`, 'm'),
    );
    const showJson = await cli(key, ['images', 'show', img.id, '--json']);
    ok(showJson);
    assert.deepEqual(JSON.parse(showJson.stdout), img);

    // A VM from the image: its template, and a disk as large as the image's by default.
    const made = await cli(key, ['vm', 'create', '--node', node, '--gpu', '4090', '--image', img.id, '--wait']);
    ok(made);
    assert.match(made.stdout, /from image "trained v2" \(template 101 \(ubuntu-24\.04\)\)/);
    assert.match(made.stdout, /is running/);
    const vms = await api(t(), u.token).get('/vms');
    assert.equal(vms.status, 200, vms.text);
    const fromImage = vms.body.find((v) => v.image_id === img.id);
    assert.ok(fromImage, 'a VM from the image');
    assert.equal(fromImage.storage_gb, 73);
    assert.equal(fromImage.template_vmid, 101);
    assert.equal(fromImage.status, 'running');
    const shown = await cli(key, ['vm', 'show', String(fromImage.vmid)]);
    ok(shown);
    assert.match(shown.stdout, new RegExp(`^Image:\\s+${img.id}$`, 'm'));

    // Without a terminal or --yes nothing is deleted; with --yes it is.
    fails(await cli(key, ['images', 'delete', img.id]), 2, /pass --yes/);
    assert.equal((await imagesOf(u)).length, 1);
    const del = await cli(key, ['images', 'delete', img.id, '--yes']);
    ok(del);
    assert.match(del.stdout, new RegExp(`Deleted image ${img.id}; its storage is no longer billed`));
    assert.deepEqual(await imagesOf(u), []);
    const none = await cli(key, ['images']);
    ok(none);
    assert.match(none.stdout, /No images; save a stopped VM as one with: gpucloud vm snapshot VM --name NAME/);
    fails(await cli(key, ['images', 'show', img.id]), 1, /^Error: Image not found$/m);
  });

  test('refusals: --image with --template, another user’s image, a running VM, no --name', async () => {
    const owner = await customer();
    const { u, key } = await customer();
    const vm = await stoppedVm(owner.u);
    const r = await api(t(), owner.u.token).post('/vms/{vm_id}/snapshots', {
      params: { vm_id: vm.id },
      body: { name: 'theirs' },
    });
    assert.equal(r.status, 202, r.text);
    await t().services.clock.advance(1);

    const both = await cli(key, [
      'vm',
      'create',
      '--node',
      node,
      '--gpu',
      '4090',
      '--image',
      r.body.id,
      '--template',
      '101',
    ]);
    fails(both, 2, /give --template or --image, not both/);
    // Another user's image is not found, whatever is asked of it.
    for (const args of [
      ['vm', 'create', '--node', node, '--gpu', '4090', '--image', r.body.id],
      ['images', 'show', r.body.id],
      ['images', 'delete', r.body.id, '--yes'],
    ])
      fails(await cli(key, args), 1, /^Error: Image not found$/m);
    const vms = await api(t(), u.token).get('/vms');
    assert.equal(vms.status, 200, vms.text);
    assert.deepEqual(vms.body, [], 'no VM was made');
    assert.equal((await imagesOf(owner.u))[0]?.state, 'ready', 'their image is untouched');

    // Only a stopped VM can be saved; the name is required.
    const running = await api(t(), u.token).post('/vms', {
      body: { node, gpu_type: '4090', gpu_count: 1, storage_gb: 50, template_vmid: 101 },
    });
    assert.equal(running.status, 201, running.text);
    await t().services.clock.advance(1);
    assert.equal((await vmOf(u, running.body.id)).status, 'running');
    fails(
      await cli(key, ['vm', 'snapshot', String(running.body.vmid), '--name', 'x']),
      1,
      /^Error: Cannot snapshot a VM that is running: stop it first/m,
    );
    fails(await cli(key, ['vm', 'snapshot', String(running.body.vmid)]), 2, /--name is required/);
    assert.deepEqual(await imagesOf(u), []);
  });

  test('a snapshot that fails: --wait exits 1 with the error; images show says it', async () => {
    const own = (await createNode(t(), admin.token, { gpu_type: '4090', gpu_count: 2, cluster_name: 'images-cli' }))
      .node;
    const { u, key } = await customer();
    const vm = await stoppedVm(u, own);
    const f = await api(t(), admin.token).post('/admin/simulator/faults', { body: { node: own, action: 'snapshot' } });
    assert.equal(f.status, 200, f.text);

    const r = await cli(key, ['vm', 'snapshot', String(vm.vmid), '--name', 'doomed', '--wait']);
    fails(r, 1, new RegExp(`Image "doomed" failed: simulated snapshot failure on ${own}`));
    const [img] = await imagesOf(u);
    assert.equal(img?.state, 'failed');
    const show = await cli(key, ['images', 'show', img.id]);
    ok(show);
    assert.match(show.stdout, /^State:\s+failed$/m);
    assert.match(show.stdout, new RegExp(`^Error:\\s+simulated snapshot failure on ${own}$`, 'm'));
    // A failed image can be deleted; the VM is still stopped and can start.
    ok(await cli(key, ['images', 'delete', img.id, '--yes']));
    assert.equal((await vmOf(u, vm.id)).status, 'stopped');
  });
});
