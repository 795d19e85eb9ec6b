/**
 * Tap byte counters from a fake sysfs: host-side names, missing devices,
 * malformed counters, and names that would escape the directory.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { tapCounters } from '../../src/host-agent/network/traffic.js';

describe('tapCounters', () => {
  let root: string;
  const dev = (name: string, rx: string, tx: string): void => {
    const d = join(root, 'class/net', name, 'statistics');
    mkdirSync(d, { recursive: true });
    writeFileSync(join(d, 'rx_bytes'), rx);
    writeFileSync(join(d, 'tx_bytes'), tx);
  };
  before(() => {
    root = mkdtempSync(join(tmpdir(), 'gc-net-'));
    dev('gc-tap1', '22118400\n', '5120\n');
    dev('gc-tap2', '0\n', '0\n');
    dev('gc-bad', 'lots\n', '1\n');
    dev('gc-huge', '99999999999999999999\n', '1\n');
  });
  after(() => rmSync(root, { recursive: true, force: true }));

  test('reads rx/tx bytes (rx = what the guest sent)', () => {
    assert.deepEqual(tapCounters('gc-tap1', root), { rxBytes: 22_118_400, txBytes: 5120 });
    assert.deepEqual(tapCounters('gc-tap2', root), { rxBytes: 0, txBytes: 0 });
  });

  test('missing device or unreadable counters give null', () => {
    assert.equal(tapCounters('gc-nope', root), null);
    assert.equal(tapCounters('gc-bad', root), null);
    assert.equal(tapCounters('gc-huge', root), null);
  });

  test('names that are not interface names throw', () => {
    for (const bad of ['../../etc', 'a/b', '', 'x'.repeat(16), 'tap 0'])
      assert.throws(() => tapCounters(bad, root), TypeError, bad);
  });

  test('the loopback device of this host has counters', () => {
    const lo = tapCounters('lo');
    assert.ok(lo && lo.rxBytes >= 0 && lo.txBytes >= 0);
  });
});
