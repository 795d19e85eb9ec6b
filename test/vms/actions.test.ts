/**
 * The VM actions in every state (an action the state does not allow is 400
 * invalid_state naming the state), reading VMs by id and by vmid, the list
 * (paging, include_destroyed, status), ownership (another user's VM is 404
 * everywhere) and suspension.
 */
import { before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { createLocalJWKSet, jwtVerify, SignJWT } from 'jose';
import { describeEachDb, JWT_SECRET } from '../helpers/app.js';
import {
  api,
  expectError,
  hasStatus,
  isErrorBody,
  type Answer,
  type Api,
  type BodyFor,
  type RequestBody,
} from '../helpers/api.js';
import {
  advance,
  createApiKey,
  createNode,
  createUser,
  credit,
  uploadSshKey,
  type TestUser,
} from '../helpers/factories.js';
import type { VmStatus } from '../../src/modules/vms/lifecycle.js';

/** A VM as POST /vms answered it. */
type Vm = BodyFor<'/vms', 'post', 201>;

describeEachDb('VM actions', (t) => {
  let admin: TestUser;
  let owner: TestUser;
  let other: TestUser;
  let shared: string; // a roomy 4090 node

  const as = (u: TestUser) => api(t(), u.token);
  const create = async (u: TestUser, over: Partial<RequestBody<'/vms', 'post'>> = {}): Promise<Vm> => {
    const r = await as(u).post('/vms', {
      body: { node: shared, gpu_type: '4090', gpu_count: 1, storage_gb: 50, template_vmid: 100, ...over },
    });
    assert.equal(r.status, 201, r.text);
    return r.body;
  };
  const get = async (u: TestUser, ref: string | number) => {
    const r = await as(u).get('/vms/{vm_id}', { params: { vm_id: String(ref) } });
    assert.equal(r.status, 200, r.text);
    return r.body;
  };
  const ok = async <R extends Answer>(r: Promise<R> | R): Promise<Extract<R, { status: 200 }>> => {
    const res = await r;
    assert.equal(res.status, 200, res.text);
    assert.ok(hasStatus(res, 200));
    return res;
  };
  const nodeInfo = async (n: string) => {
    const r = await as(admin).get('/admin/nodes/{node}', { params: { node: n } });
    assert.equal(r.status, 200, r.text);
    return r.body;
  };
  const fault = async (node: string, action: RequestBody<'/admin/simulator/faults', 'post'>['action'], count = 1) =>
    ok(as(admin).post('/admin/simulator/faults', { body: { node, action, count } }));

  before(async () => {
    admin = await createUser(t(), { admin: true });
    owner = await createUser(t());
    other = await createUser(t());
    for (const u of [owner, other]) {
      await credit(t(), admin.token, u.id, 1000);
      await uploadSshKey(t(), u.token);
    }
    shared = (await createNode(t(), admin.token, { gpu_count: 16 })).node;
  });

  describe('each action in each state', () => {
    const vm = {} as Record<VmStatus, { id: string; vmid: number }>;
    let interruptNode: string;
    let offlineNode: string;

    before(async () => {
      interruptNode = (await createNode(t(), admin.token, { gpu_count: 1 })).node;
      offlineNode = (await createNode(t(), admin.token, { gpu_count: 1 })).node;
      const failNode = (await createNode(t(), admin.token, { gpu_count: 1 })).node;
      vm.running = await create(owner);
      vm.stopped = await create(owner);
      vm.starting = await create(owner);
      vm.stopping = await create(owner);
      vm.destroyed = await create(owner);
      vm.offline = await create(owner, { node: offlineNode });
      vm.interrupted = await create(owner, { node: interruptNode, rental_type: 'interruptible' });
      await fault(failNode, 'provision');
      vm.failed = await create(owner, { node: failNode });
      await advance(t(), admin.token, 1);
      for (const s of ['running', 'stopped', 'starting', 'stopping', 'offline', 'interrupted'] as const)
        assert.equal((await get(owner, vm[s].id)).status, 'running', s);
      assert.equal((await get(owner, vm.failed.id)).status, 'failed');
      await ok(as(owner).post('/vms/{vm_id}/stop', { params: { vm_id: vm.stopped.id } }));
      await ok(as(owner).post('/vms/{vm_id}/stop', { params: { vm_id: vm.starting.id } }));
      await advance(t(), admin.token, 1);
      await ok(as(admin).patch('/admin/nodes/{node}', { params: { node: offlineNode }, body: { status: 'offline' } }));
      await create(other, { node: interruptNode }); // on demand: preempts the interruptible VM
      await ok(as(owner).delete('/vms/{vm_id}', { params: { vm_id: vm.destroyed.id } }));
      // The transient states last: no advance after this until the checks are done.
      vm.creating = await create(owner);
      await ok(as(owner).post('/vms/{vm_id}/start', { params: { vm_id: vm.starting.id } }));
      await ok(as(owner).post('/vms/{vm_id}/stop', { params: { vm_id: vm.stopping.id } }));
      for (const s of Object.keys(vm) as VmStatus[])
        assert.equal((await get(owner, vm[s].id)).status, s, `fixture in ${s}`);
      assert.equal(Object.keys(vm).length, 9, 'one VM in each of the nine states');
    });

    test('start needs stopped or interrupted: anything else is 400 invalid_state naming the state', async () => {
      for (const s of Object.keys(vm) as VmStatus[]) {
        if (s === 'stopped' || s === 'interrupted') continue;
        const r = await as(owner).post('/vms/{vm_id}/start', { params: { vm_id: vm[s].id } });
        expectError(r, 400, 'invalid_state', new RegExp(`\\b${s}\\b`));
        assert.equal((await get(owner, vm[s].id)).status, s, 'unchanged');
      }
    });

    test('stop needs running: anything else is 400 invalid_state naming the state', async () => {
      for (const s of Object.keys(vm) as VmStatus[]) {
        if (s === 'running') continue;
        const r = await as(owner).post('/vms/{vm_id}/stop', { params: { vm_id: vm[s].id } });
        expectError(r, 400, 'invalid_state', new RegExp(`\\b${s}\\b`));
        assert.equal((await get(owner, vm[s].id)).status, s, 'unchanged');
      }
    });

    test('access-info only while running: 400 invalid_state otherwise', async () => {
      for (const s of Object.keys(vm) as VmStatus[]) {
        const r = await as(owner).get('/vms/{vm_id}/access-info', { params: { vm_id: vm[s].id } });
        if (s === 'running') assert.equal(r.status, 200, r.text);
        else expectError(r, 400, 'invalid_state', new RegExp(`\\b${s}\\b`));
      }
    });

    test('start and stop take no body fields (422)', async () => {
      const r = await as(owner).post('/vms/{vm_id}/stop', {
        params: { vm_id: vm.running.id },
        rawBody: { force: true },
      });
      assert.equal(r.status, 422, r.text);
      assert.equal((await get(owner, vm.running.id)).status, 'running');
    });

    test('the allowed actions: stop a running VM, start a stopped one, start an interrupted one (GPUs permitting)', async () => {
      const stop = await ok(as(owner).post('/vms/{vm_id}/stop', { params: { vm_id: vm.running.id } }));
      assert.deepEqual(Object.keys(stop.body), ['message']);
      assert.equal((await get(owner, vm.running.id)).status, 'stopping');
      const start = await ok(as(owner).post('/vms/{vm_id}/start', { params: { vm_id: vm.stopped.id } }));
      assert.deepEqual(Object.keys(start.body), ['message']);
      assert.equal((await get(owner, vm.stopped.id)).status, 'starting');
      // Interrupted: allowed by state, but the on-demand VM still holds the node's only GPU.
      expectError(
        await as(owner).post('/vms/{vm_id}/start', { params: { vm_id: vm.interrupted.id } }),
        400,
        'gpu_unavailable',
        /0 free GPU/,
      );
      assert.equal((await get(owner, vm.interrupted.id)).status, 'interrupted');
    });

    test('destroy works from every non-destroyed state; destroyed again is 400 invalid_state', async () => {
      for (const s of Object.keys(vm) as VmStatus[]) {
        const r = await as(owner).delete('/vms/{vm_id}', { params: { vm_id: vm[s].id } });
        if (s === 'destroyed') {
          expectError(r, 400, 'invalid_state', /destroyed/);
          continue;
        }
        assert.equal(r.status, 200, `${s}: ${r.text}`);
        assert.deepEqual(Object.keys(r.body), ['message']);
        const g = await get(owner, vm[s].id);
        assert.equal(g.status, 'destroyed', s);
        assert.ok(g.destroyed_at, s);
        expectError(
          await as(owner).delete('/vms/{vm_id}', { params: { vm_id: vm[s].id } }),
          400,
          'invalid_state',
          /destroyed/,
        );
        for (const action of ['start', 'stop'] as const) {
          expectError(
            await as(owner).post(`/vms/{vm_id}/${action}`, { params: { vm_id: vm[s].id } }),
            400,
            'invalid_state',
            /destroyed/,
          );
        }
      }
      // Every GPU of the owner is free again at once.
      const mine = await as(admin).get('/admin/vms', {
        query: { user_id: owner.id, include_destroyed: true, limit: 100 },
      });
      assert.equal(mine.status, 200, mine.text);
      assert.ok(mine.body.every((v) => v.status === 'destroyed'));
      for (const n of [interruptNode, offlineNode]) {
        const info = await nodeInfo(n);
        assert.equal(info.gpus_allocated, n === interruptNode ? 1 : 0, `${n}: only the other user's VM holds a GPU`);
      }
      await ok(as(admin).patch('/admin/nodes/{node}', { params: { node: offlineNode }, body: { status: 'active' } }));
      assert.equal(
        (await get(owner, vm.offline.id)).status,
        'destroyed',
        'a destroyed VM does not come back with its node',
      );
      await advance(t(), admin.token, 1);
      for (const s of Object.keys(vm) as VmStatus[]) assert.equal((await get(owner, vm[s].id)).status, 'destroyed', s);
    });
  });

  describe('start after stop: the GPUs must be free again', () => {
    test('stopping releases the GPUs; start needs them free again, else 400 gpu_unavailable', async () => {
      const n = (await createNode(t(), admin.token, { gpu_count: 1 })).node;
      const v = await create(owner, { node: n });
      await advance(t(), admin.token, 1);
      await ok(as(owner).post('/vms/{vm_id}/stop', { params: { vm_id: v.id } }));
      const info = () => nodeInfo(n);
      assert.equal((await info()).gpus_allocated, 1, 'held while stopping');
      await advance(t(), admin.token, 1);
      assert.equal((await get(owner, v.id)).status, 'stopped');
      assert.equal((await info()).gpus_allocated, 0, 'released once stopped');
      const taker = await create(other, { node: n });
      const r = await as(owner).post('/vms/{vm_id}/start', { params: { vm_id: v.id } });
      expectError(r, 400, 'gpu_unavailable', /0 free GPU\(s\); this VM needs 1/);
      assert.equal((await get(owner, v.id)).status, 'stopped');
      await ok(as(other).delete('/vms/{vm_id}', { params: { vm_id: taker.id } }));
      await ok(as(owner).post('/vms/{vm_id}/start', { params: { vm_id: String(v.vmid) } }));
      await advance(t(), admin.token, 1);
      assert.equal((await get(owner, v.id)).status, 'running');
      await ok(as(owner).delete('/vms/{vm_id}', { params: { vm_id: v.id } }));
    });

    test('start needs one hour of the VM plus the committed spend, like a create (400 insufficient_balance)', async () => {
      const u = await createUser(t());
      await credit(t(), admin.token, u.id, 0.45);
      await uploadSshKey(t(), u.token);
      const v = await create(u); // 0.44 + 0.01 per hour
      await t().services.clock.advance(0);
      await ok(as(u).post('/vms/{vm_id}/stop', { params: { vm_id: v.id } }));
      await t().services.clock.advance(0);
      assert.equal((await get(u, v.id)).status, 'stopped');
      const adj = await as(admin).post('/admin/users/{user_id}/credits', {
        params: { user_id: u.id },
        body: { amount: -0.1, description: 'test adjustment' },
      });
      assert.equal(adj.status, 201, adj.text);
      const bal = await as(u).get('/billing/balance');
      assert.equal(bal.status, 200, bal.text);
      const balance = bal.body.balance;
      const r = await as(u).post('/vms/{vm_id}/start', { params: { vm_id: v.id } });
      expectError(r, 400, 'insufficient_balance', /required 0\.45 USD/);
      assert.ok(r.body.detail.includes(`available ${balance.toFixed(2)} USD`), r.body.detail);
      assert.equal((await get(u, v.id)).status, 'stopped');
      await credit(t(), admin.token, u.id, 1);
      await ok(as(u).post('/vms/{vm_id}/start', { params: { vm_id: v.id } }));
      await ok(as(u).delete('/vms/{vm_id}', { params: { vm_id: v.id } }));
    });
  });

  describe('set-label', () => {
    let v: { id: string; vmid: number };
    before(async () => {
      v = await create(owner);
    });
    test('32 printable ASCII characters are fine; null clears', async () => {
      const label = ' !"#$%&\'()*+,-./09:;<=>?@AZ[\\]^_`az{|}~'.slice(0, 32);
      assert.equal(label.length, 32);
      const r = await ok(
        as(owner).post('/vms/{vm_id}/set-label', { params: { vm_id: v.id }, body: { instance_label: label } }),
      );
      assert.deepEqual(Object.keys(r.body), ['message']);
      assert.equal((await get(owner, v.id)).instance_label, label);
      await ok(
        as(owner).post('/vms/{vm_id}/set-label', { params: { vm_id: String(v.vmid) }, body: { instance_label: 'x' } }),
      );
      assert.equal((await get(owner, v.id)).instance_label, 'x');
      await ok(as(owner).post('/vms/{vm_id}/set-label', { params: { vm_id: v.id }, body: { instance_label: null } }));
      assert.equal((await get(owner, v.id)).instance_label, null);
    });
    test('33 characters, non-ASCII, empty, control characters, a wrong type or no field -> 422', async () => {
      await ok(as(owner).post('/vms/{vm_id}/set-label', { params: { vm_id: v.id }, body: { instance_label: 'keep' } }));
      const bad: unknown[] = [
        'x'.repeat(33),
        'café',
        'ラベル',
        'a\u00a0b',
        '',
        'a\nb',
        'tab\there',
        'nul\u0000',
        'del\u007f',
        42,
        true,
        ['a'],
      ];
      for (const instance_label of bad) {
        const r = await as(owner).post('/vms/{vm_id}/set-label', {
          params: { vm_id: v.id },
          rawBody: { instance_label },
        });
        expectError(r, 422, 'validation_error');
        assert.ok(
          r.body.errors?.some((e) => e.field === 'body.instance_label'),
          `${JSON.stringify(instance_label)}: ${r.text}`,
        );
      }
      expectError(
        await as(owner).post('/vms/{vm_id}/set-label', { params: { vm_id: v.id }, rawBody: {} }),
        422,
        'validation_error',
      );
      expectError(
        await as(owner).post('/vms/{vm_id}/set-label', {
          params: { vm_id: v.id },
          rawBody: { instance_label: 'a', extra: 1 },
        }),
        422,
        'validation_error',
      );
      assert.equal((await get(owner, v.id)).instance_label, 'keep', 'unchanged by refused requests');
    });
  });

  describe('set-auto-restart (interruptible VMs only)', () => {
    test('on an on-demand VM -> 400 invalid_state; on an interruptible VM it toggles', async () => {
      const od = await create(owner);
      const r = await as(owner).post('/vms/{vm_id}/set-auto-restart', {
        params: { vm_id: od.id },
        body: { auto_restart: true },
      });
      expectError(r, 400, 'invalid_state', /on_demand/);
      assert.equal((await get(owner, od.id)).auto_restart, null);
      const i = await create(owner, { rental_type: 'interruptible' });
      assert.equal(i.auto_restart, true);
      const off = await ok(
        as(owner).post('/vms/{vm_id}/set-auto-restart', { params: { vm_id: i.id }, body: { auto_restart: false } }),
      );
      assert.deepEqual(Object.keys(off.body), ['message']);
      assert.equal((await get(owner, i.id)).auto_restart, false);
      await ok(
        as(owner).post('/vms/{vm_id}/set-auto-restart', {
          params: { vm_id: String(i.vmid) },
          body: { auto_restart: true },
        }),
      );
      assert.equal((await get(owner, i.id)).auto_restart, true);
      expectError(
        await as(owner).post('/vms/{vm_id}/set-auto-restart', {
          params: { vm_id: i.id },
          rawBody: { auto_restart: 'yes' },
        }),
        422,
        'validation_error',
      );
      expectError(
        await as(owner).post('/vms/{vm_id}/set-auto-restart', { params: { vm_id: i.id }, rawBody: {} }),
        422,
        'validation_error',
      );
      await ok(as(owner).delete('/vms/{vm_id}', { params: { vm_id: i.id } }));
      expectError(
        await as(owner).post('/vms/{vm_id}/set-auto-restart', {
          params: { vm_id: i.id },
          body: { auto_restart: false },
        }),
        400,
        'invalid_state',
        /destroyed/,
      );
      await ok(as(owner).delete('/vms/{vm_id}', { params: { vm_id: od.id } }));
    });
  });

  describe('access-info', () => {
    test('SSH for every template; web_ui and jupyter with launch tokens only for 102-104', async () => {
      const vms: Record<number, { id: string; vmid: number }> = {};
      for (const template_vmid of [100, 101, 102, 103, 104])
        vms[template_vmid] = await create(owner, { template_vmid });
      await advance(t(), admin.token, 1);
      const now = t().services.clock.now().getTime();
      for (const [tpl, v] of Object.entries(vms)) {
        const r = await ok(as(owner).get('/vms/{vm_id}/access-info', { params: { vm_id: v.id } }));
        const g = await get(owner, v.id);
        assert.equal(r.body.vm_id, v.id);
        assert.equal(r.body.status, 'running');
        assert.ok(g.ip_address);
        assert.deepEqual(Object.keys(r.body.ssh).sort(), ['command', 'host', 'port', 'username']);
        assert.equal(r.body.ssh.host, g.ip_address);
        assert.equal(r.body.ssh.port, 22);
        assert.ok(r.body.ssh.command.includes(g.ip_address), r.body.ssh.command);
        assert.ok(r.body.ssh.command.startsWith('ssh '));
        if (Number(tpl) <= 101) {
          assert.equal(r.body.web_ui, null, `template ${tpl}`);
          assert.equal(r.body.jupyter, null, `template ${tpl}`);
          continue;
        }
        for (const which of ['web_ui', 'jupyter'] as const) {
          const w = r.body[which];
          assert.ok(w && typeof w.url === 'string' && typeof w.launch_token === 'string', `template ${tpl} ${which}`);
          assert.equal(Date.parse(w.expires_at), now + 300_000, 'expires in 5 minutes of service time');
          const claims = await t().services.tokens.verifyPurpose('launch', w.launch_token);
          assert.ok(claims, 'the launch token verifies');
          assert.equal(claims.vm_id, v.id, 'names the VM');
          assert.equal(claims.user_id, owner.id, 'names the user');
          assert.equal(claims.exp, (now + 300_000) / 1000);
          assert.equal(
            await t().services.tokens.verifyPurpose('access', w.launch_token),
            null,
            'only as a launch token',
          );
        }
        const { web_ui: webUi, jupyter } = r.body;
        assert.ok(webUi && jupyter, r.text);
        assert.notEqual(webUi.launch_token, jupyter.launch_token);
      }
      const r = await ok(as(owner).get('/vms/{vm_id}/access-info', { params: { vm_id: vms[102]!.id } }));
      assert.ok(r.body.web_ui, r.text);
      const token = r.body.web_ui.launch_token;
      await advance(t(), admin.token, 299);
      assert.ok(await t().services.tokens.verifyPurpose('launch', token), 'still valid at 299 s');
      await advance(t(), admin.token, 2);
      assert.equal(await t().services.tokens.verifyPurpose('launch', token), null, 'expired after 300 s');
      for (const v of Object.values(vms)) await ok(as(owner).delete('/vms/{vm_id}', { params: { vm_id: v.id } }));
    });

    test('launch tokens are interactive access: a session or a read_write key gets them, a read_only key gets SSH details only', async () => {
      const v = await create(owner, { template_vmid: 102 });
      await advance(t(), admin.token, 1);
      const rw = await createApiKey(t(), owner.token, 'read_write', 'rw');
      const ro = await createApiKey(t(), owner.token, 'read_only', 'ro');
      const bo = await createApiKey(t(), owner.token, 'billing_only', 'bo');
      for (const token of [owner.token, rw]) {
        const r = await ok(api(t(), token).get('/vms/{vm_id}/access-info', { params: { vm_id: v.id } }));
        assert.ok(r.body.web_ui?.launch_token && r.body.jupyter?.launch_token);
      }
      // Signed with a key of their own (EdDSA): a portal verifies them with the published public key alone.
      const info = await ok(as(owner).get('/vms/{vm_id}/access-info', { params: { vm_id: v.id } }));
      const jwks = await ok(api(t()).get('/.well-known/jwks.json'));
      assert.equal(jwks.body.keys.length, 1);
      const [jwk] = jwks.body.keys;
      assert.deepEqual([jwk?.kty, jwk?.crv, jwk?.alg], ['OKP', 'Ed25519', 'EdDSA']);
      const keySet = createLocalJWKSet(jwks.body);
      const webUi = info.body.web_ui;
      assert.ok(webUi, info.text);
      const checked = await jwtVerify(webUi.launch_token, keySet, { currentDate: t().clock.now() });
      assert.equal(checked.protectedHeader.alg, 'EdDSA');
      assert.equal(checked.payload.vm_id, v.id);
      await assert.rejects(
        jwtVerify(owner.token, keySet, { currentDate: t().clock.now() }),
        'an access token does not verify against it',
      );
      // A launch token forged with the access-token key is refused.
      const forged = await new SignJWT({ vm_id: v.id, user_id: owner.id, service: 'webui', typ: 'launch' })
        .setProtectedHeader({ alg: 'HS256' })
        .setIssuer('gpucloud')
        .setIssuedAt(Math.floor(t().clock.nowMs() / 1000))
        .setExpirationTime(Math.floor(t().clock.nowMs() / 1000) + 300)
        .sign(new TextEncoder().encode(JWT_SECRET));
      assert.equal(await t().services.tokens.verifyPurpose('launch', forged), null);
      // The token travels in the URL's fragment, which browsers never send to a server (so nothing logs it).
      assert.ok(webUi.url.endsWith(`/.gpucloud/launch#launch_token=${webUi.launch_token}`), webUi.url);
      // Each service of each VM on an origin of its own (the portal's local default: *.localhost).
      assert.equal(new URL(webUi.url).hostname, `${v.vmid}-webui.localhost`);
      assert.equal(new URL(info.body.jupyter?.url ?? '').hostname, `${v.vmid}-jupyter.localhost`);
      assert.ok(!webUi.url.includes('?'));
      // A simulated VM's address answers nothing: access-info says so.
      assert.match(info.body.notice ?? '', /simulated node: its address is made up/);
      const readOnly = await ok(api(t(), ro).get('/vms/{vm_id}/access-info', { params: { vm_id: v.id } }));
      assert.equal(readOnly.body.web_ui, null);
      assert.equal(readOnly.body.jupyter, null);
      assert.ok(readOnly.body.ssh.command.startsWith('ssh '), "SSH details are not secret: the key is the customer's");
      assert.equal((await api(t(), bo).get('/vms/{vm_id}/access-info', { params: { vm_id: v.id } })).status, 403);
      await ok(as(owner).delete('/vms/{vm_id}', { params: { vm_id: v.id } }));
    });
  });

  describe('reading VMs by id or vmid, and the list', () => {
    let u: TestUser;
    const made: { id: string; vmid: number }[] = [];
    before(async () => {
      u = await createUser(t());
      await credit(t(), admin.token, u.id, 100);
      await uploadSshKey(t(), u.token);
      for (let i = 0; i < 5; i++) made.push(await create(u, { instance_label: `vm-${i}` }));
      await t().services.clock.advance(0); // all running now (provisioning takes 0 s in tests)
      await advance(t(), admin.token, 5);
      await ok(as(u).post('/vms/{vm_id}/stop', { params: { vm_id: made[1]!.id } }));
      await t().services.clock.advance(0); // made[1] stopped
      await ok(as(u).delete('/vms/{vm_id}', { params: { vm_id: made[3]!.id } })); // made[3] destroyed
    });

    test('GET by uuid, by upper-case uuid and by vmid return the same record', async () => {
      const byId = await ok(as(u).get('/vms/{vm_id}', { params: { vm_id: made[0]!.id } }));
      const byVmid = await ok(as(u).get('/vms/{vm_id}', { params: { vm_id: String(made[0]!.vmid) } }));
      const byUpper = await ok(as(u).get('/vms/{vm_id}', { params: { vm_id: made[0]!.id.toUpperCase() } }));
      assert.deepEqual(byVmid.body, byId.body);
      assert.deepEqual(byUpper.body, byId.body);
      assert.equal(byId.body.status, 'running');
      assert.ok(byId.body.started_at && byId.body.stopped_at === null);
      const stopped = await get(u, made[1]!.vmid);
      assert.equal(stopped.status, 'stopped');
      assert.ok(stopped.stopped_at !== null && stopped.started_at !== null, JSON.stringify(stopped));
      assert.equal(
        Date.parse(stopped.stopped_at) - Date.parse(stopped.started_at),
        5000,
        'stopped_at: the moment it left running (the stop request)',
      );
      assert.equal(stopped.cpu_percent, 0);
      assert.equal((await get(u, made[3]!.id)).status, 'destroyed', 'a destroyed VM can still be read');
    });

    test('ids that are neither a uuid nor an integer, and unknown ones, are 404', async () => {
      for (const ref of [
        'abc',
        '12abc',
        '1.5',
        '-1',
        '1e3',
        '0x10',
        `${made[0]!.id}x`,
        made[0]!.id.slice(0, 35),
        randomUUID(),
        '999999999',
        '99999999999999999999',
      ]) {
        const r = await as(u).get('/vms/{vm_id}', { params: { vm_id: ref } }); // the path encodes it
        expectError(r, 404, 'not_found', /VM not found/);
      }
    });

    test('the list: newest first, destroyed left out unless asked, X-Total-Count, status filter, paging', async () => {
      const l = await ok(as(u).get('/vms'));
      assert.deepEqual(
        l.body.map((v) => v.id),
        [made[4], made[2], made[1], made[0]].map((v) => v!.id),
      );
      assert.equal(l.headers['x-total-count'], '4');
      const all = await ok(as(u).get('/vms', { query: { include_destroyed: true } }));
      assert.deepEqual(
        all.body.map((v) => v.id),
        [...made].reverse().map((v) => v.id),
      );
      assert.equal(all.headers['x-total-count'], '5');
      const running = await ok(as(u).get('/vms', { query: { status: 'running' } }));
      assert.deepEqual(
        running.body.map((v) => v.id),
        [made[4], made[2], made[0]].map((v) => v!.id),
      );
      assert.equal(running.headers['x-total-count'], '3');
      const stopped = await ok(as(u).get('/vms', { query: { status: 'stopped' } }));
      assert.deepEqual(
        stopped.body.map((v) => v.id),
        [made[1]!.id],
      );
      const destroyed = await ok(as(u).get('/vms', { query: { status: 'destroyed' } }));
      assert.deepEqual(
        destroyed.body.map((v) => v.id),
        [made[3]!.id],
      );
      const page = await ok(as(u).get('/vms', { query: { limit: 2, offset: 1 } }));
      assert.deepEqual(
        page.body.map((v) => v.id),
        [made[2], made[1]].map((v) => v!.id),
      );
      assert.equal(page.headers['x-total-count'], '4', 'the total ignores paging');
      const none = await ok(as(u).get('/vms', { query: { offset: 10 } }));
      assert.deepEqual(none.body, []);
      assert.equal(none.headers['x-total-count'], '4');
      const badQueries: Record<string, string | number>[] = [
        { status: 'sleeping' },
        { limit: 0 },
        { limit: 101 },
        { offset: -1 },
        { include_destroyed: 'maybe' },
        { colour: 'red' },
      ];
      for (const query of badQueries) {
        expectError(await as(u).get('/vms', { rawQuery: query }), 422, 'validation_error');
      }
      // Only the caller's VMs
      const o = await ok(as(other).get('/vms', { query: { include_destroyed: true, limit: 100 } }));
      assert.ok(o.body.every((v) => v.user_id === other.id));
      assert.ok(!o.body.some((v) => made.some((m) => m.id === v.id)));
    });
  });

  describe("another user's VM is 404 on every route", () => {
    test('GET, DELETE, start, stop, set-label, set-auto-restart, access-info, interruption-history; by id and by vmid', async () => {
      const mine = await create(owner, { rental_type: 'interruptible', instance_label: 'mine' });
      await advance(t(), admin.token, 1);
      /** Each route on a VM, as `other` calls it. */
      const routes: ((c: Api, vm_id: string) => Promise<Answer>)[] = [
        (c, vm_id) => c.get('/vms/{vm_id}', { params: { vm_id } }),
        (c, vm_id) => c.delete('/vms/{vm_id}', { params: { vm_id } }),
        (c, vm_id) => c.post('/vms/{vm_id}/start', { params: { vm_id } }),
        (c, vm_id) => c.post('/vms/{vm_id}/stop', { params: { vm_id } }),
        (c, vm_id) => c.post('/vms/{vm_id}/set-label', { params: { vm_id }, body: { instance_label: 'pwned' } }),
        (c, vm_id) => c.post('/vms/{vm_id}/set-auto-restart', { params: { vm_id }, body: { auto_restart: false } }),
        (c, vm_id) => c.get('/vms/{vm_id}/access-info', { params: { vm_id } }),
        (c, vm_id) => c.get('/vms/{vm_id}/interruption-history', { params: { vm_id } }),
      ];
      const missing = randomUUID();
      const c = as(other);
      for (const call of routes) {
        for (const ref of [mine.id, String(mine.vmid)]) {
          const r = await call(c, ref);
          expectError(r, 404, 'not_found', /VM not found/);
          // Exactly as a VM that does not exist
          const m = await call(c, missing);
          assert.equal(m.status, 404);
          assert.ok(isErrorBody(m.body), m.text);
          assert.deepEqual({ detail: m.body.detail, code: m.body.code }, { detail: r.body.detail, code: r.body.code });
        }
        const junk = await call(c, 'not-a-vm');
        expectError(junk, 404, 'not_found');
      }
      const g = await get(owner, mine.id);
      assert.equal(g.status, 'running', 'untouched');
      assert.equal(g.instance_label, 'mine');
      assert.equal(g.auto_restart, true);
      const adminView = await as(other).get('/admin/vms');
      expectError(adminView, 403, 'forbidden');
      await ok(as(owner).delete('/vms/{vm_id}', { params: { vm_id: mine.id } }));
    });
  });

  describe('suspension', () => {
    test("a suspended user's running VMs are stopped, and one still coming up does not stay up", async () => {
      const s = await createUser(t());
      await credit(t(), admin.token, s.id, 100);
      await uploadSshKey(t(), s.token);
      const a = await create(s);
      const b = await create(s, { rental_type: 'interruptible' });
      const c = await create(s);
      await advance(t(), admin.token, 1);
      await ok(as(s).post('/vms/{vm_id}/stop', { params: { vm_id: c.id } }));
      await advance(t(), admin.token, 1);
      const late = await create(s); // still creating at the suspension
      const patched = await ok(
        as(admin).patch('/admin/users/{user_id}', { params: { user_id: s.id }, body: { suspended: true } }),
      );
      assert.equal(patched.body.suspended, true);
      for (const v of [a, b])
        assert.equal(
          (await ok(as(admin).get('/admin/vms', { query: { user_id: s.id, status: 'stopping' } }))).body.some(
            (x) => x.id === v.id,
          ),
          true,
        );
      expectError(await as(s).get('/vms'), 403, 'forbidden');
      expectError(await as(s).post('/vms/{vm_id}/start', { params: { vm_id: c.id } }), 403, 'forbidden');
      await advance(t(), admin.token, 1);
      const list = await ok(as(admin).get('/admin/vms', { query: { user_id: s.id } }));
      const status = Object.fromEntries(list.body.map((v) => [v.id, v.status]));
      assert.deepEqual(status, { [a.id]: 'stopped', [b.id]: 'stopped', [c.id]: 'stopped', [late.id]: 'stopped' });
      // Lifting the suspension starts nothing by itself
      await ok(as(admin).patch('/admin/users/{user_id}', { params: { user_id: s.id }, body: { suspended: false } }));
      await advance(t(), admin.token, 1);
      const after = await ok(as(s).get('/vms'));
      assert.ok(after.body.every((v) => v.status === 'stopped'));
      await ok(as(s).post('/vms/{vm_id}/start', { params: { vm_id: a.id } }));
      await advance(t(), admin.token, 1);
      assert.equal((await get(s, a.id)).status, 'running');
      for (const v of [a, b, c, late]) await ok(as(s).delete('/vms/{vm_id}', { params: { vm_id: v.id } }));
    });
  });
});
