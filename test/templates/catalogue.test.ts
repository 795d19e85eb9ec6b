/**
 * The template catalogue and the image store through the API: templates as
 * rows (GET /templates, /admin/templates), images uploaded in ranges and
 * checked whole (qemu-img), hosts' downloads with their node's token, and
 * placement: /search and POST /vms only where a template is ready.
 */
import { before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after } from 'node:test';
import { describeEachDb, type TestApp } from '../helpers/app.js';
import { api, type Api } from '../helpers/api.js';
import { createNode, createUser, credit, type TestUser } from '../helpers/factories.js';
import { FakeAgent } from '../helpers/fake-agent.js';

const dir = mkdtempSync(join(tmpdir(), 'gpucloud-catalogue-'));
after(() => rmSync(dir, { recursive: true, force: true }));

/** A small real qcow2 image with random content (qemu-img convert from raw). */
function qcow2(name: string, mb = 2): string {
  const raw = join(dir, `${name}.raw`);
  writeFileSync(raw, randomBytes(mb * 1024 * 1024));
  const out = join(dir, `${name}.qcow2`);
  execFileSync('qemu-img', ['convert', '-f', 'raw', '-O', 'qcow2', raw, out]);
  return out;
}

/** Password VMs: the renter has no SSH key. */
const pw = { auth_method: 'password' as const, password: 'correct horse battery' };

const sha256 = (b: Buffer) => createHash('sha256').update(b).digest('hex');

describeEachDb('template catalogue and images', (t) => {
  let admin: TestUser;
  let renter: TestUser;
  let asAdmin: Api;
  let asRenter: Api;
  const anon = () => api(t());

  before(async () => {
    admin = await createUser(t(), { admin: true });
    renter = await createUser(t());
    asAdmin = api(t(), admin.token);
    asRenter = api(t(), renter.token);
    await credit(t(), admin.token, renter.id, 1000);
  });

  /** Sends the bytes of `file` as one upload (ranges of `range` bytes); returns the completion's answer. */
  async function push(t: TestApp, file: Buffer, body: Record<string, unknown> = {}, range = 1024 * 1024) {
    const u = await t.req('POST', '/admin/images/uploads', {
      token: admin.token,
      body: { size_bytes: file.length, ...body },
    });
    assert.equal(u.status, 201, u.text);
    const id = (u.body as { id: string }).id;
    for (let at = 0; at < file.length; at += range) {
      const r = await putRange(t, id, at, file.subarray(at, at + range));
      assert.equal(r.statusCode, 200, r.body);
    }
    return { id, done: await t.req('POST', `/admin/images/uploads/${id}/complete`, { token: admin.token }) };
  }

  const putRange = (t: TestApp, id: string, offset: number, bytes: Buffer, type = 'application/octet-stream') =>
    t.app.inject({
      method: 'PUT',
      url: `/admin/images/uploads/${id}?offset=${offset}`,
      headers: { authorization: `Bearer ${admin.token}`, 'content-type': type },
      payload: bytes,
    });

  describe('the catalogue', () => {
    test("a fresh install has the specification's templates 100 to 104, public", async () => {
      await createNode(t(), admin.token, { gpu_type: '5090' });
      const r = await anon().get('/templates');
      assert.equal(r.status, 200, r.text);
      const ids = r.body.map((x) => x.template_vmid);
      for (const id of [100, 101, 102, 103, 104]) assert.ok(ids.includes(id), `template ${id} is listed`);
      const sd = r.body.find((x) => x.template_vmid === 102)!;
      assert.equal(sd.name, 'stable-diffusion');
      assert.deepEqual(sd.access, { ssh: true, webui_port: 7860, jupyter_port: 8888 });
      assert.deepEqual(r.body.find((x) => x.template_vmid === 100)!.access, {
        ssh: true,
        webui_port: null,
        jupyter_port: null,
      });
      assert.equal(sd.min_disk_gb, 50);
      assert.ok(sd.ready_on.gpu_types.includes('5090'), 'a simulated node holds every template of its GPU type');
      const one = await anon().get('/templates/{template_vmid}', { params: { template_vmid: 104 } });
      assert.equal(one.status, 200, one.text);
      assert.equal(one.body.name, 'desktop');
      const missing = await anon().get('/templates/{template_vmid}', { params: { template_vmid: 999 } });
      assert.equal(missing.status, 404);
    });

    test('operators add, change and delete templates; every rule is checked', async () => {
      const body = {
        template_vmid: 105,
        name: 'cuda-12.4',
        description: 'Ubuntu 24.04 with CUDA 12.4',
        os: 'Ubuntu 24.04',
        default_user: 'ubuntu',
        webui_port: 7000,
        min_disk_gb: 80,
      };
      assert.equal((await anon().post('/admin/templates', { body })).status, 401);
      assert.equal((await asRenter.post('/admin/templates', { body })).status, 403);
      const c = await asAdmin.post('/admin/templates', { body });
      assert.equal(c.status, 201, c.text);
      assert.equal(c.body.template_vmid, 105);
      assert.deepEqual(c.body.access, { ssh: true, webui_port: 7000, jupyter_port: null });
      assert.equal(c.body.image, null);
      const again = await asAdmin.post('/admin/templates', { body });
      assert.equal(again.status, 400);
      assert.equal(again.body.code, 'conflict');
      const sameName = await asAdmin.post('/admin/templates', { body: { ...body, template_vmid: 106 } });
      assert.equal(sameName.status, 400);
      assert.equal(sameName.body.code, 'conflict');
      assert.match(sameName.body.detail, /cuda-12\.4 belongs to template 105/);
      for (const [field, value] of [
        ['template_vmid', 99],
        ['template_vmid', 1_000_000],
        ['name', 'Has Spaces'],
        ['description', 'bell\u0007'],
        ['os', ''],
        ['default_user', 'Root!'],
        ['webui_port', 70000],
        ['min_disk_gb', 10],
        ['gpu_types', ['h100']],
        ['image_sha256', 'abc'],
      ] as const) {
        const r = await asAdmin.post('/admin/templates', { rawBody: { ...body, template_vmid: 107, [field]: value } });
        assert.equal(r.status, 422, `${field}=${JSON.stringify(value)}: ${r.text}`);
        assert.equal(r.body.code, 'validation_error');
      }
      const noImage = await asAdmin.post('/admin/templates', {
        body: { ...body, template_vmid: 107, name: 'x', image_sha256: 'a'.repeat(64) },
      });
      assert.equal(noImage.status, 422);
      assert.match(noImage.body.detail, /no image in the image store/);
      const samePorts = await asAdmin.post('/admin/templates', {
        body: { ...body, template_vmid: 107, name: 'y', webui_port: 8888, jupyter_port: 8888 },
      });
      assert.equal(samePorts.status, 422);
      const p = await asAdmin.patch('/admin/templates/{template_vmid}', {
        params: { template_vmid: 105 },
        body: { description: 'CUDA 12.4 and PyTorch', gpu_types: ['pro6000'] },
      });
      assert.equal(p.status, 200, p.text);
      assert.equal(p.body.description, 'CUDA 12.4 and PyTorch');
      assert.deepEqual(p.body.gpu_types, ['pro6000']);
      assert.equal(p.body.name, 'cuda-12.4', 'fields not sent stay');
      const empty = await asAdmin.patch('/admin/templates/{template_vmid}', {
        params: { template_vmid: 105 },
        rawBody: {},
      });
      assert.equal(empty.status, 422);
      const unknown = await asAdmin.patch('/admin/templates/{template_vmid}', {
        params: { template_vmid: 555 },
        body: { os: 'x' },
      });
      assert.equal(unknown.status, 404);
      assert.equal(
        (await asAdmin.delete('/admin/templates/{template_vmid}', { params: { template_vmid: 555 } })).status,
        404,
      );
      assert.equal(
        (await asRenter.delete('/admin/templates/{template_vmid}', { params: { template_vmid: 105 } })).status,
        403,
      );
      const d = await asAdmin.delete('/admin/templates/{template_vmid}', { params: { template_vmid: 105 } });
      assert.equal(d.status, 204, d.text);
      assert.equal((await anon().get('/templates/{template_vmid}', { params: { template_vmid: 105 } })).status, 404);
    });

    test('a template in use by a VM cannot be deleted until the VM is destroyed', async () => {
      const n = await createNode(t(), admin.token, { gpu_type: '4090' });
      const c = await asAdmin.post('/admin/templates', {
        body: { template_vmid: 120, name: 'in-use', description: 'x', os: 'Debian 12', default_user: 'debian' },
      });
      assert.equal(c.status, 201, c.text);
      const vm = await asRenter.post('/vms', {
        body: { node: n.node, gpu_type: '4090', gpu_count: 1, storage_gb: 50, template_vmid: 120, ...pw },
      });
      assert.equal(vm.status, 201, vm.text);
      const d = await asAdmin.delete('/admin/templates/{template_vmid}', { params: { template_vmid: 120 } });
      assert.equal(d.status, 400);
      assert.equal(d.body.code, 'conflict');
      assert.match(d.body.detail, /in use by 1 VM/);
      assert.equal((await asRenter.delete('/vms/{vm_id}', { params: { vm_id: vm.body.id } })).status, 200);
      const d2 = await asAdmin.delete('/admin/templates/{template_vmid}', { params: { template_vmid: 120 } });
      assert.equal(d2.status, 204, d2.text);
    });

    test('POST /vms: an unknown template and a disk under its minimum are 422, before any other check', async () => {
      const r = await asRenter.post('/vms', {
        body: { node: 'no-such-node', gpu_type: '4090', gpu_count: 1, storage_gb: 50, template_vmid: 130 },
      });
      assert.equal(r.status, 422, r.text);
      assert.match(r.body.detail, /there is no template 130/);
      const c = await asAdmin.post('/admin/templates', {
        body: {
          template_vmid: 131,
          name: 'big',
          description: 'x',
          os: 'Ubuntu 24.04',
          default_user: 'ubuntu',
          min_disk_gb: 200,
        },
      });
      assert.equal(c.status, 201, c.text);
      const small = await asRenter.post('/vms', {
        body: { node: 'no-such-node', gpu_type: '4090', gpu_count: 1, storage_gb: 100, template_vmid: 131 },
      });
      assert.equal(small.status, 422, small.text);
      assert.equal(small.body.errors?.[0]?.field, 'body.storage_gb');
    });

    test('a template for some GPU types only: other nodes are not offered and refuse it', async () => {
      const n4090 = await createNode(t(), admin.token, { gpu_type: '4090' });
      const c = await asAdmin.post('/admin/templates', {
        body: {
          template_vmid: 140,
          name: 'pro-only',
          description: 'x',
          os: 'Ubuntu 24.04',
          default_user: 'ubuntu',
          gpu_types: ['pro6000'],
        },
      });
      assert.equal(c.status, 201, c.text);
      const s = await anon().get('/search', { query: { template_vmid: 140, gpu_type: '4090' } });
      assert.equal(s.status, 200, s.text);
      assert.ok(!s.body.some((o) => o.node === n4090.node));
      const all = await anon().get('/search', { query: { gpu_type: '4090' } });
      assert.equal(all.status, 200, all.text);
      assert.ok(
        all.body.some((o) => o.node === n4090.node),
        'without the filter the node is offered',
      );
      const r = await asRenter.post('/vms', {
        body: { node: n4090.node, gpu_type: '4090', gpu_count: 1, storage_gb: 50, template_vmid: 140 },
      });
      assert.equal(r.status, 400, r.text);
      assert.equal(r.body.code, 'template_unavailable');
      assert.equal(
        (await anon().get('/search', { rawQuery: { template_vmid: '99' } })).status,
        422,
        'an out-of-range template id is refused',
      );
    });
  });

  describe('images', () => {
    test('an image pushed in ranges becomes a template image, named by its SHA-256; the same twice is stored once', async () => {
      const file = readFileSync(qcow2('good'));
      const c = await asAdmin.post('/admin/templates', {
        body: { template_vmid: 150, name: 'pushed', description: 'x', os: 'Debian 12', default_user: 'debian' },
      });
      assert.equal(c.status, 201, c.text);
      const { done } = await push(t(), file, { template_vmid: 150, sha256: sha256(file) }, 700_000);
      assert.equal(done.status, 201, done.text);
      const image = done.body as { sha256: string; format: string; size_bytes: number; templates: number[] };
      assert.equal(image.sha256, sha256(file));
      assert.equal(image.format, 'qcow2');
      assert.equal(image.size_bytes, file.length);
      assert.deepEqual(image.templates, [150]);
      const tpl = await anon().get('/templates/{template_vmid}', { params: { template_vmid: 150 } });
      assert.equal(tpl.status, 200);
      assert.deepEqual(tpl.body.image, { sha256: image.sha256, format: 'qcow2', size_bytes: file.length });
      const again = await push(t(), file);
      assert.equal(again.done.status, 201, again.done.text);
      const list = await asAdmin.get('/admin/images');
      assert.equal(list.status, 200, list.text);
      assert.equal(list.body.filter((i) => i.sha256 === image.sha256).length, 1);
      const inUse = await asAdmin.delete('/admin/images/{sha256}', { params: { sha256: image.sha256 } });
      assert.equal(inUse.status, 400);
      assert.equal(inUse.body.code, 'conflict');
    });

    test('a raw image is taken as raw', async () => {
      const raw = randomBytes(1024 * 1024);
      const { done } = await push(t(), raw);
      assert.equal(done.status, 201, done.text);
      assert.equal((done.body as { format: string }).format, 'raw');
      const del = await asAdmin.delete('/admin/images/{sha256}', { params: { sha256: sha256(raw) } });
      assert.equal(del.status, 204, del.text);
      assert.equal((await asAdmin.delete('/admin/images/{sha256}', { params: { sha256: sha256(raw) } })).status, 404);
    });

    test('refused whole, and nothing kept: a checksum mismatch, a backing file, a truncated qcow2', async () => {
      const file = readFileSync(qcow2('mismatch'));
      const bad = await push(t(), file, { sha256: 'f'.repeat(64) });
      assert.equal(bad.done.status, 422, bad.done.text);
      assert.match((bad.done.body as { detail: string }).detail, /checksum mismatch/);
      assert.equal((await t().req('GET', `/admin/images/uploads/${bad.id}`, { token: admin.token })).status, 404);

      const evil = join(dir, 'evil.qcow2');
      execFileSync('qemu-img', ['create', '-q', '-f', 'qcow2', '-u', '-b', '/etc/shadow', '-F', 'raw', evil, '1M']);
      const backing = await push(t(), readFileSync(evil));
      assert.equal(backing.done.status, 422, backing.done.text);
      assert.match((backing.done.body as { detail: string }).detail, /backing file.*\/etc\/shadow/);

      const cut = file.subarray(0, Math.floor(file.length / 3));
      const truncated = await push(t(), cut);
      assert.equal(truncated.done.status, 422, truncated.done.text);
      assert.match((truncated.done.body as { detail: string }).detail, /damaged or truncated/);

      const list = await asAdmin.get('/admin/images');
      assert.equal(list.status, 200, list.text);
      for (const b of [file, readFileSync(evil), cut])
        assert.ok(!list.body.some((i) => i.sha256 === sha256(b)), 'no refused image is stored');
    });

    test('ranges: the wrong offset names the right one, a wrong type is 415, a range past the size is 413', async () => {
      const u = await asAdmin.post('/admin/images/uploads', { body: { size_bytes: 1000 } });
      assert.equal(u.status, 201, u.text);
      const first = await putRange(t(), u.body.id, 0, randomBytes(600));
      assert.equal(first.statusCode, 200, first.body);
      assert.equal(JSON.parse(first.body).received_bytes, 600);
      const wrong = await putRange(t(), u.body.id, 0, randomBytes(10));
      assert.equal(wrong.statusCode, 400, wrong.body);
      assert.match(JSON.parse(wrong.body).detail, /offset=600/);
      const json = await putRange(t(), u.body.id, 600, Buffer.from('{}'), 'application/json');
      assert.equal(json.statusCode, 415, json.body);
      const over = await putRange(t(), u.body.id, 600, randomBytes(500));
      assert.equal(over.statusCode, 413, over.body);
      const state = await asAdmin.get('/admin/images/uploads/{upload_id}', { params: { upload_id: u.body.id } });
      assert.equal(state.status, 200);
      assert.equal(state.body.received_bytes, 600, 'a refused range leaves what was there');
      const early = await asAdmin.post('/admin/images/uploads/{upload_id}/complete', {
        params: { upload_id: u.body.id },
      });
      assert.equal(early.status, 400);
      assert.equal(early.body.code, 'invalid_state');
      const cancel = await asAdmin.delete('/admin/images/uploads/{upload_id}', { params: { upload_id: u.body.id } });
      assert.equal(cancel.status, 204);
      const gone = await putRange(t(), u.body.id, 600, randomBytes(10));
      assert.equal(gone.statusCode, 404);
      const renterPut = await t().app.inject({
        method: 'PUT',
        url: `/admin/images/uploads/${u.body.id}?offset=0`,
        headers: { authorization: `Bearer ${renter.token}`, 'content-type': 'application/octet-stream' },
        payload: randomBytes(10),
      });
      assert.equal(renterPut.statusCode, 403);
      const tooBig = await asAdmin.post('/admin/images/uploads', { body: { size_bytes: 300 * 1024 ** 3 } });
      assert.equal(tooBig.status, 422);
      const noTemplate = await asAdmin.post('/admin/images/uploads', { body: { size_bytes: 10, template_vmid: 998 } });
      assert.equal(noTemplate.status, 422);
    });
  });

  describe('hosts', () => {
    test("an agent downloads its node's images with its token, in ranges; its report decides placement", async () => {
      const agent = new FakeAgent(`agent-token-${randomBytes(16).toString('hex')}`);
      agent.templates = [];
      await agent.start();
      try {
        const file = readFileSync(qcow2('for-hosts'));
        const c = await asAdmin.post('/admin/templates', {
          body: { template_vmid: 160, name: 'hosted', description: 'x', os: 'Debian 12', default_user: 'debian' },
        });
        assert.equal(c.status, 201, c.text);
        const { done } = await push(t(), file, { template_vmid: 160 });
        assert.equal(done.status, 201, done.text);
        const sha = sha256(file);
        const n = await createNode(t(), admin.token, {
          gpu_type: '4090',
          gpu_count: 1,
          agent_url: agent.url,
          agent_token: agent.token,
        });
        const desired = agent.calls.filter((x) => x.method === 'PUT' && x.path === '/v1/templates');
        assert.ok(desired.length >= 1, 'the node was told what to hold at registration');
        const wanted = (desired.at(-1)!.body as { templates: { vmid: number; sha256: string; url: string }[] })
          .templates;
        const mine = wanted.find((w) => w.vmid === 160)!;
        assert.equal(mine.sha256, sha);
        const path = new URL(mine.url).pathname;
        assert.equal(path, `/agent/v1/nodes/${n.node}/images/${sha}`);

        const get = (headers: Record<string, string>, p = path) => t().app.inject({ method: 'GET', url: p, headers });
        const whole = await get({ authorization: `Bearer ${agent.token}` });
        assert.equal(whole.statusCode, 200);
        assert.equal(sha256(whole.rawPayload), sha);
        const part = await get({ authorization: `Bearer ${agent.token}`, range: 'bytes=1000-' });
        assert.equal(part.statusCode, 206);
        assert.equal(part.headers['content-range'], `bytes 1000-${file.length - 1}/${file.length}`);
        assert.ok(part.rawPayload.equals(file.subarray(1000)));
        const past = await get({ authorization: `Bearer ${agent.token}`, range: `bytes=${file.length}-` });
        assert.equal(past.statusCode, 416);
        assert.equal((await get({ authorization: 'Bearer wrong' })).statusCode, 401);
        assert.equal((await get({})).statusCode, 401);
        assert.equal((await get({ authorization: `Bearer ${admin.token}` })).statusCode, 401);
        const other = await get(
          { authorization: `Bearer ${agent.token}` },
          `/agent/v1/nodes/${n.node}/images/${'0'.repeat(64)}`,
        );
        assert.equal(other.statusCode, 404);

        // Until the host reports it ready: no offer, no VM.
        const before = await anon().get('/search', { query: { template_vmid: 160 } });
        assert.equal(before.status, 200, before.text);
        assert.ok(!before.body.some((o) => o.node === n.node));
        const refused = await asRenter.post('/vms', {
          body: { node: n.node, gpu_type: '4090', gpu_count: 1, storage_gb: 50, template_vmid: 160 },
        });
        assert.equal(refused.status, 400);
        assert.equal(refused.body.code, 'template_unavailable');
        agent.templateStates = [
          {
            vmid: 160,
            user: 'debian',
            sha256: sha,
            source: 'pulled',
            state: 'downloading',
            bytes_done: 500,
            size_bytes: file.length,
            reason: null,
          },
        ];
        await t().services.hostMonitor.checkNode(n.node);
        const states = await asAdmin.get('/admin/nodes/{node}/templates', { params: { node: n.node } });
        assert.equal(states.status, 200, states.text);
        const s160 = states.body.find((s) => s.template_vmid === 160)!;
        assert.equal(s160.state, 'downloading');
        assert.equal(s160.progress, Math.floor((500 * 100) / file.length));
        agent.templateStates = [{ ...agent.templateStates[0]!, state: 'ready', bytes_done: file.length }];
        await t().services.hostMonitor.checkNode(n.node);
        const after = await anon().get('/search', { query: { template_vmid: 160 } });
        assert.equal(after.status, 200, after.text);
        assert.ok(
          after.body.some((o) => o.node === n.node),
          'offered once ready',
        );
        const tpl = await anon().get('/templates/{template_vmid}', { params: { template_vmid: 160 } });
        assert.equal(tpl.status, 200, tpl.text);
        assert.ok(tpl.body.ready_on.nodes.includes(n.node));
        const vm = await asRenter.post('/vms', {
          body: { node: n.node, gpu_type: '4090', gpu_count: 1, storage_gb: 50, template_vmid: 160, ...pw },
        });
        assert.equal(vm.status, 201, vm.text);
        assert.equal((await asRenter.delete('/vms/{vm_id}', { params: { vm_id: vm.body.id } })).status, 200);
      } finally {
        await agent.stop();
      }
    });
  });
});
