/**
 * The VM state machine (docs/vms.md#states), as a pure unit: every allowed
 * transition, every forbidden one (exhaustive over VM_STATUSES x VM_EVENTS),
 * GPU holding per state and rental type, the started_at / stopped_at flags and
 * the offline round trip. The table below is written from the documented rules, not
 * copied from lifecycle.ts.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import {
  canTransition,
  COUNTS_TOWARD_LIMIT,
  holdsGpus,
  PREEMPTIBLE,
  RENTAL_TYPES,
  transition,
  VM_EVENTS,
  VM_STATUSES,
  type VmEvent,
  type VmStatus,
} from '../../src/modules/vms/lifecycle.js';

/** States a node going offline takes with it (each of them -> offline). */
const LIVE: VmStatus[] = ['creating', 'starting', 'running', 'stopping', 'stopped', 'interrupted'];

/**
 * The documented transitions as a table: event -> from -> to. node_online is resolved from offline_from and checked
 * apart.
 */
const EXPECTED: Record<Exclude<VmEvent, 'node_online'>, Partial<Record<VmStatus, VmStatus>>> = {
  provisioned: { creating: 'starting' },
  provision_failed: { creating: 'failed' },
  started: { starting: 'running' },
  start_failed: { starting: 'stopped' }, // a failed start returns it to stopped
  stop_requested: { running: 'stopping' }, // stop needs running
  stopped: { stopping: 'stopped' },
  // the guest shut itself down, or its QEMU process died: stopped, billed as a stop
  powered_off: { running: 'stopped' },
  start_requested: { stopped: 'starting', interrupted: 'starting' }, // start needs stopped or interrupted
  // a start on another host: the disk travels first, then the VM starts there, or stays stopped where it was
  move_requested: { stopped: 'moving', interrupted: 'moving' },
  moved: { moving: 'starting' },
  move_failed: { moving: 'stopped' },
  // interruptible VMs holding GPUs can be preempted; not one its owner is stopping
  preempted: { creating: 'interrupted', starting: 'interrupted', running: 'interrupted' },
  node_offline: Object.fromEntries(LIVE.map((s) => [s, 'offline'])),
  // anything but destroyed -> destroyed
  destroy: Object.fromEntries(VM_STATUSES.filter((s) => s !== 'destroyed').map((s) => [s, 'destroyed'])),
};

describe('VM lifecycle: the state machine', () => {
  test('the statuses and events are the documented ones', () => {
    assert.deepEqual([...VM_STATUSES].sort(), [
      'creating',
      'destroyed',
      'failed',
      'interrupted',
      'moving',
      'offline',
      'running',
      'starting',
      'stopped',
      'stopping',
    ]);
    assert.deepEqual([...VM_EVENTS].sort(), [...Object.keys(EXPECTED), 'node_online'].sort());
    assert.deepEqual([...RENTAL_TYPES].sort(), ['interruptible', 'on_demand', 'reserved']);
  });

  test('every allowed transition of the table lands where the lifecycle says', () => {
    let n = 0;
    for (const [event, row] of Object.entries(EXPECTED) as [VmEvent, Partial<Record<VmStatus, VmStatus>>][]) {
      for (const [from, to] of Object.entries(row) as [VmStatus, VmStatus][]) {
        for (const rentalType of RENTAL_TYPES) {
          const offlineFrom = from === 'offline' ? 'running' : null;
          const r = transition({ status: from, rentalType, offlineFrom, event });
          assert.ok(r.ok, `${from} --${event}--> should be allowed`);
          assert.equal(r.transition.from, from);
          assert.equal(r.transition.to, to, `${from} --${event}-->`);
          assert.equal(canTransition(from, event, offlineFrom), true);
          n++;
        }
      }
    }
    assert.equal(n, (1 + 1 + 1 + 1 + 1 + 1 + 1 + 2 + 2 + 1 + 1 + 3 + 6 + 9) * 3);
  });

  test('every other (status, event) pair is refused with a reason naming the status', () => {
    let refused = 0;
    for (const status of VM_STATUSES) {
      for (const event of VM_EVENTS) {
        if (event === 'node_online') continue;
        const allowed = EXPECTED[event][status] !== undefined;
        const r = transition({
          status,
          rentalType: 'on_demand',
          offlineFrom: status === 'offline' ? 'running' : null,
          event,
        });
        assert.equal(r.ok, allowed, `${status} --${event}--> allowed=${allowed}`);
        assert.equal(canTransition(status, event, status === 'offline' ? 'running' : null), allowed);
        if (!r.ok) {
          assert.match(r.reason, new RegExp(`\\b${status}\\b`), `reason names the current state: ${r.reason}`);
          refused++;
        }
      }
    }
    // 10 statuses x 14 events = 140 pairs, 31 allowed
    assert.equal(refused, 140 - 31);
  });

  test('specific refusals the API relies on (an action the state does not allow is 400 invalid_state)', () => {
    const no = (status: VmStatus, event: VmEvent) =>
      assert.equal(
        transition({ status, rentalType: 'on_demand', offlineFrom: null, event }).ok,
        false,
        `${status} ${event}`,
      );
    no('running', 'start_requested'); // start a running VM
    no('starting', 'start_requested');
    no('creating', 'start_requested');
    no('failed', 'start_requested');
    no('destroyed', 'start_requested');
    no('stopped', 'stop_requested');
    no('starting', 'stop_requested');
    no('interrupted', 'stop_requested');
    no('destroyed', 'destroy'); // destroy twice
    no('interrupted', 'preempted'); // holds nothing to take
    no('stopped', 'preempted');
    no('stopping', 'preempted'); // its owner is stopping it: an interruption would restart it
    no('failed', 'node_offline'); // a failed VM is not on the node any more
    no('destroyed', 'node_offline');
    no('offline', 'node_offline');
  });

  test('node_online returns an offline VM to exactly the status it had, and nothing else', () => {
    for (const before of LIVE) {
      for (const rentalType of RENTAL_TYPES) {
        const off = transition({ status: before, rentalType, offlineFrom: null, event: 'node_offline' });
        assert.ok(off.ok);
        assert.equal(off.transition.to, 'offline');
        assert.equal(off.transition.offlineFrom, before, 'remembers what it was');
        assert.equal(
          off.transition.holdsGpus,
          holdsGpus(before, rentalType),
          `offline from ${before} holds GPUs as ${before} did`,
        );
        const back = transition({
          status: 'offline',
          rentalType,
          offlineFrom: off.transition.offlineFrom,
          event: 'node_online',
        });
        assert.ok(back.ok);
        assert.equal(back.transition.to, before);
        assert.equal(back.transition.offlineFrom, null, 'forgets once back');
        assert.equal(back.transition.holdsGpus, holdsGpus(before, rentalType));
        assert.equal(
          back.transition.holdsGpusBefore,
          off.transition.holdsGpus,
          'no GPU changes hands across the round trip',
        );
      }
    }
    // Not offline, or offline without a remembered status: refused.
    for (const status of VM_STATUSES.filter((s) => s !== 'offline')) {
      assert.equal(
        transition({ status, rentalType: 'on_demand', offlineFrom: null, event: 'node_online' }).ok,
        false,
        status,
      );
      assert.equal(canTransition(status, 'node_online', 'running'), false);
    }
    assert.equal(
      transition({ status: 'offline', rentalType: 'on_demand', offlineFrom: null, event: 'node_online' }).ok,
      false,
    );
    assert.equal(canTransition('offline', 'node_online', null), false);
    // Destroying an offline VM clears offline_from
    const d = transition({ status: 'offline', rentalType: 'interruptible', offlineFrom: 'running', event: 'destroy' });
    assert.ok(d.ok);
    assert.equal(d.transition.offlineFrom, null);
    assert.equal(d.transition.holdsGpusBefore, true);
    assert.equal(d.transition.holdsGpus, false);
  });

  test('holdsGpus per state and rental type: a reserved VM keeps its GPUs while stopped', () => {
    const expected: Record<VmStatus, Record<string, boolean>> = {
      creating: { on_demand: true, reserved: true, interruptible: true },
      starting: { on_demand: true, reserved: true, interruptible: true },
      running: { on_demand: true, reserved: true, interruptible: true },
      stopping: { on_demand: true, reserved: true, interruptible: true },
      stopped: { on_demand: false, reserved: true, interruptible: false },
      interrupted: { on_demand: false, reserved: false, interruptible: false },
      destroyed: { on_demand: false, reserved: false, interruptible: false },
      failed: { on_demand: false, reserved: false, interruptible: false }, // a failed VM holds no GPUs
      offline: { on_demand: false, reserved: false, interruptible: false }, // offline with nothing remembered
      moving: { on_demand: true, reserved: true, interruptible: true }, // the new host's GPUs, kept for its start
    };
    for (const s of VM_STATUSES)
      for (const r of RENTAL_TYPES) assert.equal(holdsGpus(s, r), expected[s][r], `${s}/${r}`);
    assert.equal(holdsGpus('offline', 'on_demand', 'running'), true);
    assert.equal(holdsGpus('offline', 'on_demand', 'stopped'), false);
    assert.equal(holdsGpus('offline', 'reserved', 'stopped'), true);
    assert.equal(holdsGpus('offline', 'interruptible', 'interrupted'), false);
  });

  test('the transition result reports GPU holding before and after', () => {
    const stop = transition({ status: 'stopping', rentalType: 'on_demand', offlineFrom: null, event: 'stopped' });
    assert.ok(stop.ok);
    assert.deepEqual(
      [stop.transition.holdsGpusBefore, stop.transition.holdsGpus],
      [true, false],
      'stopping releases the GPUs',
    );
    const stopR = transition({ status: 'stopping', rentalType: 'reserved', offlineFrom: null, event: 'stopped' });
    assert.ok(stopR.ok);
    assert.deepEqual(
      [stopR.transition.holdsGpusBefore, stopR.transition.holdsGpus],
      [true, true],
      'reserved keeps them',
    );
    const fail = transition({
      status: 'creating',
      rentalType: 'on_demand',
      offlineFrom: null,
      event: 'provision_failed',
    });
    assert.ok(fail.ok);
    assert.equal(fail.transition.holdsGpus, false);
    const pre = transition({ status: 'running', rentalType: 'interruptible', offlineFrom: null, event: 'preempted' });
    assert.ok(pre.ok);
    assert.deepEqual([pre.transition.holdsGpusBefore, pre.transition.holdsGpus], [true, false]);
    const restart = transition({
      status: 'interrupted',
      rentalType: 'interruptible',
      offlineFrom: null,
      event: 'start_requested',
    });
    assert.ok(restart.ok);
    assert.deepEqual([restart.transition.holdsGpusBefore, restart.transition.holdsGpus], [false, true]);
  });

  test('started_at is set exactly when a VM becomes running, stopped_at exactly when it leaves running', () => {
    for (const status of VM_STATUSES) {
      for (const event of VM_EVENTS) {
        const offlineFrom = status === 'offline' ? 'running' : null;
        const r = transition({ status, rentalType: 'interruptible', offlineFrom, event });
        if (!r.ok) continue;
        const t = r.transition;
        assert.equal(t.setStartedAt, t.to === 'running' && status !== 'running', `${status} --${event}--> started_at`);
        assert.equal(t.setStoppedAt, status === 'running' && t.to !== 'running', `${status} --${event}--> stopped_at`);
      }
    }
    // the ways out of running: stop, interruption, node offline, destroy
    for (const event of ['stop_requested', 'preempted', 'node_offline', 'destroy'] as VmEvent[]) {
      const r = transition({ status: 'running', rentalType: 'interruptible', offlineFrom: null, event });
      assert.ok(r.ok && r.transition.setStoppedAt && !r.transition.setStartedAt, event);
    }
    const started = transition({ status: 'starting', rentalType: 'on_demand', offlineFrom: null, event: 'started' });
    assert.ok(started.ok && started.transition.setStartedAt && !started.transition.setStoppedAt);
    // Back from offline to running: it is up again from now
    const back = transition({
      status: 'offline',
      rentalType: 'on_demand',
      offlineFrom: 'running',
      event: 'node_online',
    });
    assert.ok(back.ok && back.transition.setStartedAt);
    // Back from offline to stopped: neither
    const backStopped = transition({
      status: 'offline',
      rentalType: 'on_demand',
      offlineFrom: 'stopped',
      event: 'node_online',
    });
    assert.ok(backStopped.ok && !backStopped.transition.setStartedAt && !backStopped.transition.setStoppedAt);
  });

  test('PREEMPTIBLE: the states in which an interruptible VM holds GPUs, but stopping and moving', () => {
    assert.deepEqual([...PREEMPTIBLE].sort(), ['creating', 'running', 'starting']);
    for (const s of PREEMPTIBLE) {
      assert.equal(holdsGpus(s, 'interruptible'), true, s);
      assert.equal(canTransition(s, 'preempted'), true, s);
    }
    assert.deepEqual(
      VM_STATUSES.filter((s) => holdsGpus(s, 'interruptible') && !PREEMPTIBLE.includes(s)),
      // a moving VM holds its new node's GPUs for the start its owner asked for, as a stopping one holds its own
      ['stopping', 'moving'],
    );
  });

  test('failed and destroyed VMs do not count toward the VM limit', () => {
    assert.deepEqual(VM_STATUSES.filter((s) => !COUNTS_TOWARD_LIMIT(s)).sort(), ['destroyed', 'failed']);
  });
});
