/**
 * Stopping an instance (docs/operations.md#stopping-and-restarting): on
 * SIGTERM it stops listening, answers 503 on connections already open (a load
 * balancer drains it), and exits within GPUCLOUD_SHUTDOWN_TIMEOUT_S whatever
 * clients do, even one that never finishes sending its request.
 */
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { cleanEnv, startInstance } from './instances-cluster.js';

const dirs: string[] = [];
after(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

test('SIGTERM: 503 on open connections at once, and an exit within the timeout despite a request that never ends', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'gpucloud-stop-'));
  dirs.push(dir);
  const i = await startInstance(
    'stop',
    'all',
    cleanEnv({
      GPUCLOUD_DATA_DIR: dir,
      PORT: '0',
      GPUCLOUD_DEMO: '0',
      LOG_LEVEL: 'warn',
      GPUCLOUD_SHUTDOWN_TIMEOUT_S: '2',
      GPUCLOUD_REQUEST_TIMEOUT_S: '120',
    }),
  );
  const { port } = new URL(i.url!);
  const connect = () =>
    new Promise<net.Socket>((resolve, reject) => {
      const s = net.connect(Number(port), '127.0.0.1', () => resolve(s));
      s.once('error', reject);
    });
  // A request whose body never comes, and an idle keep-alive connection that asks later.
  const stalled = await connect();
  stalled.on('error', () => undefined);
  stalled.write(
    'POST /auth/login HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"email":',
  );
  const keepAlive = await connect();
  let answer = '';
  keepAlive.on('data', (d) => (answer += d));
  keepAlive.on('error', () => undefined);
  keepAlive.write('GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n');
  for (let n = 0; n < 50 && !answer.includes('\r\n\r\n'); n++) await new Promise((r) => setTimeout(r, 20));
  assert.match(answer, /^HTTP\/1\.1 200/);
  answer = '';

  const t0 = Date.now();
  const stopped = i.stop(20_000);
  await new Promise((r) => setTimeout(r, 300));
  keepAlive.write('GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n');
  const exit = await stopped;
  const seconds = (Date.now() - t0) / 1000;
  assert.equal(exit.killed, false, `it exited by itself (${seconds} s)`);
  assert.equal(exit.code, 0, i.output());
  assert.ok(seconds < 10, `exited after ${seconds} s (timeout 2 s)`);
  assert.ok(answer === '' || /^HTTP\/1\.1 503/.test(answer), `an open connection asking after SIGTERM: ${answer}`);
  // Nothing listens any more.
  await assert.rejects(connect());
});
