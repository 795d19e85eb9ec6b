/**
 * What the hypervisor reports back (docs/vms.md#hypervisor-actions): the outcome
 * of a hypervisor action that ran, and a host agent's heartbeat report of its
 * VMs. Each is written to the VM as it is now, which may no longer be what it
 * was when the work began (destroyed, preempted, taken offline meanwhile).
 */
import type { Db } from '../../db/db.js';
import type { Clock } from '../../clock.js';
import type { HvAction, Provisioned } from '../../hypervisor/driver.js';
import * as repo from './repository.js';
import type { VmRow } from './repository.js';
import { requestStop } from './actions.js';
import { recordEvent } from '../events/service.js';
import type { ApplyTransition } from './transitions.js';

/** What a hypervisor action learnt; `built` when a failed start had provisioned the VM first. */
export type ActionOutcome =
  | { ok: true; hvRef?: string; ipAddress?: string; built?: Provisioned; gpuDevices?: string[]; bytes?: number }
  | { ok: false; error: string; built?: Provisioned };

export interface OutcomeDeps {
  db: Db;
  clock: Clock;
  apply: ApplyTransition;
}

/** The columns a finished build sets: the hypervisor's reference, address, SSH access and devices. */
function builtColumns(
  built: Provisioned | undefined,
  vm: VmRow,
  outcome?: { hvRef?: string; ipAddress?: string },
): Partial<VmRow> {
  return {
    provisioned: true,
    provision_secret: null,
    hv_ref: built?.hvRef ?? outcome?.hvRef ?? vm.hv_ref,
    ip_address: outcome?.ipAddress ?? built?.ipAddress ?? vm.ip_address,
    ...(built?.access ? { ssh_host: built.access.host, ssh_port: built.access.port, ssh_user: built.access.user } : {}),
    ...(built?.gpuDevices ? { gpu_devices: built.gpuDevices } : {}),
  };
}

/**
 * Writes the outcome of a hypervisor action back, if this claim still holds
 * the VM. The VM may have changed meanwhile (destroyed, preempted): the
 * outcome is applied to what it is now.
 */
export async function completeAction(
  deps: OutcomeDeps,
  vmId: string,
  token: string,
  action: HvAction,
  outcome: ActionOutcome,
): Promise<string | null> {
  return deps.db.transaction(async (tx) => {
    const vm = await repo.reclaim(tx, vmId, token);
    if (!vm) return null; // claim lost (lease expired and another instance took over)
    const now = deps.clock.now();
    const release = { claim_token: null, claimed_until: null } as Partial<VmRow>;
    const pending = vm.hv_action !== action ? { hv_action: vm.hv_action } : {};
    if (!outcome.ok) {
      const attempts = vm.attempts + 1;
      if (outcome.built) Object.assign(release, builtColumns(outcome.built, vm));
      if (vm.hv_action !== action) {
        await repo.updateVm(tx, vm.id, { ...release, last_error: outcome.error });
        return null;
      }
      if (action === 'move' && vm.status === 'moving') {
        await failMove(deps, tx, vm, now, outcome.error, { ...release, attempts });
        return vm.node;
      }
      if (action === 'provision' && vm.status === 'creating') {
        await deps.apply(
          tx,
          vm,
          'provision_failed',
          now,
          {
            ...release,
            hv_action: null,
            next_action_at: null,
            attempts,
            last_error: outcome.error,
            provision_secret: null,
          },
          { error: outcome.error },
        );
        return null;
      }
      if (action === 'start' && vm.status === 'starting') {
        await deps.apply(
          tx,
          vm,
          'start_failed',
          now,
          { ...release, hv_action: null, next_action_at: null, attempts, last_error: outcome.error },
          { error: outcome.error },
        );
        return null;
      }
      // stop and destroy are retried with backoff: 5 s doubling up to 5 min of service time.
      const delayS = Math.min(300, 5 * 2 ** Math.min(attempts - 1, 10));
      await repo.updateVm(tx, vm.id, {
        ...release,
        attempts,
        last_error: outcome.error,
        next_action_at: new Date(now.getTime() + delayS * 1000),
      });
      return null;
    }
    const base: Partial<VmRow> = { ...release, attempts: 0, last_error: null };
    if (vm.status === 'offline' && vm.hv_action === action) {
      // The node went offline while the hypervisor worked: keep what was built and leave the
      // action pending; it runs again once the node is back (a built VM is not provisioned twice).
      const built = action === 'provision' || action === 'start';
      await repo.updateVm(tx, vm.id, {
        ...base,
        ...(built ? builtColumns(outcome.built, vm, outcome) : {}),
        next_action_at: now,
      });
      return null;
    }
    if (action === 'provision') {
      Object.assign(base, builtColumns(outcome.built, vm, outcome));
      if (vm.status === 'creating' && vm.hv_action === 'provision') {
        await deps.apply(tx, vm, 'provisioned', now, { ...base, hv_action: 'start', next_action_at: now });
      } else {
        // Destroyed or preempted while provisioning: keep whatever is pending now.
        await repo.updateVm(tx, vm.id, {
          ...base,
          ...pending,
          hv_action: vm.hv_action === 'provision' ? null : vm.hv_action,
        });
      }
      return null;
    }
    if (vm.hv_action !== action) {
      await repo.updateVm(tx, vm.id, base); // superseded: the newer action runs next
      return null;
    }
    if (action === 'move' && vm.status === 'moving') {
      const from = vm.move_from ?? vm.node;
      const seconds = vm.move_started_at ? Math.max(0, (now.getTime() - vm.move_started_at.getTime()) / 1000) : 0;
      await deps.apply(tx, vm, 'moved', now, {
        ...base,
        ...builtColumns(outcome.built, vm, outcome),
        gpu_devices: [],
        move_from: null,
        move_started_at: null,
        hv_action: 'start',
        next_action_at: now,
      });
      await recordEvent(tx, {
        type: 'vm.moved',
        userId: vm.user_id,
        vmId: vm.id,
        data: { vmid: vm.vmid, from, to: vm.node, bytes: outcome.bytes ?? 0, seconds: Math.round(seconds * 10) / 10 },
        at: now,
      });
      return from === vm.node ? null : from;
    }
    const done = { ...base, hv_action: null, next_action_at: null } as Partial<VmRow>;
    if (action === 'start' && vm.status === 'starting') {
      // Simulated utilisation figures: steady per VM, so lists are stable.
      const up = await deps.apply(tx, vm, 'started', now, {
        ...done,
        ...builtColumns(outcome.built, vm, outcome),
        // The host binds devices at each start: these are the ones this run holds.
        ...(outcome.gpuDevices ? { gpu_devices: outcome.gpuDevices } : {}),
        cpu_percent: 5 + (vm.vmid % 40),
        ram_percent: 10 + (vm.vmid % 50),
      });
      await repo.closeInterruptions(tx, vm.id, 'restored', now);
      // A suspended user's VMs do not stay up, even one that was still coming up at the suspension.
      if (await repo.ownerSuspended(tx, vm.user_id)) await requestStop(tx, deps.apply, up, now);
    } else if (action === 'stop' && vm.status === 'stopping') {
      await deps.apply(tx, vm, 'stopped', now, done);
    } else {
      await repo.updateVm(tx, vm.id, done);
    }
    return null;
  });
}

/**
 * A move that did not finish: the VM is `stopped` again on the node its disk never left, with the
 * reason (docs/vms.md#start-on-another-host). Whatever reached the destination is removed after.
 */
export async function failMove(
  deps: { apply: ApplyTransition },
  tx: Parameters<ApplyTransition>[0],
  vm: VmRow,
  now: Date,
  error: string,
  extra: Partial<VmRow> = {},
): Promise<void> {
  const from = vm.move_from ?? vm.node;
  await deps.apply(
    tx,
    vm,
    'move_failed',
    now,
    {
      ...extra,
      node: from,
      move_from: null,
      move_started_at: null,
      hv_action: null,
      next_action_at: null,
      last_error: error,
    },
    { error },
  );
  await recordEvent(tx, {
    type: 'vm.move_failed',
    userId: vm.user_id,
    vmId: vm.id,
    data: { vmid: vm.vmid, from, to: vm.node, error },
    at: now,
  });
}

/**
 * What a node's agent says about its VMs. A running VM whose QEMU is no
 * longer running (the guest powered itself off, or the process died) is
 * stopped, billed as a stop; traffic counters are taken as they are.
 * Returns the VMs that were stopped.
 */
export async function agentReport(
  deps: OutcomeDeps,
  node: string,
  reported: {
    id: string;
    state: string;
    exit_reason: string | null;
    traffic: { rx_bytes: number; tx_bytes: number };
  }[],
): Promise<string[]> {
  const byId = new Map(reported.map((r) => [r.id, r]));
  const stopped: string[] = [];
  for (const vm of await repo.idleRunningOnNode(deps.db, node)) {
    const r = byId.get(vm.id);
    if (!r) continue; // unknown to the agent: nothing to go on, leave it to the next action
    const bytes = r.traffic.rx_bytes + r.traffic.tx_bytes;
    if (bytes > 0) await repo.raiseTraffic(deps.db, vm.id, bytes);
    if (r.state !== 'stopped') continue;
    const reason = r.exit_reason === 'crashed' ? 'the VM process on its host ended' : 'the guest powered itself off';
    const done = await deps.db.transaction(async (tx) => {
      const current = await repo.findVm(tx, { id: vm.id }, null, true);
      // Re-checked under the row lock: an action claimed meanwhile wins.
      if (!current || current.status !== 'running' || current.hv_action !== null || current.claim_token !== null)
        return false;
      await deps.apply(
        tx,
        current,
        'powered_off',
        deps.clock.now(),
        { last_error: reason, cpu_percent: 0, ram_percent: 0 },
        {
          reason: r.exit_reason === 'crashed' ? 'crashed' : 'guest_powered_off',
        },
      );
      return true;
    });
    if (done) stopped.push(vm.id);
  }
  return stopped;
}
