/**
 * The access portal end to end on both databases, over real HTTP: the service
 * listens on a port, a stand-in host agent tunnels to stand-in guest apps
 * (test/helpers/guest-app.ts), and a client speaks to VM host names under
 * `*.localhost`. A launch link signs in once and becomes a cookie for its one
 * host; the app streams both ways and upgrades to WebSocket; the guest never
 * sees a gpucloud credential; stopped, restarted and destroyed VMs, another
 * VM's token, another host, undeclared ports, simulated nodes, read_only keys
 * and bad input each get a clear answer.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { createHash, randomBytes } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import type { Server } from 'node:http';
import { describeEachDb } from '../helpers/app.js';
import { api, type Api } from '../helpers/api.js';
import {
  advance,
  createApiKey,
  createNode,
  createUser,
  credit,
  uploadSshKey,
  type TestUser,
} from '../helpers/factories.js';
import { FakeAgent } from '../helpers/fake-agent.js';
import { DOWNLOAD_BYTES, downloadBody, startGuestApp, wsConnect, wsEcho } from '../helpers/guest-app.js';

const TOKEN = 'portal-agent-token-'.padEnd(40, 'p');

interface Answer {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: Buffer;
  text: string;
}

describeEachDb('access portal', (t) => {
  let port: number;
  let admin: TestUser;
  let renter: TestUser;
  let asRenter: Api;
  let agent: FakeAgent;
  let node: string;
  const guests: Server[] = [];
  const guestOf = new Map<number, number>();

  const hostOf = (vmid: number, service: string) => `${vmid}-${service}.localhost:${port}`;
  const call = (
    host: string,
    path: string,
    opts: { method?: string; headers?: Record<string, string>; body?: Buffer | string } = {},
  ): Promise<Answer> =>
    new Promise((resolve, reject) => {
      const req = http.request(
        {
          host: '127.0.0.1',
          port,
          path,
          method: opts.method ?? 'GET',
          headers: { host, ...opts.headers },
          agent: false,
        },
        (res) => {
          const chunks: Buffer[] = [];
          res.on('data', (c: Buffer) => chunks.push(c));
          res.on('end', () => {
            const body = Buffer.concat(chunks);
            resolve({ status: res.statusCode ?? 0, headers: res.headers, body, text: body.toString() });
          });
        },
      );
      req.on('error', reject);
      req.end(opts.body);
    });
  /** POSTs a launch link's token on its own host; returns the answer and the cookie it set. */
  const exchange = async (url: string, onHost?: string) => {
    const u = new URL(url);
    const token = /#launch_token=(.+)$/.exec(url)![1]!;
    const r = await call(onHost ?? u.host, '/.gpucloud/session', {
      method: 'POST',
      headers: { 'content-type': 'application/json', accept: 'application/json' },
      body: JSON.stringify({ launch_token: token }),
    });
    const set = r.headers['set-cookie']?.[0];
    return { r, setCookie: set, cookie: set?.split(';')[0] };
  };
  const accessInfo = async (id: string, who: Api = asRenter) => {
    const r = await who.get('/vms/{vm_id}/access-info', { params: { vm_id: id } });
    assert.equal(r.status, 200, r.text);
    return r.body;
  };
  const createVm = async (body: Record<string, unknown>) => {
    const r = await asRenter.post('/vms', {
      body: { node, gpu_type: '4090', gpu_count: 1, storage_gb: 50, template_vmid: 102, ...body } as never,
    });
    assert.equal(r.status, 201, r.text);
    await advance(t(), admin.token, 5);
    return r.body;
  };

  before(async () => {
    await t().app.listen({ port: 0, host: '127.0.0.1' });
    port = (t().app.server.address() as AddressInfo).port;
    t().services.portal.links.setBase(`http://localhost:${port}`);
    admin = await createUser(t(), { admin: true });
    renter = await createUser(t());
    asRenter = api(t(), renter.token);
    await credit(t(), admin.token, renter.id, 500);
    await uploadSshKey(t(), renter.token);
    agent = new FakeAgent(TOKEN);
    agent.hostGpus = 8;
    agent.templates = [100, 101, 102, 103, 104].map((vmid) => ({ vmid, user: 'root' }));
    for (const gp of [7860, 8888, 8000]) {
      const g = await startGuestApp(`guest-${gp}`);
      guests.push(g.server);
      guestOf.set(gp, g.port);
      agent.guestPorts.set(gp, g.port);
    }
    await agent.start();
    t().forbidSecret(TOKEN);
    node = (
      await createNode(t(), admin.token, {
        agent_url: agent.url,
        agent_token: TOKEN,
        gpu_count: 8,
        ram_gb: 8,
        cpu_cores: 8,
      })
    ).node;
  });
  after(async () => {
    await agent.stop();
    for (const g of guests) await new Promise((r) => g.close(r));
  });

  test('http_ports: up to 5 ports 1024-65535, each once, not a port the template serves already', async () => {
    for (const [http_ports, why] of [
      [[80], 'below 1024'],
      [[70000], 'above 65535'],
      [[8000, 8000], 'twice'],
      [[8000, 8001, 8002, 8003, 8004, 8005], 'six'],
      [['8000'], 'a string'],
      [[8888], "the template's Jupyter port"],
    ] as const) {
      const r = await asRenter.post('/vms', {
        body: { node, gpu_type: '4090', gpu_count: 1, storage_gb: 50, template_vmid: 102, http_ports } as never,
      });
      assert.equal(r.status, 422, `${why}: ${r.text}`);
    }
    const vm = await createVm({ template_vmid: 100, http_ports: [9000, 8000] });
    assert.deepEqual(vm.http_ports, [8000, 9000], 'kept sorted on the VM');
    const info = await accessInfo(vm.id);
    assert.equal(info.web_ui, null, 'template 100 has no WebUI');
    assert.deepEqual(
      info.ports.map((p) => [p.port, new URL(p.url!).host]),
      [
        [8000, hostOf(vm.vmid, '8000')],
        [9000, hostOf(vm.vmid, '9000')],
      ],
    );
    await asRenter.delete('/vms/{vm_id}', { params: { vm_id: vm.id } });
    await advance(t(), admin.token, 1);
  });

  test('launch: one use of the token becomes a cookie for one host; the app streams both ways; the guest sees no gpucloud credential', async () => {
    const vm = await createVm({ http_ports: [8000] });
    assert.equal(vm.status, 'creating');
    const info = await accessInfo(vm.id);
    assert.ok(info.web_ui && info.jupyter, JSON.stringify(info));
    const url = new URL(info.web_ui.url);
    assert.equal(url.host, hostOf(vm.vmid, 'webui'));
    assert.equal(url.pathname, '/.gpucloud/launch');

    // The launch page: a page of the portal's own, its script a file (a strict CSP, no inline code).
    const page = await call(url.host, '/.gpucloud/launch', { headers: { accept: 'text/html' } });
    assert.equal(page.status, 200);
    assert.match(String(page.headers['content-security-policy'] ?? ''), /script-src 'self'/);
    assert.match(page.text, /<script src="\/\.gpucloud\/launch\.js">/);
    assert.ok(!/<script>/.test(page.text) && !/style=/.test(page.text));
    assert.equal((await call(url.host, '/.gpucloud/launch.js')).status, 200);

    // Not signed in: a browser gets a page saying where to sign in, a program the error shape.
    const anon = await call(url.host, '/', { headers: { accept: 'text/html' } });
    assert.equal(anon.status, 401);
    assert.match(anon.text, /Open it from the console/);
    const anonJson = await call(url.host, '/');
    assert.equal(anonJson.status, 401);
    assert.equal(JSON.parse(anonJson.text).code, 'unauthorized');

    const { r, setCookie, cookie } = await exchange(info.web_ui.url);
    assert.equal(r.status, 204, r.text);
    assert.ok(setCookie && cookie);
    const attrs = setCookie.split(';').map((a) => a.trim().toLowerCase());
    assert.ok(attrs.includes('httponly') && attrs.includes('samesite=lax') && attrs.includes('path=/'), setCookie);
    assert.ok(attrs.includes(`max-age=${12 * 3600}`), 'at most 12 hours');
    assert.ok(!attrs.some((a) => a.startsWith('domain=')), 'host-only: no other host gets it');
    assert.ok(!attrs.includes('secure'), 'plain http on localhost: not Secure (it is under https)');

    const again = await exchange(info.web_ui.url);
    assert.equal(again.r.status, 401, 'a token opens the portal once');
    assert.match(JSON.parse(again.r.text).detail, /used already/);

    // Through the portal to the guest's port 7860.
    const home = await call(url.host, '/', { headers: { cookie: `theme=dark; ${cookie}; other=1` } });
    assert.equal(home.status, 200, home.text);
    assert.match(home.text, new RegExp(`port=${guestOf.get(7860)}`));
    const echoed = await call(url.host, '/echo?x=1', {
      method: 'POST',
      headers: { cookie: `theme=dark; ${cookie}`, 'content-type': 'application/octet-stream' },
      body: 'hello',
    });
    const [headerText] = echoed.text.split('\n\n');
    assert.match(headerText!, /^POST \/echo\?x=1/);
    assert.match(headerText!, /^cookie: theme=dark$/m, "the app's own cookies pass");
    assert.ok(!echoed.text.includes('gpucloud_portal'), 'the portal cookie never reaches the guest');
    assert.match(headerText!, /^x-forwarded-for: 127\.0\.0\.1$/m);
    assert.match(headerText!, /^x-forwarded-proto: http$/m);
    assert.match(headerText!, new RegExp(`^x-forwarded-host: ${hostOf(vm.vmid, 'webui').replace(/\./g, '\\.')}$`, 'm'));
    assert.match(headerText!, new RegExp(`^host: ${hostOf(vm.vmid, 'webui').replace(/\./g, '\\.')}$`, 'm'));

    // Upload and download byte-exact, several MB each.
    const upload = randomBytes(5 * 1024 * 1024);
    const up = await call(url.host, '/echo', { method: 'PUT', headers: { cookie: cookie! }, body: upload });
    assert.equal(up.status, 200);
    const back = up.body.subarray(up.body.indexOf('\n\n') + 2);
    assert.equal(createHash('sha256').update(back).digest('hex'), createHash('sha256').update(upload).digest('hex'));
    const down = await call(url.host, '/download', { headers: { cookie: cookie! } });
    assert.equal(down.body.length, DOWNLOAD_BYTES);
    assert.ok(down.body.equals(downloadBody()));

    // WebSocket through the portal, and refused without the cookie.
    const ws = await wsConnect(port, '/ws', { host: url.host, cookie: cookie! });
    assert.equal(ws.status, 101, ws.head);
    assert.equal(await wsEcho(ws.socket, 'ping through the portal'), 'ping through the portal');
    ws.socket.destroy();
    const wsAnon = await wsConnect(port, '/ws', { host: url.host });
    assert.equal(wsAnon.status, 401);
    wsAnon.socket.destroy();
    // An upgrade on the API's own host name is refused, never passed anywhere.
    const wsApi = await wsConnect(port, '/ws', { host: `127.0.0.1:${port}` });
    assert.equal(wsApi.status, 404);
    wsApi.socket.destroy();

    // The cookie opens its own host only: Jupyter of the same VM needs its own link.
    const jupyterHost = hostOf(vm.vmid, 'jupyter');
    assert.equal((await call(jupyterHost, '/', { headers: { cookie: cookie! } })).status, 401);
    const j = await exchange(info.jupyter.url);
    assert.equal(j.r.status, 204);
    const jHome = await call(jupyterHost, '/', { headers: { cookie: j.cookie! } });
    assert.match(jHome.text, new RegExp(`port=${guestOf.get(8888)}`));
    // The customer's own port.
    const p = await exchange(info.ports[0]!.url!);
    assert.equal(p.r.status, 204);
    assert.match(
      (await call(hostOf(vm.vmid, '8000'), '/', { headers: { cookie: p.cookie! } })).text,
      new RegExp(`port=${guestOf.get(8000)}`),
    );
    assert.ok(agent.tunnels.every((x) => x.startsWith(`${vm.id}:`)));

    await asRenter.delete('/vms/{vm_id}', { params: { vm_id: vm.id } });
    await advance(t(), admin.token, 1);
  });

  test("another VM's token, another service's token, a host of no VM, an undeclared port: refused, nothing opened", async () => {
    const a = await createVm({});
    const b = await createVm({});
    const infoA = await accessInfo(a.id);
    const infoB = await accessInfo(b.id);
    const bOnA = await exchange(infoB.web_ui!.url, hostOf(a.vmid, 'webui'));
    assert.equal(bOnA.r.status, 403, bOnA.r.text);
    assert.equal(bOnA.cookie, undefined);
    const jupyterOnWebui = await exchange(infoA.jupyter!.url, hostOf(a.vmid, 'webui'));
    assert.equal(jupyterOnWebui.r.status, 403);
    const nowhere = await exchange(infoA.web_ui!.url, hostOf(999_999, 'webui'));
    assert.equal(nowhere.r.status, 403);
    assert.equal((await exchange(infoA.web_ui!.url, hostOf(a.vmid, '9999'))).r.status, 403, 'an undeclared port');
    // The refused tries did not use A's token up.
    const own = await exchange(infoA.web_ui!.url);
    assert.equal(own.r.status, 204);
    // A's cookie sent to B's host opens nothing there.
    assert.equal((await call(hostOf(b.vmid, 'webui'), '/', { headers: { cookie: own.cookie! } })).status, 401);
    // Another user's token is refused as well, whatever host it is sent to.
    const other = await createUser(t());
    assert.equal(
      (await api(t(), other.token).get('/vms/{vm_id}/access-info', { params: { vm_id: a.id } })).status,
      404,
    );
    // Names that are not a VM service go to the API (whose root leads to the console), never to a guest.
    const notService = await call(`${a.vmid}-ssh.localhost:${port}`, '/');
    assert.equal(notService.status, 302);
    assert.equal(notService.headers.location, '/console/');
    assert.equal((await call(`${a.vmid}-webui.localhost:${port}`, '/.gpucloud/nothing')).status, 404);
    // A forged or expired token.
    const forged = await call(hostOf(a.vmid, 'webui'), '/.gpucloud/session', {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ launch_token: 'x.y.z' }),
    });
    assert.equal(forged.status, 401);
    const notJson = await call(hostOf(a.vmid, 'webui'), '/.gpucloud/session', { method: 'POST', body: 'token' });
    assert.equal(notJson.status, 415);
    const late = await accessInfo(b.id);
    await advance(t(), admin.token, 301);
    assert.equal((await exchange(late.web_ui!.url)).r.status, 401, 'a link lasts 5 minutes');
    for (const v of [a, b]) await asRenter.delete('/vms/{vm_id}', { params: { vm_id: v.id } });
    await advance(t(), admin.token, 1);
  });

  test('the cookie ends with the run: a stopped VM answers a clear page, a restarted one asks for a new link, a destroyed one is gone', async () => {
    const vm = await createVm({});
    const { cookie } = await exchange((await accessInfo(vm.id)).web_ui!.url);
    const host = hostOf(vm.vmid, 'webui');
    assert.equal((await call(host, '/', { headers: { cookie: cookie! } })).status, 200);
    assert.equal((await asRenter.post('/vms/{vm_id}/stop', { params: { vm_id: vm.id } })).status, 200);
    await advance(t(), admin.token, 2);
    await new Promise((r) => setTimeout(r, 1100)); // the portal reads a VM at most once a second
    const stopped = await call(host, '/', { headers: { cookie: cookie!, accept: 'text/html' } });
    assert.equal(stopped.status, 409);
    assert.match(stopped.text, new RegExp(`VM ${vm.vmid} is stopped`));
    assert.equal((await asRenter.post('/vms/{vm_id}/start', { params: { vm_id: vm.id } })).status, 200);
    await advance(t(), admin.token, 2);
    await new Promise((r) => setTimeout(r, 1100));
    const restarted = await call(host, '/', { headers: { cookie: cookie! } });
    assert.equal(restarted.status, 401, 'a new run needs a new link');
    assert.match(JSON.parse(restarted.text).detail, /stopped since you signed in/);
    const fresh = await exchange((await accessInfo(vm.id)).web_ui!.url);
    assert.equal((await call(host, '/', { headers: { cookie: fresh.cookie! } })).status, 200);
    await asRenter.delete('/vms/{vm_id}', { params: { vm_id: vm.id } });
    await advance(t(), admin.token, 1);
    await new Promise((r) => setTimeout(r, 1100));
    assert.equal((await call(host, '/', { headers: { cookie: fresh.cookie! } })).status, 404);
  });

  test('a read_only key gets no link; a token used on one instance is refused on another', async () => {
    const vm = await createVm({ http_ports: [8000] });
    const ro = await createApiKey(t(), renter.token, 'read_only', 'ro');
    const info = await accessInfo(vm.id, api(t(), ro));
    assert.equal(info.web_ui, null);
    assert.equal(info.jupyter, null);
    assert.deepEqual(info.ports, [{ port: 8000, url: null, expires_at: null }]);
    const second = await t().another();
    await second.listen({ port: 0, host: '127.0.0.1' });
    const { url } = (await accessInfo(vm.id)).web_ui!;
    assert.equal((await exchange(url)).r.status, 204);
    const secondPort = (second.server.address() as AddressInfo).port;
    const token = /#launch_token=(.+)$/.exec(url)![1]!;
    const onSecond = await new Promise<number>((resolve, reject) => {
      const req = http.request(
        {
          host: '127.0.0.1',
          port: secondPort,
          path: '/.gpucloud/session',
          method: 'POST',
          headers: { host: `${vm.vmid}-webui.localhost:${port}`, 'content-type': 'application/json' },
        },
        (res) => {
          res.resume();
          resolve(res.statusCode ?? 0);
        },
      );
      req.on('error', reject);
      req.end(JSON.stringify({ launch_token: token }));
    });
    assert.equal(onSecond, 401, 'used once, whichever instance');
    await asRenter.delete('/vms/{vm_id}', { params: { vm_id: vm.id } });
    await advance(t(), admin.token, 1);
  });

  test("a simulated VM: the whole launch, then the portal's own page naming the port it would reach", async () => {
    const sim = await createNode(t(), admin.token, { gpu_count: 1 });
    const r = await asRenter.post('/vms', {
      body: { node: sim.node, gpu_type: '4090', gpu_count: 1, storage_gb: 50, template_vmid: 103 },
    });
    assert.equal(r.status, 201, r.text);
    await advance(t(), admin.token, 10);
    const info = await accessInfo(r.body.id);
    const { cookie } = await exchange(info.web_ui!.url);
    const html = await call(hostOf(r.body.vmid, 'webui'), '/', { headers: { cookie: cookie!, accept: 'text/html' } });
    assert.equal(html.status, 200);
    assert.match(html.text, /simulated/);
    assert.match(html.text, /port 8188/);
    const json = await call(hostOf(r.body.vmid, 'webui'), '/', { headers: { cookie: cookie! } });
    assert.equal(json.status, 409);
    assert.equal(JSON.parse(json.text).code, 'invalid_state');
    await asRenter.delete('/vms/{vm_id}', { params: { vm_id: r.body.id } });
    await advance(t(), admin.token, 1);
  });

  test('oversized headers and a malformed request get a 4xx and nothing else', async () => {
    const host = hostOf(1000, 'webui');
    const big = await call(host, '/', { headers: { 'x-big': 'a'.repeat(20_000) } }).catch(() => null);
    assert.ok(big === null || big.status === 431, `status ${big?.status}`);
    const bad = await call(host, '/.gpucloud/session', {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: '{"launch_token":',
    });
    assert.equal(bad.status, 400);
    assert.equal(JSON.parse(bad.text).code, 'malformed_json');
  });

  // Last: it moves the clock past every access token's life.
  test('a cookie lasts 12 hours at most, whatever the VM does', async () => {
    const long = await createVm({});
    const l = await exchange((await accessInfo(long.id)).web_ui!.url);
    const host = hostOf(long.vmid, 'webui');
    await advance(t(), admin.token, 12 * 3600 - 60);
    await new Promise((r) => setTimeout(r, 1100));
    assert.equal((await call(host, '/', { headers: { cookie: l.cookie! } })).status, 200, 'still open just before');
    await t().services.clock.advance(61);
    assert.equal((await call(host, '/', { headers: { cookie: l.cookie! } })).status, 401);
  });
});
