/**
 * The QMP client: against a scripted fake server (framing, ids, events,
 * errors, timeouts, closes) and against a real, paused QEMU (one client at a
 * time, re-attaching, a killed QEMU, quit).
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { QmpClient, QmpConnectionError, QmpError, type QmpEvent } from '../../src/host-agent/qemu/qmp.js';
import { isAlive, launchQemu, readPid } from '../../src/host-agent/qemu/process.js';
import { qemu } from './qemu-helpers.js';

const GREETING = '{"QMP": {"version": {"qemu": {"micro": 0, "minor": 2, "major": 7}}, "capabilities": ["oob"]}}\r\n';

async function waitFor(cond: () => boolean, ms: number, what: string): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

type Handler = (
  cmd: { execute: string; id?: unknown; arguments?: unknown },
  send: (s: string) => void,
  sock: net.Socket,
) => void;

/** A fake QMP server: greets (unless told not to) and passes each command to `handler`. */
async function fakeServer(
  dir: string,
  handler: Handler,
  opts: { greet?: boolean } = {},
): Promise<{ path: string; server: net.Server; seen: unknown[] }> {
  const path = join(dir, `fake-${Math.random().toString(36).slice(2)}.sock`);
  const seen: unknown[] = [];
  const server = net.createServer((sock) => {
    const send = (s: string): void => void sock.write(s);
    if (opts.greet !== false) send(GREETING);
    let buf = '';
    sock.setEncoding('utf8');
    sock.on('error', () => {});
    sock.on('data', (d: string) => {
      buf += d;
      let nl: number;
      while ((nl = buf.indexOf('\n')) >= 0) {
        const cmd = JSON.parse(buf.slice(0, nl));
        buf = buf.slice(nl + 1);
        seen.push(cmd);
        if (cmd.execute === 'qmp_capabilities') send(JSON.stringify({ return: {}, id: cmd.id }) + '\r\n');
        else handler(cmd, send, sock);
      }
    });
  });
  await new Promise<void>((r) => server.listen(path, r));
  return { path, server, seen };
}

describe('QmpClient against a fake server', () => {
  let dir: string;
  const servers: net.Server[] = [];
  before(() => {
    dir = mkdtempSync(join(tmpdir(), 'gc-qmpf-'));
  });
  after(() => {
    for (const s of servers) s.close();
    rmSync(dir, { recursive: true, force: true });
  });
  const serve = async (h: Handler, opts?: { greet?: boolean }) => {
    const s = await fakeServer(dir, h, opts);
    servers.push(s.server);
    return s;
  };

  test('handshake, ids, arguments, events between command and reply, split chunks', async () => {
    let chain = Promise.resolve();
    const { path, seen } = await serve((cmd, send) => {
      const reply = JSON.stringify({ return: { echo: cmd.arguments ?? null }, id: cmd.id });
      chain = chain.then(async () => {
        send('{"timestamp": {"seconds": 1, "microseconds": 2}, "event": "STOP"}\n' + reply.slice(0, 7));
        await new Promise((r) => setTimeout(r, 10));
        send(reply.slice(7) + '\r\n');
      });
    });
    const c = await QmpClient.connect(path);
    const events: QmpEvent[] = [];
    c.onEvent((ev) => events.push(ev));
    const [a, b] = await Promise.all([c.execute('query-status'), c.execute('device_del', { id: 'gpu0' })]);
    assert.deepEqual(a, { echo: null });
    assert.deepEqual(b, { echo: { id: 'gpu0' } });
    assert.equal(events.length, 2);
    assert.deepEqual(events[0], { event: 'STOP', data: undefined, timestamp: { seconds: 1, microseconds: 2 } });
    const ids = seen.map((m) => (m as { id: unknown }).id);
    assert.equal(new Set(ids).size, ids.length, 'every command has its own id');
    assert.deepEqual((seen[0] as { execute: string }).execute, 'qmp_capabilities');
    assert.equal(c.closed, false);
    c.close();
    assert.equal(c.closed, true);
  });

  test('an error reply rejects with QmpError carrying the class', async () => {
    const { path } = await serve((cmd, send) => {
      send(
        JSON.stringify({
          error: { class: 'CommandNotFound', desc: `The command ${cmd.execute} has not been found` },
          id: cmd.id,
        }) + '\n',
      );
    });
    const c = await QmpClient.connect(path);
    await assert.rejects(c.execute('nope'), (err: unknown) => {
      assert.ok(err instanceof QmpError);
      assert.equal(err.qmpClass, 'CommandNotFound');
      assert.match(err.message, /nope/);
      return true;
    });
    c.close();
  });

  test('a command times out, its late reply is ignored, the connection stays usable', async () => {
    let first = true;
    const { path } = await serve((cmd, send) => {
      const reply = JSON.stringify({ return: cmd.execute, id: cmd.id }) + '\n';
      if (first) {
        first = false;
        setTimeout(() => send(reply), 150);
      } else send(reply);
    });
    const c = await QmpClient.connect(path);
    await assert.rejects(
      c.execute('slow', undefined, { timeoutMs: 50 }),
      (err: unknown) => err instanceof QmpConnectionError && err.reason === 'timeout',
    );
    await new Promise((r) => setTimeout(r, 200));
    assert.equal(await c.execute('fast'), 'fast');
    c.close();
  });

  test('the peer closing rejects pending commands and fires onClose once; later commands reject', async () => {
    const { path } = await serve((_cmd, _send, sock) => setTimeout(() => sock.destroy(), 20));
    const c = await QmpClient.connect(path);
    let closes = 0;
    c.onClose(() => closes++);
    await assert.rejects(
      c.execute('query-status'),
      (err: unknown) => err instanceof QmpConnectionError && err.reason === 'closed',
    );
    assert.equal(c.closed, true);
    await assert.rejects(
      c.execute('query-status'),
      (err: unknown) => err instanceof QmpConnectionError && err.reason === 'closed',
    );
    c.close();
    let late = 0;
    c.onClose(() => late++);
    await new Promise((r) => setTimeout(r, 20));
    assert.equal(closes, 1);
    assert.equal(late, 1, 'a callback registered after the close still runs');
  });

  test('connect times out without a greeting, and fails at once on a missing socket', async () => {
    const { path } = await serve(() => {}, { greet: false });
    const t0 = Date.now();
    await assert.rejects(
      QmpClient.connect(path, { timeoutMs: 150 }),
      (err: unknown) => err instanceof QmpConnectionError && err.reason === 'timeout',
    );
    assert.ok(Date.now() - t0 < 1000);
    await assert.rejects(QmpClient.connect(join(dir, 'missing.sock')), /ENOENT/);
  });

  test('a line that is not a JSON object closes the connection', async () => {
    const { path } = await serve((_cmd, send) => send('this is not json\n'));
    const c = await QmpClient.connect(path);
    await assert.rejects(c.execute('query-status'), QmpConnectionError);
    assert.equal(c.closed, true);
  });
});

describe('QmpClient against a real QEMU', { skip: qemu.skip }, () => {
  let dir: string;
  const pids: number[] = [];
  before(() => {
    qemu.ensure();
    dir = mkdtempSync(join(tmpdir(), 'gc-qmp-'));
  });
  after(() => {
    for (const pid of pids) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        /* already gone */
      }
    }
    rmSync(dir, { recursive: true, force: true });
  });

  /** A paused VM without disks: nothing to boot, just QMP. */
  async function startPaused(name: string): Promise<{ sock: string; pid: number; qmpArg: string }> {
    const sock = join(dir, `${name}.sock`);
    const qmpArg = `unix:${sock},server=on,wait=off`;
    const pidFile = join(dir, `${name}.pid`);
    await launchQemu([
      '-machine',
      'q35',
      '-accel',
      'tcg',
      '-m',
      '64',
      '-nodefaults',
      '-display',
      'none',
      '-S',
      '-qmp',
      qmpArg,
      '-pidfile',
      pidFile,
      '-daemonize',
    ]);
    const pid = readPid(pidFile);
    assert.ok(pid, 'QEMU wrote its pid file');
    pids.push(pid);
    return { sock, pid, qmpArg };
  }

  test('query-status, unknown command, one client at a time, re-attach, quit', async () => {
    const { sock, pid, qmpArg } = await startPaused('a');
    assert.equal(isAlive(pid, qmpArg), true);

    const c1 = await QmpClient.connect(sock);
    assert.deepEqual(await c1.execute('query-status'), { status: 'prelaunch', singlestep: false, running: false });
    await assert.rejects(
      c1.execute('no-such-command'),
      (err: unknown) => err instanceof QmpError && err.qmpClass === 'CommandNotFound',
    );

    // QEMU greets a second client only after the first has gone.
    await assert.rejects(
      QmpClient.connect(sock, { timeoutMs: 300 }),
      (err: unknown) => err instanceof QmpConnectionError && err.reason === 'timeout',
    );
    c1.close();

    const c2 = await QmpClient.connect(sock);
    assert.equal(((await c2.execute('query-status')) as { status: string }).status, 'prelaunch');
    const events: QmpEvent[] = [];
    c2.onEvent((ev) => events.push(ev));
    let closed = false;
    c2.onClose(() => (closed = true));
    await c2.execute('quit');
    await waitFor(() => closed, 2000, 'the socket to close after quit');
    await waitFor(() => !isAlive(pid), 2000, 'QEMU to exit after quit');
    const shutdown = events.find((e) => e.event === 'SHUTDOWN');
    assert.ok(shutdown, 'a SHUTDOWN event before the socket closed');
    assert.deepEqual(shutdown.data, { guest: false, reason: 'host-qmp-quit' });
  });

  test('kill -9 closes the connection and the process is dead within 2 s', async () => {
    const { sock, pid, qmpArg } = await startPaused('b');
    const c = await QmpClient.connect(sock);
    let closed = false;
    c.onClose(() => (closed = true));
    assert.equal(((await c.execute('query-status')) as { status: string }).status, 'prelaunch');
    process.kill(pid, 'SIGKILL');
    const t0 = Date.now();
    await waitFor(() => closed && !isAlive(pid, qmpArg) && !isAlive(pid), 2000, 'onClose and a dead pid');
    assert.ok(Date.now() - t0 < 2000);
    await assert.rejects(c.execute('query-status'), QmpConnectionError);
  });
});
