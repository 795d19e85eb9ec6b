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
import { describeEachDb, type ReqOpts, type Res } from '../helpers/app.js';
import { advance, createNode, createUser, credit, uploadSshKey, type TestUser } from '../helpers/factories.js';
import { FakeAgent } from '../helpers/fake-agent.js';

const TOKEN = 'agent-token-'.padEnd(40, 'a');
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describeEachDb(
  'nodes with a host agent',
  (t) => {
    let admin: TestUser;
    let renter: TestUser;
    let agent: FakeAgent;

    const req = (method: string, url: string, opts?: ReqOpts): Promise<Res> => t().req(method, url, opts);
    const asAdmin = (method: string, url: string, body?: unknown) => req(method, url, { token: admin.token, body });
    const node = async (over: Record<string, unknown> = {}) =>
      createNode(t(), admin.token, {
        agent_url: agent.url,
        agent_token: TOKEN,
        gpu_count: 1,
        ram_gb: 1,
        cpu_cores: 1,
        ...over,
      });
    const vmOf = async (id: string) => (await req('GET', `/vms/${id}`, { token: renter.token })).body;
    /** One heartbeat round; the checks are claimed on real time, so wait out the interval first. */
    const heartbeat = async () => {
      await sleep(600);
      return t().services.agents.checkDue();
    };

    before(async () => {
      admin = await createUser(t(), { admin: true });
      renter = await createUser(t());
      await credit(t(), admin.token, renter.id, 1000);
      await uploadSshKey(t(), renter.token);
      agent = new FakeAgent(TOKEN);
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
        assert.deepEqual(n.host_gpus, [
          { pci_address: '0000:01:00.0', model: 'NVIDIA GeForce RTX 4090', vfio: true, iommu_group: 12 },
        ]);
        assert.ok(!('agent_token' in n));
        const again = await asAdmin('GET', `/admin/nodes/${n.node}`);
        assert.deepEqual(again.body, n);
        const list = await asAdmin('GET', '/admin/nodes');
        assert.ok(list.body.some((x: { node: string }) => x.node === n.node));
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
          const r = await asAdmin('POST', '/admin/nodes', { ...base, ...over });
          assert.equal(r.status, 422, `${JSON.stringify(over)}: ${r.text}`);
          assert.equal(r.body.code, 'validation_error');
          assert.ok(
            r.body.errors.some((e: { field: string }) => e.field === field),
            `${JSON.stringify(over)} -> ${field}: ${r.text}`,
          );
        }
        assert.equal((await asAdmin('GET', '/admin/nodes/agent-bad')).status, 404, 'nothing was registered');
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
        const c = await req('POST', '/vms', {
          token: renter.token,
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
          },
        );
        assert.deepEqual(calls().slice(0, 3), ['PUT /v1/vms/:id', 'POST /v1/vms/:id/start', 'GET /v1/vms/:id']);
        const port = agent.vms.get(c.body.id)!.port;
        const access = await req('GET', `/vms/${c.body.id}/access-info`, { token: renter.token });
        assert.equal(access.status, 200, access.text);
        assert.deepEqual(access.body.ssh, {
          host: agent.publicHost,
          port,
          username: 'root',
          command: `ssh -p ${port} root@${agent.publicHost}`,
        });
        const adminView = await asAdmin('GET', `/admin/vms?node=${n.node}`);
        assert.equal(adminView.status, 200, adminView.text);
        assert.deepEqual(
          adminView.body.map((v: { gpu_devices: string[] }) => v.gpu_devices),
          [['0000:01:00.0']],
          'operators see which devices it got',
        );

        agent.calls.length = 0;
        assert.equal((await req('POST', `/vms/${c.body.id}/stop`, { token: renter.token })).status, 200);
        await advance(t(), admin.token, 1);
        assert.equal((await vmOf(c.body.id)).status, 'stopped');
        assert.deepEqual(
          agent.calls.find((x) => x.method === 'POST')?.body,
          { timeout_s: 60 },
          'ACPI power-down with the configured grace',
        );
        assert.equal((await req('POST', `/vms/${c.body.id}/start`, { token: renter.token })).status, 200);
        await advance(t(), admin.token, 1);
        assert.equal((await vmOf(c.body.id)).status, 'running');
        assert.equal(calls().filter((x) => x.startsWith('PUT')).length, 0, 'a built VM is not built again');
        assert.equal((await req('DELETE', `/vms/${c.body.id}`, { token: renter.token })).status, 200);
        await advance(t(), admin.token, 1);
        assert.equal((await vmOf(c.body.id)).status, 'destroyed');
        assert.ok(calls().includes('DELETE /v1/vms/:id'));
        assert.equal(agent.vms.has(c.body.id), false, 'nothing of it is left on the host');
      });

      test("a template the host lacks: the VM ends failed with the agent's reason", async () => {
        const n = await node();
        const c = await req('POST', '/vms', {
          token: renter.token,
          body: { node: n.node, gpu_type: '4090', gpu_count: 1, storage_gb: 50, template_vmid: 101 },
        });
        assert.equal(c.status, 201, c.text);
        await advance(t(), admin.token, 5);
        const vm = await vmOf(c.body.id);
        assert.equal(vm.status, 'failed');
        const a = await asAdmin('GET', `/admin/vms?node=${n.node}&include_destroyed=true`);
        const row = a.body.find((v: { id: string }) => v.id === c.body.id);
        assert.match(row.last_error, /template 101 is not on this host/);
        assert.equal(row.gpu_devices, null, 'nothing was built');
      });

      test('a simulated node beside it works as before', async () => {
        const sim = await createNode(t(), admin.token, { gpu_count: 1 });
        assert.equal(sim.agent_url, null);
        const before = agent.calls.length;
        const c = await req('POST', '/vms', {
          token: renter.token,
          body: { node: sim.node, gpu_type: '4090', gpu_count: 1, storage_gb: 50, template_vmid: 100 },
        });
        await advance(t(), admin.token, 5);
        assert.equal((await vmOf(c.body.id)).status, 'running');
        assert.equal(agent.calls.filter((x) => x.path.includes(c.body.id)).length, 0);
        assert.ok(agent.calls.length >= before);
        await req('DELETE', `/vms/${c.body.id}`, { token: renter.token });
        await advance(t(), admin.token, 1);
      });
    });

    describe('slow hypervisor work', () => {
      test('a boot still in progress on one node holds up neither a stop on another nor the next pass; one action per VM', async () => {
        const slow = await node();
        const sim = await createNode(t(), admin.token, { gpu_count: 1 });
        const body = (n: string) => ({ node: n, gpu_type: '4090', gpu_count: 1, storage_gb: 50, template_vmid: 100 });
        const other = await req('POST', '/vms', { token: renter.token, body: body(sim.node) });
        await advance(t(), admin.token, 5);
        assert.equal((await vmOf(other.body.id)).status, 'running');

        agent.bootPolls = 1_000_000; // the guest "boots" until the test says otherwise
        const booting = await req('POST', '/vms', { token: renter.token, body: body(slow.node) });
        const reconciler = t().services.reconciler;
        try {
          await reconciler.runOnce(false); // provision
          await reconciler.drain();
          await reconciler.runOnce(false); // start: in flight, polling the agent
          await sleep(300);
          assert.equal((await vmOf(booting.body.id)).status, 'starting');

          assert.equal((await req('POST', `/vms/${other.body.id}/stop`, { token: renter.token })).status, 200);
          assert.equal(await reconciler.runOnce(false), 1, 'the next pass takes the stop');
          for (let i = 0; i < 50 && (await vmOf(other.body.id)).status !== 'stopped'; i++) await sleep(100);
          assert.equal((await vmOf(other.body.id)).status, 'stopped', 'the stop finished while the boot goes on');
          assert.equal((await vmOf(booting.body.id)).status, 'starting');
          await reconciler.runOnce(false);
          const starts = agent.calls.filter(
            (c) => c.method === 'POST' && c.path === `/v1/vms/${booting.body.id}/start`,
          );
          assert.equal(starts.length, 1, 'a VM with an action in flight is not claimed again');
        } finally {
          agent.vms.get(booting.body.id)!.state = 'running';
          agent.bootPolls = 1;
          await reconciler.drain();
        }
        assert.equal((await vmOf(booting.body.id)).status, 'running');
        for (const id of [booting.body.id, other.body.id]) await req('DELETE', `/vms/${id}`, { token: renter.token });
        await advance(t(), admin.token, 1);
      });
    });

    describe('heartbeats', () => {
      test('three missed heartbeats take the node and its VMs offline; an answer brings them back as they were', async () => {
        const n = await node();
        const c = await req('POST', '/vms', {
          token: renter.token,
          body: { node: n.node, gpu_type: '4090', gpu_count: 1, storage_gb: 50, template_vmid: 100 },
        });
        await advance(t(), admin.token, 5);
        assert.equal((await vmOf(c.body.id)).status, 'running');
        const port = agent.port;
        await agent.stop();
        try {
          for (let miss = 1; miss <= 3; miss++) {
            assert.ok((await heartbeat()) >= 1, 'the agent was due');
            const now = (await asAdmin('GET', `/admin/nodes/${n.node}`)).body;
            assert.equal(now.status, miss < 3 ? 'active' : 'offline', `after ${miss} miss(es)`);
            assert.equal(now.agent_status, miss < 3 ? 'online' : 'offline');
            assert.equal((await vmOf(c.body.id)).status, miss < 3 ? 'running' : 'offline');
          }
        } finally {
          await agent.start(port);
        }
        await heartbeat();
        const back = (await asAdmin('GET', `/admin/nodes/${n.node}`)).body;
        assert.equal(back.status, 'active');
        assert.equal(back.agent_status, 'online');
        assert.equal((await vmOf(c.body.id)).status, 'running');
      });

      test('a node an operator set offline stays offline when its agent answers', async () => {
        const n = await node();
        assert.equal((await asAdmin('PATCH', `/admin/nodes/${n.node}`, { status: 'offline' })).status, 200);
        await heartbeat();
        const after = (await asAdmin('GET', `/admin/nodes/${n.node}`)).body;
        assert.equal(after.status, 'offline');
        assert.equal(after.agent_status, 'online');
      });

      test('a running VM whose guest powered off (or whose QEMU died) becomes stopped and its usage is closed', async () => {
        const n = await node();
        const c = await req('POST', '/vms', {
          token: renter.token,
          body: { node: n.node, gpu_type: '4090', gpu_count: 1, storage_gb: 50, template_vmid: 100 },
        });
        await advance(t(), admin.token, 5);
        await advance(t(), admin.token, 600);
        assert.equal((await vmOf(c.body.id)).status, 'running');
        const fake = agent.vms.get(c.body.id)!;
        fake.state = 'stopped';
        fake.exit_reason = 'guest_powered_off';
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
        // The customer starts it again like any stopped VM.
        assert.equal((await req('POST', `/vms/${c.body.id}/start`, { token: renter.token })).status, 200);
        await advance(t(), admin.token, 1);
        assert.equal((await vmOf(c.body.id)).status, 'running');
      });
    });

    describe("changing a node's agent", () => {
      test('a node with VMs keeps its agent; a new token alone rotates it; without VMs it can leave its agent', async () => {
        const n = await node();
        const c = await req('POST', '/vms', {
          token: renter.token,
          body: { node: n.node, gpu_type: '4090', gpu_count: 1, storage_gb: 50, template_vmid: 100 },
        });
        await advance(t(), admin.token, 5);
        const drop = await asAdmin('PATCH', `/admin/nodes/${n.node}`, { agent_url: null });
        assert.equal(drop.status, 400, drop.text);
        assert.equal(drop.body.code, 'invalid_state');
        const newToken = 'rotated-token-'.padEnd(40, 'r');
        t().forbidSecret(newToken);
        const rotated = await asAdmin('PATCH', `/admin/nodes/${n.node}`, { agent_token: newToken });
        assert.equal(rotated.status, 200, rotated.text);
        assert.equal(rotated.body.agent_token_set, true);
        assert.equal(rotated.body.agent_url, agent.url);
        // The stand-in now takes only the new token; the control plane uses it.
        agent.token = newToken;
        try {
          assert.equal((await req('POST', `/vms/${c.body.id}/stop`, { token: renter.token })).status, 200);
          await advance(t(), admin.token, 1);
          assert.equal((await vmOf(c.body.id)).status, 'stopped');
          assert.equal((await req('DELETE', `/vms/${c.body.id}`, { token: renter.token })).status, 200);
          await advance(t(), admin.token, 1);
        } finally {
          agent.token = TOKEN;
        }
        const left = await asAdmin('PATCH', `/admin/nodes/${n.node}`, { agent_url: null });
        assert.equal(left.status, 200, left.text);
        assert.deepEqual(
          [left.body.agent_url, left.body.agent_token_set, left.body.agent_status, left.body.host_gpus],
          [null, false, null, null],
        );
        const bad = await asAdmin('PATCH', `/admin/nodes/${n.node}`, { agent_token: TOKEN });
        assert.equal(bad.status, 422, 'a token needs a URL');
        const noToken = await asAdmin('PATCH', `/admin/nodes/${n.node}`, { agent_url: agent.url });
        assert.equal(noToken.status, 422, 'a node gaining an agent needs its token');
      });
    });
  },
  { env: { GPUCLOUD_AGENT_HEARTBEAT_S: '1' } },
);
