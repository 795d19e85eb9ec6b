/**
 * The VM state machine (see docs/vms.md#states): every status change of a VM goes
 * through transition(). Pure: no I/O, no clock; the caller applies the
 * returned effects inside its database transaction.
 */
export const VM_STATUSES = [
  'creating',
  'starting',
  'running',
  'stopping',
  'stopped',
  'interrupted',
  'destroyed',
  'failed',
  'offline',
  'moving',
] as const;
export type VmStatus = (typeof VM_STATUSES)[number];

/** Whether a start may move the VM to another node when its own lacks the GPUs (docs/vms.md#start-on-another-host). */
export const MOVE_POLICIES = ['never', 'if_needed'] as const;
export type MovePolicy = (typeof MOVE_POLICIES)[number];

export const RENTAL_TYPES = ['on_demand', 'reserved', 'interruptible'] as const;
export type RentalType = (typeof RENTAL_TYPES)[number];

/**
 * An interruptible VM's preemption record (docs/vms.md#preemption): interrupted while the VM is down, then
 * restored when it runs again, or abandoned when it is destroyed first.
 */
export const INTERRUPTION_STATUSES = ['interrupted', 'restored', 'abandoned'] as const;
export type InterruptionStatus = (typeof INTERRUPTION_STATUSES)[number];

export type VmEvent =
  /** hypervisor actions: the hypervisor built the VM (creating -> starting) */
  | 'provisioned'
  /** hypervisor actions: provisioning failed for good (creating -> failed) */
  | 'provision_failed'
  /** hypervisor actions: the hypervisor started it (starting -> running) */
  | 'started'
  /** hypervisor actions: the start failed (starting -> stopped) */
  | 'start_failed'
  /** API: stop (running -> stopping) */
  | 'stop_requested'
  /** hypervisor actions: the hypervisor stopped it (stopping -> stopped) */
  | 'stopped'
  /** host agent: the guest powered itself off or its process died (running -> stopped) */
  | 'powered_off'
  /** API start or auto-restart (stopped | interrupted -> starting) */
  | 'start_requested'
  /** API start on another host (stopped | interrupted -> moving): the disk travels first */
  | 'move_requested'
  /** hypervisor actions: the disk arrived and was verified on the new host (moving -> starting) */
  | 'moved'
  /** hypervisor actions: the move failed; the VM is back on its host (moving -> stopped) */
  | 'move_failed'
  /** placement: preempted by an on-demand or reserved VM (-> interrupted) */
  | 'preempted'
  /** admin: the node went offline (-> offline) */
  | 'node_offline'
  /** admin: the node came back (offline -> the status it had) */
  | 'node_online'
  /** API or admin: destroy (anything but destroyed -> destroyed) */
  | 'destroy';

/** Every event, for exhaustive checks (tests walk VM_STATUSES x VM_EVENTS). */
export const VM_EVENTS: readonly VmEvent[] = [
  'provisioned',
  'provision_failed',
  'started',
  'start_failed',
  'stop_requested',
  'stopped',
  'powered_off',
  'start_requested',
  'move_requested',
  'moved',
  'move_failed',
  'preempted',
  'node_offline',
  'node_online',
  'destroy',
];

/** States in which a VM holds GPUs of its node; a reserved VM keeps them while stopped. */
export function holdsGpus(status: VmStatus, rentalType: RentalType, offlineFrom: VmStatus | null = null): boolean {
  switch (status) {
    case 'creating':
    case 'starting':
    case 'running':
    case 'stopping':
    case 'moving': // the new host's GPUs, held while the disk travels so the start finds them
      return true;
    case 'stopped':
      return rentalType === 'reserved';
    case 'offline':
      return offlineFrom !== null && holdsGpus(offlineFrom, rentalType);
    case 'interrupted':
    case 'destroyed':
    case 'failed':
      return false;
  }
}

/**
 * Interruptible VMs in these states hold GPUs that an on-demand or reserved VM
 * may take. Not `stopping`: its owner asked for it to stop, and an
 * interruption would bring it back by itself (auto_restart) once GPUs free up;
 * its GPUs come free when the hypervisor confirms the stop.
 */
export const PREEMPTIBLE: readonly VmStatus[] = ['creating', 'starting', 'running'];

const TABLE: Record<VmEvent, Partial<Record<VmStatus, VmStatus>>> = {
  provisioned: { creating: 'starting' },
  provision_failed: { creating: 'failed' },
  started: { starting: 'running' },
  start_failed: { starting: 'stopped' },
  stop_requested: { running: 'stopping' },
  stopped: { stopping: 'stopped' },
  powered_off: { running: 'stopped' },
  start_requested: { stopped: 'starting', interrupted: 'starting' },
  move_requested: { stopped: 'moving', interrupted: 'moving' },
  moved: { moving: 'starting' },
  move_failed: { moving: 'stopped' },
  preempted: { creating: 'interrupted', starting: 'interrupted', running: 'interrupted' },
  node_offline: {
    creating: 'offline',
    starting: 'offline',
    running: 'offline',
    stopping: 'offline',
    stopped: 'offline',
    interrupted: 'offline',
  },
  node_online: {}, // resolved from offlineFrom below
  destroy: {
    creating: 'destroyed',
    starting: 'destroyed',
    running: 'destroyed',
    stopping: 'destroyed',
    stopped: 'destroyed',
    interrupted: 'destroyed',
    failed: 'destroyed',
    offline: 'destroyed',
    moving: 'destroyed',
  },
};

export interface TransitionInput {
  status: VmStatus;
  rentalType: RentalType;
  /** For an offline VM: the status it had when its node went offline. */
  offlineFrom: VmStatus | null;
  event: VmEvent;
}

export interface Transition {
  from: VmStatus;
  to: VmStatus;
  holdsGpusBefore: boolean;
  holdsGpus: boolean;
  /** The VM becomes running now: set started_at. */
  setStartedAt: boolean;
  /** The VM leaves running now: set stopped_at. */
  setStoppedAt: boolean;
  /** New value of offline_from. */
  offlineFrom: VmStatus | null;
}

export type TransitionResult = { ok: true; transition: Transition } | { ok: false; reason: string };

export function canTransition(status: VmStatus, event: VmEvent, offlineFrom: VmStatus | null = null): boolean {
  if (event === 'node_online') return status === 'offline' && offlineFrom !== null;
  return TABLE[event][status] !== undefined;
}

export function transition(input: TransitionInput): TransitionResult {
  const { status, rentalType, event } = input;
  let to: VmStatus | undefined;
  if (event === 'node_online') to = status === 'offline' ? (input.offlineFrom ?? undefined) : undefined;
  else to = TABLE[event][status];
  if (!to) return { ok: false, reason: `cannot ${describe(event)} a VM that is ${status}` };
  const offlineFrom = to === 'offline' ? status : null;
  return {
    ok: true,
    transition: {
      from: status,
      to,
      holdsGpusBefore: holdsGpus(status, rentalType, input.offlineFrom),
      holdsGpus: holdsGpus(to, rentalType, offlineFrom),
      setStartedAt: to === 'running' && status !== 'running',
      setStoppedAt: status === 'running' && to !== 'running',
      offlineFrom,
    },
  };
}

function describe(event: VmEvent): string {
  switch (event) {
    case 'stop_requested':
      return 'stop';
    case 'start_requested':
    case 'move_requested':
      return 'start';
    case 'destroy':
      return 'destroy';
    case 'preempted':
      return 'preempt';
    default:
      return `apply "${event}" to`;
  }
}

/** Statuses whose VMs count toward the per-user VM limit (failed and destroyed do not). */
export const COUNTS_TOWARD_LIMIT = (s: VmStatus) => s !== 'destroyed' && s !== 'failed';
