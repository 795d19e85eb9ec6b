/**
 * Auto-restart (docs/vms.md#auto-restart): interrupted VMs with auto_restart
 * go back to `starting`, on every pass of hypervisor actions, when their node is
 * active with the GPUs free and their owner has the money a manual start needs.
 */
import type { Db } from '../../db/db.js';
import type { Clock } from '../../clock.js';
import * as ledger from '../billing/ledger.js';
import type { InventoryService } from '../inventory/service.js';
import { recordEvent } from '../events/service.js';
import * as repo from './repository.js';
import { committedHourly } from './rates.js';
import { freeGpus } from './placement.js';
import { checkStartLimit } from './create.js';
import { AppError } from '../../errors.js';
import type { ApplyTransition } from './transitions.js';

export interface AutoRestartDeps {
  db: Db;
  clock: Clock;
  inventory: InventoryService;
  apply: ApplyTransition;
}

/** Thrown inside an auto-restart's transaction to roll its change back: the VM stays interrupted for now. */
class StaysInterrupted extends Error {}

/**
 * Interrupted VMs with auto_restart go back to starting as soon as their node has the GPUs free
 * (docs/vms.md#auto-restart).
 */
export async function autoRestartDue(deps: AutoRestartDeps): Promise<number> {
  const candidates = await repo.autoRestartCandidates(deps.db, 50);
  let restarted = 0;
  for (const c of candidates) {
    const ok = await deps.db
      .transaction(async (tx) => {
        // The lock order of a manual start (docs/billing.md#lock-order): the node, the VM, the change (which
        // runs the meter), then the balance for the limit and the money; a refusal rolls the change back.
        const node = await deps.inventory.lockNode(tx, c.node);
        const vm = await repo.findVm(tx, { id: c.id }, null, true);
        if (!node || node.status !== 'active' || !vm || vm.status !== 'interrupted' || !vm.auto_restart) return false;
        if ((await freeGpus(tx, deps.inventory, vm.node, node.gpu_count)) < vm.gpu_count) return false;
        const now = deps.clock.now();
        await deps.apply(
          tx,
          vm,
          'start_requested',
          now,
          { hv_action: 'start', next_action_at: now, attempts: 0, last_error: null },
          { reason: 'auto_restart' },
        );
        // An automatic restart meets the GPU limit and needs the money a manual start would (an
        // out-of-credit user, or one at the limit, stays interrupted).
        const balance = await ledger.lockBalance(tx, c.user_id);
        let mine;
        try {
          mine = await checkStartLimit(tx, vm);
        } catch (err) {
          if (err instanceof AppError && err.code === 'limit_exceeded') throw new StaysInterrupted();
          throw err;
        }
        if (balance < vm.gpu_hourly_rate_micros + vm.storage_hourly_rate_micros + committedHourly(mine, vm.id)) {
          throw new StaysInterrupted();
        }
        await recordEvent(tx, {
          type: 'vm.restarted',
          userId: vm.user_id,
          vmId: vm.id,
          data: { vmid: vm.vmid },
          at: now,
        });
        return true;
      })
      .catch((err: unknown) => {
        if (err instanceof StaysInterrupted) return false;
        throw err;
      });
    if (ok) restarted++;
  }
  return restarted;
}
