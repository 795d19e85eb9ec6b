/**
 * Metrics of the background work (see docs/architecture.md, "Background
 * loops"): every pass of every loop, what each pass did, the hypervisor
 * actions and their outcomes, webhook attempts and missed agent heartbeats.
 * Failures are counted here and logged, with the VM, node or webhook they
 * concern, where they happen. One registry per set of services; GET /metrics
 * serves it with the HTTP metrics, and a worker serves it on
 * GPUCLOUD_METRICS_PORT.
 */
import { Counter, Histogram, Registry } from 'prom-client';

export class JobMetrics {
  readonly registry = new Registry();

  /** Passes of each background loop, by outcome (ok, failed). */
  readonly passes = new Counter({
    name: 'gpucloud_job_passes_total',
    help: 'Passes of each background loop by outcome',
    labelNames: ['job', 'outcome'] as const,
    registers: [this.registry],
  });

  /** How long a pass took. */
  readonly passSeconds = new Histogram({
    name: 'gpucloud_job_pass_seconds',
    help: 'Duration of a pass of each background loop',
    labelNames: ['job'] as const,
    buckets: [0.001, 0.01, 0.05, 0.1, 0.5, 1, 5, 30, 120],
    registers: [this.registry],
  });

  /** What passes did: periods closed, VMs stopped, actions started... as each job counts its work. */
  readonly items = new Counter({
    name: 'gpucloud_job_items_total',
    help: 'Work done by each background loop, in its own unit (periods closed, VMs acted on, deliveries made)',
    labelNames: ['job'] as const,
    registers: [this.registry],
  });

  /**
   * Hypervisor actions (provision, start, stop, destroy) by outcome: ok, failed (the driver), unrecorded (the outcome
   * could not be written).
   */
  readonly hypervisorActions = new Counter({
    name: 'gpucloud_hypervisor_actions_total',
    help: 'Hypervisor actions by action and outcome',
    labelNames: ['action', 'outcome'] as const,
    registers: [this.registry],
  });

  /** Webhook delivery attempts by outcome: succeeded, retrying (failed, tried again later), given_up. */
  readonly webhookAttempts = new Counter({
    name: 'gpucloud_webhook_attempts_total',
    help: 'Webhook delivery attempts by outcome',
    labelNames: ['outcome'] as const,
    registers: [this.registry],
  });

  /** Heartbeats a node's agent did not answer. */
  readonly agentMisses = new Counter({
    name: 'gpucloud_agent_heartbeat_misses_total',
    help: 'Heartbeats a host agent did not answer, by node',
    labelNames: ['node'] as const,
    registers: [this.registry],
  });

  /** Runs one pass of `job`, counting it, its duration and its work (a number it returns). */
  async pass<T>(job: string, run: () => Promise<T>): Promise<T> {
    const end = this.passSeconds.startTimer({ job });
    try {
      const result = await run();
      this.passes.inc({ job, outcome: 'ok' });
      if (typeof result === 'number' && result > 0) this.items.inc({ job }, result);
      return result;
    } catch (err) {
      this.passes.inc({ job, outcome: 'failed' });
      throw err;
    } finally {
      end();
    }
  }
}
