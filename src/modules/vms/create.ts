/**
 * Creating a VM (docs/vms.md#creating-a-vm), checks in the order of
 * docs/vms.md#the-order-of-the-checks. The VM is inserted in `creating` with
 * its provisioning due; the hypervisor work is left to the hypervisor-actions job.
 */
import type { Static } from 'typebox';
import type { Db, Queryable } from '../../db/db.js';
import type { Clock } from '../../clock.js';
import { AppError, invalidState, notFound, validation } from '../../errors.js';
import { newId, UUID_RE } from '../../ids.js';
import { formatAmount } from '../../money.js';
import { seal } from '../../crypto.js';
import * as ledger from '../billing/ledger.js';
import { noPrice, type InventoryService } from '../inventory/service.js';
import type { SshKeyService } from '../ssh-keys/service.js';
import { quote, type Months, type ReservationService } from '../reservations/service.js';
import { recordEvent } from '../events/service.js';
import type { RentalType } from './lifecycle.js';
import * as repo from './repository.js';
import type { CountedVm, VmRow } from './repository.js';
import { LABEL_RE, LABEL_RULE, toVmRecord, type VmRecord } from './records.js';
import type { TemplateService } from '../templates/service.js';
import { committedHourly, ratesFor } from './rates.js';
import { pickVictims, placeCreate } from './placement.js';
import { preempt } from './preemption.js';
import type { ApplyTransition } from './transitions.js';
import type { CreateBody } from './schemas.js';

export const DEFAULT_MAX_VMS = 10;
export const DEFAULT_MAX_GPUS = 16;

/** The body of POST /vms, as its schema says (docs/vms.md#the-request). */
export type CreateVmInput = Static<typeof CreateBody>;

export interface CreateDeps {
  db: Db;
  clock: Clock;
  inventory: InventoryService;
  sshKeys: SshKeyService;
  /** Takes a reserved VM's deposit. */
  reservations: ReservationService;
  /** Seals a password until the VM is built. */
  secretKey: Buffer;
  provisionDelayMs: number;
  /** The template catalogue: the template must exist and be ready on the node. */
  templates: TemplateService;
  /** The user's ready image a VM starts from instead of a template. */
  customerImages: (
    tx: Queryable,
    userId: number,
    imageId: string,
    storageGb: number,
  ) => Promise<{ id: string; template_vmid: number; sha256: string | null }>;
  apply: ApplyTransition;
  gpuUsageChanged: (tx: Queryable) => void;
  /** Takes what a status change of these VMs will lock after them (their meters), before any balance. */
  beforeStatusChanges: (tx: Queryable, vmIds: readonly string[]) => Promise<void>;
}

/** Cross-field validation (422), after the schema's per-field rules. */
function checkInput(input: CreateVmInput, rental: RentalType, authMethod: 'ssh_key' | 'password'): void {
  if (input.template_vmid === undefined && input.image_id === undefined) {
    throw validation('body.template_vmid', 'is required (or image_id, to start from one of your images)');
  }
  if (input.template_vmid !== undefined && input.image_id !== undefined) {
    throw validation('body.image_id', 'is given instead of template_vmid, not with it (the image brings its template)');
  }
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
}

/** A customer's HTTP port may not be one of the template's web services, which have links of their own. */
function checkHttpPorts(input: CreateVmInput, template: { webui_port: number | null; jupyter_port: number | null }) {
  for (const [name, port] of [
    ['webui', template.webui_port],
    ['jupyter', template.jupyter_port],
  ] as const) {
    if (port !== null && input.http_ports?.includes(port))
      throw validation('body.http_ports', `${port} is the template's ${name} port already; it has a link of its own`);
  }
}

/**
 * The user's VM and GPU limits (docs/vms.md#limits-per-account), behind the lock on the user's balance; returns the
 * user's VMs that count toward them.
 */
async function checkLimits(
  tx: Queryable,
  userId: number,
  gpuCount: number,
  { maxVms, maxGpus }: { maxVms: number; maxGpus: number },
): Promise<CountedVm[]> {
  const mine = await repo.userVmsForLimits(tx, userId);
  if (mine.length + 1 > maxVms)
    throw new AppError('limit_exceeded', `VM limit reached: at most ${maxVms} VMs per account (destroy one first)`);
  gpuLimit(mine, maxGpus, gpuCount);
  return mine;
}

async function limitsOf(tx: Queryable, userId: number): Promise<{ maxVms: number; maxGpus: number }> {
  const limits = await repo.userLimits(tx, userId);
  return { maxVms: limits?.max_vms ?? DEFAULT_MAX_VMS, maxGpus: limits?.max_gpus ?? DEFAULT_MAX_GPUS };
}

/** GPUs in use (held by the user's VMs) plus `gpuCount` more must stay within the limit. */
function gpuLimit(mine: CountedVm[], maxGpus: number, gpuCount: number, exceptVmId?: string): void {
  const gpusInUse = mine.filter((v) => v.holds_gpus && v.id !== exceptVmId).reduce((s, v) => s + v.gpu_count, 0);
  if (gpusInUse + gpuCount > maxGpus) {
    throw new AppError(
      'limit_exceeded',
      `GPU limit reached: ${gpusInUse} of ${maxGpus} GPUs in use, ${gpuCount} requested`,
    );
  }
}

/**
 * A start takes GPUs again (a stopped on-demand or interrupted VM holds none): the GPU limit is
 * the one a create meets, so that stopping VMs, creating others and starting the first ones again
 * never puts more GPUs in use than the limit. Returns the user's VMs that count toward the limits.
 */
export async function checkStartLimit(tx: Queryable, vm: VmRow): Promise<CountedVm[]> {
  const mine = await repo.userVmsForLimits(tx, vm.user_id);
  // `vm` as it was before the start: its own row may already say it holds its GPUs.
  if (!vm.holds_gpus) gpuLimit(mine, (await limitsOf(tx, vm.user_id)).maxGpus, vm.gpu_count, vm.id);
  return mine;
}

/** The SSH key a create names (or the user's oldest); none for an id that is not a UUID, which names no key. */
async function findKey(deps: CreateDeps, tx: Queryable, userId: number, id: string | undefined) {
  if (id !== undefined && !UUID_RE.test(id)) return undefined;
  return deps.sshKeys.publicKeyFor(tx, userId, id);
}

export async function createVm(deps: CreateDeps, userId: number, input: CreateVmInput): Promise<VmRecord> {
  const rental: RentalType = input.rental_type ?? 'on_demand';
  const authMethod = input.auth_method ?? 'ssh_key';
  checkInput(input, rental, authMethod);

  return deps.db.transaction(async (tx) => {
    const now = deps.clock.now();
    // Read first, before any lock: what no concurrent create changes (the user's limits, the price, the SSH key).
    // Each is checked at its place in the order below; the rows locked next are held only for what needs them.
    const limits = await limitsOf(tx, userId);
    const pricing = await deps.inventory.findPricing(tx, input.gpu_type);
    const key = authMethod === 'ssh_key' ? await findKey(deps, tx, userId, input.ssh_key_id) : undefined;
    // The template exists and takes a disk this large (422 before any other check); whether the node's
    // host holds it is checked with the node. A VM from an image has the image's template, which its
    // host need not hold: the disk comes from the image store.
    const image =
      input.image_id === undefined
        ? undefined
        : await deps.customerImages(tx, userId, input.image_id, input.storage_gb);
    const templateVmid = image ? image.template_vmid : input.template_vmid!;
    const template = await deps.templates.forCreate(tx, templateVmid, image ? Infinity : input.storage_gb);
    checkHttpPorts(input, template);
    // The lock order (docs/billing.md#lock-order): the node and the VMs to preempt, their meters, then the balances
    // of this user and of the victims' owners at once, in id order (preempting a VM charges its owner).
    const { node, free, victims } = await placeCreate(tx, deps.inventory, input, rental);
    if (!image) await deps.templates.checkReady(tx, template, node.node);
    else if (image.sha256 === null && node.agent_url)
      throw new AppError(
        'template_unavailable',
        `The image was taken on a simulated node and holds no disk a host could start from; use it on a simulated node`,
      );
    // Interruptible VMs preempted (most recently started first) only for the GPUs that are not free.
    const preempted = pickVictims(victims, input.gpu_count, free);
    await deps.beforeStatusChanges(
      tx,
      preempted.map((v) => v.id),
    );
    // Serializes this user's creates so that together they never pass the limits or the balance check on the same
    // money.
    const balances = await ledger.lockBalances(tx, [userId, ...preempted.map((v) => v.user_id)]);
    const balance = balances.get(userId)!;
    if (input.storage_gb > node.max_storage_gb) {
      throw new AppError(
        'limit_exceeded',
        `storage_gb ${input.storage_gb} exceeds the node's maximum of ${node.max_storage_gb} GB`,
      );
    }
    const mine = await checkLimits(tx, userId, input.gpu_count, limits);
    // placeCreate checked that the node has the GPU type asked for, whose price was read above.
    if (!pricing) throw noPrice(node.gpu_type);
    const rates = ratesFor(pricing, rental, input.gpu_count, input.storage_gb, input.reservation_months);
    // A reserved VM needs its deposit (the whole commitment, prepaid); others one hour of their own
    // rate plus one hour of the user's committed spend.
    const reservationQuote =
      rental === 'reserved'
        ? quote(pricing, input.gpu_count, input.storage_gb, input.reservation_months as Months)
        : undefined;
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
      if (!key && input.ssh_key_id) throw notFound('SSH key');
      if (!key)
        throw invalidState('You have no SSH key: upload one with POST /ssh-keys, or use auth_method "password"');
      sshKeyId = key.id;
      sshPublicKey = key.public_key;
    }

    const id = newId();
    const reservationId = reservationQuote ? newId() : null;
    deps.gpuUsageChanged(tx);
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
      template_vmid: templateVmid,
      image_id: image?.id ?? null,
      http_ports: [...(input.http_ports ?? [])].sort((a, b) => a - b),
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
      provision_secret: input.password ? seal(deps.secretKey, input.password) : null,
      created_at: now,
      // The simulated provisioning delay is the simulator's; a host agent takes the real time it takes.
      next_action_at: new Date(now.getTime() + (node.agent_url ? 0 : deps.provisionDelayMs)),
      hv_action: 'provision',
    });
    await recordEvent(tx, {
      type: 'vm.created',
      userId,
      vmId: vm.id,
      data: {
        vmid: vm.vmid,
        node: vm.node,
        gpu_type: vm.gpu_type,
        gpu_count: vm.gpu_count,
        storage_gb: vm.storage_gb,
        rental_type: vm.rental_type,
      },
      at: now,
    });

    if (reservationQuote) {
      // The reservation and its deposit in the same transaction as the VM.
      await deps.reservations.createForVm(tx, {
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

    for (const victim of preempted) {
      await preempt(tx, deps.apply, victim, vm.id, now);
    }
    return toVmRecord(vm);
  });
}
