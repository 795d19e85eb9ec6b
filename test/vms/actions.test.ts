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
import { describeEachDb, JWT_SECRET, type ReqOpts, type Res } from '../helpers/app.js';
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

describeEachDb('VM actions', (t) => {
  let admin: TestUser;
  let owner: TestUser;
  let other: TestUser;
  let shared: string; // a roomy 4090 node

  const req = (method: string, url: string, opts?: ReqOpts): Promise<Res> => t().req(method, url, opts);
  const expectError = (r: Res, status: number, code: string, detail?: RegExp) => {
    assert.equal(r.status, status, r.text);
    assert.equal(r.body.code, code, r.text);
    if (detail) assert.match(r.body.detail, detail);
  };
  const create = async (u: TestUser, over: Record<string, unknown> = {}) => {
    const r = await req('POST', '/vms', {
      token: u.token,
      body: { node: shared, gpu_type: '4090', gpu_count: 1, storage_gb: 50, template_vmid: 100, ...over },
    });
    assert.equal(r.status, 201, r.text);
    return r.body as { id: string; vmid: number; [k: string]: unknown };
  };
  const get = async (u: TestUser, ref: string | number) => (await req('GET', `/vms/${ref}`, { token: u.token })).body;
  const ok = async (r: Promise<Res> | Res) => {
    const res = await r;
    assert.equal(res.status, 200, res.text);
    return res;
  };
  const fault = async (node: string, action: string, count = 1) =>
    ok(req('POST', '/admin/simulator/faults', { token: admin.token, body: { node, action, count } }));

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
      await ok(req('POST', `/vms/${vm.stopped.id}/stop`, { token: owner.token }));
      await ok(req('POST', `/vms/${vm.starting.id}/stop`, { token: owner.token }));
      await advance(t(), admin.token, 1);
      await ok(req('PATCH', `/admin/nodes/${offlineNode}`, { token: admin.token, body: { status: 'offline' } }));
      await create(other, { node: interruptNode }); // on demand: preempts the interruptible VM
      await ok(req('DELETE', `/vms/${vm.destroyed.id}`, { token: owner.token }));
      // The transient states last: no advance after this until the checks are done.
      vm.creating = await create(owner);
      await ok(req('POST', `/vms/${vm.starting.id}/start`, { token: owner.token }));
      await ok(req('POST', `/vms/${vm.stopping.id}/stop`, { token: owner.token }));
      for (const s of Object.keys(vm) as VmStatus[])
        assert.equal((await get(owner, vm[s].id)).status, s, `fixture in ${s}`);
      assert.equal(Object.keys(vm).length, 9, 'one VM in each of the nine states');
    });

    test('start needs stopped or interrupted: anything else is 400 invalid_state naming the state', async () => {
      for (const s of Object.keys(vm) as VmStatus[]) {
        if (s === 'stopped' || s === 'interrupted') continue;
        const r = await req('POST', `/vms/${vm[s].id}/start`, { token: owner.token });
        expectError(r, 400, 'invalid_state', new RegExp(`\\b${s}\\b`));
        assert.equal((await get(owner, vm[s].id)).status, s, 'unchanged');
      }
    });

    test('stop needs running: anything else is 400 invalid_state naming the state', async () => {
      for (const s of Object.keys(vm) as VmStatus[]) {
        if (s === 'running') continue;
        const r = await req('POST', `/vms/${vm[s].id}/stop`, { token: owner.token });
        expectError(r, 400, 'invalid_state', new RegExp(`\\b${s}\\b`));
        assert.equal((await get(owner, vm[s].id)).status, s, 'unchanged');
      }
    });

    test('access-info only while running: 400 invalid_state otherwise', async () => {
      for (const s of Object.keys(vm) as VmStatus[]) {
        const r = await req('GET', `/vms/${vm[s].id}/access-info`, { token: owner.token });
        if (s === 'running') assert.equal(r.status, 200, r.text);
        else expectError(r, 400, 'invalid_state', new RegExp(`\\b${s}\\b`));
      }
    });

    test('start and stop take no body fields (422)', async () => {
      const r = await req('POST', `/vms/${vm.running.id}/stop`, { token: owner.token, body: { force: true } });
      assert.equal(r.status, 422, r.text);
      assert.equal((await get(owner, vm.running.id)).status, 'running');
    });

    test('the allowed actions: stop a running VM, start a stopped one, start an interrupted one (GPUs permitting)', async () => {
      const stop = await ok(req('POST', `/vms/${vm.running.id}/stop`, { token: owner.token }));
      assert.deepEqual(Object.keys(stop.body), ['message']);
      assert.equal((await get(owner, vm.running.id)).status, 'stopping');
      const start = await ok(req('POST', `/vms/${vm.stopped.id}/start`, { token: owner.token }));
      assert.deepEqual(Object.keys(start.body), ['message']);
      assert.equal((await get(owner, vm.stopped.id)).status, 'starting');
      // Interrupted: allowed by state, but the on-demand VM still holds the node's only GPU.
      expectError(
        await req('POST', `/vms/${vm.interrupted.id}/start`, { token: owner.token }),
        400,
        'gpu_unavailable',
        /0 free GPU/,
      );
      assert.equal((await get(owner, vm.interrupted.id)).status, 'interrupted');
    });

    test('destroy works from every non-destroyed state; destroyed again is 400 invalid_state', async () => {
      for (const s of Object.keys(vm) as VmStatus[]) {
        const r = await req('DELETE', `/vms/${vm[s].id}`, { token: owner.token });
        if (s === 'destroyed') {
          expectError(r, 400, 'invalid_state', /destroyed/);
          continue;
        }
        assert.equal(r.status, 200, `${s}: ${r.text}`);
        assert.deepEqual(Object.keys(r.body), ['message']);
        const g = await get(owner, vm[s].id);
        assert.equal(g.status, 'destroyed', s);
        assert.ok(g.destroyed_at, s);
        expectError(await req('DELETE', `/vms/${vm[s].id}`, { token: owner.token }), 400, 'invalid_state', /destroyed/);
        for (const action of ['start', 'stop']) {
          expectError(
            await req('POST', `/vms/${vm[s].id}/${action}`, { token: owner.token }),
            400,
            'invalid_state',
            /destroyed/,
          );
        }
      }
      // Every GPU of the owner is free again at once.
      const mine = await req('GET', '/admin/vms', {
        token: admin.token,
        query: { user_id: owner.id, include_destroyed: true, limit: 100 },
      });
      assert.ok(mine.body.every((v: { status: string }) => v.status === 'destroyed'));
      for (const n of [interruptNode, offlineNode]) {
        const info = (await req('GET', `/admin/nodes/${n}`, { token: admin.token })).body;
        assert.equal(info.gpus_allocated, n === interruptNode ? 1 : 0, `${n}: only the other user's VM holds a GPU`);
      }
      await ok(req('PATCH', `/admin/nodes/${offlineNode}`, { token: admin.token, body: { status: 'active' } }));
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
      await ok(req('POST', `/vms/${v.id}/stop`, { token: owner.token }));
      const info = async () => (await req('GET', `/admin/nodes/${n}`, { token: admin.token })).body;
      assert.equal((await info()).gpus_allocated, 1, 'held while stopping');
      await advance(t(), admin.token, 1);
      assert.equal((await get(owner, v.id)).status, 'stopped');
      assert.equal((await info()).gpus_allocated, 0, 'released once stopped');
      const taker = await create(other, { node: n });
      const r = await req('POST', `/vms/${v.id}/start`, { token: owner.token });
      expectError(r, 400, 'gpu_unavailable', /0 free GPU\(s\); this VM needs 1/);
      assert.equal((await get(owner, v.id)).status, 'stopped');
      await ok(req('DELETE', `/vms/${taker.id}`, { token: other.token }));
      await ok(req('POST', `/vms/${v.vmid}/start`, { token: owner.token }));
      await advance(t(), admin.token, 1);
      assert.equal((await get(owner, v.id)).status, 'running');
      await ok(req('DELETE', `/vms/${v.id}`, { token: owner.token }));
    });

    test('start needs one hour of the VM plus the committed spend, like a create (400 insufficient_balance)', async () => {
      const u = await createUser(t());
      await credit(t(), admin.token, u.id, 0.45);
      await uploadSshKey(t(), u.token);
      const v = await create(u); // 0.44 + 0.01 per hour
      await t().services.clock.advance(0);
      await ok(req('POST', `/vms/${v.id}/stop`, { token: u.token }));
      await t().services.clock.advance(0);
      assert.equal((await get(u, v.id)).status, 'stopped');
      const adj = await req('POST', `/admin/users/${u.id}/credits`, {
        token: admin.token,
        body: { amount: -0.1, description: 'test adjustment' },
      });
      assert.equal(adj.status, 201, adj.text);
      const balance = (await req('GET', '/billing/balance', { token: u.token })).body.balance;
      const r = await req('POST', `/vms/${v.id}/start`, { token: u.token });
      expectError(r, 400, 'insufficient_balance', /required 0\.45 USD/);
      assert.ok(r.body.detail.includes(`available ${balance.toFixed(2)} USD`), r.body.detail);
      assert.equal((await get(u, v.id)).status, 'stopped');
      await credit(t(), admin.token, u.id, 1);
      await ok(req('POST', `/vms/${v.id}/start`, { token: u.token }));
      await ok(req('DELETE', `/vms/${v.id}`, { token: u.token }));
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
        req('POST', `/vms/${v.id}/set-label`, { token: owner.token, body: { instance_label: label } }),
      );
      assert.deepEqual(Object.keys(r.body), ['message']);
      assert.equal((await get(owner, v.id)).instance_label, label);
      await ok(req('POST', `/vms/${v.vmid}/set-label`, { token: owner.token, body: { instance_label: 'x' } }));
      assert.equal((await get(owner, v.id)).instance_label, 'x');
      await ok(req('POST', `/vms/${v.id}/set-label`, { token: owner.token, body: { instance_label: null } }));
      assert.equal((await get(owner, v.id)).instance_label, null);
    });
    test('33 characters, non-ASCII, empty, control characters, a wrong type or no field -> 422', async () => {
      await ok(req('POST', `/vms/${v.id}/set-label`, { token: owner.token, body: { instance_label: 'keep' } }));
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
        const r = await req('POST', `/vms/${v.id}/set-label`, { token: owner.token, body: { instance_label } });
        expectError(r, 422, 'validation_error');
        assert.ok(
          r.body.errors.some((e: { field: string }) => e.field === 'body.instance_label'),
          `${JSON.stringify(instance_label)}: ${r.text}`,
        );
      }
      expectError(
        await req('POST', `/vms/${v.id}/set-label`, { token: owner.token, body: {} }),
        422,
        'validation_error',
      );
      expectError(
        await req('POST', `/vms/${v.id}/set-label`, { token: owner.token, body: { instance_label: 'a', extra: 1 } }),
        422,
        'validation_error',
      );
      assert.equal((await get(owner, v.id)).instance_label, 'keep', 'unchanged by refused requests');
    });
  });

  describe('set-auto-restart (interruptible VMs only)', () => {
    test('on an on-demand VM -> 400 invalid_state; on an interruptible VM it toggles', async () => {
      const od = await create(owner);
      const r = await req('POST', `/vms/${od.id}/set-auto-restart`, {
        token: owner.token,
        body: { auto_restart: true },
      });
      expectError(r, 400, 'invalid_state', /on_demand/);
      assert.equal((await get(owner, od.id)).auto_restart, null);
      const i = await create(owner, { rental_type: 'interruptible' });
      assert.equal(i.auto_restart, true);
      const off = await ok(
        req('POST', `/vms/${i.id}/set-auto-restart`, { token: owner.token, body: { auto_restart: false } }),
      );
      assert.deepEqual(Object.keys(off.body), ['message']);
      assert.equal((await get(owner, i.id)).auto_restart, false);
      await ok(req('POST', `/vms/${i.vmid}/set-auto-restart`, { token: owner.token, body: { auto_restart: true } }));
      assert.equal((await get(owner, i.id)).auto_restart, true);
      expectError(
        await req('POST', `/vms/${i.id}/set-auto-restart`, { token: owner.token, body: { auto_restart: 'yes' } }),
        422,
        'validation_error',
      );
      expectError(
        await req('POST', `/vms/${i.id}/set-auto-restart`, { token: owner.token, body: {} }),
        422,
        'validation_error',
      );
      await ok(req('DELETE', `/vms/${i.id}`, { token: owner.token }));
      expectError(
        await req('POST', `/vms/${i.id}/set-auto-restart`, { token: owner.token, body: { auto_restart: false } }),
        400,
        'invalid_state',
        /destroyed/,
      );
      await ok(req('DELETE', `/vms/${od.id}`, { token: owner.token }));
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
        const r = await ok(req('GET', `/vms/${v.id}/access-info`, { token: owner.token }));
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
        assert.notEqual(r.body.web_ui.launch_token, r.body.jupyter.launch_token);
      }
      const r = await ok(req('GET', `/vms/${vms[102]!.id}/access-info`, { token: owner.token }));
      const token = r.body.web_ui.launch_token;
      await advance(t(), admin.token, 299);
      assert.ok(await t().services.tokens.verifyPurpose('launch', token), 'still valid at 299 s');
      await advance(t(), admin.token, 2);
      assert.equal(await t().services.tokens.verifyPurpose('launch', token), null, 'expired after 300 s');
      for (const v of Object.values(vms)) await ok(req('DELETE', `/vms/${v.id}`, { token: owner.token }));
    });

    test('launch tokens are interactive access: a session or a read_write key gets them, a read_only key gets SSH details only', async () => {
      const v = await create(owner, { template_vmid: 102 });
      await advance(t(), admin.token, 1);
      const rw = await createApiKey(t(), owner.token, 'read_write', 'rw');
      const ro = await createApiKey(t(), owner.token, 'read_only', 'ro');
      const bo = await createApiKey(t(), owner.token, 'billing_only', 'bo');
      for (const token of [owner.token, rw]) {
        const r = await ok(req('GET', `/vms/${v.id}/access-info`, { token }));
        assert.ok(r.body.web_ui?.launch_token && r.body.jupyter?.launch_token);
      }
      // Signed with a key of their own (EdDSA): a portal verifies them with the published public key alone.
      const info = await ok(req('GET', `/vms/${v.id}/access-info`, { token: owner.token }));
      const jwks = await ok(req('GET', '/.well-known/jwks.json'));
      assert.equal(jwks.body.keys.length, 1);
      assert.deepEqual(
        [jwks.body.keys[0].kty, jwks.body.keys[0].crv, jwks.body.keys[0].alg],
        ['OKP', 'Ed25519', 'EdDSA'],
      );
      const keySet = createLocalJWKSet(jwks.body);
      const checked = await jwtVerify(info.body.web_ui.launch_token, keySet, { currentDate: t().clock.now() });
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
      assert.ok(info.body.web_ui.url.endsWith(`/#launch_token=${info.body.web_ui.launch_token}`), info.body.web_ui.url);
      assert.ok(!info.body.web_ui.url.includes('?'));
      const readOnly = await ok(req('GET', `/vms/${v.id}/access-info`, { token: ro }));
      assert.equal(readOnly.body.web_ui, null);
      assert.equal(readOnly.body.jupyter, null);
      assert.ok(readOnly.body.ssh.command.startsWith('ssh '), "SSH details are not secret: the key is the customer's");
      assert.equal((await req('GET', `/vms/${v.id}/access-info`, { token: bo })).status, 403);
      await ok(req('DELETE', `/vms/${v.id}`, { token: owner.token }));
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
      await ok(req('POST', `/vms/${made[1]!.id}/stop`, { token: u.token }));
      await t().services.clock.advance(0); // made[1] stopped
      await ok(req('DELETE', `/vms/${made[3]!.id}`, { token: u.token })); // made[3] destroyed
    });

    test('GET by uuid, by upper-case uuid and by vmid return the same record', async () => {
      const byId = await ok(req('GET', `/vms/${made[0]!.id}`, { token: u.token }));
      const byVmid = await ok(req('GET', `/vms/${made[0]!.vmid}`, { token: u.token }));
      const byUpper = await ok(req('GET', `/vms/${made[0]!.id.toUpperCase()}`, { token: u.token }));
      assert.deepEqual(byVmid.body, byId.body);
      assert.deepEqual(byUpper.body, byId.body);
      assert.equal(byId.body.status, 'running');
      assert.ok(byId.body.started_at && byId.body.stopped_at === null);
      const stopped = await get(u, made[1]!.vmid);
      assert.equal(stopped.status, 'stopped');
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
        const r = await req('GET', `/vms/${encodeURIComponent(ref)}`, { token: u.token });
        expectError(r, 404, 'not_found', /VM not found/);
      }
    });

    test('the list: newest first, destroyed left out unless asked, X-Total-Count, status filter, paging', async () => {
      const l = await ok(req('GET', '/vms', { token: u.token }));
      assert.deepEqual(
        l.body.map((v: { id: string }) => v.id),
        [made[4], made[2], made[1], made[0]].map((v) => v!.id),
      );
      assert.equal(l.headers['x-total-count'], '4');
      const all = await ok(req('GET', '/vms', { token: u.token, query: { include_destroyed: true } }));
      assert.deepEqual(
        all.body.map((v: { id: string }) => v.id),
        [...made].reverse().map((v) => v.id),
      );
      assert.equal(all.headers['x-total-count'], '5');
      const running = await ok(req('GET', '/vms', { token: u.token, query: { status: 'running' } }));
      assert.deepEqual(
        running.body.map((v: { id: string }) => v.id),
        [made[4], made[2], made[0]].map((v) => v!.id),
      );
      assert.equal(running.headers['x-total-count'], '3');
      const stopped = await ok(req('GET', '/vms', { token: u.token, query: { status: 'stopped' } }));
      assert.deepEqual(
        stopped.body.map((v: { id: string }) => v.id),
        [made[1]!.id],
      );
      const destroyed = await ok(req('GET', '/vms', { token: u.token, query: { status: 'destroyed' } }));
      assert.deepEqual(
        destroyed.body.map((v: { id: string }) => v.id),
        [made[3]!.id],
      );
      const page = await ok(req('GET', '/vms', { token: u.token, query: { limit: 2, offset: 1 } }));
      assert.deepEqual(
        page.body.map((v: { id: string }) => v.id),
        [made[2], made[1]].map((v) => v!.id),
      );
      assert.equal(page.headers['x-total-count'], '4', 'the total ignores paging');
      const none = await ok(req('GET', '/vms', { token: u.token, query: { offset: 10 } }));
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
        expectError(await req('GET', '/vms', { token: u.token, query }), 422, 'validation_error');
      }
      // Only the caller's VMs
      const o = await ok(req('GET', '/vms', { token: other.token, query: { include_destroyed: true, limit: 100 } }));
      assert.ok(o.body.every((v: { user_id: number }) => v.user_id === other.id));
      assert.ok(!o.body.some((v: { id: string }) => made.some((m) => m.id === v.id)));
    });
  });

  describe("another user's VM is 404 on every route", () => {
    test('GET, DELETE, start, stop, set-label, set-auto-restart, access-info, interruption-history; by id and by vmid', async () => {
      const mine = await create(owner, { rental_type: 'interruptible', instance_label: 'mine' });
      await advance(t(), admin.token, 1);
      const routes: [string, string, unknown?][] = [
        ['GET', ''],
        ['DELETE', ''],
        ['POST', '/start'],
        ['POST', '/stop'],
        ['POST', '/set-label', { instance_label: 'pwned' }],
        ['POST', '/set-auto-restart', { auto_restart: false }],
        ['GET', '/access-info'],
        ['GET', '/interruption-history'],
      ];
      const missing = randomUUID();
      for (const [method, suffix, body] of routes) {
        for (const ref of [mine.id, String(mine.vmid)]) {
          const r = await req(method, `/vms/${ref}${suffix}`, { token: other.token, body });
          expectError(r, 404, 'not_found', /VM not found/);
          // Exactly as a VM that does not exist
          const m = await req(method, `/vms/${missing}${suffix}`, { token: other.token, body });
          assert.equal(m.status, 404);
          assert.deepEqual({ detail: m.body.detail, code: m.body.code }, { detail: r.body.detail, code: r.body.code });
        }
        const junk = await req(method, `/vms/not-a-vm${suffix}`, { token: other.token, body });
        expectError(junk, 404, 'not_found');
      }
      const g = await get(owner, mine.id);
      assert.equal(g.status, 'running', 'untouched');
      assert.equal(g.instance_label, 'mine');
      assert.equal(g.auto_restart, true);
      const adminView = await req('GET', '/admin/vms', { token: other.token });
      expectError(adminView, 403, 'forbidden');
      await ok(req('DELETE', `/vms/${mine.id}`, { token: owner.token }));
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
      await ok(req('POST', `/vms/${c.id}/stop`, { token: s.token }));
      await advance(t(), admin.token, 1);
      const late = await create(s); // still creating at the suspension
      const patched = await ok(req('PATCH', `/admin/users/${s.id}`, { token: admin.token, body: { suspended: true } }));
      assert.equal(patched.body.suspended, true);
      for (const v of [a, b])
        assert.equal(
          (
            await req('GET', `/admin/vms`, { token: admin.token, query: { user_id: s.id, status: 'stopping' } })
          ).body.some((x: { id: string }) => x.id === v.id),
          true,
        );
      expectError(await req('GET', '/vms', { token: s.token }), 403, 'forbidden');
      expectError(await req('POST', `/vms/${c.id}/start`, { token: s.token }), 403, 'forbidden');
      await advance(t(), admin.token, 1);
      const list = await ok(req('GET', '/admin/vms', { token: admin.token, query: { user_id: s.id } }));
      const status = Object.fromEntries(list.body.map((v: { id: string; status: string }) => [v.id, v.status]));
      assert.deepEqual(status, { [a.id]: 'stopped', [b.id]: 'stopped', [c.id]: 'stopped', [late.id]: 'stopped' });
      // Lifting the suspension starts nothing by itself
      await ok(req('PATCH', `/admin/users/${s.id}`, { token: admin.token, body: { suspended: false } }));
      await advance(t(), admin.token, 1);
      const after = await ok(req('GET', '/vms', { token: s.token }));
      assert.ok(after.body.every((v: { status: string }) => v.status === 'stopped'));
      await ok(req('POST', `/vms/${a.id}/start`, { token: s.token }));
      await advance(t(), admin.token, 1);
      assert.equal((await get(s, a.id)).status, 'running');
      for (const v of [a, b, c, late]) await ok(req('DELETE', `/vms/${v.id}`, { token: s.token }));
    });
  });
});
