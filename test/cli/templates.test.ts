/**
 * The template catalogue from the command line, run as child processes
 * against a real listening server on both databases: `gpucloud templates` (no
 * login needed), `vm create --template NAME` resolved through the catalogue
 * (an unknown name is bad usage), `admin templates add / set / delete` with
 * the API's refusals shown, and `admin nodes templates NODE` (each template's
 * state on an agent's host). Images: images.test.ts.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describeEachDb } from '../helpers/app.js';
import { api } from '../helpers/api.js';
import { createApiKey, createNode, createUser, credit, type TestUser } from '../helpers/factories.js';
import { FakeAgent } from '../helpers/fake-agent.js';
import { cliEnv, fails, gpucloud, ok } from './harness.js';

const AGENT_TOKEN = 'agent-token-'.padEnd(40, 'c');

describeEachDb('gpucloud templates and admin templates', (t) => {
  let base: string;
  let admin: TestUser;
  let renter: TestUser;
  let adminKey: string;
  let renterKey: string;
  let simNode: string;
  let agentNode: string;
  let agent: FakeAgent;
  let home: string;

  before(async () => {
    base = await t().app.listen({ port: 0, host: '127.0.0.1' });
    admin = await createUser(t(), { admin: true });
    renter = await createUser(t());
    await credit(t(), admin.token, renter.id, 500);
    adminKey = await createApiKey(t(), admin.token, 'read_write', 'cli-admin');
    renterKey = await createApiKey(t(), renter.token, 'read_write', 'cli');
    simNode = (await createNode(t(), admin.token, { gpu_type: '4090', gpu_count: 8 })).node;
    agent = new FakeAgent(AGENT_TOKEN);
    await agent.start();
    t().forbidSecret(AGENT_TOKEN);
    agentNode = (
      await createNode(t(), admin.token, {
        gpu_type: '5090',
        gpu_count: 1,
        agent_url: agent.url,
        agent_token: AGENT_TOKEN,
        ram_gb: 8,
        cpu_cores: 8,
      })
    ).node;
    home = mkdtempSync(join(tmpdir(), 'gpucloud-cli-templates-'));
  });
  after(async () => {
    await agent.stop();
    rmSync(home, { recursive: true, force: true });
  });

  /** Runs `gpucloud ARGS` as the admin (or with `key`; null: no credentials at all). */
  const cli = (args: string[], opts: { key?: string | null; url?: string; env?: NodeJS.ProcessEnv } = {}) =>
    gpucloud(args, cliEnv(home, opts.url ?? base, opts.key === undefined ? adminKey : opts.key, opts.env));
  const asAdmin = () => api(t(), admin.token);
  const template = async (vmid: number) =>
    asAdmin().get('/templates/{template_vmid}', { params: { template_vmid: vmid } });

  test('templates: the catalogue without a login; vm create --template by name; an unknown name is bad usage', async () => {
    const r = await cli(['templates'], { key: null });
    ok(r);
    const lines = r.stdout.split('\n');
    assert.match(lines[0]!, /^ *ID +NAME +OS +USER +ACCESS +MIN DISK +READY ON$/);
    const sd = lines.find((l) => /^ *102 /.test(l));
    assert.ok(sd, r.stdout);
    assert.match(
      sd,
      /^ *102 +stable-diffusion +Ubuntu 22\.04 +ubuntu +ssh, webui:7860, jupyter:8888 +50 GB +\d+ nodes? \(/,
    );
    assert.match(
      lines.find((l) => /^ *100 /.test(l))!,
      / ssh {2,}50 GB /,
    );
    const json = await cli(['templates', '--json'], { key: null });
    ok(json);
    const listed = await api(t()).get('/templates');
    assert.equal(listed.status, 200, listed.text);
    assert.deepEqual(JSON.parse(json.stdout), listed.body);

    const created = await cli(
      ['vm', 'create', '--node', simNode, '--gpu', '4090', '--template', 'comfyui', '--password', 'a long password 1'],
      { key: renterKey },
    );
    ok(created);
    assert.match(created.stdout, /^Created VM \d+ \(\S+\) on \S+, template 103 \(comfyui\): creating$/m);

    const unknown = await cli(['vm', 'create', '--node', simNode, '--gpu', '4090', '--template', 'windows'], {
      key: renterKey,
    });
    fails(unknown, 2, /--template: there is no template named "windows"; the templates are ubuntu-22\.04 \(100\), /);
    assert.match(unknown.stderr, /\(see gpucloud templates\)/);
    const numbered = await cli(['vm', 'create', '--node', simNode, '--gpu', '4090', '--template', '999'], {
      key: renterKey,
    });
    fails(numbered, 1, /^Error: .*there is no template 999/);
    const vms = await api(t(), renter.token).get('/vms');
    assert.equal(vms.status, 200, vms.text);
    assert.equal(vms.body.length, 1, 'only the comfyui VM was made');
  });

  test('admin templates add, set and delete: the catalogue changes; the API’s refusals are shown', async () => {
    const add = await cli([
      'admin',
      'templates',
      'add',
      '150',
      '--name',
      'cli-tpl',
      '--description',
      'Made by the CLI test',
      '--os',
      'Debian 12',
      '--user',
      'debian',
      '--webui-port',
      '7000',
      '--jupyter-port',
      '8888',
      '--min-disk',
      '60',
      '--gpu-types',
      '4090',
    ]);
    ok(add);
    assert.match(add.stdout, /^Added template 150 \(cli-tpl\)$/m);
    assert.match(add.stdout, /^Access: +ssh, webui:7000, jupyter:8888$/m);
    assert.match(add.stdout, /It has no image yet: push one with gpucloud admin images push FILE --template 150/);
    const got = await template(150);
    assert.equal(got.status, 200, got.text);
    assert.equal(got.body.os, 'Debian 12');
    assert.equal(got.body.default_user, 'debian');
    assert.equal(got.body.min_disk_gb, 60);
    assert.deepEqual(got.body.gpu_types, ['4090']);
    assert.deepEqual(got.body.access, { ssh: true, webui_port: 7000, jupyter_port: 8888 });
    assert.match((await cli(['templates'], { key: null })).stdout, /^ *150 +cli-tpl +Debian 12 +debian /m);

    fails(
      await cli([
        'admin',
        'templates',
        'add',
        '150',
        '--name',
        'other',
        '--description',
        'x',
        '--os',
        'x',
        '--user',
        'x',
      ]),
      1,
      /^Error: Template 150 exists already/,
    );
    fails(
      await cli(['admin', 'templates', 'add', '151', '--name', 'x', '--description', 'x', '--user', 'x']),
      2,
      /--os is required/,
    );
    fails(
      await cli([
        'admin',
        'templates',
        'add',
        '151',
        '--name',
        'x',
        '--description',
        'x',
        '--os',
        'x',
        '--user',
        'x',
        '--gpu-types',
        'h100',
      ]),
      2,
      /--gpu-types takes 5090, 4090, pro6000/,
    );
    fails(
      await cli([
        'admin',
        'templates',
        'add',
        '151',
        '--name',
        'Bad Name',
        '--description',
        'x',
        '--os',
        'x',
        '--user',
        'x',
      ]),
      1,
      /^Error: .*name/,
    );
    fails(
      await cli(['admin', 'templates', 'add', '99', '--name', 'low', '--description', 'x', '--os', 'x', '--user', 'x']),
      1,
      /^Error: .*template_vmid/,
    );
    fails(await cli(['admin', 'templates', 'add', 'abc', '--name', 'x']), 2, /VMID must be a number/);
    fails(
      await cli(['admin', 'templates', 'add', '151', '--name', 'y', '--description', 'x', '--os', 'x', '--user', 'x'], {
        key: renterKey,
      }),
      1,
      /^Error: Administrator role required/,
    );
    assert.equal((await template(151)).status, 404, 'nothing was added');

    const set = await cli([
      'admin',
      'templates',
      'set',
      '150',
      '--description',
      'Changed',
      '--jupyter-port',
      'none',
      '--gpu-types',
      'all',
    ]);
    ok(set);
    assert.match(set.stdout, /^Changed template 150 \(cli-tpl\)$/m);
    const changed = await template(150);
    assert.equal(changed.status, 200, changed.text);
    assert.equal(changed.body.description, 'Changed');
    assert.equal(changed.body.access.jupyter_port, null);
    assert.equal(changed.body.access.webui_port, 7000, 'what was not given stays');
    assert.equal(changed.body.gpu_types, null);
    const setJson = await cli(['admin', 'templates', 'set', '150', '--min-disk', '70', '--json']);
    ok(setJson);
    assert.equal(JSON.parse(setJson.stdout).min_disk_gb, 70);
    fails(await cli(['admin', 'templates', 'set', '150']), 2, /nothing to change/);
    fails(await cli(['admin', 'templates', 'set', '9999', '--os', 'x']), 1, /^Error: Template not found/);
    fails(
      await cli(['admin', 'templates', 'set', '150', '--webui-port', '8888', '--jupyter-port', '8888']),
      1,
      /jupyter_port/,
    );

    // A VM built from it: deleting the template is refused with the API's reason, then allowed once it is destroyed.
    const vm = await api(t(), renter.token).post('/vms', {
      body: {
        node: simNode,
        gpu_type: '4090',
        gpu_count: 1,
        storage_gb: 70,
        template_vmid: 150,
        auth_method: 'password',
        password: 'a long password 1',
      },
    });
    assert.equal(vm.status, 201, vm.text);
    fails(
      await cli(['admin', 'templates', 'delete', '150']),
      1,
      /^Error: Template 150 is in use by 1 VM\(s\) that are not destroyed/,
    );
    assert.equal((await api(t(), renter.token).delete('/vms/{vm_id}', { params: { vm_id: vm.body.id } })).status, 200);
    const vmId = vm.body.id;
    const statusOf = async () => {
      const v = await api(t(), renter.token).get('/vms/{vm_id}', { params: { vm_id: vmId } });
      assert.equal(v.status, 200, v.text);
      return v.body.status;
    };
    for (let i = 0; i < 100 && (await statusOf()) !== 'destroyed'; i++) await t().services.clock.advance(5);
    const del = await cli(['admin', 'templates', 'delete', '150']);
    ok(del);
    assert.equal(del.stdout, 'Deleted template 150\n');
    assert.equal((await template(150)).status, 404);
    fails(await cli(['admin', 'templates', 'delete', '150']), 1, /^Error: Template not found/);
  });

  test('admin nodes templates: each template’s state on an agent’s host; a simulated node holds them all', async () => {
    const other = 'f'.repeat(64);
    agent.templateStates = [
      { vmid: 100, user: 'root', source: 'local', state: 'ready', sha256: null, bytes_done: 0, size_bytes: 0 },
      {
        vmid: 102,
        user: 'ubuntu',
        source: 'pulled',
        state: 'downloading',
        sha256: other,
        bytes_done: 250,
        size_bytes: 1000,
        reason: null,
      },
      {
        vmid: 103,
        user: 'ubuntu',
        source: 'pulled',
        state: 'failed',
        sha256: other,
        bytes_done: 1000,
        size_bytes: 1000,
        reason: 'checksum mismatch: the download hashes to something else',
      },
    ];
    await t().services.hostMonitor.checkNode(agentNode);
    const r = await cli(['admin', 'nodes', 'templates', agentNode]);
    ok(r);
    const row = (vmid: number) => r.stdout.split('\n').find((l) => new RegExp(`^ *${vmid} `).test(l)) ?? '';
    assert.match(r.stdout.split('\n')[0]!, /^TEMPLATE +NAME +STATE +SOURCE +IMAGE +UPDATED$/);
    assert.match(row(100), /^ *100 +ubuntu-22\.04 +ready +local /);
    assert.match(row(101), /^ *101 +ubuntu-24\.04 +missing /);
    assert.match(row(102), /^ *102 +stable-diffusion +downloading 25% +pulled +ffffffffffff /);
    assert.match(
      row(103),
      /^ *103 +comfyui +failed: checksum mismatch: the download hashes to something else +pulled /,
    );
    const json = await cli(['admin', 'nodes', 'templates', agentNode, '--json']);
    ok(json);
    const states = await asAdmin().get('/admin/nodes/{node}/templates', { params: { node: agentNode } });
    assert.equal(states.status, 200, states.text);
    assert.deepEqual(JSON.parse(json.stdout), states.body);

    const sim = await cli(['admin', 'nodes', 'templates', simNode]);
    ok(sim);
    for (const vmid of [100, 101, 102, 103, 104]) assert.match(sim.stdout, new RegExp(`^ *${vmid} +\\S+ +ready `, 'm'));
    fails(await cli(['admin', 'nodes', 'templates', 'no-such-node']), 1, /^Error: Node not found/);
    // `admin nodes` is still the list.
    const nodes = await cli(['admin', 'nodes']);
    ok(nodes);
    assert.match(nodes.stdout, new RegExp(`^${agentNode} `, 'm'));
  });
});
