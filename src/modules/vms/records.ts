/**
 * What the API shows of VMs and interruption records, and how a `{vm_id}`
 * finds its VM (docs/vms.md#labels-access-and-lists).
 */
import type { Static } from 'typebox';
import type { Db, Queryable } from '../../db/db.js';
import { notFound } from '../../errors.js';
import { UUID_RE } from '../../ids.js';
import { toAmount } from '../../money.js';
import * as repo from './repository.js';
import type { InterruptionRow, VmRow } from './repository.js';
import { findListedVm, type ListedVmRow } from './listed-repository.js';
import type { AdminVmSchema, InterruptionSchema, VmSchema } from './schemas.js';

/** A label is 1..32 printable ASCII characters (space to tilde). */
export const LABEL_RE = /^[\x20-\x7e]{1,32}$/;
export const LABEL_RULE = 'must be 1 to 32 printable ASCII characters';

/** A VM as its owner sees it (GET /vms); the schema is the one place its fields are written. */
export type VmRecord = Static<typeof VmSchema>;
/** A VM as operators see it (GET /admin/vms). */
export type AdminVmRecord = Static<typeof AdminVmSchema>;
export type InterruptionRecord = Static<typeof InterruptionSchema>;

const iso = (d: Date | null) => (d ? d.toISOString() : null);

export const toVmRecord = (v: ListedVmRow): VmRecord => ({
  id: v.id,
  vmid: v.vmid,
  user_id: v.user_id,
  node: v.node,
  instance_label: v.instance_label,
  gpu_type: v.gpu_type,
  gpu_count: v.gpu_count,
  storage_gb: v.storage_gb,
  ram_gb: v.ram_gb,
  cpu_cores: v.cpu_cores,
  ip_address: v.ip_address,
  status: v.status,
  created_at: v.created_at.toISOString(),
  started_at: iso(v.started_at),
  stopped_at: iso(v.stopped_at),
  rental_type: v.rental_type,
  reservation_id: v.reservation_id,
  auto_restart: v.auto_restart,
  hourly_rate: toAmount(v.gpu_hourly_rate_micros + v.storage_hourly_rate_micros),
  gpu_hourly_rate: toAmount(v.gpu_hourly_rate_micros),
  storage_hourly_rate: toAmount(v.storage_hourly_rate_micros),
  cpu_percent: v.status === 'running' ? v.cpu_percent : 0,
  ram_percent: v.status === 'running' ? v.ram_percent : 0,
  cpu_model: v.cpu_model,
  pcie_gen: v.pcie_gen,
  template_vmid: v.template_vmid,
  destroyed_at: iso(v.destroyed_at),
  http_ports: v.http_ports,
  // A failed VM says why (the hypervisor's reason, e.g. a template the host lacks); others have none.
  failure_reason: v.status === 'failed' ? (v.last_error ?? 'provisioning failed') : null,
  image_id: v.image_id,
});

export const toAdminVmRecord = (v: ListedVmRow): AdminVmRecord => ({
  ...toVmRecord(v),
  gpu_devices: v.gpu_devices,
  last_error: v.last_error,
});

export const toInterruptionRecord = (i: InterruptionRow): InterruptionRecord => ({
  id: i.id,
  interruptible_vm_id: i.interruptible_vm_id,
  preempted_by_vm_id: i.preempted_by_vm_id,
  preempted_at: i.preempted_at.toISOString(),
  restored_at: iso(i.restored_at),
  downtime_seconds: i.downtime_seconds,
  status: i.status,
});

/** `{vm_id}` is the uuid or the integer vmid; anything else can never exist. */
export function parseVmRef(raw: string): { id?: string; vmid?: number } | null {
  if (/^\d{1,9}$/.test(raw)) return { vmid: Number(raw) };
  if (UUID_RE.test(raw)) return { id: raw.toLowerCase() };
  return null;
}

/**
 * What the record of the VM a `{vm_id}` names shows (of `userId`, or anyone's when null), else 404: an unknown VM
 * and another user's look the same.
 */
export async function mustFindListed(
  db: Pick<Db, 'kind' | 'query'>,
  userId: number | null,
  rawRef: string,
): Promise<ListedVmRow> {
  const ref = parseVmRef(rawRef);
  const vm = ref ? await findListedVm(db, ref, userId) : undefined;
  if (!vm) throw notFound('VM');
  return vm;
}

/** Like mustFindListed, but the whole row (for a change: `forUpdate` locks it). */
export async function mustFind(q: Queryable, userId: number | null, rawRef: string, forUpdate = false): Promise<VmRow> {
  const ref = parseVmRef(rawRef);
  const vm = ref ? await repo.findVm(q, ref, userId, forUpdate) : undefined;
  if (!vm) throw notFound('VM');
  return vm;
}
