/**
 * Placement (docs/vms.md#placement-and-gpu-counting): the node row is locked
 * (`SELECT ... FOR UPDATE`, which serializes GPU allocation per node), the
 * GPUs its VMs hold are counted (inventory.usage), and for an on-demand or
 * reserved create the interruptible VMs it may preempt are locked and picked.
 * The caller inserts or updates the VM in the same transaction, so a node
 * never hands out more GPUs than it has.
 */
import type { Queryable } from '../../db/db.js';
import { AppError } from '../../errors.js';
import type { InventoryService } from '../inventory/service.js';
import type { FullNodeRow } from '../inventory/repository.js';
import { PREEMPTIBLE, type RentalType } from './lifecycle.js';
import * as repo from './repository.js';
import type { VmRow } from './repository.js';

/** GPUs of a node that no VM holds (negative if it holds more than the node has now). */
export async function freeGpus(
  tx: Queryable,
  inventory: InventoryService,
  node: string,
  gpuCount: number,
): Promise<number> {
  return gpuCount - (await inventory.usage(tx, node)).held;
}

/**
 * A create's node (checks 2 and 3 of docs/vms.md#the-order-of-the-checks): it exists, is
 * active, has GPUs of the type asked for, and enough of them free, or for an on-demand or
 * reserved VM free plus held by preemptible interruptible VMs. Returns the locked node, its
 * free GPUs and those candidates (most recently started first), locked.
 */
export async function placeCreate(
  tx: Queryable,
  inventory: InventoryService,
  want: { node: string; gpu_type: string; gpu_count: number },
  rental: RentalType,
): Promise<{ node: FullNodeRow; free: number; victims: VmRow[] }> {
  const node = await inventory.lockNode(tx, want.node);
  if (!node) throw new AppError('gpu_unavailable', `Node ${want.node} does not exist`);
  if (node.status !== 'active')
    throw new AppError('gpu_unavailable', `Node ${want.node} is ${node.status} and accepts no new VMs`);
  if (node.gpu_type !== want.gpu_type) {
    throw new AppError('gpu_unavailable', `Node ${want.node} has ${node.gpu_type} GPUs, not ${want.gpu_type}`);
  }
  let free = await freeGpus(tx, inventory, node.node, node.gpu_count);
  // Interruptible VMs this one may preempt (docs/vms.md#preemption), locked before they are counted on: one
  // that starts stopping meanwhile still holds its GPUs but can no longer be preempted, so it
  // must not count as takeable. Behind the locks the usage is read again.
  let victims: VmRow[] = [];
  if (rental !== 'interruptible' && free < want.gpu_count) {
    victims = await repo.preemptionCandidates(tx, node.node, PREEMPTIBLE);
    free = await freeGpus(tx, inventory, node.node, node.gpu_count);
  }
  const takeable = free + victims.reduce((sum, v) => sum + v.gpu_count, 0);
  if (takeable < want.gpu_count) {
    throw new AppError(
      'gpu_unavailable',
      `Node ${node.node} has ${Math.max(0, takeable)} ${rental === 'interruptible' ? 'free' : 'available'} GPU(s); ${want.gpu_count} requested`,
    );
  }
  return { node, free, victims };
}

/**
 * The victims to preempt, in the candidates' order (most recently started first), only for the GPUs that are not
 * free.
 */
export function pickVictims(candidates: VmRow[], gpuCount: number, free: number): VmRow[] {
  const picked: VmRow[] = [];
  let missing = gpuCount - free;
  for (const victim of candidates) {
    if (missing <= 0) break;
    picked.push(victim);
    missing -= victim.gpu_count;
  }
  return picked;
}

/**
 * A start's node (docs/vms.md#start): the VM's own, locked, not offline (a draining one will do),
 * and unless the VM still holds its GPUs (a stopped reserved VM) they must be free again. Start
 * never preempts anyone.
 */
export async function placeStart(tx: Queryable, inventory: InventoryService, vm: VmRow): Promise<void> {
  const node = await inventory.lockNode(tx, vm.node);
  if (!node || node.status === 'offline') throw new AppError('gpu_unavailable', `Node ${vm.node} is offline`);
  if (!vm.holds_gpus) {
    const free = await freeGpus(tx, inventory, vm.node, node.gpu_count);
    if (free < vm.gpu_count) {
      throw new AppError(
        'gpu_unavailable',
        `Node ${vm.node} has ${Math.max(0, free)} free GPU(s); this VM needs ${vm.gpu_count}`,
      );
    }
  }
}

/**
 * Where a stopped VM whose node lacks the GPUs starts instead (docs/vms.md#start-on-another-host):
 * another active node of the same GPU type and kind with the GPUs free and room for its disk,
 * locked. Never for a reserved VM (its GPUs are held where it is), a VM whose node is offline (its
 * disk cannot leave), or one never built (it has no disk yet). 400 gpu_unavailable with the reason
 * when nothing qualifies; `why` is why its own node said no.
 */
export async function placeMove(tx: Queryable, inventory: InventoryService, vm: VmRow, why: string): Promise<string> {
  const refuse = (reason: string) => new AppError('gpu_unavailable', `${why}, and it cannot move: ${reason}`);
  if (vm.rental_type === 'reserved') throw refuse('a reserved VM is never moved');
  const from = await inventory.lockNode(tx, vm.node);
  if (!from || from.status === 'offline') throw new AppError('gpu_unavailable', why);
  if (!vm.provisioned) throw refuse('it was never built, so it has no disk to move');
  const target = await inventory.lockMoveTarget(tx, from, { gpuCount: vm.gpu_count, storageGb: vm.storage_gb });
  if (!target)
    throw refuse(
      `no other active ${vm.gpu_type} node has ${vm.gpu_count} free GPU(s) and room for a ${vm.storage_gb} GB disk`,
    );
  return target.node;
}
