/**
 * `gpucloud serve --role portal`: the access portal on its own process, next
 * to an instance that serves the API and runs the jobs, on one PostgreSQL
 * database (the deployment of docs/portal.md#running-it). A link from the
 * API's access-info signs in on the portal instance; it answers /healthz for
 * a load balancer and nothing for names that are not a VM service.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { randomBytes } from 'node:crypto';
import { freePort } from '../helpers/ports.js';
import {
  cleanEnv,
  createDatabase,
  sleep,
  sshPublicKey,
  startInstance,
  type FreshDatabase,
  type Instance,
} from '../reliability/instances-cluster.js';

const SERVER = process.env.DATABASE_URL;

function call(
  port: number,
  host: string,
  path: string,
  opts: { method?: string; headers?: Record<string, string>; body?: string } = {},
) {
  return new Promise<{ status: number; text: string; headers: http.IncomingHttpHeaders }>((resolve, reject) => {
    const req = http.request(
      { host: '127.0.0.1', port, path, method: opts.method ?? 'GET', headers: { host, ...opts.headers }, agent: false },
      (res) => {
        let text = '';
        res.on('data', (d) => (text += d));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, text, headers: res.headers }));
      },
    );
    req.on('error', reject);
    req.end(opts.body);
  });
}

describe('serve --role portal', { skip: SERVER ? false : 'needs DATABASE_URL (PostgreSQL)' }, () => {
  let db: FreshDatabase;
  let api: Instance;
  let portal: Instance;
  let portalPort: number;
  const admin = { email: 'portal-admin@example.com', password: `pw-${randomBytes(8).toString('hex')}` };

  before(async () => {
    db = await createDatabase(SERVER!);
    portalPort = await freePort();
    const common = {
      DATABASE_URL: db.url,
      GPUCLOUD_JWT_SECRET: randomBytes(24).toString('hex'),
      GPUCLOUD_PORTAL_URL: `http://localhost:${portalPort}`,
      GPUCLOUD_SIM_PROVISION_MS: '0',
      GPUCLOUD_ADMIN_EMAIL: admin.email,
      GPUCLOUD_ADMIN_PASSWORD: admin.password,
      LOG_LEVEL: 'warn',
    };
    api = await startInstance('all', 'all', cleanEnv({ ...common, PORT: '0' }));
    portal = await startInstance('portal', 'portal', cleanEnv({ ...common, PORT: String(portalPort) }));
  });
  after(async () => {
    await portal?.stop();
    await api?.stop();
    await db?.drop();
  });

  test('a link of the API signs in on the portal instance, which shows the simulated VM', async () => {
    assert.match(portal.output(), new RegExp(`Access portal: .* http://localhost:${portalPort}`));
    const health = await call(portalPort, `127.0.0.1:${portalPort}`, '/healthz');
    assert.equal(health.status, 200);
    const other = await call(portalPort, `example.com`, '/');
    assert.equal(other.status, 404);
    assert.equal(JSON.parse(other.text).code, 'not_found');

    const j = async (method: string, path: string, token?: string, body?: unknown) => {
      const r = await fetch(`${api.url}${path}`, {
        method,
        headers: {
          ...(token ? { authorization: `Bearer ${token}` } : {}),
          ...(body ? { 'content-type': 'application/json' } : {}),
        },
        body: body ? JSON.stringify(body) : undefined,
      });
      const text = await r.text();
      assert.ok(r.status < 300, `${method} ${path}: ${r.status} ${text}`);
      return text ? JSON.parse(text) : undefined;
    };
    const adminToken = (await j('POST', '/auth/login', undefined, admin)).access_token as string;
    const me = await j('GET', '/account', adminToken);
    await j('POST', `/admin/users/${me.id}/credits`, adminToken, { amount: 100, description: 'test' });
    await j('POST', '/ssh-keys', adminToken, { ssh_public_key: sshPublicKey('portal-role') });
    const node = await j('POST', '/admin/nodes', adminToken, {
      node: 'sim-portal',
      gpu_type: '4090',
      gpu_count: 1,
      ram_gb: 8,
      cpu_cores: 4,
      cpu_model: 'x',
      pcie_gen: '4.0',
      max_storage_gb: 500,
      location: 'here',
      cluster_name: 'c',
    });
    const vm = await j('POST', '/vms', adminToken, {
      node: node.node,
      gpu_type: '4090',
      gpu_count: 1,
      storage_gb: 50,
      template_vmid: 102,
    });
    for (let i = 0; i < 100 && (await j('GET', `/vms/${vm.id}`, adminToken)).status !== 'running'; i++)
      await sleep(100);
    const info = await j('GET', `/vms/${vm.id}/access-info`, adminToken);
    const url = new URL(info.web_ui.url);
    assert.equal(url.host, `${vm.vmid}-webui.localhost:${portalPort}`);
    const token = /#launch_token=(.+)$/.exec(info.web_ui.url)![1]!;
    const ex = await call(portalPort, url.host, '/.gpucloud/session', {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ launch_token: token }),
    });
    assert.equal(ex.status, 204, ex.text);
    const cookie = ex.headers['set-cookie']![0]!.split(';')[0]!;
    const page = await call(portalPort, url.host, '/', { headers: { cookie, accept: 'text/html' } });
    assert.equal(page.status, 200);
    assert.match(page.text, /simulated/);
    // The API's own instance serves the same names too: the token is used up there as well.
    const again = await call(Number(new URL(api.url!).port), url.host, '/.gpucloud/session', {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ launch_token: token }),
    });
    assert.equal(again.status, 401);
  });
});
