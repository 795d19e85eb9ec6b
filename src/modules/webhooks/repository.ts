/**
 * The only SQL of webhooks: endpoints, the delivery outbox and the attempts (the outbox's rows are added by
 * recordEvent).
 */
import type { Queryable } from '../../db/db.js';
import type { Row } from '../../db/rows.js';

export type WebhookRow = Row<'webhooks'>;

const COLS =
  'id, user_id, url, event_types, description, enabled, disabled_reason, secret, previous_secret, previous_secret_until, failing_since, created_at, updated_at';

/** Locks the user's row while the endpoint is added, so two creates at once cannot pass the limit together. */
export async function lockOwner(q: Queryable, userId: number): Promise<void> {
  await q.query('SELECT 1 FROM users WHERE id = $1 FOR NO KEY UPDATE', [userId]);
}

export async function countOf(q: Queryable, userId: number): Promise<number> {
  return Number(
    (await q.query<{ n: number }>('SELECT count(*) AS n FROM webhooks WHERE user_id = $1', [userId])).rows[0]!.n,
  );
}

export async function insertWebhook(
  q: Queryable,
  w: {
    id: string;
    userId: number;
    url: string;
    eventTypes: string[] | null;
    description: string;
    secret: string;
    now: Date;
  },
): Promise<WebhookRow> {
  const r = await q.query<WebhookRow>(
    `INSERT INTO webhooks (id, user_id, url, event_types, description, secret, created_at, updated_at)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $7) RETURNING ${COLS}`,
    [w.id, w.userId, w.url, w.eventTypes, w.description, w.secret, w.now],
  );
  return r.rows[0]!;
}

export async function listWebhooks(
  q: Queryable,
  userId: number,
  limit: number,
  offset: number,
): Promise<{ rows: WebhookRow[]; total: number }> {
  const rows = await q.query<WebhookRow>(
    `SELECT ${COLS} FROM webhooks WHERE user_id = $1 ORDER BY created_at DESC, id DESC LIMIT $2 OFFSET $3`,
    [userId, limit, offset],
  );
  return { rows: rows.rows, total: await countOf(q, userId) };
}

/** The user's endpoint (locked with `forUpdate`), or undefined for an unknown or another user's one. */
export async function findWebhook(
  q: Queryable,
  userId: number,
  id: string,
  forUpdate = false,
): Promise<WebhookRow | undefined> {
  const r = await q.query<WebhookRow>(
    `SELECT ${COLS} FROM webhooks WHERE id = $1 AND user_id = $2${forUpdate ? ' FOR UPDATE' : ''}`,
    [id, userId],
  );
  return r.rows[0];
}

export async function updateWebhook(
  q: Queryable,
  id: string,
  w: Pick<WebhookRow, 'url' | 'event_types' | 'description' | 'enabled' | 'disabled_reason' | 'failing_since'>,
  now: Date,
): Promise<WebhookRow> {
  const r = await q.query<WebhookRow>(
    `UPDATE webhooks SET url = $2, event_types = $3, description = $4, enabled = $5, disabled_reason = $6, failing_since = $7, updated_at = $8
      WHERE id = $1 RETURNING ${COLS}`,
    [id, w.url, w.event_types, w.description, w.enabled, w.disabled_reason, w.failing_since, now],
  );
  return r.rows[0]!;
}

export async function rotateSecret(
  q: Queryable,
  id: string,
  secret: string,
  previousUntil: Date,
  now: Date,
): Promise<WebhookRow> {
  const r = await q.query<WebhookRow>(
    `UPDATE webhooks SET previous_secret = secret, previous_secret_until = $3, secret = $2, updated_at = $4 WHERE id = $1 RETURNING ${COLS}`,
    [id, secret, previousUntil, now],
  );
  return r.rows[0]!;
}

export async function deleteWebhook(q: Queryable, userId: number, id: string): Promise<boolean> {
  return ((await q.query('DELETE FROM webhooks WHERE id = $1 AND user_id = $2', [id, userId])).rowCount ?? 0) > 0;
}

/** Deliveries still waiting for an endpoint that was turned off are dropped (given up, never attempted again). */
export async function dropPending(q: Queryable, webhookId: string): Promise<void> {
  await q.query(
    `UPDATE webhook_deliveries SET state = 'given_up', lease_token = NULL, lease_until = NULL WHERE webhook_id = $1 AND state = 'pending'`,
    [webhookId],
  );
}

/** One delivery, claimed, with what it takes to send it. */
export interface ClaimedDelivery {
  webhook_id: string;
  event_id: string;
  attempts: number;
  url: string;
  secret: string;
  previous_secret: string | null;
  previous_secret_until: Date | null;
  type: string;
  vm_id: string | null;
  data: Record<string, unknown>;
  created_at: Date;
}

/**
 * Claims up to `limit` deliveries due at `now` (service time) for `leaseMs`
 * of real time. A delivery is due when its endpoint is enabled (a test is
 * sent to a turned-off one too), no claim on it still holds, and no earlier
 * delivery of the same VM's events to the same endpoint is still pending
 * (so a VM's events arrive in order). SKIP LOCKED: instances claiming at
 * once take different deliveries; the lease keeps them apart afterwards.
 */
export async function claimDue(
  q: Queryable,
  now: Date,
  realNow: Date,
  leaseMs: number,
  token: string,
  limit: number,
): Promise<ClaimedDelivery[]> {
  const r = await q.query<ClaimedDelivery>(
    `WITH due AS (
       SELECT d.webhook_id, d.event_id
         FROM webhook_deliveries d
         JOIN webhooks w ON w.id = d.webhook_id
         JOIN events e ON e.id = d.event_id
        WHERE d.state = 'pending' AND d.next_attempt_at <= $1
          AND (w.enabled OR e.type = 'webhook.test')
          AND (d.lease_until IS NULL OR d.lease_until < $2)
          AND (d.vm_id IS NULL OR NOT EXISTS (
                SELECT 1 FROM webhook_deliveries p
                 WHERE p.webhook_id = d.webhook_id AND p.vm_id = d.vm_id AND p.state = 'pending' AND p.event_seq < d.event_seq))
        ORDER BY d.next_attempt_at, d.event_seq
        LIMIT $5
        FOR UPDATE OF d SKIP LOCKED
     )
     UPDATE webhook_deliveries d
        SET lease_token = $4, lease_until = $2::timestamptz + make_interval(secs => $3::float8 / 1000)
       FROM due, webhooks w, events e
      WHERE d.webhook_id = due.webhook_id AND d.event_id = due.event_id AND w.id = d.webhook_id AND e.id = d.event_id
      RETURNING d.webhook_id, d.event_id, d.attempts, w.url, w.secret, w.previous_secret, w.previous_secret_until,
                e.type, e.vm_id, e.data, e.created_at`,
    [now, realNow, leaseMs, token, limit],
  );
  return r.rows;
}

/** Locks the delivery if the claim `token` still holds it; false when another instance took it over. */
export async function holdClaim(
  q: Queryable,
  webhookId: string,
  eventId: string,
  token: string,
): Promise<{ attempts: number } | undefined> {
  const r = await q.query<Pick<Row<'webhook_deliveries'>, 'attempts'>>(
    `SELECT attempts FROM webhook_deliveries WHERE webhook_id = $1 AND event_id = $2 AND lease_token = $3 AND state = 'pending' FOR UPDATE`,
    [webhookId, eventId, token],
  );
  return r.rows[0];
}

export async function finishDelivery(
  q: Queryable,
  d: {
    webhookId: string;
    eventId: string;
    state: 'pending' | 'succeeded' | 'given_up';
    attempts: number;
    nextAttemptAt: Date | null;
  },
): Promise<void> {
  await q.query(
    `UPDATE webhook_deliveries SET state = $3, attempts = $4, next_attempt_at = coalesce($5, next_attempt_at), lease_token = NULL, lease_until = NULL
      WHERE webhook_id = $1 AND event_id = $2`,
    [d.webhookId, d.eventId, d.state, d.attempts, d.nextAttemptAt],
  );
}

export type AttemptRow = Omit<Row<'webhook_attempts'>, 'webhook_id'> & {
  event_type: string;
  next_attempt_at: Date | null;
};

export async function insertAttempt(
  q: Queryable,
  a: {
    id: string;
    webhookId: string;
    eventId: string;
    attempt: number;
    at: Date;
    status: number | null;
    error: string | null;
    durationMs: number;
    outcome: AttemptRow['outcome'];
  },
): Promise<void> {
  await q.query(
    `INSERT INTO webhook_attempts (id, webhook_id, event_id, attempt, attempted_at, status_code, error, duration_ms, outcome)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
    [a.id, a.webhookId, a.eventId, a.attempt, a.at, a.status, a.error, a.durationMs, a.outcome],
  );
}

/** The endpoint's attempts, newest first, each with when its delivery is tried next (while it is retrying). */
export async function listAttempts(
  q: Queryable,
  webhookId: string,
  limit: number,
  offset: number,
): Promise<{ rows: AttemptRow[]; total: number }> {
  const rows = await q.query<AttemptRow>(
    `SELECT a.id, a.event_id, e.type AS event_type, a.attempt, a.attempted_at, a.status_code, a.error, a.duration_ms, a.outcome,
            CASE WHEN a.outcome = 'retrying' AND d.state = 'pending' AND d.attempts = a.attempt THEN d.next_attempt_at END AS next_attempt_at
       FROM webhook_attempts a
       JOIN events e ON e.id = a.event_id
       JOIN webhook_deliveries d ON d.webhook_id = a.webhook_id AND d.event_id = a.event_id
      WHERE a.webhook_id = $1
      ORDER BY a.attempted_at DESC, a.id DESC
      LIMIT $2 OFFSET $3`,
    [webhookId, limit, offset],
  );
  const total = await q.query<{ n: number }>('SELECT count(*) AS n FROM webhook_attempts WHERE webhook_id = $1', [
    webhookId,
  ]);
  return { rows: rows.rows, total: Number(total.rows[0]!.n) };
}

/** Marks an endpoint failing since `now` unless it already was; returns since when it has been failing. */
export async function markFailing(
  q: Queryable,
  webhookId: string,
  now: Date,
): Promise<{ failing_since: Date; enabled: boolean; user_id: number }> {
  const r = await q.query<{ failing_since: Date; enabled: boolean; user_id: number }>(
    'UPDATE webhooks SET failing_since = coalesce(failing_since, $2) WHERE id = $1 RETURNING failing_since, enabled, user_id',
    [webhookId, now],
  );
  return r.rows[0]!;
}

export async function markHealthy(q: Queryable, webhookId: string): Promise<void> {
  await q.query('UPDATE webhooks SET failing_since = NULL WHERE id = $1 AND failing_since IS NOT NULL', [webhookId]);
}

/** Turns an endpoint off on the service's initiative; true when it was on. */
export async function disableFailing(q: Queryable, webhookId: string, reason: string, now: Date): Promise<boolean> {
  const r = await q.query(
    'UPDATE webhooks SET enabled = false, disabled_reason = $2, updated_at = $3 WHERE id = $1 AND enabled',
    [webhookId, reason, now],
  );
  return (r.rowCount ?? 0) > 0;
}

/** Finished deliveries (succeeded or given up) made before `before`, with their attempts (housekeeping). */
export async function purgeFinished(q: Queryable, before: Date): Promise<number> {
  const r = await q.query(`DELETE FROM webhook_deliveries WHERE state <> 'pending' AND created_at < $1`, [before]);
  return r.rowCount ?? 0;
}
