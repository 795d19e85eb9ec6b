/**
 * Nodes driven by a host agent, from the control plane's side, against a
 * stand-in agent over real HTTP: registration (agent_url, the write-only
 * token, an agent that does not answer), the VM lifecycle through the agent,
 * access-info through the agent's port, heartbeats (three misses take the
 * node and its VMs offline, an answer brings them back), a VM that stops on
 * its host, and the rules for changing a node's agent. A simulated node
 * keeps working beside it.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { describeEachDb } from '../helpers/app.js';
import { api, type Api, type RequestBody } from '../helpers/api.js';
import { advance, createNode, createUser, credit, uploadSshKey, type TestUser } from '../helpers/factories.js';
import { FakeAgent } from '../helpers/fake-agent.js';
import type { NodeSpec, Vm } from '../helpers/world.js';

const TOKEN = 'agent-token-'.padEnd(40, 'a');
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describeEachDb(
  'nodes with a host agent',
  (t) => {
    let admin: TestUser;
    let renter: TestUser;
    let agent: FakeAgent;
    /** Typed clients for the administrator and the renter (made in before()). */
    let asAdmin: Api;
    let asRenter: Api;

    const node = async (over: NodeSpec = {}) =>
      createNode(t(), admin.token, {
        agent_url: agent.url,
        agent_token: TOKEN,
        gpu_count: 1,
        ram_gb: 1,
        cpu_cores: 1,
        ...over,
      });
    const vmOf = async (id: string): Promise<Vm> => {
      const r = await asRenter.get('/vms/{vm_id}', { params: { vm_id: id } });
      assert.equal(r.status, 200, r.text);
      return r.body;
    };
    const nodeOf = async (name: string) => {
      const r = await asAdmin.get('/admin/nodes/{node}', { params: { node: name } });
      assert.equal(r.status, 200, r.text);
      return r.body;
    };
    /** POST /vms as the renter; asserts the 201. */
    const createVm = async (body: RequestBody<'/vms', 'post'>) => {
      const r = await asRenter.post('/vms', { body });
      assert.equal(r.status, 201, r.text);
      return r;
    };
    const ofVm = (id: string) => ({ params: { vm_id: id } });
    /** The host devices an operator sees a VM holding. */
    const devicesOf = async (node: string, id: string) => {
      const r = await asAdmin.get('/admin/vms', { query: { node } });
      assert.equal(r.status, 200, r.text);
      return r.body.find((v) => v.id === id)?.gpu_devices;
    };
    /** One heartbeat round; the checks are claimed on real time, so wait out the interval first. */
    const heartbeat = async () => {
      await sleep(600);
      return t().services.hostMonitor.checkDue();
    };

    before(async () => {
      admin = await createUser(t(), { admin: true });
      renter = await createUser(t());
      asAdmin = api(t(), admin.token);
      asRenter = api(t(), renter.token);
      await credit(t(), admin.token, renter.id, 1000);
      await uploadSshKey(t(), renter.token);
      agent = new FakeAgent(TOKEN);
      agent.hostGpus = 8; // one host stands in for the nodes of every test here
      await agent.start();
      t().forbidSecret(TOKEN);
    });
    after(async () => {
      await agent.stop();
    });

    describe('registration', () => {
      test('an answering agent: 201 online, with what it reports; the token is never shown', async () => {
        const n = await node();
        assert.equal(n.agent_url, agent.url);
        assert.equal(n.agent_token_set, true);
        assert.equal(n.agent_status, 'online');
        assert.equal(n.agent_seen_at, new Date(t().clock.nowMs()).toISOString());
        assert.equal(n.agent_version, '9.9.9-fake');
        assert.equal(n.accel, 'tcg');
        assert.equal(n.host_cpu_model, 'Fake CPU @ 1 GHz');
        assert.equal(n.host_gpus?.length, agent.hostGpus);
        assert.deepEqual(n.host_gpus?.[0], {
          pci_address: '0000:01:00.0',
          model: 'NVIDIA GeForce RTX 4090',
          vfio: true,
          iommu_group: 12,
        });
        assert.ok(!('agent_token' in n));
        const again = await asAdmin.get('/admin/nodes/{node}', { params: { node: n.node } });
        assert.deepEqual(again.body, n);
        const list = await asAdmin.get('/admin/nodes');
        assert.equal(list.status, 200, list.text);
        assert.ok(list.body.some((x) => x.node === n.node));
      });

      test('an agent that does not answer: still 201, shown offline', async () => {
        const n = await node({ agent_url: 'http://127.0.0.1:9' });
        assert.equal(n.agent_status, 'offline');
        assert.equal(n.agent_seen_at, null);
        assert.equal(n.agent_version, null);
        assert.deepEqual(n.host_gpus, []);
      });

      test('a wrong token is an agent that does not answer', async () => {
        const n = await node({ agent_token: 'another-token-'.padEnd(40, 'b') });
        assert.equal(n.agent_status, 'offline');
      });

      test('validation: URL and token go together, the URL is http(s) without credentials, the token 32+ characters', async () => {
        const base = {
          node: 'agent-bad',
          gpu_type: '4090',
          gpu_count: 1,
          ram_gb: 1,
          cpu_cores: 1,
          cpu_model: 'x',
          pcie_gen: '4.0',
          max_storage_gb: 100,
          location: 'l',
          cluster_name: 'c',
        };
        const cases: [Record<string, unknown>, string][] = [
          [{ agent_url: agent.url }, 'body.agent_token'],
          [{ agent_token: TOKEN }, 'body.agent_url'],
          [{ agent_url: 'ftp://h:21', agent_token: TOKEN }, 'body.agent_url'],
          [{ agent_url: 'not a url', agent_token: TOKEN }, 'body.agent_url'],
          [{ agent_url: 'http://user:pw@h:7070', agent_token: TOKEN }, 'body.agent_url'],
          [{ agent_url: 'http://h:7070/?x=1', agent_token: TOKEN }, 'body.agent_url'],
          [{ agent_url: agent.url, agent_token: 'short' }, 'body.agent_token'],
          [{ agent_url: agent.url, agent_token: 42 }, 'body.agent_token'],
          [{ agent_url: '', agent_token: TOKEN }, 'body.agent_url'],
        ];
        for (const [over, field] of cases) {
          const r = await asAdmin.post('/admin/nodes', { rawBody: { ...base, ...over } });
          assert.equal(r.status, 422, `${JSON.stringify(over)}: ${r.text}`);
          assert.equal(r.body.code, 'validation_error');
          assert.ok(
            r.body.errors?.some((e) => e.field === field),
            `${JSON.stringify(over)} -> ${field}: ${r.text}`,
          );
        }
        assert.equal(
          (await asAdmin.get('/admin/nodes/{node}', { params: { node: 'agent-bad' } })).status,
          404,
          'nothing was registered',
        );
      });
    });

    describe('VMs on an agent node', () => {
      test("create, run, access-info through the agent's port, stop, start, destroy", async () => {
        const n = await node();
        const calls = () =>
          agent.calls
            .filter((c) => c.path.startsWith('/v1/vms/'))
            .map((c) => `${c.method} ${c.path.replace(/[0-9a-f-]{36}/, ':id')}`);
        agent.calls.length = 0;
        const c = await asRenter.post('/vms', {
          body: { node: n.node, gpu_type: '4090', gpu_count: 1, storage_gb: 60, template_vmid: 100 },
        });
        assert.equal(c.status, 201, c.text);
        await advance(t(), admin.token, 5);
        const vm = await vmOf(c.body.id);
        assert.equal(vm.status, 'running');
        const put = agent.calls.find((x) => x.method === 'PUT')!;
        assert.deepEqual(
          { ...(put.body as object), ssh_public_key: typeof (put.body as { ssh_public_key: unknown }).ssh_public_key },
          {
            vmid: c.body.vmid,
            template_vmid: 100,
            cpu_cores: 1,
            ram_mb: 1024,
            storage_gb: 60,
            gpu_count: 1,
            auth_method: 'ssh_key',
            ssh_public_key: 'string',
            password: null,
            web_ports: [],
          },
        );
        assert.deepEqual(calls().slice(0, 3), ['PUT /v1/vms/:id', 'POST /v1/vms/:id/start', 'GET /v1/vms/:id']);
        const port = agent.vms.get(c.body.id)!.port;
        const access = await asRenter.get('/vms/{vm_id}/access-info', ofVm(c.body.id));
        assert.equal(access.status, 200, access.text);
        assert.equal(access.body.notice, null, 'a VM on a host agent is reached as access-info says');
        assert.deepEqual(access.body.ssh, {
          host: agent.publicHost,
          port,
          username: 'root',
          command: `ssh -p ${port} root@${agent.publicHost}`,
        });
        const adminView = await asAdmin.get('/admin/vms', { query: { node: n.node } });
        assert.equal(adminView.status, 200, adminView.text);
        assert.deepEqual(
          adminView.body.map((v) => v.gpu_devices),
          [['0000:01:00.0']],
          'operators see which devices it got',
        );

        agent.calls.length = 0;
        assert.equal((await asRenter.post('/vms/{vm_id}/stop', ofVm(c.body.id))).status, 200);
        await advance(t(), admin.token, 1);
        assert.equal((await vmOf(c.body.id)).status, 'stopped');
        assert.deepEqual(
          agent.calls.find((x) => x.method === 'POST')?.body,
          { timeout_s: 60 },
          'ACPI power-down with the configured grace',
        );
        assert.equal((await asRenter.post('/vms/{vm_id}/start', ofVm(c.body.id))).status, 200);
        await advance(t(), admin.token, 1);
        assert.equal((await vmOf(c.body.id)).status, 'running');
        assert.equal(calls().filter((x) => x.startsWith('PUT')).length, 0, 'a built VM is not built again');
        const devices = () => devicesOf(n.node, c.body.id);
        assert.deepEqual(await devices(), [agent.vms.get(c.body.id)!.gpus[0]], 'the devices of this run');
        assert.equal((await asRenter.post('/vms/{vm_id}/stop', ofVm(c.body.id))).status, 200);
        await advance(t(), admin.token, 1);
        assert.deepEqual(await devices(), [], 'a stopped VM holds no device');
        assert.equal((await asRenter.post('/vms/{vm_id}/start', ofVm(c.body.id))).status, 200);
        await advance(t(), admin.token, 1);
        assert.equal((await asRenter.delete('/vms/{vm_id}', ofVm(c.body.id))).status, 200);
        await advance(t(), admin.token, 1);
        assert.equal((await vmOf(c.body.id)).status, 'destroyed');
        assert.ok(calls().includes('DELETE /v1/vms/:id'));
        assert.equal(agent.vms.has(c.body.id), false, 'nothing of it is left on the host');
      });

      test("a stopped VM's GPU goes to the next renter on a one-GPU host, and comes back when free", async () => {
        const small = new FakeAgent(TOKEN);
        small.hostGpus = 1;
        await small.start();
        try {
          const n = await node({ agent_url: small.url });
          const other = await createUser(t());
          await credit(t(), admin.token, other.id, 100);
          await uploadSshKey(t(), other.token);
          const asOther = api(t(), other.token);
          const spec = { node: n.node, gpu_type: '4090', gpu_count: 1, storage_gb: 50, template_vmid: 100 } as const;
          const a = await createVm(spec);
          await advance(t(), admin.token, 5);
          assert.equal((await vmOf(a.body.id)).status, 'running');
          assert.deepEqual(small.vms.get(a.body.id)!.gpus, ['0000:01:00.0']);
          assert.equal((await asRenter.post('/vms/{vm_id}/stop', ofVm(a.body.id))).status, 200);
          await advance(t(), admin.token, 1);
          assert.deepEqual(small.vms.get(a.body.id)!.gpus, [], 'the host gave the device back');

          const b = await asOther.post('/vms', { body: spec });
          assert.equal(b.status, 201, b.text);
          await advance(t(), admin.token, 5);
          const bVm = await asOther.get('/vms/{vm_id}', ofVm(b.body.id));
          assert.equal(bVm.status, 200, bVm.text);
          assert.equal(bVm.body.status, 'running', "the next renter's VM runs on the freed GPU");
          const host = await small.hostView();
          assert.deepEqual(
            host.host_gpus.map((g) => g.vm_id),
            [b.body.id],
            'the host reports which VM holds the device',
          );

          const refused = await asRenter.post('/vms/{vm_id}/start', ofVm(a.body.id));
          assert.equal(refused.status, 400, refused.text);
          assert.equal((refused.body as { code: string }).code, 'gpu_unavailable');
          assert.equal((await asOther.post('/vms/{vm_id}/stop', ofVm(b.body.id))).status, 200);
          await advance(t(), admin.token, 1);
          assert.equal((await asRenter.post('/vms/{vm_id}/start', ofVm(a.body.id))).status, 200);
          await advance(t(), admin.token, 1);
          assert.equal((await vmOf(a.body.id)).status, 'running', 'the first VM starts again once the GPU is free');
          for (const [who, id] of [
            [asRenter, a.body.id],
            [asOther, b.body.id],
          ] as const)
            assert.equal((await who.delete('/vms/{vm_id}', ofVm(id))).status, 200);
          await advance(t(), admin.token, 1);
        } finally {
          await small.stop();
        }
      });

      test('a template the host lacks: no offer, 400 template_unavailable, no VM', async () => {
        const n = await node();
        const offers = await asRenter.get('/search', { query: { template_vmid: 101, gpu_type: '4090' } });
        assert.equal(offers.status, 200, offers.text);
        assert.ok(!offers.body.some((o) => o.node === n.node), 'the node is not offered for 101');
        const held = await asRenter.get('/search', { query: { template_vmid: 100, gpu_type: '4090' } });
        assert.equal(held.status, 200, held.text);
        assert.ok(
          held.body.some((o) => o.node === n.node),
          'the node is offered for 100, which its host holds',
        );
        const before = await asAdmin.get('/admin/vms', { query: { node: n.node, include_destroyed: true } });
        const c = await asRenter.post('/vms', {
          body: { node: n.node, gpu_type: '4090', gpu_count: 1, storage_gb: 50, template_vmid: 101 },
        });
        assert.equal(c.status, 400, c.text);
        assert.equal(c.body.code, 'template_unavailable');
        assert.match(c.body.detail, /Template 101 \(ubuntu-24\.04\) is not ready on node/);
        const after = await asAdmin.get('/admin/vms', { query: { node: n.node, include_destroyed: true } });
        assert.equal(before.status, 200, before.text);
        assert.equal(after.status, 200, after.text);
        assert.equal(after.body.length, before.body.length, 'no VM row was written');
        const states = await asAdmin.get('/admin/nodes/{node}/templates', { params: { node: n.node } });
        assert.equal(states.status, 200, states.text);
        assert.equal(states.body.find((s) => s.template_vmid === 100)?.state, 'ready');
        assert.equal(states.body.find((s) => s.template_vmid === 101)?.state, 'missing');
      });

      test('a simulated node beside it works as before', async () => {
        const sim = await createNode(t(), admin.token, { gpu_count: 1 });
        assert.equal(sim.agent_url, null);
        const before = agent.calls.length;
        const c = await createVm({
          node: sim.node,
          gpu_type: '4090',
          gpu_count: 1,
          storage_gb: 50,
          template_vmid: 100,
        });
        await advance(t(), admin.token, 5);
        assert.equal((await vmOf(c.body.id)).status, 'running');
        assert.equal(agent.calls.filter((x) => x.path.includes(c.body.id)).length, 0);
        assert.ok(agent.calls.length >= before);
        await asRenter.delete('/vms/{vm_id}', ofVm(c.body.id));
        await advance(t(), admin.token, 1);
      });
    });

    describe('slow hypervisor work', () => {
      test('a boot still in progress on one node holds up neither a stop on another nor the next pass; one action per VM', async () => {
        const slow = await node();
        const sim = await createNode(t(), admin.token, { gpu_count: 1 });
        const body = (n: string): RequestBody<'/vms', 'post'> => ({
          node: n,
          gpu_type: '4090',
          gpu_count: 1,
          storage_gb: 50,
          template_vmid: 100,
        });
        const other = await createVm(body(sim.node));
        await advance(t(), admin.token, 5);
        assert.equal((await vmOf(other.body.id)).status, 'running');

        agent.bootPolls = 1_000_000; // the guest "boots" until the test says otherwise
        const booting = await createVm(body(slow.node));
        const { scheduler, actions } = t().services;
        try {
          await scheduler.runOnce(false); // provision
          await actions.drain();
          await scheduler.runOnce(false); // start: in flight, polling the agent
          await sleep(300);
          assert.equal((await vmOf(booting.body.id)).status, 'starting');

          assert.equal((await asRenter.post('/vms/{vm_id}/stop', ofVm(other.body.id))).status, 200);
          assert.equal(await scheduler.runOnce(false), 1, 'the next pass takes the stop');
          for (let i = 0; i < 50 && (await vmOf(other.body.id)).status !== 'stopped'; i++) await sleep(100);
          assert.equal((await vmOf(other.body.id)).status, 'stopped', 'the stop finished while the boot goes on');
          assert.equal((await vmOf(booting.body.id)).status, 'starting');
          await scheduler.runOnce(false);
          const starts = agent.calls.filter(
            (c) => c.method === 'POST' && c.path === `/v1/vms/${booting.body.id}/start`,
          );
          assert.equal(starts.length, 1, 'a VM with an action in flight is not claimed again');
        } finally {
          agent.vms.get(booting.body.id)!.state = 'running';
          agent.bootPolls = 1;
          await actions.drain();
        }
        assert.equal((await vmOf(booting.body.id)).status, 'running');
        for (const id of [booting.body.id, other.body.id]) await asRenter.delete('/vms/{vm_id}', ofVm(id));
        await advance(t(), admin.token, 1);
      });
    });

    describe('heartbeats', () => {
      test('three missed heartbeats take the node and its VMs offline; an answer brings them back as they were', async () => {
        const n = await node();
        const c = await createVm({ node: n.node, gpu_type: '4090', gpu_count: 1, storage_gb: 50, template_vmid: 100 });
        await advance(t(), admin.token, 5);
        assert.equal((await vmOf(c.body.id)).status, 'running');
        const port = agent.port;
        await agent.stop();
        try {
          for (let miss = 1; miss <= 3; miss++) {
            assert.ok((await heartbeat()) >= 1, 'the agent was due');
            const now = await nodeOf(n.node);
            assert.equal(now.status, miss < 3 ? 'active' : 'offline', `after ${miss} miss(es)`);
            assert.equal(now.agent_status, miss < 3 ? 'online' : 'offline');
            assert.equal((await vmOf(c.body.id)).status, miss < 3 ? 'running' : 'offline');
          }
        } finally {
          await agent.start(port);
        }
        await heartbeat();
        const back = await nodeOf(n.node);
        assert.equal(back.status, 'active');
        assert.equal(back.agent_status, 'online');
        assert.equal((await vmOf(c.body.id)).status, 'running');
      });

      test('a node an operator set offline stays offline when its agent answers', async () => {
        const n = await node();
        assert.equal(
          (await asAdmin.patch('/admin/nodes/{node}', { params: { node: n.node }, body: { status: 'offline' } }))
            .status,
          200,
        );
        await heartbeat();
        const after = await nodeOf(n.node);
        assert.equal(after.status, 'offline');
        assert.equal(after.agent_status, 'online');
      });

      test('a running VM whose guest powered off (or whose QEMU died) becomes stopped and its usage is closed', async () => {
        const n = await node();
        const c = await createVm({ node: n.node, gpu_type: '4090', gpu_count: 1, storage_gb: 50, template_vmid: 100 });
        await advance(t(), admin.token, 5);
        await advance(t(), admin.token, 600);
        assert.equal((await vmOf(c.body.id)).status, 'running');
        const fake = agent.vms.get(c.body.id)!;
        assert.equal(fake.gpus.length, 1);
        agent.endVm(c.body.id, 'guest_powered_off');
        fake.rx = 1000;
        fake.tx = 500;
        await heartbeat();
        const vm = await vmOf(c.body.id);
        assert.equal(vm.status, 'stopped');
        assert.equal(vm.stopped_at, new Date(t().clock.nowMs()).toISOString());
        const usage = await t().db.query<{ n: number }>('SELECT count(*)::int AS n FROM usage_logs WHERE vm_id = $1', [
          c.body.id,
        ]);
        assert.ok(usage.rows[0]!.n >= 1, 'the running time was billed up to the stop');
        const ev = await t().db.query<{ data: { reason: string } }>(
          `SELECT data FROM events WHERE vm_id = $1 AND type = 'vm.status_changed' AND data->>'from' = 'running' AND data->>'to' = 'stopped'`,
          [c.body.id],
        );
        assert.deepEqual(
          ev.rows.map((r) => r.data.reason),
          ['guest_powered_off'],
        );
        const traffic = await t().db.query<{ b: string }>(
          'SELECT network_bytes_total::text AS b FROM vms WHERE id = $1',
          [c.body.id],
        );
        assert.equal(traffic.rows[0]!.b, '1500');
        assert.deepEqual(await devicesOf(n.node, c.body.id), [], 'a VM whose QEMU ended holds no device');
        // The customer starts it again like any stopped VM.
        assert.equal((await asRenter.post('/vms/{vm_id}/start', ofVm(c.body.id))).status, 200);
        await advance(t(), admin.token, 1);
        assert.equal((await vmOf(c.body.id)).status, 'running');
      });
    });

    describe("changing a node's agent", () => {
      test('a node with VMs keeps its agent; a new token alone rotates it; without VMs it can leave its agent', async () => {
        const n = await node();
        const c = await createVm({ node: n.node, gpu_type: '4090', gpu_count: 1, storage_gb: 50, template_vmid: 100 });
        await advance(t(), admin.token, 5);
        const at = { params: { node: n.node } };
        const drop = await asAdmin.patch('/admin/nodes/{node}', { ...at, body: { agent_url: null } });
        assert.equal(drop.status, 400, drop.text);
        assert.equal(drop.body.code, 'invalid_state');
        const newToken = 'rotated-token-'.padEnd(40, 'r');
        t().forbidSecret(newToken);
        const rotated = await asAdmin.patch('/admin/nodes/{node}', { ...at, body: { agent_token: newToken } });
        assert.equal(rotated.status, 200, rotated.text);
        assert.equal(rotated.body.agent_token_set, true);
        assert.equal(rotated.body.agent_url, agent.url);
        // The stand-in now takes only the new token; the control plane uses it.
        agent.token = newToken;
        try {
          assert.equal((await asRenter.post('/vms/{vm_id}/stop', ofVm(c.body.id))).status, 200);
          await advance(t(), admin.token, 1);
          assert.equal((await vmOf(c.body.id)).status, 'stopped');
          assert.equal((await asRenter.delete('/vms/{vm_id}', ofVm(c.body.id))).status, 200);
          await advance(t(), admin.token, 1);
        } finally {
          agent.token = TOKEN;
        }
        const left = await asAdmin.patch('/admin/nodes/{node}', { ...at, body: { agent_url: null } });
        assert.equal(left.status, 200, left.text);
        assert.deepEqual(
          [left.body.agent_url, left.body.agent_token_set, left.body.agent_status, left.body.host_gpus],
          [null, false, null, null],
        );
        const bad = await asAdmin.patch('/admin/nodes/{node}', { ...at, body: { agent_token: TOKEN } });
        assert.equal(bad.status, 422, 'a token needs a URL');
        const noToken = await asAdmin.patch('/admin/nodes/{node}', { ...at, body: { agent_url: agent.url } });
        assert.equal(noToken.status, 422, 'a node gaining an agent needs its token');
      });
    });
  },
  { env: { GPUCLOUD_AGENT_HEARTBEAT_S: '1' } },
);
