/**
 * The reactions between modules: what one module's change sets off in another, each inside the
 * transaction of its cause (docs/architecture.md#the-composition-root).
 */
import type { Services } from './services.js';

export function wireReactions(s: Services): void {
  const { vms, meter, reservations, adminUsers, inventory, auth, apiKeys, hostMonitor } = s;
  // Billing periods close at status changes.
  vms.onTransition((tx, before, after, now) => meter.onTransition(tx, before, after, now));
  vms.onBeforeStatusChanges((tx, vmIds) => meter.lockMeters(tx, vmIds));
  vms.onTransition(async (tx, before, after, now) => {
    // Interrupting others is never free: a VM that preempted any pays at least one billing period.
    if (after.status === 'destroyed' && before.status !== 'destroyed')
      await meter.chargePreemptionMinimum(tx, after.id, now);
  });
  vms.onTransition(async (tx, before, after, now) => {
    // A reserved VM that ends failed gets its whole deposit back.
    if (after.status === 'failed' && before.status !== 'failed' && after.reservation_id)
      await reservations.refundFailed(tx, after.reservation_id, now);
  });
  adminUsers.onSuspend((tx, userId, now) => vms.stopAllOf(tx, userId, now, 'suspended').then(() => undefined));
  // Offers are read from a snapshot; GPUs taken or freed replace it once their transaction commits.
  vms.onGpuUsageChange(() => inventory.offersChanged());
  // A suspension or a new role applies to remembered sessions and keys at once.
  adminUsers.onChange((userId) => {
    auth.forgetUser(userId);
    apiKeys.forgetUser(userId);
  });
  // A newly registered agent is asked at once what its host holds.
  inventory.onAgentContact((node) => hostMonitor.checkNode(node));
  // An offline node takes its VMs offline.
  inventory.onNodeStatusChange((tx, node, from, to, now) => vms.onNodeStatus(tx, node, from, to, now));
}
