/**
 * The portal case: what the access portal costs next to reaching the same
 * HTTP server directly. The service (`npm start` of --repo) runs a template-102
 * VM on a node whose host agent is a stand-in in a process of its own
 * (bench/portal-host.ts), its tunnel leading to a stand-in guest app on this
 * machine, so that what is measured is the portal and the tunnel, not a guest
 * under TCG. Figures:
 *
 *   - GET / at 50 connections through the portal, and straight to the app:
 *     requests per second (target: at least half of direct) and the p50 the
 *     portal adds (target: under 2 ms);
 *   - a 100 MB download through the portal and straight (target: at least
 *     half of direct throughput);
 *   - 1,000 idle WebSockets held through the portal: the service's RSS growth
 *     (target: under 50 MB).
 */
import { spawn } from 'node:child_process';
import http from 'node:http';
import { readFileSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { must } from '../scripts/soak/client.js';
import { withScope } from './cleanup.js';
import { measure } from './load.js';
import type { BenchOptions, BenchResult } from './types.js';
import { benchAdmin, freshDatabase, startService } from './service.js';
import { login } from './setup.js';
import { wsConnect, wsEcho } from '../test/helpers/guest-app.js';
import type { Socket } from 'node:net';

const HOST_SCRIPT = fileURLToPath(new URL('./portal-host.ts', import.meta.url));
const TIMEOUT_MS = 30_000;
const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));
const rssMb = (pid: number) =>
  Number(/VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1] ?? 0) / 1024;

/** Seconds to read a whole answer of `path` from 127.0.0.1:`port` with these headers; checks its length. */
function download(port: number, path: string, headers: Record<string, string>, bytes: number): Promise<number> {
  const t0 = process.hrtime.bigint();
  return new Promise((resolve, reject) => {
    http
      .get({ host: '127.0.0.1', port, path, headers, agent: false }, (res) => {
        let got = 0;
        res.on('data', (c: Buffer) => (got += c.length));
        res.on('end', () => {
          if (got !== bytes)
            return reject(new Error(`${path}: ${got} bytes, expected ${bytes} (status ${res.statusCode})`));
          resolve(Number(process.hrtime.bigint() - t0) / 1e9);
        });
      })
      .on('error', reject);
  });
}

export async function portalBench(o: BenchOptions): Promise<BenchResult[]> {
  return withScope(async (scope) => {
    const host = spawn(process.execPath, ['--import', 'tsx', HOST_SCRIPT], { stdio: ['ignore', 'pipe', 'inherit'] });
    scope.defer(async () => {
      host.kill('SIGKILL');
    });
    const first = await new Promise<string>((resolve, reject) => {
      createInterface({ input: host.stdout! }).once('line', resolve);
      host.once('exit', (code) => reject(new Error(`bench/portal-host.ts exited ${code}`)));
    });
    const { agentUrl, token, guestPort } = JSON.parse(first) as { agentUrl: string; token: string; guestPort: number };

    const db = await freshDatabase(scope, o.db);
    const admin = benchAdmin();
    const svc = await startService(scope, o.repo, db, admin);
    const port = Number(new URL(svc.url).port);
    const adminToken = await login(svc.url, admin);
    const me = await must<{ id: number }>(svc.url, 'GET', '/account', { token: adminToken, timeoutMs: TIMEOUT_MS });
    await must(svc.url, 'POST', `/admin/users/${me.id}/credits`, {
      token: adminToken,
      body: { amount: 1000, description: 'bench credit' },
      timeoutMs: TIMEOUT_MS,
    });
    const node = 'bench-portal';
    await must(svc.url, 'POST', '/admin/nodes', {
      token: adminToken,
      timeoutMs: TIMEOUT_MS,
      body: {
        node,
        gpu_type: '4090',
        gpu_count: 8,
        ram_gb: 64,
        cpu_cores: 16,
        max_storage_gb: 1000,
        cpu_model: 'Bench EPYC',
        pcie_gen: '4.0',
        location: 'bench',
        cluster_name: 'bench',
        agent_url: agentUrl,
        agent_token: token,
      },
    });
    const vm = await must<{ id: string; vmid: number }>(svc.url, 'POST', '/vms', {
      token: adminToken,
      timeoutMs: TIMEOUT_MS,
      body: {
        node,
        gpu_type: '4090',
        gpu_count: 1,
        storage_gb: 50,
        template_vmid: 102,
        auth_method: 'password',
        password: 'a bench password 123',
      },
    });
    let info: { web_ui: { url: string } | null } | undefined;
    for (let i = 0; i < 300 && !info; i++) {
      const r = await must<{ status: string }>(svc.url, 'GET', `/vms/${vm.id}`, {
        token: adminToken,
        timeoutMs: TIMEOUT_MS,
      });
      if (r.status === 'running')
        info = await must(svc.url, 'GET', `/vms/${vm.id}/access-info`, { token: adminToken, timeoutMs: TIMEOUT_MS });
      else await sleep(100);
    }
    if (!info?.web_ui) throw new Error('the bench VM did not run');
    const portalHost = `${vm.vmid}-webui.localhost:${port}`;
    const launch = new URL(info.web_ui.url);
    const cookie = await new Promise<string>((resolve, reject) => {
      const req = http.request(
        {
          host: '127.0.0.1',
          port,
          path: '/.gpucloud/session',
          method: 'POST',
          headers: { host: launch.host, 'content-type': 'application/json' },
        },
        (res) => {
          res.resume();
          const set = res.headers['set-cookie']?.[0];
          if (res.statusCode !== 204 || !set) return reject(new Error(`the launch answered ${res.statusCode}`));
          resolve(set.split(';')[0]!);
        },
      );
      req.on('error', reject);
      req.end(JSON.stringify({ launch_token: /#launch_token=(.+)$/.exec(info.web_ui!.url)![1] }));
    });
    console.log(`  setup: VM ${vm.vmid} on a stand-in agent; portal at ${portalHost}`);

    const results: BenchResult[] = [];
    const direct = await measure({ url: `http://127.0.0.1:${guestPort}/` }, o.durationS);
    const through = await measure(
      { url: `http://127.0.0.1:${port}/`, headers: { host: portalHost, cookie } },
      o.durationS,
    );
    results.push({
      kind: 'http',
      name: 'GET / through the portal',
      db: o.db,
      ...through,
      baseline: 'GET / straight to the app',
      baseline_rps: direct.rps,
      ratio: direct.rps ? Math.round((through.rps / direct.rps) * 100) / 100 : null,
    });
    const addedP50 = (through.p50_ms ?? 0) - (direct.p50_ms ?? 0);
    console.log(`  portal adds ${addedP50.toFixed(2)} ms at p50 (target < 2 ms)`);
    results.push({ kind: 'metering', name: 'portal: p50 added, ms (target < 2)', db: o.db, seconds: addedP50 });

    const bytes = 100 * 1024 * 1024;
    const directS = await download(guestPort, '/download?mb=100', {}, bytes);
    const portalS = await download(port, '/download?mb=100', { host: portalHost, cookie }, bytes);
    console.log(
      `  100 MB: ${(100 / directS).toFixed(0)} MB/s straight, ${(100 / portalS).toFixed(0)} MB/s through the portal (ratio ${(directS / portalS).toFixed(2)}, target >= 0.5)`,
    );
    results.push({ kind: 'metering', name: 'portal: 100 MB download, s', db: o.db, seconds: portalS });
    results.push({ kind: 'metering', name: 'direct: 100 MB download, s', db: o.db, seconds: directS });

    const before = rssMb(svc.pid);
    const sockets: Socket[] = [];
    for (let i = 0; i < 1000; i++) {
      const ws = await wsConnect(port, '/ws', { host: portalHost, cookie });
      if (ws.status !== 101) throw new Error(`WebSocket ${i}: ${ws.head}`);
      sockets.push(ws.socket);
    }
    const echo = await wsEcho(sockets[999]!, 'still there');
    await sleep(2000);
    const after = rssMb(svc.pid);
    console.log(
      `  1,000 idle WebSockets: RSS ${before.toFixed(0)} -> ${after.toFixed(0)} MB (+${(after - before).toFixed(1)}, target < 50); echo "${echo}"`,
    );
    results.push({
      kind: 'metering',
      name: 'portal: RSS growth, 1,000 WebSockets, MB',
      db: o.db,
      seconds: after - before,
    });
    for (const s of sockets) s.destroy();
    return results;
  });
}
