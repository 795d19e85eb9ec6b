/**
 * The serial console's capped log: whatever arrives on the console socket is
 * kept in console.log and console.log.1, each at most the cap, the newest
 * bytes always kept; the reader ends with the socket and never throws when
 * there is none. (A real guest flooding its serial port is in e2e.test.ts.)
 */
import { after, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, rmSync, statSync } from 'node:fs';
import net from 'node:net';
import { join } from 'node:path';
import { ConsoleLog } from '../../src/host-agent/qemu/console.js';
import { workDir } from './real-vms.js';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe('serial console log', () => {
  const dir = workDir('con');
  after(() => rmSync(dir, { recursive: true, force: true }));

  test('a flood keeps at most two files of the cap, ending with the newest bytes', async () => {
    const sock = join(dir, 'con.sock');
    const log = join(dir, 'console.log');
    let peer: net.Socket | undefined;
    const server = net.createServer((s) => (peer = s));
    await new Promise<void>((r) => server.listen(sock, r));
    const reader = new ConsoleLog(sock, log, 64 * 1024);
    assert.equal(await reader.open(), true);
    for (let i = 0; i < 50 && !peer; i++) await sleep(20);
    assert.ok(peer, 'connected');
    // 1 MiB in chunks of odd sizes, then a marker: sixteen times the cap.
    const chunk = Buffer.alloc(7777, 'A');
    let sent = 0;
    while (sent < 1024 * 1024) {
      if (!peer.write(chunk)) await new Promise((r) => peer!.once('drain', r));
      sent += chunk.length;
    }
    const marker = Buffer.from('\n--- the last line the guest wrote ---\n');
    peer.end(marker);
    const total = sent + marker.length;
    let seen = 0;
    for (let i = 0; i < 200; i++) {
      const now = [log, `${log}.1`].reduce((n, f) => n + (existsSync(f) ? statSync(f).size : 0), 0);
      if (now === seen && i > 5) break;
      seen = now;
      await sleep(25);
    }
    assert.ok(statSync(log).size <= 64 * 1024, `console.log is ${statSync(log).size} bytes`);
    assert.equal(statSync(`${log}.1`).size, 64 * 1024, 'the rotated file is a full cap');
    const kept = statSync(log).size + statSync(`${log}.1`).size;
    assert.ok(kept <= 128 * 1024 && kept < total, `${kept} bytes kept of ${total}`);
    assert.ok(ConsoleLog.tail(log, 200).toString().endsWith(marker.toString()), 'the newest bytes are kept');
    assert.equal(ConsoleLog.tail(log, 100_000_000).length, kept, 'tail reads both files, oldest first');
    reader.close();
    await new Promise<void>((r) => server.close(() => r()));
  });

  test('no socket: open answers false at once and nothing is written', async () => {
    const reader = new ConsoleLog(join(dir, 'missing.sock'), join(dir, 'none.log'));
    assert.equal(await reader.open(), false);
    assert.equal(existsSync(join(dir, 'none.log')), false);
    reader.close();
    assert.equal(ConsoleLog.tail(join(dir, 'none.log'), 10).length, 0);
  });
});
