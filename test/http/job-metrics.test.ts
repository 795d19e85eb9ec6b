/**
 * The background work's metrics: GET /metrics counts every pass of every job
 * and the hypervisor actions by outcome, failures included; a worker (no
 * API) serves the same on GPUCLOUD_METRICS_PORT.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describeEachDb } from '../helpers/app.js';
import { api } from '../helpers/api.js';
import { createNode, createUser, credit, uploadSshKey } from '../helpers/factories.js';
import { cleanEnv, startInstance } from '../reliability/instances-cluster.js';

/** The value of one series of the Prometheus text, 0 when absent. */
function sample(text: string, name: string, labels: Record<string, string>): number {
  for (const line of text.split('\n')) {
    const m = /^([a-z_]+)\{([^}]*)\} (\S+)$/.exec(line);
    if (!m || m[1] !== name) continue;
    const got = Object.fromEntries([...m[2]!.matchAll(/(\w+)="([^"]*)"/g)].map((x) => [x[1], x[2]]));
    if (Object.entries(labels).every(([k, v]) => got[k] === v)) return Number(m[3]);
  }
  return 0;
}

describeEachDb('background work metrics', (t) => {
  test('passes of each job and hypervisor actions are counted, failed ones apart', async () => {
    const admin = await createUser(t(), { admin: true });
    const { node } = await createNode(t(), admin.token, { gpu_count: 2 });
    const u = await createUser(t());
    await credit(t(), admin.token, u.id, 100);
    await uploadSshKey(t(), u.token);
    const c = api(t(), u.token);
    const metrics = async () => {
      const r = await api(t()).get('/metrics');
      assert.equal(r.status, 200, r.text);
      return r.text;
    };
    const before = await metrics();
    assert.match(before, /^# TYPE gpucloud_job_passes_total counter$/m);
    assert.match(before, /^# TYPE gpucloud_hypervisor_actions_total counter$/m);
    assert.match(before, /^# TYPE gpucloud_http_requests_total counter$/m, 'the HTTP metrics are still there');

    const create = () =>
      c.post('/vms', {
        body: { node, gpu_type: '4090', gpu_count: 1, storage_gb: 50, template_vmid: 100 },
      });
    const ok = await create();
    assert.equal(ok.status, 201, ok.text);
    await t().services.clock.advance(1);
    // A provision the hypervisor refuses.
    const fault = await api(t(), admin.token).post('/admin/simulator/faults', {
      body: { node, action: 'provision' },
    });
    assert.equal(fault.status, 200, fault.text);
    const bad = await create();
    assert.equal(bad.status, 201, bad.text);
    await t().services.clock.advance(1);
    const failed = await c.get('/vms/{vm_id}', { params: { vm_id: bad.body.id } });
    assert.equal(failed.status, 200, failed.text);
    assert.equal(failed.body.status, 'failed');

    const after = await metrics();
    const grew = (name: string, labels: Record<string, string>) =>
      sample(after, name, labels) - sample(before, name, labels);
    assert.equal(grew('gpucloud_hypervisor_actions_total', { action: 'provision', outcome: 'ok' }), 1);
    assert.equal(grew('gpucloud_hypervisor_actions_total', { action: 'provision', outcome: 'failed' }), 1);
    assert.ok(grew('gpucloud_hypervisor_actions_total', { action: 'start', outcome: 'ok' }) >= 1);
    for (const job of ['billing-intervals', 'low-balance', 'reservation-ends', 'housekeeping']) {
      assert.ok(
        grew('gpucloud_job_passes_total', { job, outcome: 'ok' }) >= 2,
        `${job} counted once per advance at least`,
      );
      assert.equal(grew('gpucloud_job_passes_total', { job, outcome: 'failed' }), 0, job);
    }
    assert.ok(sample(after, 'gpucloud_job_pass_seconds_count', { job: 'billing-intervals' }) >= 2);
  });
});

describe('a worker serves its metrics on GPUCLOUD_METRICS_PORT', () => {
  test('loopback reads /metrics and /healthz; the banner says where', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'gpucloud-worker-metrics-'));
    const env = cleanEnv({
      GPUCLOUD_DATA_DIR: dir,
      GPUCLOUD_DEMO: '0',
      GPUCLOUD_METRICS_PORT: '0',
      HOST: '127.0.0.1',
      LOG_LEVEL: 'warn',
    });
    const worker = await startInstance('worker', 'worker', env);
    try {
      const url = /Metrics:\s+(http:\/\/\S+)/.exec(worker.output())?.[1];
      assert.ok(url, worker.output());
      assert.doesNotMatch(worker.output(), /API:/, 'a worker serves no API');
      let text = '';
      // Loops pass every second: wait for the first passes to be counted.
      for (let i = 0; i < 50 && !/gpucloud_job_passes_total\{job="housekeeping"/.test(text); i++) {
        await new Promise((r) => setTimeout(r, 200));
        const r: Response = await fetch(url);
        assert.equal(r.status, 200);
        text = await r.text();
      }
      assert.match(text, /gpucloud_job_passes_total\{job="hypervisor-actions",outcome="ok"\} \d+/);
      assert.match(text, /^gpucloud_process_cpu_user_seconds_total /m, 'the process metrics too');
      const health = await fetch(url.replace(/\/metrics$/, '/healthz'));
      assert.equal(health.status, 200);
      const api = await fetch(url.replace(/\/metrics$/, '/vms'));
      assert.equal(api.status, 404, 'nothing else is served there');
    } finally {
      await worker.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
