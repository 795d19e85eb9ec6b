/**
 * What a user (or an administrator) does to an existing VM: start, stop,
 * destroy, label, auto-restart (docs/vms.md#what-each-action-does-in-each-state).
 * Each is one transaction that records the hypervisor work due; none waits
 * for the hypervisor.
 */
import type { Db, Queryable } from '../../db/db.js';
import type { Clock } from '../../clock.js';
import { AppError, invalidState, validation } from '../../errors.js';
import { formatAmount } from '../../money.js';
import * as ledger from '../billing/ledger.js';
import type { InventoryService } from '../inventory/service.js';
import { recordEvent } from '../events/service.js';
import * as repo from './repository.js';
import type { VmRow } from './repository.js';
import { LABEL_RE, LABEL_RULE, mustFind } from './records.js';
import { committedHourly } from './rates.js';
import { placeMove, placeStart } from './placement.js';
import type { MovePolicy } from './lifecycle.js';
import { checkStartLimit } from './create.js';
import type { ApplyTransition, StatusReason } from './transitions.js';

export interface ActionDeps {
  db: Db;
  clock: Clock;
  inventory: InventoryService;
  apply: ApplyTransition;
}

export async function startVm(
  deps: ActionDeps,
  userId: number,
  ref: string,
  opts: { move: MovePolicy } = { move: 'never' },
): Promise<{ message: string }> {
  return deps.db.transaction(async (tx) => {
    // The lock order of every transaction on VMs and money (docs/billing.md#lock-order): the node,
    // then the VM, then (through the status change) its meter, then the balance. The change is made
    // before the limit and balance checks take the balance; a refusal rolls it back, so the checks
    // answer in their usual order.
    const vm = await lockWithNode(tx, deps.inventory, userId, ref);
    if (vm.status !== 'stopped' && vm.status !== 'interrupted') {
      throw invalidState(`Cannot start a VM that is ${vm.status}: start needs a stopped or interrupted VM`);
    }
    if (await repo.snapshotInProgress(tx, vm.id))
      throw invalidState(
        'Cannot start the VM while a snapshot of it is being taken; it can start once the image is ready',
      );
    let target: string | null = null;
    try {
      await placeStart(tx, deps.inventory, vm);
    } catch (err) {
      if (opts.move !== 'if_needed' || !(err instanceof AppError) || err.code !== 'gpu_unavailable') throw err;
      target = await placeMove(tx, deps.inventory, vm, err.message);
    }
    const now = deps.clock.now();
    if (target) {
      await deps.apply(tx, vm, 'move_requested', now, {
        node: target,
        move_from: vm.node,
        move_started_at: now,
        hv_action: 'move',
        next_action_at: now,
        attempts: 0,
        last_error: null,
      });
    } else {
      await deps.apply(tx, vm, 'start_requested', now, {
        hv_action: 'start',
        next_action_at: now,
        attempts: 0,
        last_error: null,
      });
    }
    // The balance row serializes this user's starts and creates: the limit and the money are counted once.
    const balance = await ledger.lockBalance(tx, userId);
    const mine = await checkStartLimit(tx, vm);
    if (vm.rental_type !== 'reserved') {
      const own = vm.gpu_hourly_rate_micros + vm.storage_hourly_rate_micros;
      const required = own + committedHourly(mine, vm.id);
      if (balance < required) {
        throw new AppError(
          'insufficient_balance',
          `Insufficient balance: required ${formatAmount(required)} (one hour of this VM plus one hour of your other VMs), available ${formatAmount(balance)}`,
        );
      }
    }
    if (target)
      return {
        message: `VM ${vm.vmid} is moving to node ${target} (node ${vm.node} has no free GPUs for it); it starts there once its disk has arrived`,
      };
    return { message: `VM ${vm.vmid} is starting` };
  });
}

/**
 * The VM, locked behind its node's lock. A VM changes node only when it moves, under its own lock:
 * if it moved between the unlocked read and the lock, its new node is locked as well (a lock too
 * many is harmless; the VM cannot move again while this transaction holds it).
 */
async function lockWithNode(tx: Queryable, inventory: InventoryService, userId: number, ref: string): Promise<VmRow> {
  let { node } = await mustFind(tx, userId, ref);
  for (;;) {
    await inventory.lockNode(tx, node);
    const vm = await mustFind(tx, userId, ref, true);
    if (vm.node === node) return vm;
    node = vm.node;
  }
}

export async function stopVm(deps: ActionDeps, userId: number, ref: string): Promise<{ message: string }> {
  return deps.db.transaction(async (tx) => {
    const vm = await mustFind(tx, userId, ref, true);
    if (vm.status !== 'running') throw invalidState(`Cannot stop a VM that is ${vm.status}: stop needs a running VM`);
    await requestStop(tx, deps.apply, vm, deps.clock.now());
    return { message: `VM ${vm.vmid} is stopping; GPU billing paused, storage continues` };
  });
}

/** A running VM to `stopping`, its stop due on the hypervisor now (a user's stop, low balance, suspension). */
export async function requestStop(
  tx: Queryable,
  apply: ApplyTransition,
  vm: VmRow,
  now: Date,
  reason: StatusReason = 'user',
): Promise<VmRow> {
  return apply(
    tx,
    vm,
    'stop_requested',
    now,
    { hv_action: 'stop', next_action_at: now, attempts: 0, last_error: null, cpu_percent: 0, ram_percent: 0 },
    { reason },
  );
}

/** `userId` null: an administrator's destroy, of anyone's VM. */
export async function destroyVm(deps: ActionDeps, userId: number | null, ref: string): Promise<{ message: string }> {
  return deps.db.transaction(async (tx) => {
    const vm = await mustFind(tx, userId, ref, true);
    if (vm.status === 'destroyed') throw invalidState('The VM is already destroyed');
    const now = deps.clock.now();
    const reason = userId === null ? 'admin' : 'user';
    await deps.apply(
      tx,
      vm,
      'destroy',
      now,
      {
        // Cleanup on the hypervisor runs in the background and is retried until it succeeds.
        hv_action: 'destroy',
        next_action_at: now,
        attempts: 0,
        last_error: null,
        provision_secret: null,
        cpu_percent: 0,
        ram_percent: 0,
      },
      { reason },
    );
    await repo.closeInterruptions(tx, vm.id, 'abandoned', now);
    await recordEvent(tx, {
      type: 'vm.destroyed',
      userId: vm.user_id,
      vmId: vm.id,
      data: { vmid: vm.vmid, reason },
      at: now,
    });
    return { message: `VM ${vm.vmid} destroyed; its data is being erased` };
  });
}

export async function setLabel(
  db: Db,
  userId: number,
  ref: string,
  label: string | null,
): Promise<{ message: string }> {
  if (label !== null && !LABEL_RE.test(label)) {
    throw validation('body.instance_label', `${LABEL_RULE}, or null to clear it`);
  }
  return db.transaction(async (tx) => {
    const vm = await mustFind(tx, userId, ref, true);
    await repo.updateVm(tx, vm.id, { instance_label: label });
    return { message: label === null ? `Label of VM ${vm.vmid} cleared` : `Label of VM ${vm.vmid} set to "${label}"` };
  });
}

export async function setAutoRestart(db: Db, userId: number, ref: string, on: boolean): Promise<{ message: string }> {
  return db.transaction(async (tx) => {
    const vm = await mustFind(tx, userId, ref, true);
    if (vm.rental_type !== 'interruptible') {
      throw invalidState(`auto_restart applies to interruptible VMs only; this VM is ${vm.rental_type}`);
    }
    if (vm.status === 'destroyed') throw invalidState('The VM is destroyed');
    await repo.updateVm(tx, vm.id, { auto_restart: on });
    return { message: `Auto-restart ${on ? 'enabled' : 'disabled'} for VM ${vm.vmid}` };
  });
}
