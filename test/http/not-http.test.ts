/**
 * Requests the HTTP parser refuses before any route is chosen (a raw byte
 * outside ASCII in the path, a body that cannot be framed, a request line that
 * is not HTTP), sent as raw bytes to a real listening server: 400 in the error
 * shape with the code `validation_error` (never `malformed_json`: no body was
 * parsed), a detail that says what was wrong, the usual headers, and the
 * connection closed.
 */
import { before, test } from 'node:test';
import assert from 'node:assert/strict';
import { connect, type AddressInfo } from 'node:net';
import { describeEachDb } from '../helpers/app.js';
import { ERROR_CODES } from '../helpers/expected.js';

/** Writes `bytes` on a new connection and resolves with everything the server sent before it closed. */
function exchange(port: number, bytes: Buffer | string): Promise<string> {
  return new Promise((resolve, reject) => {
    const s = connect(port, '127.0.0.1');
    const chunks: Buffer[] = [];
    s.on('data', (d: Buffer) => chunks.push(d));
    s.on('connect', () => s.write(bytes));
    s.on('close', () => resolve(Buffer.concat(chunks).toString('latin1')));
    s.on('error', reject);
    // The server closes the connection itself; never wait for ever.
    setTimeout(() => s.destroy(new Error('the server did not close the connection')), 10_000).unref();
  });
}

interface RawAnswer {
  status: number;
  headers: Map<string, string>;
  body: { detail?: unknown; code?: unknown };
}

function parse(reply: string): RawAnswer {
  const end = reply.indexOf('\r\n\r\n');
  assert.ok(end > 0, `no header block in ${JSON.stringify(reply)}`);
  const [statusLine, ...lines] = reply.slice(0, end).split('\r\n');
  const m = /^HTTP\/1\.1 (\d{3}) /.exec(statusLine!);
  assert.ok(m, `status line ${statusLine}`);
  const headers = new Map(
    lines.map((l) => [l.slice(0, l.indexOf(':')).toLowerCase(), l.slice(l.indexOf(':') + 1).trim()] as const),
  );
  return { status: Number(m[1]), headers, body: JSON.parse(reply.slice(end + 4)) as RawAnswer['body'] };
}

const CASES: Array<{ name: string; bytes: Buffer | string; detail: RegExp }> = [
  {
    name: 'a raw byte outside ASCII in the path',
    bytes: Buffer.concat([
      Buffer.from('GET /vms/caf'),
      Buffer.from([0xc3, 0xa9]),
      Buffer.from(' HTTP/1.1\r\nHost: x\r\n\r\n'),
    ]),
    detail: /request target has a character that is not allowed/,
  },
  {
    name: 'Content-Length together with Transfer-Encoding',
    bytes:
      'POST /auth/login HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 5\r\n' +
      'Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n',
    detail: /body cannot be framed/,
  },
  {
    name: 'Content-Length twice',
    bytes: 'POST /auth/login HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}',
    detail: /body cannot be framed/,
  },
  {
    name: 'a Content-Length that is not a number',
    bytes: 'POST /auth/login HTTP/1.1\r\nHost: x\r\nContent-Length: two\r\n\r\n{}',
    detail: /body cannot be framed/,
  },
  {
    name: 'a chunk size that is not hexadecimal',
    bytes: 'POST /auth/login HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n',
    detail: /body cannot be framed/,
  },
  {
    name: 'a request line that is not HTTP',
    bytes: 'THIS IS NOT HTTP\r\n\r\n',
    detail: /not valid HTTP/,
  },
];

describeEachDb('requests the HTTP parser refuses', (t) => {
  let port: number;
  before(async () => {
    await t().app.listen({ port: 0, host: '127.0.0.1' });
    port = (t().app.server.address() as AddressInfo).port;
  });

  for (const c of CASES) {
    test(`${c.name}: 400 validation_error, in the error shape, and the connection closed`, async () => {
      const r = parse(await exchange(port, c.bytes));
      assert.equal(r.status, 400, c.name);
      assert.equal(r.body.code, 'validation_error', `${c.name}: ${JSON.stringify(r.body)}`);
      assert.ok(ERROR_CODES.has(r.body.code), 'a code of the closed list');
      assert.equal(typeof r.body.detail, 'string');
      assert.match(String(r.body.detail), /^The request is not valid HTTP/);
      assert.match(String(r.body.detail), c.detail, c.name);
      const id = r.headers.get('x-request-id');
      assert.ok(id, 'X-Request-Id');
      assert.match(String(r.body.detail), new RegExp(`\\(request id ${id}\\)$`), 'the detail names the request id');
      assert.equal(r.headers.get('api-version'), '1.0.0');
      assert.equal(r.headers.get('connection'), 'close');
      assert.equal(r.headers.get('x-content-type-options'), 'nosniff');
      assert.match(String(r.headers.get('content-type')), /^application\/json/);
    });
  }

  test('the same bytes percent-encoded are an ordinary request', async () => {
    const reply = await exchange(port, 'GET /nowhere/caf%C3%A9 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n');
    const r = parse(reply);
    assert.equal(r.status, 404);
    assert.equal(r.body.code, 'not_found');
  });
});
