/**
 * The schedule (docs/architecture.md#background-loops): a job is declared once, and the manual clock's
 * advance uses that declaration both to stop at the moment the job says it has work and to run it
 * there; the same declaration runs in a loop of its own under a running clock.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { describeEachDb } from '../helpers/app.js';
import { advance, createUser } from '../helpers/factories.js';
import { within } from '../helpers/wait.js';
import { Scheduler } from '../../src/background/scheduler.js';

describeEachDb('the schedule', (t) => {
  test('an advance stops at the moment a job declares and runs it then, once', async () => {
    const admin = await createUser(t(), { admin: true });
    const start = t().clock.nowMs();
    const dueAt = start + 90_000;
    const ranAt: number[] = [];
    t().services.scheduler.add({
      name: 'test-once-at-90s',
      run: async (now) => {
        if (now.getTime() < dueAt || ranAt.length > 0) return 0;
        ranAt.push(now.getTime());
        return 1;
      },
      nextDue: async () => (ranAt.length > 0 ? null : dueAt),
    });
    await advance(t(), admin.token, 300);
    assert.deepEqual(ranAt, [dueAt], 'ran once, at the declared moment, not at the end of the advance');
    assert.equal(t().clock.nowMs(), start + 300_000);
  });

  test('nextDue is the earliest of the jobs that know theirs', async () => {
    const s = new Scheduler(t().clock);
    s.add({ name: 'none', run: async () => 0 });
    assert.equal(await s.nextDue(0), null);
    s.add({ name: 'late', run: async () => 0, nextDue: async () => 5_000 });
    s.add({ name: 'early', run: async () => 0, nextDue: async () => 2_000 });
    s.add({ name: 'idle', run: async () => 0, nextDue: async () => null });
    assert.equal(await s.nextDue(0), 2_000);
    assert.throws(() => s.add({ name: 'late', run: async () => 0 }), /already scheduled/);
  });

  test('the same declaration runs in a loop of its own under a running clock', async () => {
    const s = new Scheduler(t().clock);
    let runs = 0;
    s.add({ name: 'counted', run: async () => ++runs && 0 });
    s.start(10);
    try {
      await within(5_000, async () => runs >= 3, 'the job runs on its own timer');
    } finally {
      await s.stop();
    }
    const after = runs;
    await new Promise((r) => setTimeout(r, 50));
    assert.equal(runs, after, 'nothing runs once stopped');
  });

  test('the service schedules each job of its declaration once, hypervisor actions last', () => {
    const names = t()
      .services.scheduler.names()
      .filter((n) => !n.startsWith('test-'));
    assert.equal(new Set(names).size, names.length);
    assert.equal(names.at(-1), 'hypervisor-actions', 'the actions the other jobs made due run in the same pass');
    for (const required of ['billing-intervals', 'low-balance', 'reservation-ends'])
      assert.ok(names.includes(required), required);
  });
});
