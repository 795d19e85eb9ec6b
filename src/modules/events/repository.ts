/**
 * Events: what happened to a customer's VMs, money, keys and account, and
 * to the operator's nodes, each written in the transaction of the change it
 * records, so an event exists exactly when its change committed. Read back
 * with GET /events (docs/events.md).
 */
import type { Queryable } from '../../db/db.js';
import type { Row } from '../../db/rows.js';
import { newOrderedId } from '../../ids.js';
import type { EventType } from './types.js';

export type EventRow = Omit<Row<'events'>, 'data'> & {
  data: Record<string, unknown>;
};

/**
 * Writes one event; `userId` null for the operator's (node) events. Call inside the change's transaction.
 * The same statement puts it in the webhook outbox: one delivery for each enabled endpoint of its owner
 * (of every administrator, for the operator's events) that takes its type, so an event and its
 * deliveries commit together. `webhookId` sends it to that one endpoint only, whatever it takes (a test).
 */
export async function recordEvent(
  q: Queryable,
  e: {
    type: EventType;
    userId: number | null;
    vmId?: string | null;
    data?: Record<string, unknown>;
    at: Date;
    webhookId?: string;
  },
): Promise<string> {
  const id = newOrderedId();
  await q.query(
    `WITH e AS (
       INSERT INTO events (id, type, user_id, vm_id, data, created_at) VALUES ($1, $2, $3, $4, $5, $6) RETURNING id, seq
     )
     INSERT INTO webhook_deliveries (webhook_id, event_id, event_seq, vm_id, next_attempt_at, created_at)
     SELECT w.id, e.id, e.seq, $4, $6, $6 FROM e, webhooks w
      WHERE CASE WHEN $7::uuid IS NOT NULL THEN w.id = $7
                 ELSE w.enabled AND (w.event_types IS NULL OR $2 = ANY (w.event_types))
                      AND (w.user_id = $3 OR ($3::bigint IS NULL AND w.user_id IN (SELECT u.id FROM users u WHERE u.role = 'admin'))) END`,
    [id, e.type, e.userId, e.vmId ?? null, JSON.stringify(e.data ?? {}), e.at, e.webhookId ?? null],
  );
  return id;
}

/** Whose events a reader sees: their own, and an operator (admin) also the nodes'. */
export interface EventReader {
  userId: number;
  operator: boolean;
}

const visible = `(user_id = $1 OR ($2::boolean AND user_id IS NULL))`;
const COLUMNS = 'id, seq, type, user_id, vm_id, data, created_at';

/** The position of event `id` among the reader's events; undefined when it is not one of them. */
export async function positionOf(q: Queryable, reader: EventReader, id: string): Promise<number | undefined> {
  const r = await q.query<Pick<Row<'events'>, 'seq'>>(`SELECT seq FROM events WHERE id = $3 AND ${visible}`, [
    reader.userId,
    reader.operator,
    id,
  ]);
  return r.rows[0]?.seq;
}

/** The reader's events after position `afterSeq`, oldest first, optionally of some types or one VM. */
export async function listEvents(
  q: Queryable,
  reader: EventReader,
  o: { afterSeq: number; types: string[] | null; vmId: string | null; limit: number },
): Promise<EventRow[]> {
  const r = await q.query<EventRow>(
    `SELECT ${COLUMNS} FROM events
      WHERE ${visible} AND seq > $3 AND ($4::text[] IS NULL OR type = ANY($4::text[])) AND ($5::uuid IS NULL OR vm_id = $5)
      ORDER BY seq
      LIMIT $6`,
    [reader.userId, reader.operator, o.afterSeq, o.types, o.vmId, o.limit],
  );
  return r.rows;
}

/** The newest event's position, and which positions in (low, newest] are committed (`low` = newest - `window`). */
export async function newestPositions(
  q: Queryable,
  window: number,
): Promise<{ newest: number; low: number; present: Set<number> }> {
  const r = await q.query<{ max: number | null }>('SELECT max(seq)::int8 AS max FROM events');
  const newest = Number(r.rows[0]?.max ?? 0);
  const low = Math.max(0, newest - window);
  const present = await q.query<Pick<Row<'events'>, 'seq'>>('SELECT seq FROM events WHERE seq > $1 AND seq <= $2', [
    low,
    newest,
  ]);
  return { newest, low, present: new Set(present.rows.map((x) => Number(x.seq))) };
}

/** Every reader's events after position `afterSeq`, in order (for the live streams). */
export async function eventsAfter(q: Queryable, afterSeq: number, limit: number): Promise<EventRow[]> {
  return (
    await q.query<EventRow>(`SELECT ${COLUMNS} FROM events WHERE seq > $1 ORDER BY seq LIMIT $2`, [afterSeq, limit])
  ).rows;
}
