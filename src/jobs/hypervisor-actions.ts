/**
 * The hypervisor actions (one claim, one action, one write): VMs whose `hv_action` is due are
 * claimed with FOR UPDATE SKIP LOCKED under a lease, the hypervisor driver is called outside any
 * transaction (concurrently, one action per VM at most), and the outcome is written back if the
 * claim still holds. Interrupted VMs with auto_restart go back to starting when their node has the
 * GPUs. Several instances can run this at once: each VM action is claimed by exactly one of them.
 * It runs as one job of the schedule (wiring/schedule.ts).
 */
import type { FastifyBaseLogger } from 'fastify';
import { newId } from '../ids.js';
import type { HypervisorDriver, Moved, Provisioned } from '../hypervisor/driver.js';
import type { ActionOutcome, VmService } from '../modules/vms/service.js';
import { JobMetrics } from '../background/metrics.js';

/** How long a claim holds before another instance may retry (real time, whatever the service clock does). */
export const CLAIM_LEASE_MS = 5 * 60 * 1000;
const BATCH = 25;
/** Driver actions one instance runs at once. */
const MAX_INFLIGHT = 64;

export class HypervisorActions {
  /** Called when an action has been recorded: whatever it left due (a built VM's start) runs at once. */
  onRecorded: () => void = () => undefined;

  constructor(
    private readonly driver: HypervisorDriver,
    private readonly vms: VmService,
    private readonly log?: FastifyBaseLogger,
    private readonly metrics: JobMetrics = new JobMetrics(),
  ) {}

  /** Driver actions running now, by VM id (at most one per VM: the claim guarantees it across instances). */
  private readonly inflight = new Map<string, Promise<void>>();

  /**
   * One pass: interrupted VMs back to starting where GPUs are free, then the hypervisor actions due
   * at `now`, each running on its own (a slow boot on one node holds up neither a stop on another nor
   * the next pass); returns how much work it started. With `wait` it returns only when its actions are
   * done (a manual-clock advance).
   */
  async runOnce(now: Date, wait = true, signal?: AbortSignal): Promise<number> {
    // Once stopping, nothing new is claimed (and a loop of passes ends, finding no work): what a stopped worker
    // would claim, another instance (or its own next start) does, and the database may be closing.
    if (signal?.aborted) return 0;
    let work = await this.vms.autoRestartDue();
    const started: Promise<void>[] = [];
    const room = MAX_INFLIGHT - this.inflight.size;
    if (room > 0) {
      const token = newId();
      const claimed = await this.vms.claimDue(now, CLAIM_LEASE_MS, token, Math.min(BATCH, room));
      for (const vm of claimed) {
        if (this.inflight.has(vm.id)) continue; // cannot happen while the lease holds; never run two at once
        // Whatever an action leaves due (a built VM's start) runs at once, not a tick later.
        const p = this.act(vm, token).finally(() => this.onRecorded());
        started.push(p);
        this.inflight.set(
          vm.id,
          p.catch(() => undefined).finally(() => this.inflight.delete(vm.id)),
        );
        work++;
      }
    }
    if (wait) {
      // A settling caller (the manual clock's advance) learns of a failure to record an outcome.
      const results = await Promise.allSettled(started);
      await this.drain();
      const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
      if (failed) throw failed.reason;
    }
    return work;
  }

  /** Waits for every driver action in flight. */
  async drain(): Promise<void> {
    while (this.inflight.size > 0) await Promise.allSettled([...this.inflight.values()]);
  }

  private async act(vm: Awaited<ReturnType<VmService['claimDue']>>[number], token: string): Promise<void> {
    const action = vm.hv_action!;
    const ref = { id: vm.id, vmid: vm.vmid, node: vm.node, hvRef: vm.hv_ref };
    let built: Provisioned | undefined;
    let moved: Moved | undefined;
    let outcome: ActionOutcome;
    // Only the driver's own failures count as a failed action: an error writing the
    // outcome back must not turn a VM the hypervisor built into a `failed` one.
    try {
      let ipAddress: string | undefined;
      let gpuDevices: string[] | undefined;
      if (!vm.provisioned && (action === 'provision' || action === 'start')) {
        // A VM preempted before it was ever built is built when it starts again; one already
        // built (its node went offline as the build finished) is not built twice.
        built = await this.driver.provision(await this.vms.specOf(vm));
        ipAddress = built.ipAddress;
      }
      if (action === 'start') {
        const up = await this.driver.start({ ...ref, hvRef: built?.hvRef ?? ref.hvRef });
        ipAddress = up.ipAddress ?? ipAddress;
        gpuDevices = up.gpuDevices;
      }
      if (action === 'move') {
        moved = await this.driver.move(await this.vms.specOf(vm), vm.move_from ?? vm.node);
        built = moved;
      }
      if (action === 'stop') await this.driver.stop(ref);
      if (action === 'destroy') await this.driver.destroy(ref);
      outcome = { ok: true, hvRef: built?.hvRef, ipAddress, built, gpuDevices, bytes: moved?.bytes };
    } catch (err) {
      const message = err instanceof Error ? err.message : String(err);
      this.log?.warn({ vm: vm.id, node: vm.node, action, err: message }, 'hypervisor action failed');
      // A start that built the VM and then failed to boot it keeps what was built (no second clone).
      outcome = { ok: false, error: message, built };
    }
    let left: string | null;
    try {
      left = await this.vms.completeAction(vm.id, token, action, outcome);
      this.metrics.hypervisorActions.inc({ action, outcome: outcome.ok ? 'ok' : 'failed' });
    } catch (err) {
      // The claim's lease runs out and the action is retried: every driver call is safe to repeat.
      this.log?.error({ vm: vm.id, node: vm.node, action, err }, 'could not record a hypervisor action');
      this.metrics.hypervisorActions.inc({ action, outcome: 'unrecorded' });
      throw err;
    }
    // A move is recorded: the copy on the node the VM no longer lives on goes (the source after a
    // move, what reached the destination after a failed one). Missed here, the node's next
    // heartbeat removes it.
    if (left) {
      await this.driver.release({ ...ref, node: left }).catch((err) => {
        this.log?.warn(
          { vm: vm.id, node: left, err: err instanceof Error ? err.message : String(err) },
          'copy not released',
        );
      });
    }
  }

  /** Up to `max` passes while each finds work (the system clock's loop); returns the work started. */
  async runPasses(now: () => Date, max: number, signal?: AbortSignal): Promise<number> {
    let work = 0;
    for (let i = 0; i < max; i++) {
      const n = await this.runOnce(now(), false, signal);
      work += n;
      if (n === 0) break;
    }
    return work;
  }
}
