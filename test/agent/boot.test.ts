/**
 * When a booting VM becomes running (src/host-agent/qemu/boot.ts): the console
 * scanner on real-looking console output (split anywhere, with a Debian
 * guest's journald prefixes and colours), a console log file fed through
 * ConsoleLog from a socket as QEMU serves it (an earlier boot's marker in the
 * file does not count), and the wait itself: the marker and an SSH answer
 * begun after it, the SSH-only fallback for guests without cloud-init, the
 * cap for a cloud-init that never prints its marker, and a wait that stops
 * mattering.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { bootMarker } from '../../src/host-agent/images/seed.js';
import {
  ConsoleScanner,
  isBooted,
  markBooted,
  bootedFile,
  waitForBoot,
  type BootWait,
} from '../../src/host-agent/qemu/boot.js';
import { ConsoleLog } from '../../src/host-agent/qemu/console.js';

const ID = '0b6f7c1e-3d2a-4c5b-9e8f-7a6b5c4d3e2f';
const OTHER = '0b6f7c1e-3d2a-4c5b-9e8f-7a6b5c4d3e20';
const marker = bootMarker(ID);

/** The end of a Debian 12 cloud image's boot on ttyS0, as the agent receives it (CRLF, colours, prefixes). */
const debianBoot = [
  '[    3.911234] systemd[1]: Starting \x1b[0;1;39mcloud-init-local.service\x1b[0m - Initial cloud-init job (pre-networking)...',
  "[   11.502871] cloud-init[402]: Cloud-init v. 22.4.2 running 'init-local' at Sun, 29 Nov 2026 03:40:01 +0000. Up 11.41 seconds.",
  '[  OK  ] Started \x1b[0;1;39mssh.service\x1b[0m - OpenBSD Secure Shell server.',
  "[   44.120412] cloud-init[611]: Cloud-init v. 22.4.2 running 'modules:config' at Sun, 29 Nov 2026 03:40:34 +0000. Up 44.0 seconds.",
  `[   47.310233] cloud-init[655]: ${marker} cloud-init finished after 47.29 s`,
  '[  OK  ] Finished \x1b[0;1;39mcloud-final.service\x1b[0m - Execute cloud user/final scripts.',
  '',
].join('\r\n');

describe('ConsoleScanner', () => {
  test('a Debian boot: cloud-init seen early, finished only at the marker', () => {
    const s = new ConsoleScanner(marker);
    const cut = debianBoot.indexOf(marker);
    s.feed(Buffer.from(debianBoot.slice(0, cut)));
    assert.equal(s.cloudInit, true);
    assert.equal(s.finished, false);
    s.feed(Buffer.from(debianBoot.slice(cut)));
    assert.equal(s.finished, true);
  });

  test('text split anywhere, even one byte a chunk', () => {
    for (const size of [1, 2, 7, 64]) {
      const s = new ConsoleScanner(marker);
      const bytes = Buffer.from(debianBoot);
      for (let i = 0; i < bytes.length; i += size) s.feed(bytes.subarray(i, i + size));
      assert.equal(s.finished, true, `chunks of ${size}`);
    }
  });

  test("another VM's marker, a partial marker and a guest without cloud-init do not count", () => {
    const s = new ConsoleScanner(marker);
    s.feed(`${bootMarker(OTHER)} cloud-init finished\r\n`);
    s.feed(`${marker.slice(0, -1)}\r\n`);
    assert.equal(s.finished, false);
    assert.equal(s.cloudInit, true);
    const plain = new ConsoleScanner(marker);
    plain.feed('[  OK  ] Started ssh.service - OpenBSD Secure Shell server.\r\nDebian GNU/Linux 12 vm ttyS0\r\n');
    assert.equal(plain.cloudInit, false);
    plain.feed('CLOUD-INIT is mentioned in capitals');
    assert.equal(plain.cloudInit, true, 'any case');
  });

  test('pause ends early when cloud-init shows or the marker arrives', async () => {
    const s = new ConsoleScanner(marker);
    const t0 = Date.now();
    const first = s.pause(10_000);
    s.feed('no news\r\n');
    s.feed('cloud-init[1]: running\r\n');
    await first;
    const second = s.pause(10_000);
    s.feed(`${marker}\r\n`);
    await second;
    await s.pause(5);
    assert.ok(Date.now() - t0 < 2000, `${Date.now() - t0} ms`);
  });

  test('the marker names the instance and is refused for a bad instance id', () => {
    assert.equal(marker, `[gpucloud-ready ${ID}]`);
    assert.throws(() => bootMarker('a b'), TypeError);
    assert.throws(() => new ConsoleScanner(''), TypeError);
  });
});

describe('a console log file fed by ConsoleLog', () => {
  let dir: string;
  before(() => {
    dir = mkdtempSync(join(tmpdir(), 'gc-boot-'));
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  test("the current run's stream counts, an earlier boot's marker in the file does not", async () => {
    const sock = join(dir, 'con.sock');
    const file = join(dir, 'console.log');
    // The previous boot ended with the marker: it is in the file the new run appends to.
    writeFileSync(file, `old boot\r\n${marker} cloud-init finished after 40.1 s\r\n`);
    let guest: net.Socket | null = null;
    const server = net.createServer((c) => (guest = c));
    await new Promise<void>((r) => server.listen(sock, r));
    const log = new ConsoleLog(sock, file);
    const scanner = new ConsoleScanner(marker);
    log.onData((chunk) => scanner.feed(chunk));
    assert.equal(await log.open(), true);
    for (let i = 0; i < 50 && !guest; i++) await new Promise((r) => setTimeout(r, 20));
    assert.ok(guest, 'connected');
    const g = guest as net.Socket;
    const cut = debianBoot.indexOf(marker) + 10;
    g.write(debianBoot.slice(0, cut));
    await until(() => readFileSync(file, 'latin1').includes('modules:config'));
    assert.equal(scanner.cloudInit, true);
    assert.equal(scanner.finished, false, 'the old marker in the file does not count');
    g.write(debianBoot.slice(cut));
    await until(() => scanner.finished);
    assert.ok(readFileSync(file, 'latin1').endsWith(debianBoot), 'the log keeps what arrived');
    log.close();
    g.destroy();
    await new Promise((r) => server.close(r));
  });

  test('the booted file', () => {
    assert.equal(isBooted(dir), false);
    markBooted(dir, 'cloud-init', new Date('2026-11-29T03:40:00Z'));
    assert.equal(isBooted(dir), true);
    assert.deepEqual(JSON.parse(readFileSync(bootedFile(dir), 'utf8')), {
      at: '2026-11-29T03:40:00.000Z',
      how: 'cloud-init',
    });
  });
});

async function until(check: () => boolean): Promise<void> {
  for (let i = 0; i < 200; i++) {
    if (check()) return;
    await new Promise((r) => setTimeout(r, 10));
  }
  assert.fail('condition not reached within 2 s');
}

describe('waitForBoot', () => {
  /** A guest on a fake clock: each SSH probe takes 100 ms; `events` change the guest at given times. */
  function guest(events: { at: number; ssh?: boolean; print?: string }[], opts: Partial<BootWait> = {}) {
    let now = 0;
    let ssh = false;
    const scanner = new ConsoleScanner(marker);
    const probes: { at: number; answered: boolean }[] = [];
    const apply = () => {
      while (events.length && events[0]!.at <= now) {
        const e = events.shift()!;
        if (e.ssh !== undefined) ssh = e.ssh;
        if (e.print) scanner.feed(e.print);
      }
    };
    const wait = waitForBoot({
      scanner,
      sshAnswers: async () => {
        const answered = ssh;
        now += 100;
        apply();
        probes.push({ at: now, answered });
        return answered;
      },
      current: () => now < 600_000,
      now: () => now,
      pollMs: 0,
      ...opts,
    });
    // Time moves only with the probes (the polls sleep 0 ms of real time).
    return { wait, probes, clock: () => now, scanner, tick: apply };
  }

  test('cloud-init: not ready at the first SSH answer, ready at an answer begun after the marker', async () => {
    const g = guest([
      { at: 0, print: "Cloud-init v. 22.4.2 running 'init'\r\n" },
      { at: 40_000, ssh: true },
      { at: 42_000, ssh: false }, // set-passwords restarts sshd
      { at: 42_500, ssh: true },
      { at: 45_050, print: `${marker} cloud-init finished after 45.05 s\r\n` },
    ]);
    assert.equal(await g.wait, 'cloud-init');
    const first = g.probes.find((p) => p.answered)!;
    assert.ok(first.at <= 40_200, 'SSH answered early');
    assert.ok(g.clock() > 45_050, `ready at ${g.clock()} ms, after the marker`);
  });

  test('the marker before SSH answers (the test image prints it once SSH listens): ready when SSH answers', async () => {
    const g = guest([
      { at: 0, print: 'gpucloud-test-image: cloud-init (stand-in) running: init\r\n' },
      { at: 3_000, print: `${marker} cloud-init finished after 3.0 s\r\n` },
      { at: 3_400, ssh: true },
    ]);
    assert.equal(await g.wait, 'cloud-init');
    assert.ok(g.clock() >= 3_400 && g.clock() < 3_700, `${g.clock()}`);
  });

  test('no cloud-init on the console: ready once SSH has answered for the grace period', async () => {
    const g = guest([{ at: 20_000, ssh: true }], { graceMs: 3000 });
    assert.equal(await g.wait, 'ssh');
    assert.ok(g.clock() >= 23_000 && g.clock() < 23_300, `${g.clock()}`);
  });

  test('cloud-init mentioned late, within the grace period: its marker is waited for', async () => {
    const g = guest(
      [
        { at: 10_000, ssh: true },
        { at: 11_000, print: 'cloud-init[600]: modules:config\r\n' },
        { at: 30_000, print: `${marker}\r\n` },
      ],
      { graceMs: 3000 },
    );
    assert.equal(await g.wait, 'cloud-init');
    assert.ok(g.clock() > 30_000);
  });

  test('cloud-init without its marker: ready after the cap, counted from the first SSH answer', async () => {
    const g = guest(
      [
        { at: 0, print: 'cloud-init\r\n' },
        { at: 5_000, ssh: true },
      ],
      { cloudInitWaitMs: 60_000 },
    );
    assert.equal(await g.wait, 'ssh-without-final-message');
    assert.ok(g.clock() >= 65_000 && g.clock() < 65_300, `${g.clock()}`);
  });

  test('a wait that stops mattering (the VM stopped) gives null', async () => {
    let calls = 0;
    const r = await waitForBoot({
      scanner: new ConsoleScanner(marker),
      sshAnswers: async () => {
        calls++;
        return false;
      },
      current: () => calls < 3,
      pollMs: 0,
    });
    assert.equal(r, null);
    assert.equal(calls, 3);
  });
});
