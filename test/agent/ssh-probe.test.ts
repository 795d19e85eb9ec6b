/**
 * The SSH banner probe against loopback servers that speak SSH, stay silent,
 * speak something else or refuse; and picking a free forwarding port.
 */
import { after, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { freePortInRange, sshBanner } from '../../src/host-agent/network/ssh-probe.js';

const servers: net.Server[] = [];
after(() => {
  for (const s of servers) s.close();
});

async function serve(onConn: (s: net.Socket) => void): Promise<number> {
  const server = net.createServer((s) => {
    s.on('error', () => {});
    onConn(s);
  });
  servers.push(server);
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return (server.address() as net.AddressInfo).port;
}

async function unusedPort(): Promise<number> {
  const s = net.createServer();
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
  const port = (s.address() as net.AddressInfo).port;
  await new Promise((r) => s.close(r));
  return port;
}

describe('sshBanner', () => {
  test('returns the identification line of an SSH server', async () => {
    const port = await serve((s) => s.write('SSH-2.0-dropbear_2022.83\r\n'));
    assert.equal(await sshBanner('127.0.0.1', port, 1000), 'SSH-2.0-dropbear_2022.83');
  });

  test('accepts SSH-1.99, a banner in pieces, and lines before it', async () => {
    const p1 = await serve((s) => s.write('SSH-1.99-OpenSSH_3.9\r\n'));
    assert.equal(await sshBanner('127.0.0.1', p1, 1000), 'SSH-1.99-OpenSSH_3.9');
    const p2 = await serve((s) => {
      s.write('Welcome\r\nSSH-2.0-Open');
      setTimeout(() => s.write('SSH_9.2p1 Debian-2\r\n'), 30);
    });
    assert.equal(await sshBanner('127.0.0.1', p2, 1000), 'SSH-2.0-OpenSSH_9.2p1 Debian-2');
  });

  test('null for a silent peer, after the timeout', async () => {
    const port = await serve(() => {});
    const t0 = Date.now();
    assert.equal(await sshBanner('127.0.0.1', port, 200), null);
    const dt = Date.now() - t0;
    assert.ok(dt >= 190 && dt < 1500, `took ${dt} ms`);
  });

  test('null for a peer that accepts and closes (QEMU user networking before the guest listens)', async () => {
    const port = await serve((s) => s.end());
    assert.equal(await sshBanner('127.0.0.1', port, 1000), null);
  });

  test('null for other protocols, old SSH, endless garbage', async () => {
    const http = await serve((s) => s.write('HTTP/1.1 400 Bad Request\r\n\r\n'));
    assert.equal(await sshBanner('127.0.0.1', http, 500), null);
    const old = await serve((s) => s.write('SSH-1.5-ancient\r\n'));
    assert.equal(await sshBanner('127.0.0.1', old, 500), null);
    const noise = await serve((s) => s.write('x'.repeat(20_000)));
    const t0 = Date.now();
    assert.equal(await sshBanner('127.0.0.1', noise, 3000), null);
    assert.ok(Date.now() - t0 < 1000, 'gives up on a line that is too long without waiting');
  });

  test('never throws: refused port, bad host, bad arguments', async () => {
    assert.equal(await sshBanner('127.0.0.1', await unusedPort(), 500), null);
    assert.equal(await sshBanner('no-such-host.invalid', 22, 500), null);
    assert.equal(await sshBanner('127.0.0.1', 0, 500), null);
    assert.equal(await sshBanner('127.0.0.1', 70000, 500), null);
    assert.equal(await sshBanner('127.0.0.1', 22.5, 500), null);
    assert.equal(await sshBanner('127.0.0.1', 22, NaN), null);
  });
});

describe('freePortInRange', () => {
  test('the lowest port that is neither taken nor bound', async () => {
    const busy = net.createServer();
    servers.push(busy);
    await new Promise<void>((r) => busy.listen(0, '127.0.0.1', r));
    const b = (busy.address() as net.AddressInfo).port;
    assert.equal(await freePortInRange(b, b, new Set(), '127.0.0.1'), null, 'a bound port is not free');
    const from = b < 65000 ? b : b - 10;
    const got = await freePortInRange(from, from + 10, new Set([from + 1]), '127.0.0.1');
    assert.ok(got !== null && got !== b && got !== from + 1 && got >= from && got <= from + 10);
    if (from === b) assert.ok(got >= b + 2, 'skips the bound port and the taken one');
  });

  test('null when every port is taken; the chosen port is bindable', async () => {
    const p = await unusedPort();
    assert.equal(await freePortInRange(p, p, new Set([p]), '127.0.0.1'), null);
    assert.equal(await freePortInRange(p, p, new Set(), '127.0.0.1'), p);
  });

  test('bad ranges and non-local addresses throw', async () => {
    await assert.rejects(freePortInRange(0, 10, new Set(), '127.0.0.1'), RangeError);
    await assert.rejects(freePortInRange(10, 70000, new Set(), '127.0.0.1'), RangeError);
    await assert.rejects(freePortInRange(30000, 30001, new Set(), '192.0.2.1'), /EADDRNOTAVAIL/);
  });
});
