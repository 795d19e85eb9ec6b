/**
 * The reconcilers (one claim, one action, one write): VMs whose `hv_action`
 * is due are claimed with FOR UPDATE SKIP LOCKED under a lease, the hypervisor
 * driver is called outside any transaction (concurrently, one action per VM at
 * most), and the outcome is written back if the claim still holds. Interrupted VMs with auto_restart go
 * back to starting when their node has the GPUs. Several instances can run
 * this at once: each VM action is claimed by exactly one of them.
 */
import type { FastifyBaseLogger } from 'fastify';
import { yieldToIo, type Clock } from '../clock.js';
import { newId } from '../ids.js';
import type { HypervisorDriver, Moved, Provisioned } from '../hypervisor/driver.js';
import type { ActionOutcome, VmService } from '../modules/vms/service.js';
import { Loop } from './loop.js';
import { JobMetrics } from './metrics.js';

/** How long a claim holds before another instance may retry (real time, whatever the service clock does). */
export const CLAIM_LEASE_MS = 5 * 60 * 1000;
const BATCH = 25;
/** Driver actions one instance runs at once. */
const MAX_INFLIGHT = 64;

/**
 * Due work other modules add (metering, reservation ends): under the system
 * clock each job runs in a loop of its own, every `everyMs` (default: the
 * loop interval given to start); under the manual clock an advance runs them
 * all in order. `signal` is aborted when the worker stops: long work ends at
 * its next safe point. Returns how much work it did (0: nothing was due).
 */
export type DueJob = { name: string; everyMs?: number; run: (now: Date, signal?: AbortSignal) => Promise<number> };

export class Reconciler {
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<number> | undefined;
  private looping = false;
  private again = false;
  /** The background passes running now (kick's loop), which stop() waits for. */
  private kicking: Promise<unknown> | undefined;
  private loops: Loop[] = [];
  private stopping: AbortController | undefined;
  private readonly jobs: DueJob[] = [];

  constructor(
    private readonly clock: Clock,
    private readonly driver: HypervisorDriver,
    private readonly vms: VmService,
    private readonly log?: FastifyBaseLogger,
    private readonly metrics: JobMetrics = new JobMetrics(),
  ) {}

  addJob(job: DueJob): void {
    this.jobs.push(job);
  }

  /** Driver actions running now, by VM id (at most one per VM: the claim guarantees it across instances). */
  private readonly inflight = new Map<string, Promise<void>>();

  /**
   * One pass over everything due now; returns how much work it started.
   * Driver actions run concurrently, each on its own: a slow boot on one node
   * holds up neither a stop on another nor the next pass. With `wait` the pass
   * returns only when its actions are done (the manual clock's settle).
   */
  async runOnce(wait = true): Promise<number> {
    let work = 0;
    for (const job of this.jobs) {
      const run = () => job.run(this.clock.now());
      work += await this.metrics.pass(job.name, run);
    }
    return work + (await this.runActions(wait));
  }

  /** Interrupted VMs back to starting where GPUs are free, then the hypervisor actions due now. */
  private async runActions(wait: boolean): Promise<number> {
    // Once stopping, nothing new is claimed (and a loop of passes ends, finding no work): what a stopped worker
    // would claim, another instance (or its own next start) does, and the database may be closing.
    if (this.stopping?.signal.aborted) return 0;
    let work = await this.vms.autoRestartDue();
    const started: Promise<void>[] = [];
    const room = MAX_INFLIGHT - this.inflight.size;
    if (room > 0) {
      const token = newId();
      const claimed = await this.vms.claimDue(this.clock.now(), CLAIM_LEASE_MS, token, Math.min(BATCH, room));
      for (const vm of claimed) {
        if (this.inflight.has(vm.id)) continue; // cannot happen while the lease holds; never run two at once
        // Whatever an action leaves due (a built VM's start) runs at once, not a tick later.
        const p = this.act(vm, token).finally(() => this.kick());
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

  /** Runs passes until nothing is due (bounded), so a manual-clock advance leaves a settled state. */
  async settle(maxPasses = 50): Promise<void> {
    for (let i = 0; i < maxPasses; i++) {
      if ((await this.runExclusive()) === 0) return;
      await yieldToIo();
    }
  }

  /** One pass after the one before it ended: passes never overlap, whoever starts them. */
  private runExclusive(wait = true, jobs = true): Promise<number> {
    const prev = this.running ?? Promise.resolve(0);
    const next = prev.catch(() => 0).then(() => (jobs ? this.runOnce(wait) : this.runActions(wait)));
    this.running = next;
    return next;
  }

  /**
   * The background loops for a system clock: hypervisor actions on one, each
   * job on its own, so a long billing close never delays a start or a stop.
   */
  start(intervalMs = 1000): void {
    if (this.timer) return;
    this.stopping = new AbortController();
    const signal = this.stopping.signal;
    this.timer = setInterval(() => this.kick(), intervalMs);
    this.timer.unref();
    this.loops = this.jobs.map(
      (job) =>
        new Loop(job.name, job.everyMs ?? intervalMs, () => job.run(this.clock.now(), signal), this.log, this.metrics),
    );
    for (const loop of this.loops) loop.start();
  }

  /** A pass now, in the background loop (none under the manual clock, whose advance settles instead). */
  private kick(): void {
    if (!this.timer) return;
    if (this.looping) {
      this.again = true;
      return;
    }
    this.looping = true;
    const passes = () => this.runPasses(5);
    this.kicking = this.metrics
      .pass('hypervisor-actions', passes)
      .catch((err) => this.log?.error({ err, job: 'hypervisor-actions' }, 'reconciler pass failed'))
      .finally(() => {
        this.looping = false;
        if (this.again) {
          this.again = false;
          this.kick();
        }
      });
  }

  /** Up to `max` passes while each finds work; returns the work started. */
  private async runPasses(max: number): Promise<number> {
    let work = 0;
    for (let i = 0; i < max; i++) {
      const n = await this.runExclusive(false, false);
      work += n;
      if (n === 0) break;
    }
    return work;
  }

  /**
   * Stops every loop: the passes running end at their next safe point and claim nothing more, driver actions in
   * flight finish and their outcomes are recorded.
   */
  async stop(): Promise<void> {
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
    this.stopping?.abort();
    await Promise.all([
      ...this.loops.map((loop) => loop.stop()),
      this.kicking?.catch(() => undefined),
      this.running?.catch(() => undefined),
    ]);
    this.loops = [];
    await this.drain();
  }
}
