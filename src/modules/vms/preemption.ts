/**
 * Preempting an interruptible VM for an on-demand or reserved create, inside
 * that create's transaction (docs/vms.md#preemption): placement.ts picks the
 * victims; each becomes `interrupted`, gets an interruption record and a
 * `vm.interrupted` event.
 */
import type { Queryable } from '../../db/db.js';
import { newId } from '../../ids.js';
import { recordEvent } from '../events/service.js';
import * as repo from './repository.js';
import type { VmRow } from './repository.js';
import type { ApplyTransition } from './transitions.js';

export async function preempt(
  tx: Queryable,
  apply: ApplyTransition,
  victim: VmRow,
  byId: string,
  now: Date,
): Promise<void> {
  await apply(tx, victim, 'preempted', now, {
    // Stop it on the hypervisor if it was built; a VM preempted while provisioning has nothing to stop.
    hv_action: victim.provisioned ? 'stop' : null,
    next_action_at: victim.provisioned ? now : null,
    attempts: 0,
    cpu_percent: 0,
    ram_percent: 0,
  });
  await repo.insertInterruption(tx, {
    id: newId(),
    interruptible_vm_id: victim.id,
    preempted_by_vm_id: byId,
    preempted_at: now,
  });
  await recordEvent(tx, {
    type: 'vm.interrupted',
    userId: victim.user_id,
    vmId: victim.id,
    data: { vmid: victim.vmid, auto_restart: victim.auto_restart === true },
    at: now,
  });
}
