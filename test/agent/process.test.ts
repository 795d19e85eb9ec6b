/**
 * Starting QEMU and judging liveness: pid files, /proc states (zombies are
 * dead), recycled pids (argv check), and QEMU's own error on a bad option.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { hostAccel, isAlive, launchQemu, qemuAvailable, readPid } from '../../src/host-agent/qemu/process.js';
import { qemu } from './qemu-helpers.js';

let dir: string;
before(() => {
  dir = mkdtempSync(join(tmpdir(), 'gc-proc-'));
});
after(() => rmSync(dir, { recursive: true, force: true }));

describe('readPid', () => {
  test('reads a pid, null for missing or garbage files', () => {
    const f = join(dir, 'pid');
    writeFileSync(f, '12345\n');
    assert.equal(readPid(f), 12345);
    for (const bad of ['', 'abc', '-5', '0', '12 34', '1.5', '99999999', '0x10']) {
      writeFileSync(f, bad);
      assert.equal(readPid(f), null, JSON.stringify(bad));
    }
    assert.equal(readPid(join(dir, 'missing')), null);
  });
});

describe('isAlive', () => {
  test('this process is alive; with an argv check it must match an exact argument', () => {
    assert.equal(isAlive(process.pid), true);
    assert.equal(isAlive(process.pid, process.argv0 === process.execPath ? process.execPath : process.argv0), true);
    assert.equal(isAlive(process.pid, 'unix:/nonexistent/qmp.sock,server=on,wait=off'), false);
  });

  test('invalid and unused pids are dead', () => {
    for (const pid of [0, -1, 1.5, NaN, 2 ** 31]) assert.equal(isAlive(pid), false, String(pid));
    assert.equal(isAlive(4_194_303), false);
  });

  test('a zombie is dead, and so is an exited process', async () => {
    // sh starts a background child that exits at once, then execs sleep, which never reaps it.
    const sh = spawn('sh', ['-c', 'true & echo $!; exec sleep 5'], { stdio: ['ignore', 'pipe', 'ignore'] });
    try {
      const out = await new Promise<string>((resolve) => sh.stdout.once('data', (d: Buffer) => resolve(d.toString())));
      const zombie = Number(out.trim());
      const end = Date.now() + 2000;
      while (isAlive(zombie) && Date.now() < end) await new Promise((r) => setTimeout(r, 20));
      assert.equal(isAlive(zombie), false, 'zombie counts as dead');
      assert.equal(isAlive(sh.pid!), true);
      // sh echoes the pid before it execs sleep: until it has, its argv is sh's (a busy machine shows it).
      const exec = Date.now() + 5000;
      while (!isAlive(sh.pid!, '5') && Date.now() < exec) await new Promise((r) => setTimeout(r, 20));
      assert.equal(isAlive(sh.pid!, '5'), true, 'argv of the sleep is checked');
    } finally {
      sh.kill('SIGKILL');
    }
    await new Promise((r) => sh.once('exit', r));
    assert.equal(isAlive(sh.pid!), false);
  });
});

describe('host checks', () => {
  test('qemuAvailable finds executables in PATH or by path', () => {
    assert.equal(qemuAvailable('sh'), true);
    assert.equal(qemuAvailable('/bin/sh'), true);
    assert.equal(qemuAvailable('no-such-binary-gpucloud'), false);
    const plain = join(dir, 'not-executable');
    writeFileSync(plain, '#!/bin/sh\n', { mode: 0o644 });
    assert.equal(qemuAvailable(plain), false);
    assert.equal(qemuAvailable('/tmp'), false);
  });

  test('hostAccel answers kvm or tcg', () => {
    assert.ok(['kvm', 'tcg'].includes(hostAccel()));
  });
});

describe('launchQemu', () => {
  test('refuses an argv without -daemonize', async () => {
    await assert.rejects(launchQemu(['-S']), /-daemonize/);
  });

  test('a missing binary rejects with the package to install', async () => {
    await assert.rejects(launchQemu(['-daemonize'], { binary: 'no-such-qemu-gpucloud' }), /not found/);
  });

  test('a launcher that never exits is killed at the timeout', async () => {
    const t0 = Date.now();
    await assert.rejects(
      launchQemu(['-c', 'sleep 10', '-daemonize'], { binary: 'sh', timeoutMs: 200 }),
      /did not daemonize within 200 ms/,
    );
    assert.ok(Date.now() - t0 < 2000);
  });

  test("a bad option rejects with QEMU's message", { skip: qemu.skip }, async () => {
    qemu.ensure();
    await assert.rejects(
      launchQemu([
        '-machine',
        'q35',
        '-accel',
        'tcg',
        '-nodefaults',
        '-display',
        'none',
        '-no-such-option',
        '-daemonize',
      ]),
      /qemu-system-x86_64: -no-such-option: invalid option/,
    );
    await assert.rejects(
      launchQemu([
        '-machine',
        'q35',
        '-accel',
        'tcg',
        '-nodefaults',
        '-display',
        'none',
        '-drive',
        `file=${join(dir, 'missing.qcow2')},if=virtio,format=qcow2`,
        '-daemonize',
      ]),
      /missing\.qcow2.*No such file or directory/,
    );
  });
});
