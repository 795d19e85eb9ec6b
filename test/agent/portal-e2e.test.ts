/**
 * The access portal into real guests, on both databases: `gpucloud agent`
 * (its own process, QEMU under TCG) runs template-102 and -103 VMs of the test
 * image, whose web ports serve a small app (scripts/test-image.mjs), and
 * headless Chromium opens the WebUI and Jupyter links of access-info: the
 * launch page signs in once, the guest's page shows, a WebSocket echoes
 * through the portal. Uploads and downloads are byte-exact; a used token,
 * another VM's token, an undeclared port and a cookie after stop and after
 * destroy open nothing.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { createHash, randomBytes } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import type { Browser } from 'playwright-core';
import { buildTestApp, type TestApp } from '../helpers/app.js';
import { api } from '../helpers/api.js';
import { DB_KINDS } from '../helpers/db.js';
import { advance, createApiKey, createNode, createUser, credit, type TestUser } from '../helpers/factories.js';
import { browserSkipReason, launchChromium } from '../helpers/browser.js';
import { qemu, qemuImg, genisoimage } from './qemu-helpers.js';
import {
  cli,
  freePort,
  kill,
  qemuPidsUnder,
  startAgentProcess,
  testImage,
  workDir,
  type AgentProcess,
} from './real-vms.js';
import { rmSync } from 'node:fs';
import { join } from 'node:path';

const TOKEN = 'portal-e2e-agent-token-'.padEnd(48, 'q');
const skip = qemu.skip || qemuImg.skip || genisoimage.skip || browserSkipReason();
const PATTERN = Buffer.from('0123456789abcde\n');

interface Answer {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: Buffer;
}

describe('the access portal into real guests', { skip }, () => {
  let dir: string;
  let agent: AgentProcess;
  let browser: Browser;

  before(async () => {
    for (const tool of [qemu, qemuImg, genisoimage]) tool.ensure();
    const image = testImage();
    dir = workDir('pe2e');
    const dataDir = join(dir, 'a');
    for (const vmid of ['102', '103']) {
      const added = cli(['agent', 'template', 'add', vmid, image, '--user', 'root', '--data-dir', dataDir]);
      assert.equal(added.status, 0, added.stderr);
    }
    const sshFrom = 24000 + Math.floor(Math.random() * 400) * 10;
    agent = await startAgentProcess([
      '--listen',
      `127.0.0.1:${await freePort()}`,
      '--data-dir',
      dataDir,
      '--token',
      TOKEN,
      '--accel',
      'tcg',
      '--fake-gpus',
      '2',
      '--ssh-ports',
      `${sshFrom}-${sshFrom + 9}`,
    ]);
    browser = await launchChromium();
  });

  after(async () => {
    await browser?.close();
    if (agent) await kill(agent.child);
    if (dir) for (const pid of qemuPidsUnder(dir)) process.kill(pid, 'SIGKILL');
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  for (const kind of DB_KINDS) {
    describe(kind, () => {
      let t: TestApp;
      let port: number;
      let admin: TestUser;
      let renter: TestUser;

      const call = (
        host: string,
        path: string,
        opts: { method?: string; headers?: Record<string, string>; body?: Buffer | string } = {},
      ) =>
        new Promise<Answer>((resolve, reject) => {
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
              res.on('end', () =>
                resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks) }),
              );
            },
          );
          req.on('error', reject);
          req.end(opts.body);
        });
      const exchange = (url: string, onHost?: string) =>
        call(onHost ?? new URL(url).host, '/.gpucloud/session', {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ launch_token: /#launch_token=(.+)$/.exec(url)![1] }),
        });
      const accessInfo = async (id: string, token = renter.token) => {
        const r = await api(t, token).get('/vms/{vm_id}/access-info', { params: { vm_id: id } });
        assert.equal(r.status, 200, r.text);
        return r.body;
      };

      before(async () => {
        t = await buildTestApp(kind, { env: { GPUCLOUD_AGENT_HEARTBEAT_S: '1' } });
        t.forbidSecret(TOKEN);
        await t.app.listen({ port: 0, host: '127.0.0.1' });
        port = (t.app.server.address() as AddressInfo).port;
        t.services.portal.links.setBase(`http://localhost:${port}`);
        admin = await createUser(t, { admin: true });
        renter = await createUser(t);
        await credit(t, admin.token, renter.id, 100);
      });
      after(async () => {
        await t?.close();
      });

      test('WebUI and Jupyter open in the browser; WebSocket, upload and download through the portal; tokens and cookies hold', async () => {
        const n = await createNode(t, admin.token, {
          agent_url: agent.url,
          agent_token: TOKEN,
          gpu_count: 2,
          ram_gb: 1,
          cpu_cores: 2,
        });
        const create = async (template: 102 | 103, httpPorts: number[]) => {
          const r = await api(t, renter.token).post('/vms', {
            body: {
              node: n.node,
              gpu_type: '4090',
              gpu_count: 1,
              storage_gb: 50,
              template_vmid: template,
              auth_method: 'password',
              password: 'a password for the portal test',
              http_ports: httpPorts,
            },
          });
          assert.equal(r.status, 201, r.text);
          return r.body;
        };
        const a = await create(102, [8000]);
        const b = await create(103, []);
        await advance(t, admin.token, 5);
        for (const v of [a, b]) {
          const got = await api(t, renter.token).get('/vms/{vm_id}', { params: { vm_id: v.id } });
          assert.equal(got.body && 'status' in got.body ? got.body.status : got.text, 'running');
        }
        const info = await accessInfo(a.id);

        // Chromium follows the links as a customer does: the launch page, then the guest's own page.
        const context = await browser.newContext();
        const page = await context.newPage();
        await page.goto(info.web_ui!.url);
        await page.waitForURL(`http://${a.vmid}-webui.localhost:${port}/`);
        assert.match(
          (await page.textContent('body')) ?? '',
          new RegExp(`gpucloud-test-guest vm=gpucloud-${a.vmid} port=7860`),
        );
        const echoed = await page.evaluate(
          () =>
            new Promise<string>((resolve, reject) => {
              const ws = new WebSocket(`ws://${location.host}/ws`);
              ws.onopen = () => ws.send('hello through the portal');
              ws.onmessage = (e) => resolve(String(e.data).trim());
              ws.onerror = () => reject(new Error('websocket failed'));
            }),
        );
        assert.equal(echoed, 'hello through the portal');
        const jupyter = await context.newPage();
        await jupyter.goto(info.jupyter!.url);
        await jupyter.waitForURL(`http://${a.vmid}-jupyter.localhost:${port}/`);
        assert.match((await jupyter.textContent('body')) ?? '', /port=8888/);
        const own = await context.newPage();
        await own.goto(info.ports[0]!.url!);
        await own.waitForURL(`http://${a.vmid}-8000.localhost:${port}/`);
        assert.match((await own.textContent('body')) ?? '', /port=8000/);

        // The cookie the browser holds, for byte-exact transfers and the checks below.
        const cookie = (await context.cookies(`http://${a.vmid}-webui.localhost:${port}/`)).find(
          (c) => c.name === 'gpucloud_portal',
        );
        assert.ok(cookie && cookie.httpOnly && cookie.sameSite === 'Lax', JSON.stringify(cookie));
        const jar = `${cookie.name}=${cookie.value}`;
        const host = `${a.vmid}-webui.localhost:${port}`;
        const upload = randomBytes(3 * 1024 * 1024);
        const up = await call(host, '/echo', { method: 'POST', headers: { cookie: jar }, body: upload });
        assert.equal(up.status, 200);
        const sent = up.body.subarray(up.body.indexOf('\n\n') + 2);
        assert.equal(
          createHash('sha256').update(sent).digest('hex'),
          createHash('sha256').update(upload).digest('hex'),
        );
        assert.ok(!up.body.subarray(0, up.body.indexOf('\n\n')).toString().includes('gpucloud_portal'));
        const down = await call(host, '/download', { headers: { cookie: jar } });
        assert.equal(down.body.length, 4 * 1024 * 1024);
        assert.ok(down.body.equals(Buffer.concat(Array.from({ length: 262_144 }, () => PATTERN))));

        // A used token, another VM's token, an undeclared port.
        assert.equal((await exchange(info.web_ui!.url)).status, 401, 'a token opens the portal once');
        const bInfo = await accessInfo(b.id);
        assert.equal((await exchange(bInfo.web_ui!.url, host)).status, 403, "VM B's token on VM A's host");
        assert.equal((await call(`${b.vmid}-webui.localhost:${port}`, '/', { headers: { cookie: jar } })).status, 401);
        assert.equal((await exchange(info.ports[0]!.url!, `${a.vmid}-9000.localhost:${port}`)).status, 403);
        const ro = await createApiKey(t, renter.token, 'read_only', 'ro');
        const roInfo = await accessInfo(a.id, ro);
        assert.deepEqual([roInfo.web_ui, roInfo.jupyter, roInfo.ports[0]?.url], [null, null, null]);

        // After a stop, then after a destroy, the cookie opens nothing.
        assert.equal((await api(t, renter.token).post('/vms/{vm_id}/stop', { params: { vm_id: a.id } })).status, 200);
        await advance(t, admin.token, 1);
        await new Promise((r) => setTimeout(r, 1100));
        assert.equal((await call(host, '/', { headers: { cookie: jar } })).status, 409);
        for (const v of [a, b]) await api(t, renter.token).delete('/vms/{vm_id}', { params: { vm_id: v.id } });
        await advance(t, admin.token, 1);
        await new Promise((r) => setTimeout(r, 1100));
        assert.equal((await call(host, '/', { headers: { cookie: jar } })).status, 404);
        await context.close();
        assert.deepEqual(qemuPidsUnder(join(dir, 'a')), []);
      });
    });
  }
});
