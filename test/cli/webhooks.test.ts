/**
 * `gpucloud webhooks ...` run as a child process against a real server with
 * its delivery loop running, and a receiver on loopback: create (the secret
 * shown once), list, show, update, test (waiting for the attempt's outcome,
 * exit 1 when the endpoint fails), deliveries, rotate-secret, rm, and the
 * usage errors.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { buildTestApp, type TestApp } from '../helpers/app.js';
import { createApiKey, createUser } from '../helpers/factories.js';
import { startReceiver, type Receiver } from '../helpers/receiver.js';
import { gpucloudMain } from '../helpers/entry.js';

describe('gpucloud webhooks', () => {
  let t: TestApp;
  let rec: Receiver;
  let env: NodeJS.ProcessEnv;
  let home: string;

  before(async () => {
    t = await buildTestApp('pglite', { env: { GPUCLOUD_WEBHOOK_ALLOW_PRIVATE: '1', GPUCLOUD_WEBHOOK_TIMEOUT_S: '2' } });
    await t.app.listen({ port: 0, host: '127.0.0.1' });
    const addr = t.app.server.address();
    assert.ok(addr && typeof addr === 'object');
    t.services.scheduler.start(100, { serviceTime: false }); // the manual clock's loops: deliveries, heartbeats
    rec = await startReceiver();
    const u = await createUser(t);
    home = mkdtempSync(join(tmpdir(), 'gpucloud-cli-webhooks-'));
    env = {
      ...process.env,
      XDG_CONFIG_HOME: home,
      GPUCLOUD_API_URL: `http://127.0.0.1:${addr.port}`,
      GPUCLOUD_API_KEY: await createApiKey(t, u.token, 'read_write'),
    };
  });
  after(async () => {
    await t?.services.scheduler.stop();
    await t?.close();
    await rec?.close();
    rmSync(home, { recursive: true, force: true });
  });

  function cli(args: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
    const child = spawn(process.execPath, [gpucloudMain(), ...args], {
      env,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => (stderr += d));
    const timer = setTimeout(() => child.kill('SIGKILL'), 90_000);
    return new Promise((resolve) =>
      child.on('close', (code) => {
        clearTimeout(timer);
        resolve({ code, stdout, stderr });
      }),
    );
  }

  test('create, list, show, test, deliveries, update, rotate-secret, rm', async () => {
    const created = await cli([
      'webhooks',
      'create',
      `${rec.url}/cli`,
      '--events',
      'vm.interrupted,billing.low_balance',
      '--events',
      'api_key.created',
      '--description',
      'from the CLI',
    ]);
    assert.equal(created.code, 0, created.stderr);
    const secret = /\n {2}(whsec_\S+)\n/.exec(created.stdout)?.[1];
    assert.ok(secret, created.stdout);
    const id = /Added webhook (\S+) ->/.exec(created.stdout)![1]!;
    assert.match(created.stdout, /vm\.interrupted,billing\.low_balance,api_key\.created/);

    const list = await cli(['webhooks', 'list']);
    assert.equal(list.code, 0, list.stderr);
    assert.match(
      list.stdout,
      new RegExp(
        `${id}\\s+${rec.url}/cli\\s+vm\\.interrupted,billing\\.low_balance,api_key\\.created\\s+on\\s+from the CLI`,
      ),
    );
    assert.ok(!list.stdout.includes(secret), 'never the secret again');

    rec.answer = () => 200;
    const tested = await cli(['webhooks', 'test', id]);
    assert.equal(tested.code, 0, tested.stderr);
    assert.match(tested.stdout, /^Test event \S+: succeeded \(HTTP 200, \d+ ms\)\n$/);
    assert.equal(rec.verify(rec.received.at(-1)!, secret).type, 'webhook.test');

    rec.answer = () => 500;
    const failing = await cli(['webhooks', 'test', id, '--json']);
    assert.equal(failing.code, 1);
    const attempt = JSON.parse(failing.stdout.slice(0, failing.stdout.lastIndexOf('}') + 1));
    assert.deepEqual([attempt.status_code, attempt.outcome], [500, 'retrying']);
    assert.match(failing.stderr, /did not answer 2xx/);

    const deliveries = await cli(['webhooks', 'deliveries', id]);
    assert.equal(deliveries.code, 0, deliveries.stderr);
    assert.match(deliveries.stdout, /webhook\.test\s+1\s+500\s+\d+\s+retrying at /);
    assert.match(deliveries.stdout, /webhook\.test\s+1\s+200\s+\d+\s+succeeded/);

    const updated = await cli(['webhooks', 'update', id, '--events', 'all', '--disable']);
    assert.equal(updated.code, 0, updated.stderr);
    assert.match(updated.stdout, /Events:\s+all/);
    assert.match(updated.stdout, /State:\s+off/);
    const shown = JSON.parse((await cli(['webhooks', 'show', id, '--json'])).stdout);
    assert.deepEqual([shown.event_types, shown.enabled], [null, false]);

    const rotated = await cli(['webhooks', 'rotate-secret', id]);
    assert.equal(rotated.code, 0, rotated.stderr);
    assert.match(rotated.stdout, /whsec_/);
    assert.ok(!rotated.stdout.includes(secret));

    assert.equal((await cli(['webhooks', 'rm', id])).code, 0);
    const gone = await cli(['webhooks', 'show', id]);
    assert.equal(gone.code, 1);
    assert.match(gone.stderr, /Webhook not found/);
  });

  test("usage errors exit 2; refusals exit 1 with the server's detail", async () => {
    const noUrl = await cli(['webhooks', 'create']);
    assert.equal(noUrl.code, 2);
    const both = await cli(['webhooks', 'update', '00000000-0000-4000-8000-000000000000', '--enable', '--disable']);
    assert.equal(both.code, 2);
    const nothing = await cli(['webhooks', 'update', '00000000-0000-4000-8000-000000000000']);
    assert.equal(nothing.code, 2);
    assert.match(nothing.stderr, /nothing to change/);
    const mixed = await cli(['webhooks', 'create', `${rec.url}/x`, '--events', 'all,vm.created']);
    assert.equal(mixed.code, 2);
    const bad = await cli(['webhooks', 'create', 'ftp://example.com/x']);
    assert.equal(bad.code, 1);
    assert.match(bad.stderr, /must use http or https/);
  });
});
