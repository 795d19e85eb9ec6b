/**
 * VMs (see docs/vms.md): the rules of create, start, stop, destroy, label,
 * auto-restart, access and interruptions. Every status change goes through
 * applyTransition (lifecycle.ts decides, this writes); hypervisor work is left
 * to the reconcilers through `hv_action`, never done inside a request.
 */
import type { Db, Queryable } from '../../db/db.js';
import { realTimeMs, type Clock } from '../../clock.js';
import { AppError, invalidState, notFound, validation } from '../../errors.js';
import { newId, UUID_RE } from '../../ids.js';
import { discounted, formatAmount, toAmount } from '../../money.js';
import { deriveKey, open, seal } from '../../crypto.js';
import type { HvAction, Provisioned, VmSpec } from '../../hypervisor/driver.js';
import * as ledger from '../billing/ledger.js';
import type { InventoryService } from '../inventory/service.js';
import type { PricingRow } from '../inventory/repository.js';
import type { SshKeyService } from '../ssh-keys/service.js';
import type { TokenService } from '../auth/tokens.js';
import { quote, type Months, type ReservationService } from '../reservations/service.js';
import { holdsGpus, transition, PREEMPTIBLE, type RentalType, type VmEvent, type VmStatus } from './lifecycle.js';
import * as repo from './repository.js';
import type { InterruptionRow, VmRow } from './repository.js';
import { afterCommit } from '../../db/commit-hook.js';
import { recordEvent } from '../events/repository.js';

export const DEFAULT_MAX_VMS = 10;
export const DEFAULT_MAX_GPUS = 16;
export const LAUNCH_TOKEN_TTL_S = 300;
/** A label is 1..32 printable ASCII characters (space to tilde). */
export const LABEL_RE = /^[\x20-\x7e]{1,32}$/;
const LABEL_RULE = 'must be 1 to 32 printable ASCII characters';
export const WEB_TEMPLATES = new Set([102, 103, 104]);
export const TEMPLATES: Record<number, string> = {
  100: 'Ubuntu 22.04 with GPU drivers',
  101: 'Ubuntu 24.04 with GPU drivers',
  102: 'Stable Diffusion WebUI',
  103: 'ComfyUI (node-based image/video/audio generation)',
  104: 'Linux desktop in the browser',
};

export interface CreateVmInput {
  node: string;
  gpu_type: string;
  gpu_count: number;
  storage_gb: number;
  template_vmid: number;
  rental_type?: RentalType;
  reservation_months?: number;
  auth_method?: 'ssh_key' | 'password';
  ssh_key_id?: string;
  password?: string;
  instance_label?: string | null;
}

export interface VmRecord {
  id: string;
  vmid: number;
  user_id: number;
  node: string;
  instance_label: string | null;
  gpu_type: string;
  gpu_count: number;
  storage_gb: number;
  ram_gb: number;
  cpu_cores: number;
  ip_address: string | null;
  status: VmStatus;
  created_at: string;
  started_at: string | null;
  stopped_at: string | null;
  rental_type: RentalType;
  reservation_id: string | null;
  auto_restart: boolean | null;
  hourly_rate: number;
  gpu_hourly_rate: number;
  storage_hourly_rate: number;
  cpu_percent: number;
  ram_percent: number;
  cpu_model: string | null;
  pcie_gen: string | null;
  template_vmid: number;
  destroyed_at: string | null;
}

export interface InterruptionRecord {
  id: string;
  interruptible_vm_id: string;
  preempted_by_vm_id: string;
  preempted_at: string;
  restored_at: string | null;
  downtime_seconds: number | null;
  status: InterruptionRow['status'];
}

const iso = (d: Date | null) => (d ? d.toISOString() : null);

export const toVmRecord = (v: VmRow): VmRecord => ({
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
});

const toInterruptionRecord = (i: InterruptionRow): InterruptionRecord => ({
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

/** The rates fixed on the VM at creation (later price changes apply to new VMs only). */
export function ratesFor(p: PricingRow, rental: RentalType, gpuCount: number, storageGb: number, months?: number) {
  let perGpu = p.gpu_price_hourly_micros;
  if (rental === 'interruptible') perGpu = p.interruptible_rate_micros;
  if (rental === 'reserved') {
    const bp = months === 6 ? p.reserved_discount_6mo_bp : months === 3 ? p.reserved_discount_3mo_bp : p.reserved_discount_1mo_bp;
    perGpu = discounted(p.gpu_price_hourly_micros, bp);
  }
  const gpu = gpuCount * perGpu;
  const storage = storageGb * p.storage_price_gb_hourly_micros;
  return { gpu, storage, total: gpu + storage };
}

/** What a VM commits the user to per hour from the credit balance (reserved VMs draw on their reservation). */
export function committedHourly(vms: VmRow[], excludeId?: string): number {
  let sum = 0;
  for (const v of vms) {
    if (v.id === excludeId || v.rental_type === 'reserved') continue;
    if (v.status === 'destroyed' || v.status === 'failed') continue;
    sum += v.status === 'stopped' ? v.storage_hourly_rate_micros : v.gpu_hourly_rate_micros + v.storage_hourly_rate_micros;
  }
  return sum;
}

/** What a reconciler learnt from the hypervisor; `built` when a failed start had provisioned the VM first. */
export type ActionOutcome =
  | { ok: true; hvRef?: string; ipAddress?: string; built?: Provisioned }
  | { ok: false; error: string; built?: Provisioned };

/** The columns a finished build sets: the hypervisor's reference, address, SSH access and devices. */
function builtColumns(built: Provisioned | undefined, vm: VmRow, outcome?: { hvRef?: string; ipAddress?: string }): Partial<VmRow> {
  return {
    provisioned: true,
    provision_secret: null,
    hv_ref: built?.hvRef ?? outcome?.hvRef ?? vm.hv_ref,
    ip_address: outcome?.ipAddress ?? built?.ipAddress ?? vm.ip_address,
    ...(built?.access ? { ssh_host: built.access.host, ssh_port: built.access.port, ssh_user: built.access.user } : {}),
    ...(built?.gpuDevices ? { gpu_devices: built.gpuDevices } : {}),
  };
}

/** Called inside the transaction of every status change (metering subscribes here). */
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
  | 'node_online';

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
  preempted: 'preempted',
  node_offline: 'node_offline',
  node_online: 'node_online',
  destroy: 'user',
};

export type TransitionHook = (tx: Queryable, before: VmRow, after: VmRow, now: Date) => Promise<void>;

export interface Principalish {
  userId: number;
}

export class VmService {
  private readonly transitionHooks: TransitionHook[] = [];
  private readonly usageHooks: (() => void)[] = [];
  private readonly secretKey: Buffer;

  constructor(
    private readonly db: Db,
    private readonly clock: Clock,
    private readonly inventory: InventoryService,
    private readonly sshKeys: SshKeyService,
    private readonly tokens: TokenService,
    private readonly opts: { provisionDelayMs: number; secret: string; portalUrl: string },
  ) {
    this.secretKey = deriveKey(opts.secret, 'vm-provision-secret');
  }

  /** Called after a transaction that changed which GPUs VMs hold (a new VM, a status, a rental type) has committed. */
  onGpuUsageChange(hook: () => void): void {
    this.usageHooks.push(hook);
  }

  private gpuUsageChanged(tx: Queryable): void {
    afterCommit(tx, () => {
      for (const hook of this.usageHooks) hook();
    });
  }

  onTransition(hook: TransitionHook): void {
    this.transitionHooks.push(hook);
  }

  private reservations: ReservationService | undefined;

  /** Reserved VMs need the reservation module (it takes their deposit at creation); wired in app.ts. */
  useReservations(reservations: ReservationService): void {
    this.reservations = reservations;
  }

  /**
   * A reserved VM whose reservation is cancelled or ends goes on as on-demand at the current on-demand price
   * (its open period was closed by the caller). False when the VM is gone.
   */
  async convertToOnDemand(tx: Queryable, vmId: string, _now: Date): Promise<boolean> {
    const vm = await repo.findVm(tx, { id: vmId }, null, true);
    if (!vm || vm.status === 'destroyed' || vm.status === 'failed') return false;
    if (vm.rental_type !== 'reserved') return true;
    const pricing = await this.inventory.pricingFor(tx, vm.gpu_type);
    const rates = ratesFor(pricing, 'on_demand', vm.gpu_count, vm.storage_gb);
    await repo.updateVm(tx, vm.id, {
      rental_type: 'on_demand',
      gpu_hourly_rate_micros: rates.gpu,
      storage_hourly_rate_micros: rates.storage,
      // A stopped reserved VM held its GPUs; as on-demand it no longer does.
      holds_gpus: holdsGpus(vm.status, 'on_demand', vm.offline_from),
    });
    this.gpuUsageChanged(tx);
    return true;
  }

  /**
   * The one place a VM's status is written (ARCHITECTURE invariant). A
   * change of status is recorded as a `vm.status_changed` event with its
   * reason (by default the one the transition implies; `why` names another,
   * e.g. low_balance for a stop, and may add the error).
   */
  async applyTransition(
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
    const after = await repo.updateVm(tx, vm.id, patch);
    if (after.status !== vm.status) {
      const data = { vmid: vm.vmid, from: vm.status, to: after.status, reason: why.reason ?? REASON_OF[event], ...(why.error ? { error: why.error } : {}) };
      await recordEvent(tx, { type: 'vm.status_changed', userId: vm.user_id, vmId: vm.id, data, at: now });
    }
    this.gpuUsageChanged(tx);
    for (const hook of this.transitionHooks) await hook(tx, vm, after, now);
    return after;
  }

  private async mustFind(q: Queryable, userId: number | null, rawRef: string, forUpdate = false): Promise<VmRow> {
    const ref = parseVmRef(rawRef);
    const vm = ref ? await repo.findVm(q, ref, userId, forUpdate) : undefined;
    if (!vm) throw notFound('VM');
    return vm;
  }

  // ---- create (see docs/vms.md#the-order-of-the-checks) ----

  async create(userId: number, input: CreateVmInput): Promise<VmRecord> {
    const rental: RentalType = input.rental_type ?? 'on_demand';
    const authMethod = input.auth_method ?? 'ssh_key';
    // Cross-field validation (422), after the schema's per-field rules.
    if (rental === 'reserved' && input.reservation_months === undefined) {
      throw validation('body.reservation_months', 'is required when rental_type is reserved (1, 3 or 6)');
    }
    if (rental !== 'reserved' && input.reservation_months !== undefined) {
      throw validation('body.reservation_months', 'is only allowed when rental_type is reserved');
    }
    if (authMethod === 'password' && input.password === undefined) {
      throw validation('body.password', 'is required when auth_method is password (at least 12 characters)');
    }
    if (authMethod === 'ssh_key' && input.password !== undefined) {
      throw validation('body.password', 'is only allowed when auth_method is password');
    }
    if (authMethod === 'password' && input.ssh_key_id !== undefined) {
      throw validation('body.ssh_key_id', 'is only allowed when auth_method is ssh_key');
    }
    if (input.instance_label != null && !LABEL_RE.test(input.instance_label)) {
      throw validation('body.instance_label', LABEL_RULE);
    }

    return this.db.transaction(async (tx) => {
      const now = this.clock.now();
      // Serializes this user's creates so that together they never pass the balance check on the same money.
      const balance = await ledger.lockBalance(tx, userId);
      const node = await this.inventory.lockNode(tx, input.node);
      if (!node) throw new AppError('gpu_unavailable', `Node ${input.node} does not exist`);
      if (node.status !== 'active') throw new AppError('gpu_unavailable', `Node ${input.node} is ${node.status} and accepts no new VMs`);
      if (node.gpu_type !== input.gpu_type) {
        throw new AppError('gpu_unavailable', `Node ${input.node} has ${node.gpu_type} GPUs, not ${input.gpu_type}`);
      }
      let free = node.gpu_count - (await this.inventory.usage(tx, node.node)).held;
      // Interruptible VMs this one may preempt (docs/vms.md#preemption), locked before they are counted on: one
      // that starts stopping meanwhile still holds its GPUs but can no longer be preempted, so it
      // must not count as takeable. Behind the locks the usage is read again.
      let victims: VmRow[] = [];
      if (rental !== 'interruptible' && free < input.gpu_count) {
        victims = await repo.preemptionCandidates(tx, node.node, PREEMPTIBLE);
        free = node.gpu_count - (await this.inventory.usage(tx, node.node)).held;
      }
      const takeable = free + victims.reduce((sum, v) => sum + v.gpu_count, 0);
      if (takeable < input.gpu_count) {
        throw new AppError(
          'gpu_unavailable',
          `Node ${node.node} has ${Math.max(0, takeable)} ${rental === 'interruptible' ? 'free' : 'available'} GPU(s); ${input.gpu_count} requested`,
        );
      }
      if (input.storage_gb > node.max_storage_gb) {
        throw new AppError('limit_exceeded', `storage_gb ${input.storage_gb} exceeds the node's maximum of ${node.max_storage_gb} GB`);
      }
      const limits = await tx.query<{ max_vms: number | null; max_gpus: number | null }>('SELECT max_vms, max_gpus FROM users WHERE id = $1', [userId]);
      const maxVms = limits.rows[0]?.max_vms ?? DEFAULT_MAX_VMS;
      const maxGpus = limits.rows[0]?.max_gpus ?? DEFAULT_MAX_GPUS;
      const mine = await repo.userVmsForLimits(tx, userId);
      if (mine.length + 1 > maxVms) throw new AppError('limit_exceeded', `VM limit reached: at most ${maxVms} VMs per account (destroy one first)`);
      const gpusInUse = mine.filter((v) => v.holds_gpus).reduce((s, v) => s + v.gpu_count, 0);
      if (gpusInUse + input.gpu_count > maxGpus) {
        throw new AppError('limit_exceeded', `GPU limit reached: ${gpusInUse} of ${maxGpus} GPUs in use, ${input.gpu_count} requested`);
      }
      const pricing = await this.inventory.pricingFor(tx, node.gpu_type);
      const rates = ratesFor(pricing, rental, input.gpu_count, input.storage_gb, input.reservation_months);
      // A reserved VM needs its deposit (the whole commitment, prepaid); others one hour of their own
      // rate plus one hour of the user's committed spend.
      const reservationQuote =
        rental === 'reserved' ? quote(pricing, input.gpu_count, input.storage_gb, input.reservation_months as Months) : undefined;
      if (reservationQuote) {
        if (balance < reservationQuote.depositMicros) {
          throw new AppError(
            'insufficient_balance',
            `Insufficient balance: required ${formatAmount(reservationQuote.depositMicros)} (the deposit of a ${reservationQuote.months}-month reservation), available ${formatAmount(balance)}`,
          );
        }
      } else {
        const required = rates.total + committedHourly(mine);
        if (balance < required) {
          throw new AppError(
            'insufficient_balance',
            `Insufficient balance: required ${formatAmount(required)} (one hour of this VM at ${formatAmount(rates.total)}/h plus one hour of your other VMs), available ${formatAmount(balance)}`,
          );
        }
      }
      let sshKeyId: string | null = null;
      let sshPublicKey: string | null = null;
      if (authMethod === 'ssh_key') {
        // A malformed id can name no key: 404 like an unknown one, at this step of the order (the key comes last).
        if (input.ssh_key_id !== undefined && !UUID_RE.test(input.ssh_key_id)) throw notFound('SSH key');
        const key = await this.sshKeys.publicKeyFor(tx, userId, input.ssh_key_id);
        if (!key && input.ssh_key_id) throw notFound('SSH key');
        if (!key) throw invalidState('You have no SSH key: upload one with POST /ssh-keys, or use auth_method "password"');
        sshKeyId = key.id;
        sshPublicKey = key.public_key;
      }

      const id = newId();
      const reservationId = reservationQuote ? newId() : null;
      this.gpuUsageChanged(tx);
      const vm = await repo.insertVm(tx, {
        id,
        user_id: userId,
        node: node.node,
        instance_label: input.instance_label ?? null,
        gpu_type: node.gpu_type,
        gpu_count: input.gpu_count,
        storage_gb: input.storage_gb,
        ram_gb: Math.max(1, Math.floor((node.ram_gb * input.gpu_count) / node.gpu_count)),
        cpu_cores: Math.max(1, Math.floor((node.cpu_cores * input.gpu_count) / node.gpu_count)),
        cpu_model: node.cpu_model,
        pcie_gen: node.pcie_gen,
        template_vmid: input.template_vmid,
        status: 'creating',
        holds_gpus: true,
        rental_type: rental,
        reservation_id: reservationId,
        auto_restart: rental === 'interruptible' ? true : null,
        gpu_hourly_rate_micros: rates.gpu,
        storage_hourly_rate_micros: rates.storage,
        auth_method: authMethod,
        ssh_key_id: sshKeyId,
        ssh_public_key: sshPublicKey,
        provision_secret: input.password ? seal(this.secretKey, input.password) : null,
        created_at: now,
        // The simulated provisioning delay is the simulator's; a host agent takes the real time it takes.
        next_action_at: new Date(now.getTime() + (node.agent_url ? 0 : this.opts.provisionDelayMs)),
        hv_action: 'provision',
      });
      await recordEvent(tx, {
        type: 'vm.created',
        userId,
        vmId: vm.id,
        data: { vmid: vm.vmid, node: vm.node, gpu_type: vm.gpu_type, gpu_count: vm.gpu_count, storage_gb: vm.storage_gb, rental_type: vm.rental_type },
        at: now,
      });

      if (reservationQuote && this.reservations) {
        // The reservation and its deposit in the same transaction as the VM.
        await this.reservations.createForVm(tx, {
          id: reservationId!,
          userId,
          vmId: vm.id,
          vmid: vm.vmid,
          gpuType: vm.gpu_type,
          gpuCount: vm.gpu_count,
          storageGb: vm.storage_gb,
          quote: reservationQuote,
          now,
        });
      }

      // Preempt interruptible VMs (most recently started first) only for the GPUs that are not free.
      let missing = input.gpu_count - free;
      for (const victim of victims) {
        if (missing <= 0) break;
        await this.preempt(tx, victim, vm.id, now);
        missing -= victim.gpu_count;
      }
      return toVmRecord(vm);
    });
  }

  private async preempt(tx: Queryable, victim: VmRow, byId: string, now: Date): Promise<void> {
    await this.applyTransition(tx, victim, 'preempted', now, {
      // Stop it on the hypervisor if it was built; a VM preempted while provisioning has nothing to stop.
      hv_action: victim.provisioned ? 'stop' : null,
      next_action_at: victim.provisioned ? now : null,
      attempts: 0,
      cpu_percent: 0,
      ram_percent: 0,
    });
    await repo.insertInterruption(tx, { id: newId(), interruptible_vm_id: victim.id, preempted_by_vm_id: byId, preempted_at: now });
    await recordEvent(tx, { type: 'vm.interrupted', userId: victim.user_id, vmId: victim.id, data: { vmid: victim.vmid, auto_restart: victim.auto_restart === true }, at: now });
  }

  // ---- read ----

  async list(userId: number | undefined, f: Omit<repo.VmFilter, 'userId'>): Promise<{ items: VmRecord[]; total: number }> {
    const r = await repo.listVms(this.db, { ...f, userId });
    return { items: r.rows.map(toVmRecord), total: r.total };
  }

  /** The operator's view: also the host devices a VM was given and the hypervisor's last error. */
  async adminList(f: Omit<repo.VmFilter, 'userId'> & { userId?: number }): Promise<{ items: (VmRecord & { gpu_devices: string[] | null; last_error: string | null })[]; total: number }> {
    const r = await repo.listVms(this.db, f);
    return { items: r.rows.map((v) => ({ ...toVmRecord(v), gpu_devices: v.gpu_devices, last_error: v.last_error })), total: r.total };
  }

  async get(userId: number, ref: string): Promise<VmRecord> {
    return toVmRecord(await this.mustFind(this.db, userId, ref));
  }

  async interruptions(userId: number, ref: string, limit: number, offset: number): Promise<{ items: InterruptionRecord[]; total: number }> {
    const vm = await this.mustFind(this.db, userId, ref);
    const r = await repo.listInterruptions(this.db, vm.id, limit, offset);
    return { items: r.rows.map(toInterruptionRecord), total: r.total };
  }

  // ---- actions (see docs/vms.md#what-each-action-does-in-each-state) ----

  async start(userId: number, ref: string): Promise<{ message: string }> {
    return this.db.transaction(async (tx) => {
      const balance = await ledger.lockBalance(tx, userId);
      const vm = await this.mustFind(tx, userId, ref, true);
      if (vm.status !== 'stopped' && vm.status !== 'interrupted') {
        throw invalidState(`Cannot start a VM that is ${vm.status}: start needs a stopped or interrupted VM`);
      }
      const node = await this.inventory.lockNode(tx, vm.node);
      if (!node || node.status === 'offline') throw new AppError('gpu_unavailable', `Node ${vm.node} is offline`);
      if (!vm.holds_gpus) {
        const usage = await this.inventory.usage(tx, vm.node);
        const free = node.gpu_count - usage.held;
        if (free < vm.gpu_count) {
          throw new AppError('gpu_unavailable', `Node ${vm.node} has ${Math.max(0, free)} free GPU(s); this VM needs ${vm.gpu_count}`);
        }
      }
      if (vm.rental_type !== 'reserved') {
        const mine = await repo.userVmsForLimits(tx, userId);
        const own = vm.gpu_hourly_rate_micros + vm.storage_hourly_rate_micros;
        const required = own + committedHourly(mine, vm.id);
        if (balance < required) {
          throw new AppError(
            'insufficient_balance',
            `Insufficient balance: required ${formatAmount(required)} (one hour of this VM plus one hour of your other VMs), available ${formatAmount(balance)}`,
          );
        }
      }
      await this.applyTransition(tx, vm, 'start_requested', this.clock.now(), { hv_action: 'start', next_action_at: this.clock.now(), attempts: 0, last_error: null });
      return { message: `VM ${vm.vmid} is starting` };
    });
  }

  async stop(userId: number, ref: string): Promise<{ message: string }> {
    return this.db.transaction(async (tx) => {
      const vm = await this.mustFind(tx, userId, ref, true);
      if (vm.status !== 'running') throw invalidState(`Cannot stop a VM that is ${vm.status}: stop needs a running VM`);
      await this.requestStop(tx, vm, this.clock.now());
      return { message: `VM ${vm.vmid} is stopping; GPU billing paused, storage continues` };
    });
  }

  private async requestStop(tx: Queryable, vm: VmRow, now: Date, reason: StatusReason = 'user'): Promise<VmRow> {
    return this.applyTransition(tx, vm, 'stop_requested', now, { hv_action: 'stop', next_action_at: now, attempts: 0, last_error: null, cpu_percent: 0, ram_percent: 0 }, { reason });
  }

  async destroy(userId: number | null, ref: string): Promise<{ message: string }> {
    return this.db.transaction(async (tx) => {
      const vm = await this.mustFind(tx, userId, ref, true);
      if (vm.status === 'destroyed') throw invalidState('The VM is already destroyed');
      const now = this.clock.now();
      const reason = userId === null ? 'admin' : 'user';
      await this.applyTransition(
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
      await recordEvent(tx, { type: 'vm.destroyed', userId: vm.user_id, vmId: vm.id, data: { vmid: vm.vmid, reason }, at: now });
      return { message: `VM ${vm.vmid} destroyed; its data is being erased` };
    });
  }

  async setLabel(userId: number, ref: string, label: string | null): Promise<{ message: string }> {
    if (label !== null && !LABEL_RE.test(label)) {
      throw validation('body.instance_label', `${LABEL_RULE}, or null to clear it`);
    }
    return this.db.transaction(async (tx) => {
      const vm = await this.mustFind(tx, userId, ref, true);
      await repo.updateVm(tx, vm.id, { instance_label: label });
      return { message: label === null ? `Label of VM ${vm.vmid} cleared` : `Label of VM ${vm.vmid} set to "${label}"` };
    });
  }

  async setAutoRestart(userId: number, ref: string, on: boolean): Promise<{ message: string }> {
    return this.db.transaction(async (tx) => {
      const vm = await this.mustFind(tx, userId, ref, true);
      if (vm.rental_type !== 'interruptible') {
        throw invalidState(`auto_restart applies to interruptible VMs only; this VM is ${vm.rental_type}`);
      }
      if (vm.status === 'destroyed') throw invalidState('The VM is destroyed');
      await repo.updateVm(tx, vm.id, { auto_restart: on });
      return { message: `Auto-restart ${on ? 'enabled' : 'disabled'} for VM ${vm.vmid}` };
    });
  }

  /** `launchTokens`: whether the caller may have WebUI/Jupyter launch tokens (interactive access). */
  async accessInfo(userId: number, ref: string, opts: { launchTokens: boolean } = { launchTokens: true }) {
    const vm = await this.mustFind(this.db, userId, ref);
    if (vm.status !== 'running' || !vm.ip_address) {
      throw invalidState(`Access info is available while the VM is running; it is ${vm.status}`);
    }
    // A VM on an agent's host is reached through its own port on the agent's public host.
    const username = vm.ssh_user ?? 'ubuntu';
    const host = vm.ssh_host ?? vm.ip_address;
    const port = vm.ssh_port ?? 22;
    const web = async (service: 'webui' | 'jupyter') => {
      const { token, expiresAt } = await this.tokens.signPurpose('launch', { vm_id: vm.id, user_id: vm.user_id, service }, LAUNCH_TOKEN_TTL_S);
      // The token rides in the fragment: browsers never send it, so no server or proxy logs it.
      return { url: `${this.opts.portalUrl}/vms/${vm.vmid}/${service}/#launch_token=${token}`, launch_token: token, expires_at: expiresAt.toISOString() };
    };
    const hasWeb = WEB_TEMPLATES.has(vm.template_vmid) && opts.launchTokens;
    return {
      vm_id: vm.id,
      status: vm.status,
      ssh: { host, port, username, command: port === 22 ? `ssh ${username}@${host}` : `ssh -p ${port} ${username}@${host}` },
      web_ui: hasWeb ? await web('webui') : null,
      jupyter: hasWeb ? await web('jupyter') : null,
    };
  }

  // ---- hooks from other modules ----

  /** A user's running VMs are stopped: their balance reached zero, or they were suspended (inside that change's transaction). */
  async stopAllOf(tx: Queryable, userId: number, now: Date, reason: 'low_balance' | 'suspended'): Promise<number> {
    const running = await repo.runningVmsOfUser(tx, userId);
    for (const vm of running) await this.requestStop(tx, vm, now, reason);
    return running.length;
  }

  /** A node going offline takes its VMs offline; coming back restores them (docs/vms.md#when-a-node-goes-offline). */
  async onNodeStatus(tx: Queryable, node: string, from: string, to: string, now: Date): Promise<void> {
    if (to === 'offline') {
      for (const vm of await repo.vmsOnNode(tx, node, ['creating', 'starting', 'running', 'stopping', 'stopped', 'interrupted'])) {
        await this.applyTransition(tx, vm, 'node_offline', now);
      }
    } else if (from === 'offline') {
      for (const vm of await repo.vmsOnNode(tx, node, ['offline'])) {
        // A VM that was running comes back running: it is up again from now (started_at is set anew).
        await this.applyTransition(tx, vm, 'node_online', now);
      }
    }
  }

  // ---- reconciler side ----

  /** Claims up to `limit` VMs whose action is due at `now` (service time), under a lease of `leaseMs` of real time. */
  async claimDue(now: Date, leaseMs: number, token: string, limit: number): Promise<VmRow[]> {
    const realNow = realTimeMs();
    return this.db.transaction((tx) => repo.claimDue(tx, now, new Date(realNow), new Date(realNow + leaseMs), token, limit));
  }

  specOf(vm: VmRow): VmSpec {
    return {
      id: vm.id,
      vmid: vm.vmid,
      node: vm.node,
      gpuType: vm.gpu_type,
      gpuCount: vm.gpu_count,
      storageGb: vm.storage_gb,
      ramGb: vm.ram_gb,
      cpuCores: vm.cpu_cores,
      templateVmid: vm.template_vmid,
      authMethod: vm.auth_method,
      sshPublicKey: vm.ssh_public_key,
      password: vm.provision_secret ? open(this.secretKey, vm.provision_secret) : null,
    };
  }

  /**
   * Writes the outcome of a hypervisor action back, if this claim still holds
   * the VM. The VM may have changed meanwhile (destroyed, preempted): the
   * outcome is applied to what it is now.
   */
  async completeAction(
    vmId: string,
    token: string,
    action: HvAction,
    outcome: ActionOutcome,
  ): Promise<void> {
    await this.db.transaction(async (tx) => {
      const vm = await repo.reclaim(tx, vmId, token);
      if (!vm) return; // claim lost (lease expired and another instance took over)
      const now = this.clock.now();
      const release = { claim_token: null, claimed_until: null } as Partial<VmRow>;
      const pending = vm.hv_action !== action ? { hv_action: vm.hv_action } : {};
      if (!outcome.ok) {
        const attempts = vm.attempts + 1;
        if (outcome.built) Object.assign(release, builtColumns(outcome.built, vm));
        if (vm.hv_action !== action) {
          await repo.updateVm(tx, vm.id, { ...release, last_error: outcome.error });
          return;
        }
        if (action === 'provision' && vm.status === 'creating') {
          await this.applyTransition(
            tx,
            vm,
            'provision_failed',
            now,
            { ...release, hv_action: null, next_action_at: null, attempts, last_error: outcome.error, provision_secret: null },
            { error: outcome.error },
          );
          return;
        }
        if (action === 'start' && vm.status === 'starting') {
          await this.applyTransition(tx, vm, 'start_failed', now, { ...release, hv_action: null, next_action_at: null, attempts, last_error: outcome.error }, { error: outcome.error });
          return;
        }
        // stop and destroy are retried with backoff: 5 s doubling up to 5 min of service time.
        const delayS = Math.min(300, 5 * 2 ** Math.min(attempts - 1, 10));
        await repo.updateVm(tx, vm.id, { ...release, attempts, last_error: outcome.error, next_action_at: new Date(now.getTime() + delayS * 1000) });
        return;
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
        return;
      }
      if (action === 'provision') {
        Object.assign(base, builtColumns(outcome.built, vm, outcome));
        if (vm.status === 'creating' && vm.hv_action === 'provision') {
          await this.applyTransition(tx, vm, 'provisioned', now, { ...base, hv_action: 'start', next_action_at: now });
        } else {
          // Destroyed or preempted while provisioning: keep whatever is pending now.
          await repo.updateVm(tx, vm.id, { ...base, ...pending, hv_action: vm.hv_action === 'provision' ? null : vm.hv_action });
        }
        return;
      }
      if (vm.hv_action !== action) {
        await repo.updateVm(tx, vm.id, base); // superseded: the newer action runs next
        return;
      }
      const done = { ...base, hv_action: null, next_action_at: null } as Partial<VmRow>;
      if (action === 'start' && vm.status === 'starting') {
        // Simulated utilisation figures: steady per VM, so lists are stable.
        const up = await this.applyTransition(tx, vm, 'started', now, {
          ...done,
          ...builtColumns(outcome.built, vm, outcome),
          cpu_percent: 5 + (vm.vmid % 40),
          ram_percent: 10 + (vm.vmid % 50),
        });
        await repo.closeInterruptions(tx, vm.id, 'restored', now);
        // A suspended user's VMs do not stay up, even one that was still coming up at the suspension.
        if (await repo.ownerSuspended(tx, vm.user_id)) await this.requestStop(tx, up, now);
      } else if (action === 'stop' && vm.status === 'stopping') {
        await this.applyTransition(tx, vm, 'stopped', now, done);
      } else {
        await repo.updateVm(tx, vm.id, done);
      }
    });
  }

  /**
   * What a node's agent says about its VMs. A running VM whose QEMU is no
   * longer running (the guest powered itself off, or the process died) is
   * stopped, billed as a stop; traffic counters are taken as they are.
   * Returns the VMs that were stopped.
   */
  async agentReport(node: string, reported: { id: string; state: string; exit_reason: string | null; traffic: { rx_bytes: number; tx_bytes: number } }[]): Promise<string[]> {
    const byId = new Map(reported.map((r) => [r.id, r]));
    const stopped: string[] = [];
    for (const vm of await repo.idleRunningOnNode(this.db, node)) {
      const r = byId.get(vm.id);
      if (!r) continue; // unknown to the agent: nothing to go on, leave it to the next action
      const bytes = r.traffic.rx_bytes + r.traffic.tx_bytes;
      if (bytes > 0) await repo.raiseTraffic(this.db, vm.id, bytes);
      if (r.state !== 'stopped') continue;
      const reason = r.exit_reason === 'crashed' ? 'the VM process on its host ended' : 'the guest powered itself off';
      const done = await this.db.transaction(async (tx) => {
        const current = await repo.findVm(tx, { id: vm.id }, null, true);
        // Re-checked under the row lock: an action claimed meanwhile wins.
        if (!current || current.status !== 'running' || current.hv_action !== null || current.claim_token !== null) return false;
        await this.applyTransition(tx, current, 'powered_off', this.clock.now(), { last_error: reason, cpu_percent: 0, ram_percent: 0 }, {
          reason: r.exit_reason === 'crashed' ? 'crashed' : 'guest_powered_off',
        });
        return true;
      });
      if (done) stopped.push(vm.id);
    }
    return stopped;
  }

  /** Interrupted VMs with auto_restart go back to starting as soon as their node has the GPUs free (docs/vms.md#auto-restart). */
  async autoRestartDue(): Promise<number> {
    const candidates = await repo.autoRestartCandidates(this.db, 50);
    let restarted = 0;
    for (const c of candidates) {
      const ok = await this.db.transaction(async (tx) => {
        // Same lock order as start(): the user's balance, then the VM, then the node.
        const balance = await ledger.lockBalance(tx, c.user_id);
        const vm = await repo.findVm(tx, { id: c.id }, null, true);
        const node = await this.inventory.lockNode(tx, c.node);
        if (!node || node.status !== 'active' || !vm || vm.status !== 'interrupted' || !vm.auto_restart) return false;
        const usage = await this.inventory.usage(tx, vm.node);
        if (node.gpu_count - usage.held < vm.gpu_count) return false;
        // An automatic restart needs the money a manual start would (an out-of-credit user stays interrupted).
        const mine = await repo.userVmsForLimits(tx, vm.user_id);
        if (balance < vm.gpu_hourly_rate_micros + vm.storage_hourly_rate_micros + committedHourly(mine, vm.id)) return false;
        const now = this.clock.now();
        await this.applyTransition(tx, vm, 'start_requested', now, { hv_action: 'start', next_action_at: now, attempts: 0, last_error: null }, { reason: 'auto_restart' });
        await recordEvent(tx, { type: 'vm.restarted', userId: vm.user_id, vmId: vm.id, data: { vmid: vm.vmid }, at: now });
        return true;
      });
      if (ok) restarted++;
    }
    return restarted;
  }
}
