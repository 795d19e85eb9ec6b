/**
 * Slow clients cannot hold connections: a whole request must arrive within
 * GPUCLOUD_REQUEST_TIMEOUT_S (here 2 s), headers within a third of it, on a
 * real listening socket. A normal request is unaffected.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { connect } from 'node:net';
import type { AddressInfo } from 'node:net';
import { buildTestApp, type TestApp } from '../helpers/app.js';

/** Sends `head`, then `drip` one byte every `everyMs`; resolves with what came back and when the server closed. */
function slowClient(
  port: number,
  head: string,
  drip: string,
  everyMs: number,
): Promise<{ seconds: number; reply: string }> {
  return new Promise((resolve) => {
    const started = Date.now();
    const s = connect(port, '127.0.0.1');
    let reply = '';
    let timer: NodeJS.Timeout | undefined;
    s.on('data', (d) => (reply += d));
    s.on('connect', () => {
      s.write(head);
      let i = 0;
      timer = setInterval(() => {
        if (i < drip.length && !s.destroyed) s.write(drip[i++]!);
      }, everyMs);
    });
    const done = () => {
      clearInterval(timer);
      resolve({ seconds: (Date.now() - started) / 1000, reply });
    };
    s.on('close', done);
    s.on('error', () => undefined);
    // Never wait forever: the test fails on the time, not by hanging.
    setTimeout(() => s.destroy(), 20_000).unref();
  });
}

describe('request timeouts', () => {
  let t: TestApp;
  let port: number;
  before(async () => {
    t = await buildTestApp('pglite', { env: { GPUCLOUD_REQUEST_TIMEOUT_S: '2' } });
    await t.app.listen({ port: 0, host: '127.0.0.1' });
    port = (t.app.server.address() as AddressInfo).port;
  });
  after(async () => {
    await t?.close();
  });

  test('a body sent a byte at a time is cut off after the request timeout', async () => {
    const body = JSON.stringify({ email: 'slow@example.com', password: 'a-long-password-1' });
    const head = `POST /auth/login HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n`;
    const r = await slowClient(port, head, body, 300);
    assert.ok(r.seconds < 5, `closed after ${r.seconds} s`);
    assert.match(r.reply, /^HTTP\/1\.1 408/);
    assert.equal(
      JSON.parse(r.reply.slice(r.reply.indexOf('\r\n\r\n') + 4)).code,
      'validation_error',
      'in the error shape',
    );
  });

  test('headers sent a byte at a time are cut off sooner', async () => {
    const r = await slowClient(port, 'GET /healthz HTTP/1.1\r\n', 'X-Slow: ' + 'a'.repeat(100), 200);
    assert.ok(r.seconds < 4, `closed after ${r.seconds} s`);
  });

  test('requests Node refuses itself (headers too large, not HTTP) are answered in the error shape and closed', async () => {
    const big = await slowClient(
      port,
      `GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(20_000)}\r\n\r\n`,
      '',
      1000,
    );
    assert.match(big.reply, /^HTTP\/1\.1 431 /);
    assert.match(big.reply, /\r\nConnection: close\r\n/i);
    assert.match(big.reply, /\r\nX-Request-Id: \S+\r\n/i);
    const body = JSON.parse(big.reply.slice(big.reply.indexOf('\r\n\r\n') + 4));
    assert.equal(typeof body.detail, 'string');
    assert.equal(body.code, 'validation_error');
    const junk = await slowClient(port, 'THIS IS NOT HTTP\r\n\r\n', '', 1000);
    assert.match(junk.reply, /^HTTP\/1\.1 400 /);
    assert.equal(JSON.parse(junk.reply.slice(junk.reply.indexOf('\r\n\r\n') + 4)).code, 'validation_error');
  });

  test('a normal request is unaffected', async () => {
    const res = await fetch(`http://127.0.0.1:${port}/healthz`);
    assert.equal(res.status, 200);
  });
});
