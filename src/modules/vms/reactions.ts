/**
 * What other modules' changes do to VMs, inside the transaction of their
 * cause (hooks wired in app.ts): a user's balance ran out or they were
 * suspended, a node went offline or came back, a reservation ended.
 */
import type { Queryable } from '../../db/db.js';
import type { InventoryService } from '../inventory/service.js';
import { holdsGpus } from './lifecycle.js';
import * as repo from './repository.js';
import { ratesFor } from './rates.js';
import { failMove } from './outcomes.js';
import { requestStop } from './actions.js';
import type { ApplyTransition } from './transitions.js';

/**
 * A user's running VMs are stopped: their balance reached zero, or they were suspended (inside that change's
 * transaction).
 */
export async function stopAllOf(
  tx: Queryable,
  apply: ApplyTransition,
  userId: number,
  now: Date,
  reason: 'low_balance' | 'suspended',
): Promise<number> {
  const running = await repo.runningVmsOfUser(tx, userId);
  for (const vm of running) await requestStop(tx, apply, vm, now, reason);
  return running.length;
}

/** A node going offline takes its VMs offline; coming back restores them (docs/vms.md#when-a-node-goes-offline). */
export async function onNodeStatus(
  tx: Queryable,
  apply: ApplyTransition,
  node: string,
  from: string,
  to: string,
  now: Date,
): Promise<void> {
  if (to === 'offline') {
    // A move to this node cannot finish: the VM stays where its disk is (docs/vms.md#start-on-another-host).
    for (const vm of await repo.vmsOnNode(tx, node, ['moving'])) {
      await failMove({ apply }, tx, vm, now, `node ${node} went offline during the move`);
    }
    for (const vm of await repo.vmsOnNode(tx, node, [
      'creating',
      'starting',
      'running',
      'stopping',
      'stopped',
      'interrupted',
    ])) {
      await apply(tx, vm, 'node_offline', now);
    }
  } else if (from === 'offline') {
    for (const vm of await repo.vmsOnNode(tx, node, ['offline'])) {
      // A VM that was running comes back running: it is up again from now (started_at is set anew).
      await apply(tx, vm, 'node_online', now);
    }
  }
}

/**
 * A reserved VM whose reservation is cancelled or ends goes on as on-demand at the current on-demand price
 * (its open period was closed by the caller). False when the VM is gone.
 */
export async function convertToOnDemand(
  tx: Queryable,
  deps: { inventory: InventoryService; gpuUsageChanged: (tx: Queryable) => void },
  vmId: string,
): Promise<boolean> {
  const vm = await repo.findVm(tx, { id: vmId }, null, true);
  if (!vm || vm.status === 'destroyed' || vm.status === 'failed') return false;
  if (vm.rental_type !== 'reserved') return true;
  const pricing = await deps.inventory.pricingFor(tx, vm.gpu_type);
  const rates = ratesFor(pricing, 'on_demand', vm.gpu_count, vm.storage_gb);
  await repo.updateVm(tx, vm.id, {
    rental_type: 'on_demand',
    gpu_hourly_rate_micros: rates.gpu,
    storage_hourly_rate_micros: rates.storage,
    // A stopped reserved VM held its GPUs; as on-demand it no longer does.
    holds_gpus: holdsGpus(vm.status, 'on_demand', vm.offline_from),
  });
  deps.gpuUsageChanged(tx);
  return true;
}
