/**
 * VMs (see docs/vms.md): the rules of create, start, stop, destroy, label,
 * auto-restart, access and interruptions. Every status change goes through
 * applyTransition (lifecycle.ts decides, transitions.ts writes); hypervisor work
 * is left to the hypervisor-actions job through `hv_action`, never done inside a request.
 *
 * VmService is the module's face to the rest of the service; the rules live in
 * the files it delegates to: create.ts, placement.ts, preemption.ts,
 * actions.ts, access.ts, outcomes.ts, auto-restart.ts, reactions.ts.
 */
import type { Db, Queryable } from '../../db/db.js';
import { realTimeMs, type Clock } from '../../clock.js';
import { deriveKey, open } from '../../crypto.js';
import type { HvAction, VmSpec } from '../../hypervisor/driver.js';
import { afterCommit } from '../../db/commit-hook.js';
import { UUID_RE } from '../../ids.js';
import { invalidState } from '../../errors.js';
import type { InventoryService } from '../inventory/service.js';
import type { SshKeyService } from '../ssh-keys/service.js';
import type { TokenService } from '../auth/tokens.js';
import type { ReservationService } from '../reservations/service.js';
import type { MovePolicy, VmEvent } from './lifecycle.js';
import * as repo from './repository.js';
import * as listedRepo from './listed-repository.js';
import { VmRecordCache } from './record-cache.js';
import type { VmRow } from './repository.js';
import * as transitions from './transitions.js';
import type { ApplyTransition, StatusReason, TransitionHook } from './transitions.js';
import {
  mustFind,
  mustFindListed,
  toAdminVmRecord,
  toInterruptionRecord,
  toVmRecord,
  type AdminVmRecord,
  type InterruptionRecord,
  type VmRecord,
} from './records.js';
import { createVm, type CreateDeps, type CreateVmInput } from './create.js';
import * as actions from './actions.js';
import type { ActionDeps } from './actions.js';
import { accessInfo } from './access.js';
import * as outcomes from './outcomes.js';
import type { ActionOutcome } from './outcomes.js';
import { autoRestartDue } from './auto-restart.js';
import * as reactions from './reactions.js';

// What callers have always imported from here.
export { DEFAULT_MAX_VMS, DEFAULT_MAX_GPUS, type CreateVmInput } from './create.js';
export { LAUNCH_TOKEN_TTL_S } from './access.js';
import type { PortalLinks } from '../portal/links.js';
import { webPortsOf } from './templates.js';
import type { TemplateService } from '../templates/service.js';
export {
  LABEL_RE,
  toVmRecord,
  parseVmRef,
  type AdminVmRecord,
  type VmRecord,
  type InterruptionRecord,
} from './records.js';
export { ratesFor, committedHourly } from './rates.js';
export type { ActionOutcome } from './outcomes.js';
export type { StatusReason, TransitionHook } from './transitions.js';

/** What this module asks of customer images (docs/images.md), bound once both modules exist. */
export interface CustomerImages {
  forCreate: CreateDeps['customerImages'];
  /** The content a VM is built from (null: an image without content, from a simulated node). */
  contentOf: (imageId: string) => Promise<{ sha256: string; sizeBytes: number; loginUser: string | null } | null>;
}

export interface Principalish {
  userId: number;
}

export class VmService {
  private readonly transitionHooks: TransitionHook[] = [];
  private readonly beforeChangeHooks: ((tx: Queryable, vmIds: readonly string[]) => Promise<void>)[] = [];
  private readonly usageHooks: (() => void)[] = [];
  private readonly secretKey: Buffer;
  /** applyTransition as the other files of this module take it. */
  private readonly apply: ApplyTransition = (tx, vm, event, now, extra, why) =>
    this.applyTransition(tx, vm, event, now, extra, why);
  /** What actions.ts, outcomes.ts and auto-restart.ts need; status changes go through this.applyTransition. */
  private readonly deps: ActionDeps;
  /** Records of listed VMs at their row versions (list()). */
  private readonly records = new VmRecordCache();

  constructor(
    private readonly db: Db,
    private readonly clock: Clock,
    private readonly inventory: InventoryService,
    private readonly sshKeys: SshKeyService,
    private readonly tokens: TokenService,
    /** Reserved VMs take their deposit from the reservation module at creation. */
    private readonly reservations: ReservationService,
    private readonly opts: {
      provisionDelayMs: number;
      secret: string;
      links: PortalLinks;
      templates: TemplateService;
      /** Customer images (the snapshot module): what a VM starts from instead of a template. */
      images: CustomerImages;
    },
  ) {
    this.secretKey = deriveKey(opts.secret, 'vm-provision-secret');
    this.deps = { db, clock, inventory, apply: this.apply };
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

  /**
   * Called with the VMs whose status a transaction will change (their rows locked) before it takes
   * any balance: the meter locks their meters there, so the lock order holds (docs/billing.md#lock-order).
   */
  onBeforeStatusChanges(hook: (tx: Queryable, vmIds: readonly string[]) => Promise<void>): void {
    this.beforeChangeHooks.push(hook);
  }

  private async beforeStatusChanges(tx: Queryable, vmIds: readonly string[]): Promise<void> {
    for (const hook of this.beforeChangeHooks) await hook(tx, vmIds);
  }

  /**
   * A reserved VM whose reservation is cancelled or ends goes on as on-demand at the current on-demand price
   * (its open period was closed by the caller). False when the VM is gone.
   */
  async convertToOnDemand(tx: Queryable, vmId: string, _now: Date): Promise<boolean> {
    return reactions.convertToOnDemand(
      tx,
      { inventory: this.inventory, gpuUsageChanged: (q) => this.gpuUsageChanged(q) },
      vmId,
    );
  }

  /**
   * The one place a VM's status is written (ARCHITECTURE invariant; see transitions.ts). A
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
    return transitions.applyTransition(
      { hooks: this.transitionHooks, gpuUsageChanged: (q) => this.gpuUsageChanged(q) },
      tx,
      vm,
      event,
      now,
      extra,
      why,
    );
  }

  // ---- create (see docs/vms.md#the-order-of-the-checks; create.ts) ----

  /** When the earliest pending hypervisor action comes due (ms), or null: the manual clock stops there. */
  async nextActionDue(): Promise<number | null> {
    return (await repo.nextActionAt(this.db))?.getTime() ?? null;
  }

  async create(userId: number, input: CreateVmInput): Promise<VmRecord> {
    return createVm(
      {
        ...this.deps,
        sshKeys: this.sshKeys,
        reservations: this.reservations,
        secretKey: this.secretKey,
        provisionDelayMs: this.opts.provisionDelayMs,
        templates: this.opts.templates,
        customerImages: (tx, userId, imageId, storageGb) => this.opts.images.forCreate(tx, userId, imageId, storageGb),
        gpuUsageChanged: (q) => this.gpuUsageChanged(q),
        beforeStatusChanges: (tx, vmIds) => this.beforeStatusChanges(tx, vmIds),
      },
      userId,
      input,
    );
  }

  // ---- read ----

  /**
   * A page of the user's VMs. The page comes as ids and row versions; only the rows this process has no
   * record of at that version are read in full (docs/architecture.md#lists-of-vms).
   */
  async list(userId: number, f: Omit<listedRepo.VmFilter, 'userId'>): Promise<{ items: VmRecord[]; total: number }> {
    const { refs, total } = await listedRepo.listVmVersions(this.db, { ...f, userId });
    const items: (VmRecord | undefined)[] = refs.map((r) => this.records.get(r.id, r.version));
    const missing = refs.filter((_, i) => items[i] === undefined);
    if (missing.length === 0) return { items: items as VmRecord[], total };
    const ids = missing.map((r) => r.id);
    const rows = new Map((await listedRepo.listedVmsByIds(this.db, ids)).map((v) => [v.id, v]));
    for (const [i, ref] of refs.entries()) {
      if (items[i] !== undefined) continue;
      const row = rows.get(ref.id);
      if (row?.version !== ref.version) {
        // The row changed (or went) between the two reads: the page is read again whole, as one snapshot.
        const r = await listedRepo.listVms(this.db, { ...f, userId });
        return { items: r.rows.map(toVmRecord), total: r.total };
      }
      const { version, ...listed } = row;
      const record = toVmRecord(listed);
      this.records.set(ref.id, version, record);
      items[i] = record;
    }
    return { items: items as VmRecord[], total };
  }

  /** The operator's view: also the host devices a VM was given and the hypervisor's last error. */
  async adminList(
    f: Omit<listedRepo.VmFilter, 'userId'> & { userId?: number },
  ): Promise<{ items: AdminVmRecord[]; total: number }> {
    const r = await listedRepo.listVms(this.db, f);
    return { items: r.rows.map(toAdminVmRecord), total: r.total };
  }

  async get(userId: number, ref: string): Promise<VmRecord> {
    return toVmRecord(await mustFindListed(this.db, userId, ref));
  }

  async interruptions(
    userId: number,
    ref: string,
    limit: number,
    offset: number,
  ): Promise<{ items: InterruptionRecord[]; total: number }> {
    const vm = await mustFind(this.db, userId, ref);
    const r = await repo.listInterruptions(this.db, vm.id, limit, offset);
    return { items: r.rows.map(toInterruptionRecord), total: r.total };
  }

  // ---- actions (see docs/vms.md#what-each-action-does-in-each-state; actions.ts, access.ts) ----

  /** `move: 'if_needed'`: on another node when its own lacks the GPUs (docs/vms.md#start-on-another-host). */
  async start(
    userId: number,
    ref: string,
    opts: { move: MovePolicy } = { move: 'never' },
  ): Promise<{ message: string }> {
    return actions.startVm(this.deps, userId, ref, opts);
  }

  async stop(userId: number, ref: string): Promise<{ message: string }> {
    return actions.stopVm(this.deps, userId, ref);
  }

  async destroy(userId: number | null, ref: string): Promise<{ message: string }> {
    return actions.destroyVm(this.deps, userId, ref);
  }

  async setLabel(userId: number, ref: string, label: string | null): Promise<{ message: string }> {
    return actions.setLabel(this.db, userId, ref, label);
  }

  async setAutoRestart(userId: number, ref: string, on: boolean): Promise<{ message: string }> {
    return actions.setAutoRestart(this.db, userId, ref, on);
  }

  /** `launchTokens`: whether the caller may have WebUI/Jupyter launch tokens (interactive access). */
  async accessInfo(userId: number, ref: string, opts: { launchTokens: boolean } = { launchTokens: true }) {
    return accessInfo(
      { db: this.db, tokens: this.tokens, links: this.opts.links, templateWeb: (v) => this.opts.templates.webOf(v) },
      userId,
      ref,
      opts,
    );
  }

  // ---- snapshots (docs/images.md) ----

  /**
   * The user's VM a snapshot is taken of, locked: stopped or interrupted, and built (400
   * invalid_state otherwise; 404 for another user's).
   */
  async lockSnapshotSource(
    tx: Queryable,
    userId: number,
    ref: string,
  ): Promise<{
    id: string;
    vmid: number;
    node: string;
    storage_gb: number;
    template_vmid: number;
    ssh_user: string | null;
  }> {
    const vm = await mustFind(tx, userId, ref, true);
    if (vm.status !== 'stopped' && vm.status !== 'interrupted')
      throw invalidState(`Cannot snapshot a VM that is ${vm.status}: stop it first (a snapshot copies a disk at rest)`);
    if (!vm.provisioned) throw invalidState('The VM was never built: it has no disk to save');
    if (await repo.snapshotInProgress(tx, vm.id)) throw invalidState('A snapshot of this VM is being taken already');
    return {
      id: vm.id,
      vmid: vm.vmid,
      node: vm.node,
      storage_gb: vm.storage_gb,
      template_vmid: vm.template_vmid,
      ssh_user: vm.ssh_user,
    };
  }

  /** The VM a snapshot is being taken of, if its disk is still at rest where it was. */
  async snapshotSource(vmId: string): Promise<{ id: string; vmid: number; node: string; hvRef: string | null } | null> {
    const vm = await repo.findVm(this.db, { id: vmId }, null);
    if (!vm || (vm.status !== 'stopped' && vm.status !== 'interrupted')) return null;
    return { id: vm.id, vmid: vm.vmid, node: vm.node, hvRef: vm.hv_ref };
  }

  // ---- hooks from other modules (reactions.ts) ----

  /**
   * A user's running VMs are stopped: their balance reached zero, or they were suspended (inside that change's
   * transaction).
   */
  async stopAllOf(tx: Queryable, userId: number, now: Date, reason: 'low_balance' | 'suspended'): Promise<number> {
    return reactions.stopAllOf(tx, this.apply, userId, now, reason);
  }

  /** A node going offline takes its VMs offline; coming back restores them (docs/vms.md#when-a-node-goes-offline). */
  async onNodeStatus(tx: Queryable, node: string, from: string, to: string, now: Date): Promise<void> {
    return reactions.onNodeStatus(tx, this.apply, node, from, to, now);
  }

  // ---- the hypervisor-actions side (outcomes.ts, auto-restart.ts) ----

  /** Claims up to `limit` VMs whose action is due at `now` (service time), under a lease of `leaseMs` of real time. */
  async claimDue(now: Date, leaseMs: number, token: string, limit: number): Promise<VmRow[]> {
    const realNow = realTimeMs();
    return this.db.transaction((tx) =>
      repo.claimDue(tx, now, new Date(realNow), new Date(realNow + leaseMs), token, limit),
    );
  }

  /** What the driver is given to build a VM; a password sealed at creation is opened here only. */
  async specOf(vm: VmRow): Promise<VmSpec> {
    const content = vm.image_id && !vm.provisioned ? await this.opts.images.contentOf(vm.image_id) : null;
    return {
      ...(content
        ? {
            image: {
              url: this.opts.templates.imageUrl(vm.node, content.sha256),
              sha256: content.sha256,
              sizeBytes: content.sizeBytes,
              format: 'qcow2' as const,
            },
          }
        : {}),
      id: vm.id,
      vmid: vm.vmid,
      node: vm.node,
      gpuType: vm.gpu_type,
      gpuCount: vm.gpu_count,
      storageGb: vm.storage_gb,
      ramGb: vm.ram_gb,
      cpuCores: vm.cpu_cores,
      templateVmid: vm.template_vmid,
      // The user the disk has: the VM's own (a move), the image's source VM's, else its template's.
      user: vm.ssh_user ?? content?.loginUser ?? (await this.opts.templates.userOf(vm.template_vmid)),
      webPorts: webPortsOf(await this.opts.templates.webOf(vm.template_vmid), vm),
      authMethod: vm.auth_method,
      sshPublicKey: vm.ssh_public_key,
      password: vm.provision_secret ? open(this.secretKey, vm.provision_secret) : null,
    };
  }

  /**
   * Writes the outcome of a hypervisor action back, if this claim still holds
   * the VM. The VM may have changed meanwhile (destroyed, preempted): the
   * outcome is applied to what it is now. Returns the node whose copy of the VM may be removed (a
   * recorded move's source, or a failed move's destination), else null.
   */
  async completeAction(vmId: string, token: string, action: HvAction, outcome: ActionOutcome): Promise<string | null> {
    return outcomes.completeAction(this.deps, vmId, token, action, outcome);
  }

  /**
   * What a node's agent says about its VMs. A running VM whose QEMU is no
   * longer running (the guest powered itself off, or the process died) is
   * stopped, billed as a stop; traffic counters are taken as they are.
   * Returns the VMs that were stopped.
   */
  async agentReport(
    node: string,
    reported: {
      id: string;
      state: string;
      exit_reason: string | null;
      traffic: { rx_bytes: number; tx_bytes: number };
    }[],
  ): Promise<string[]> {
    return outcomes.agentReport(this.deps, node, reported);
  }

  /**
   * Which of the VMs a node's agent reports are copies left there by a move (the VM lives on another
   * node now): those the agent holds stopped or half-imported may be removed. A running one never is.
   */
  async leftCopies(node: string, reported: readonly { id: string; state: string }[]): Promise<string[]> {
    const idle = reported.filter((r) => (r.state === 'stopped' || r.state === 'importing') && UUID_RE.test(r.id));
    return repo.leftCopies(
      this.db,
      node,
      idle.map((r) => r.id),
    );
  }

  /**
   * Interrupted VMs with auto_restart go back to starting as soon as their node has the GPUs free
   * (docs/vms.md#auto-restart).
   */
  async autoRestartDue(): Promise<number> {
    return autoRestartDue(this.deps);
  }
}
