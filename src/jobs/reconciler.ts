/**
 * The reconcilers (ARCHITECTURE: one claim, one action, one write): VMs whose
 * `hv_action` is due are claimed with FOR UPDATE SKIP LOCKED under a lease,
 * the hypervisor driver is called outside any transaction, and the outcome is
 * written back if the claim still holds. Interrupted VMs with auto_restart go
 * back to starting when their node has the GPUs. Several instances can run
 * this at once: each VM action is claimed by exactly one of them.
 */
import type { FastifyBaseLogger } from 'fastify';
import type { Clock } from '../clock.js';
import { newId } from '../ids.js';
import type { HypervisorDriver } from '../hypervisor/driver.js';
import type { ActionOutcome, VmService } from '../modules/vms/service.js';

/** How long a claim holds before another instance may retry (service time). */
export const CLAIM_LEASE_MS = 5 * 60 * 1000;
const BATCH = 25;

/** Extra due work other modules run on every pass (metering, reservation ends). */
export type DueJob = { name: string; run: (now: Date) => Promise<number> };

export class Reconciler {
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<number> | undefined;
  private readonly jobs: DueJob[] = [];

  constructor(
    private readonly clock: Clock,
    private readonly driver: HypervisorDriver,
    private readonly vms: VmService,
    private readonly log?: FastifyBaseLogger,
  ) {}

  addJob(job: DueJob): void {
    this.jobs.push(job);
  }

  /** One pass over everything due now; returns how much work it did. */
  async runOnce(): Promise<number> {
    let work = 0;
    for (const job of this.jobs) work += await job.run(this.clock.now());
    work += await this.vms.autoRestartDue();
    const token = newId();
    const claimed = await this.vms.claimDue(this.clock.now(), CLAIM_LEASE_MS, token, BATCH);
    for (const vm of claimed) {
      const action = vm.hv_action!;
      const ref = { id: vm.id, vmid: vm.vmid, node: vm.node, hvRef: vm.hv_ref };
      let built: { hvRef: string; ipAddress: string } | undefined;
      let outcome: ActionOutcome;
      // Only the driver's own failures count as a failed action: an error writing the
      // outcome back must not turn a VM the hypervisor built into a `failed` one.
      try {
        let ipAddress: string | undefined;
        if (!vm.provisioned && (action === 'provision' || action === 'start')) {
          // A VM preempted before it was ever built is built when it starts again; one already
          // built (its node went offline as the build finished) is not built twice.
          built = await this.driver.provision(this.vms.specOf(vm));
          ipAddress = built.ipAddress;
        }
        if (action === 'start') ipAddress = (await this.driver.start({ ...ref, hvRef: built?.hvRef ?? ref.hvRef })).ipAddress ?? ipAddress;
        if (action === 'stop') await this.driver.stop(ref);
        if (action === 'destroy') await this.driver.destroy(ref);
        outcome = { ok: true, hvRef: built?.hvRef, ipAddress };
      } catch (err) {
        const message = err instanceof Error ? err.message : String(err);
        this.log?.warn({ vm: vm.id, action, err: message }, 'hypervisor action failed');
        // A start that built the VM and then failed to boot it keeps what was built (no second clone).
        outcome = { ok: false, error: message, built };
      }
      await this.vms.completeAction(vm.id, token, action, outcome);
      work++;
    }
    return work;
  }

  /** Runs passes until nothing is due (bounded), so a manual-clock advance leaves a settled state (D43). */
  async settle(maxPasses = 50): Promise<void> {
    for (let i = 0; i < maxPasses; i++) {
      if ((await this.runExclusive()) === 0) return;
    }
  }

  private runExclusive(): Promise<number> {
    const prev = this.running ?? Promise.resolve(0);
    const next = prev.catch(() => 0).then(() => this.runOnce());
    this.running = next;
    return next;
  }

  /** The background loop for a system clock. */
  start(intervalMs = 1000): void {
    if (this.timer) return;
    this.timer = setInterval(() => {
      this.settle(5).catch((err) => this.log?.error({ err }, 'reconciler pass failed'));
    }, intervalMs);
    this.timer.unref();
  }

  async stop(): Promise<void> {
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
    await this.running?.catch(() => undefined);
  }
}
