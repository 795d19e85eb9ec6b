/**
 * Webhooks (docs/webhooks.md): endpoints a customer registers, and the
 * delivery of their events to them, signed the Standard Webhooks way, at
 * least once, from the outbox recordEvent fills in each event's transaction.
 *
 * Delivery runs on real time in a loop of its own (it talks to the outside
 * world, like the host agents), under either clock; its schedule (when an
 * attempt is due, how long an endpoint has been failing) is service time, so
 * a manual clock's advance brings retries due like everything else.
 */
import type { FastifyBaseLogger } from 'fastify';
import type { Db } from '../../db/db.js';
import { realTimeMs, type Clock } from '../../clock.js';
import { AppError, notFound, validation } from '../../errors.js';
import { deriveKey, open, seal } from '../../crypto.js';
import { newId, newOrderedId } from '../../ids.js';
import type { Principal } from '../../http/principal.js';
import type { JobMetrics } from '../../background/metrics.js';
import { afterCommit } from '../../db/commit-hook.js';
import { assertKnownTypes, EVENT_TYPES, eventRecord, recordEvent } from '../events/service.js';
import * as repo from './repository.js';
import { hostProblem, postJson, urlFormProblem } from './outbound.js';
import { newSecret, signedHeaders } from './signing.js';
import type { AttemptRecord, WebhookRecord, WebhookWithSecretRecord } from './schemas.js';

export const MAX_WEBHOOKS = 10;
/** After the first failed attempt, the next ones wait this long; after the last, the delivery is given up. */
export const RETRY_DELAYS_MS = [5_000, 300_000, 1_800_000, 7_200_000, 18_000_000, 36_000_000, 36_000_000];
/** An endpoint whose deliveries have failed, without a success, for this long is turned off. */
export const DISABLE_AFTER_MS = 5 * 86_400_000;
/** How long a rotated-out secret still signs. */
export const ROTATION_OVERLAP_MS = 86_400_000;
/** Finished deliveries and their attempts are kept this long. */
export const KEEP_FINISHED_MS = 30 * 86_400_000;
/** Types an endpoint can ask for: every event but the test, which goes only where it is asked for. */
export const SUBSCRIBABLE_TYPES = EVENT_TYPES.filter((t) => t !== 'webhook.test');
const OPERATOR_TYPES = ['node.offline', 'node.online'];
/** Deliveries one pass claims, and sends at once. */
const BATCH = 32;
const PARALLEL = 8;

const toRecord = (w: repo.WebhookRow): WebhookRecord => ({
  id: w.id,
  url: w.url,
  event_types: w.event_types,
  description: w.description,
  enabled: w.enabled,
  disabled_reason: w.disabled_reason,
  failing_since: w.failing_since?.toISOString() ?? null,
  created_at: w.created_at.toISOString(),
  updated_at: w.updated_at.toISOString(),
});

const toAttempt = (a: repo.AttemptRow): AttemptRecord => ({
  id: a.id,
  event_id: a.event_id,
  event_type: a.event_type,
  attempt: a.attempt,
  attempted_at: a.attempted_at.toISOString(),
  status_code: a.status_code,
  error: a.error,
  duration_ms: a.duration_ms,
  outcome: a.outcome,
  next_attempt_at: a.next_attempt_at?.toISOString() ?? null,
});

export interface WebhookInput {
  url?: string;
  event_types?: string[] | null;
  description?: string;
  enabled?: boolean;
}

export class WebhookService {
  private readonly key: Buffer;
  /** Asks for a delivery pass soon rather than at the next tick (the schedule wires it to its loop). */
  onDue: () => void = () => undefined;

  constructor(
    private readonly db: Db,
    private readonly clock: Clock,
    private readonly o: {
      secret: string;
      allowPrivate: boolean;
      timeoutMs: number;
      log?: FastifyBaseLogger;
      metrics?: JobMetrics;
    },
  ) {
    this.key = deriveKey(o.secret, 'webhook-secret');
  }

  private async checkUrl(url: string): Promise<string> {
    const u = url.trim();
    const form = urlFormProblem(u);
    if (form) throw validation('body.url', form);
    const host = await hostProblem(u, this.o.allowPrivate);
    if (host) throw validation('body.url', `cannot receive webhooks: ${host}`);
    return u;
  }

  private checkTypes(p: Principal, types: string[] | null | undefined): string[] | null {
    if (types == null) return null;
    assertKnownTypes('body.event_types', types, SUBSCRIBABLE_TYPES);
    const operator = types.find((t) => OPERATOR_TYPES.includes(t));
    if (operator && p.role !== 'admin') throw validation('body.event_types', `${operator} goes to administrators only`);
    return [...new Set(types)];
  }

  async create(
    p: Principal,
    input: { url: string; event_types?: string[] | null; description?: string },
  ): Promise<WebhookWithSecretRecord> {
    const url = await this.checkUrl(input.url);
    const eventTypes = this.checkTypes(p, input.event_types);
    const secret = newSecret();
    const now = this.clock.now();
    return this.db.transaction(async (tx) => {
      await repo.lockOwner(tx, p.userId);
      if ((await repo.countOf(tx, p.userId)) >= MAX_WEBHOOKS) {
        throw new AppError('limit_exceeded', `At most ${MAX_WEBHOOKS} webhooks per account; delete one first`);
      }
      const row = await repo.insertWebhook(tx, {
        id: newOrderedId(), // ids made one after another sort as made: the list's order among equal times
        userId: p.userId,
        url,
        eventTypes,
        description: input.description?.trim() ?? '',
        secret: seal(this.key, secret),
        now,
      });
      return { ...toRecord(row), secret };
    });
  }

  async list(p: Principal, limit: number, offset: number): Promise<{ items: WebhookRecord[]; total: number }> {
    const r = await repo.listWebhooks(this.db, p.userId, limit, offset);
    return { items: r.rows.map(toRecord), total: r.total };
  }

  async get(p: Principal, id: string): Promise<WebhookRecord> {
    const row = await repo.findWebhook(this.db, p.userId, id);
    if (!row) throw notFound('Webhook');
    return toRecord(row);
  }

  async update(p: Principal, id: string, input: WebhookInput): Promise<WebhookRecord> {
    const url = input.url === undefined ? undefined : await this.checkUrl(input.url);
    const eventTypes = input.event_types === undefined ? undefined : this.checkTypes(p, input.event_types);
    const now = this.clock.now();
    return this.db.transaction(async (tx) => {
      const row = await repo.findWebhook(tx, p.userId, id, true);
      if (!row) throw notFound('Webhook');
      const enabled = input.enabled ?? row.enabled;
      // Turned off: what waits for it is dropped (events while it is off are not queued either).
      const reenabled = enabled && !row.enabled;
      if (!enabled && row.enabled) await repo.dropPending(tx, id);
      const updated = await repo.updateWebhook(
        tx,
        id,
        {
          url: url ?? row.url,
          event_types: eventTypes === undefined ? row.event_types : eventTypes,
          description: input.description?.trim() ?? row.description,
          enabled,
          // Only the service's own turning off has a reason, and it lasts until the endpoint is turned on.
          disabled_reason: enabled || input.enabled === false ? null : row.disabled_reason,
          // A new URL or a fresh start: the failures before no longer count.
          failing_since: reenabled || (url !== undefined && url !== row.url) ? null : row.failing_since,
        },
        now,
      );
      return toRecord(updated);
    });
  }

  async remove(p: Principal, id: string): Promise<void> {
    if (!(await repo.deleteWebhook(this.db, p.userId, id))) throw notFound('Webhook');
  }

  /**
   * A new secret, shown once; the one it replaces still signs for a day, so receivers can switch without losing a
   * delivery.
   */
  async rotateSecret(p: Principal, id: string): Promise<WebhookWithSecretRecord> {
    const secret = newSecret();
    const now = this.clock.now();
    return this.db.transaction(async (tx) => {
      const row = await repo.findWebhook(tx, p.userId, id, true);
      if (!row) throw notFound('Webhook');
      const updated = await repo.rotateSecret(
        tx,
        id,
        seal(this.key, secret),
        new Date(now.getTime() + ROTATION_OVERLAP_MS),
        now,
      );
      return { ...toRecord(updated), secret };
    });
  }

  /** Sends a `webhook.test` event to this endpoint only (also when it is turned off); returns the event's id. */
  async test(p: Principal, id: string): Promise<{ event_id: string }> {
    const now = this.clock.now();
    const eventId = await this.db.transaction(async (tx) => {
      const row = await repo.findWebhook(tx, p.userId, id);
      if (!row) throw notFound('Webhook');
      return recordEvent(tx, {
        type: 'webhook.test',
        userId: p.userId,
        data: { webhook_id: id },
        at: now,
        webhookId: id,
      });
    });
    this.onDue();
    return { event_id: eventId };
  }

  async deliveries(
    p: Principal,
    id: string,
    limit: number,
    offset: number,
  ): Promise<{ items: AttemptRecord[]; total: number }> {
    if (!(await repo.findWebhook(this.db, p.userId, id))) throw notFound('Webhook');
    const r = await repo.listAttempts(this.db, id, limit, offset);
    return { items: r.rows.map(toAttempt), total: r.total };
  }

  // ---- delivery ----

  /** How long a claim holds: the attempt's deadline and room to write its outcome (real time). */
  private get leaseMs(): number {
    return this.o.timeoutMs + 5_000;
  }

  /** One pass: claims what is due, sends it (a few at once), records each outcome. Returns how many it sent. */
  async deliverDue(): Promise<number> {
    const token = newId();
    const claimed = await repo.claimDue(this.db, this.clock.now(), new Date(realTimeMs()), this.leaseMs, token, BATCH);
    let next = 0;
    const worker = async () => {
      while (next < claimed.length) {
        const d = claimed[next++]!;
        try {
          await this.attempt(d, token);
        } catch (err) {
          // The claim runs out and the delivery is tried again: at least once.
          this.o.log?.error({ err, webhook: d.webhook_id, event: d.event_id }, 'could not record a webhook delivery');
        }
      }
    };
    await Promise.all(Array.from({ length: Math.min(PARALLEL, claimed.length) }, worker));
    return claimed.length;
  }

  /** A sealed secret in clear, or undefined when it was sealed under a signing secret the service no longer has. */
  private unseal(sealed: string): string | undefined {
    try {
      return open(this.key, sealed);
    } catch {
      return undefined;
    }
  }

  /**
   * The secrets that sign now: the current one and, in its overlap, the previous one; none when the
   * current one cannot be read (until its owner rotates it). An unreadable previous one is left out.
   */
  private secretsOf(d: repo.ClaimedDelivery, now: Date): string[] | undefined {
    const current = this.unseal(d.secret);
    if (current === undefined) return undefined;
    const overlapping =
      d.previous_secret && d.previous_secret_until && d.previous_secret_until.getTime() > now.getTime();
    const previous = overlapping ? this.unseal(d.previous_secret!) : undefined;
    return previous === undefined ? [current] : [current, previous];
  }

  /** The body of a delivery: the event as GET /events gives it, under the Standard Webhooks envelope. */
  static payload(d: Pick<repo.ClaimedDelivery, 'event_id' | 'type' | 'vm_id' | 'data' | 'created_at'>): string {
    const event = eventRecord({ ...d, id: d.event_id });
    return JSON.stringify({ type: event.type, timestamp: event.created_at, data: event });
  }

  private async attempt(d: repo.ClaimedDelivery, token: string): Promise<void> {
    const body = WebhookService.payload(d);
    // The signature's timestamp is real time: receivers check it against their own clocks to refuse replays.
    const timestampS = Math.floor(realTimeMs() / 1000);
    const secrets = this.secretsOf(d, this.clock.now());
    const sent = secrets
      ? await postJson(d.url, signedHeaders(secrets, d.event_id, timestampS, body), body, {
          timeoutMs: this.o.timeoutMs,
          allowPrivate: this.o.allowPrivate,
        })
      : {
          error:
            "the signing secret cannot be read (the service's own secret changed): rotate it with POST /webhooks/{id}/rotate-secret",
          durationMs: 0,
        };
    const ok = sent.status !== undefined && sent.status >= 200 && sent.status < 300;
    const now = this.clock.now();
    if (!ok)
      this.o.log?.info(
        { webhook: d.webhook_id, event: d.event_id, status: sent.status, err: sent.error },
        'webhook delivery attempt failed',
      );
    await this.db.transaction(async (tx) => {
      const held = await repo.holdClaim(tx, d.webhook_id, d.event_id, token);
      if (!held) return; // another instance took the delivery over after our claim ran out; its attempt counts
      const attempt = held.attempts + 1;
      if (ok) await repo.markHealthy(tx, d.webhook_id);
      const failing = ok ? undefined : await repo.markFailing(tx, d.webhook_id, now);
      const disable =
        !!failing && failing.enabled && now.getTime() - failing.failing_since.getTime() >= DISABLE_AFTER_MS;
      const retryIn = RETRY_DELAYS_MS[attempt - 1];
      const outcome = ok ? 'succeeded' : disable || retryIn === undefined ? 'given_up' : 'retrying';
      afterCommit(tx, () => this.o.metrics?.webhookAttempts.inc({ outcome }));
      await repo.finishDelivery(tx, {
        webhookId: d.webhook_id,
        eventId: d.event_id,
        state: outcome === 'retrying' ? 'pending' : outcome,
        attempts: attempt,
        nextAttemptAt: outcome === 'retrying' ? new Date(now.getTime() + retryIn!) : null,
      });
      await repo.insertAttempt(tx, {
        id: newOrderedId(),
        webhookId: d.webhook_id,
        eventId: d.event_id,
        attempt,
        at: now,
        status: sent.status ?? null,
        error: ok ? null : (sent.error ?? `HTTP ${sent.status}`),
        durationMs: sent.durationMs,
        outcome,
      });
      if (disable && (await repo.disableFailing(tx, d.webhook_id, 'failing', now))) {
        // Turned off: what still waits for it is dropped, and its owner hears of it (on their other endpoints too).
        await repo.dropPending(tx, d.webhook_id);
        await recordEvent(tx, {
          type: 'webhook.disabled',
          userId: failing!.user_id,
          // Not the URL: events are readable with a read_only key, and a receiver's URL is often a credential.
          data: { webhook_id: d.webhook_id, reason: 'failing', failing_since: failing!.failing_since.toISOString() },
          at: now,
        });
        this.o.log?.warn({ webhook: d.webhook_id }, 'webhook endpoint turned off: its deliveries failed for 5 days');
      }
    });
  }

  /** Finished deliveries older than a month go, with their attempts. */
  async purge(now: Date): Promise<number> {
    return repo.purgeFinished(this.db, new Date(now.getTime() - KEEP_FINISHED_MS));
  }

  /**
   * Passes until nothing more is due (bounded), so a backlog does not wait a second per batch: the
   * `webhook-deliveries` job of the schedule (docs/architecture.md#background-loops). Returns the
   * deliveries attempted.
   */
  async drainDue(signal?: AbortSignal): Promise<number> {
    let sent = 0;
    for (let i = 0; i < 20 && !signal?.aborted; i++) {
      const n = await this.deliverDue();
      sent += n;
      if (n < BATCH) break;
    }
    return sent;
  }
}
