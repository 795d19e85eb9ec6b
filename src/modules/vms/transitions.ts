/**
 * Writing a VM's status change (ARCHITECTURE invariant: the one place `status`
 * is written). lifecycle.ts decides the change; applyTransition writes it,
 * records its `vm.status_changed` event and runs the hooks of other modules.
 */
import type { Queryable } from '../../db/db.js';
import { invalidState } from '../../errors.js';
import { recordEvent } from '../events/service.js';
import { transition, type VmEvent } from './lifecycle.js';
import * as repo from './repository.js';
import type { VmRow } from './repository.js';

/** Why a VM's status changed, as `vm.status_changed` events say. */
export type StatusReason =
  | 'user'
  | 'admin'
  | 'low_balance'
  | 'suspended'
  | 'preempted'
  | 'auto_restart'
  | 'provisioned'
  | 'provision_failed'
  | 'started'
  | 'start_failed'
  | 'stopped'
  | 'guest_powered_off'
  | 'crashed'
  | 'node_offline'
  | 'node_online'
  | 'moved'
  | 'move_failed';

/** The reason a transition implies when its caller names none. */
const REASON_OF: Record<VmEvent, StatusReason> = {
  provisioned: 'provisioned',
  provision_failed: 'provision_failed',
  started: 'started',
  start_failed: 'start_failed',
  stop_requested: 'user',
  stopped: 'stopped',
  powered_off: 'guest_powered_off',
  start_requested: 'user',
  move_requested: 'user',
  moved: 'moved',
  move_failed: 'move_failed',
  preempted: 'preempted',
  node_offline: 'node_offline',
  node_online: 'node_online',
  destroy: 'user',
};

/** Statuses in which no QEMU process of the VM runs on its host. */
const ENDED = new Set<string>(['stopped', 'interrupted', 'failed', 'destroyed']);

/** Called inside the transaction of every status change (metering subscribes here). */
export type TransitionHook = (tx: Queryable, before: VmRow, after: VmRow, now: Date) => Promise<void>;

/**
 * applyTransition with its dependencies bound (VmService.applyTransition): what the other files of this module call.
 */
export type ApplyTransition = (
  tx: Queryable,
  vm: VmRow,
  event: VmEvent,
  now: Date,
  extra?: Partial<VmRow>,
  why?: { reason?: StatusReason; error?: string },
) => Promise<VmRow>;

export interface TransitionDeps {
  /** The hooks registered with VmService.onTransition, run in order. */
  hooks: readonly TransitionHook[];
  /** Notes, for after the commit, that the GPUs VMs hold may have changed. */
  gpuUsageChanged: (tx: Queryable) => void;
}

/**
 * The one place a VM's status is written (ARCHITECTURE invariant). A
 * change of status is recorded as a `vm.status_changed` event with its
 * reason (by default the one the transition implies; `why` names another,
 * e.g. low_balance for a stop, and may add the error).
 */
export async function applyTransition(
  deps: TransitionDeps,
  tx: Queryable,
  vm: VmRow,
  event: VmEvent,
  now: Date,
  extra: Partial<VmRow> = {},
  why: { reason?: StatusReason; error?: string } = {},
): Promise<VmRow> {
  const r = transition({ status: vm.status, rentalType: vm.rental_type, offlineFrom: vm.offline_from, event });
  if (!r.ok) throw invalidState(r.reason.charAt(0).toUpperCase() + r.reason.slice(1));
  const t = r.transition;
  const patch: Partial<VmRow> = { status: t.to, holds_gpus: t.holdsGpus, offline_from: t.offlineFrom, ...extra };
  if (t.setStartedAt) {
    patch.started_at = now;
    if (!vm.first_started_at) patch.first_started_at = now;
  }
  if (t.setStoppedAt) patch.stopped_at = now;
  if (t.to === 'destroyed') patch.destroyed_at = now;
  // A host binds a VM's devices only while it runs: one that ended holds none (docs/agent.md#gpus).
  if (ENDED.has(t.to) && vm.gpu_devices && vm.gpu_devices.length > 0 && extra.gpu_devices === undefined)
    patch.gpu_devices = [];
  const after = await repo.updateVm(tx, vm.id, patch);
  if (after.status !== vm.status) {
    const data = {
      vmid: vm.vmid,
      from: vm.status,
      to: after.status,
      reason: why.reason ?? REASON_OF[event],
      ...(why.error ? { error: why.error } : {}),
    };
    await recordEvent(tx, { type: 'vm.status_changed', userId: vm.user_id, vmId: vm.id, data, at: now });
  }
  deps.gpuUsageChanged(tx);
  for (const hook of deps.hooks) await hook(tx, vm, after, now);
  return after;
}
