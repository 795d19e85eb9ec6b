/**
 * The background work, each job declared once: what it runs, how often under the system clock, and
 * when it next has work for the manual clock's stepping advance (docs/architecture.md#background-loops).
 */
import { purgeExpiredIdempotencyKeys } from '../http/idempotency.js';
import type { Job } from '../background/scheduler.js';
import type { AppDeps, Services } from './services.js';

/**
 * In this order on every pass: reservation ends (their usage draws on the reservation up to end_at),
 * interval closes (traffic counters read first), image storage, snapshots, then low-balance stops
 * (docs/billing.md#low-balance), housekeeping, and last the hypervisor actions all of them made due.
 * Heartbeats and webhook deliveries run on real time, in loops of their own under either clock.
 */
export function jobsOf(s: Services, deps: AppDeps): Job[] {
  const { meter, driver, vms } = s;
  const traffic = (now: Date, all = false) =>
    meter.sampleTraffic(now, (node, refs) => driver.trafficBytes(node, refs), all ? { all } : undefined);
  return [
    {
      name: 'reservation-ends',
      run: (now) => s.reservations.endDue(now),
      nextDue: () => s.reservations.nextEndDue(),
    },
    {
      name: 'billing-intervals',
      run: async (now, signal) => {
        // The counters of the VMs whose period closes are read first, so the close bills them.
        await traffic(now);
        return meter.closeDueIntervals(now, { signal });
      },
      // The billing boundary at which a balance could reach zero, unbilled traffic counted: the
      // boundaries before it are closed in bulk wherever the advance stops next.
      nextDue: async (nowMs) => {
        await traffic(new Date(nowMs), true);
        return meter.nextLowBalanceBoundary(nowMs);
      },
    },
    { name: 'image-storage', run: (now) => s.imageMeter.closeDue(now) },
    // Snapshots: one at a time per instance, each copied into the image store (docs/images.md).
    { name: 'snapshots', run: () => s.snapshots.takeDue() },
    {
      name: 'low-balance',
      run: async (now) => {
        const users = await meter.lowBalanceUsers();
        for (const userId of users) {
          await deps.db.transaction(async (tx) => {
            // The VMs before the balance row (docs/billing.md#lock-order).
            await vms.stopAllOf(tx, userId, now, 'low_balance');
            await meter.clearLowBalance(tx, userId);
          });
        }
        return users.length;
      },
    },
    {
      name: 'housekeeping',
      everyMs: 60_000,
      run: async (now) => {
        await purgeExpiredIdempotencyKeys(deps.db, now);
        await s.webhooks.purge(now);
        await s.auth.purgeExpired(now);
        await s.portal.purge(now);
        return 0; // housekeeping: never a reason for another pass
      },
    },
    {
      // Host agents are real processes: their heartbeats run on real time under either clock (docs/agent.md).
      name: 'agent-heartbeats',
      clock: 'real',
      run: () => s.hostMonitor.checkDue(),
    },
    {
      // Deliveries talk to the outside world: real time under either clock; their retries come due in service time
      // (docs/webhooks.md).
      name: 'webhook-deliveries',
      clock: 'real',
      run: (_now, signal) => s.webhooks.drainDue(signal),
    },
    {
      name: 'hypervisor-actions',
      // Under the system clock a pass runs up to five rounds of claims while each finds work; actions run in the
      // background and each one recorded wakes the loop. A manual-clock advance waits for them.
      run: (now, signal, settle) =>
        settle ? s.actions.runOnce(now, true, signal) : s.actions.runPasses(() => s.clock.clock.now(), 5, signal),
      nextDue: () => vms.nextActionDue(),
      finish: () => s.actions.drain(),
    },
  ];
}

/**
 * Adds the jobs to the scheduler and hands the manual clock its two questions: run what is due
 * (settle), and when is work next due. An advance that would close more periods than about half a
 * minute of work is refused (docs/architecture.md#background-loops).
 */
export function wireSchedule(s: Services, deps: AppDeps): void {
  for (const job of jobsOf(s, deps)) s.scheduler.add(job);
  s.actions.onRecorded = () => s.scheduler.wake('hypervisor-actions');
  s.webhooks.onDue = () => s.scheduler.wake('webhook-deliveries');
  deps.clock.onAdvance(
    () => s.scheduler.settle(),
    (nowMs) => s.scheduler.nextDue(nowMs),
  );
  deps.clock.limitAdvance((toMs) => s.meter.refuseLargeAdvance(toMs));
}
