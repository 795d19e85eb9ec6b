/**
 * What the rest of the service uses of events: their types, how the API shows
 * one, and recordEvent, which writes an event inside the transaction of the
 * change it tells of (so an event exists exactly when its change committed)
 * and puts it in the webhook outbox (docs/events.md).
 */
import { validation } from '../../errors.js';
import type { EventRow } from './repository.js';
import { EVENT_TYPES, type EventType } from './types.js';

export { recordEvent } from './repository.js';

export { EVENT_TYPES, type EventType };

/** 422 on `field` naming the first of `types` that is not one of `known`, and the types that are. */
export function assertKnownTypes(
  field: string,
  types: readonly string[],
  known: readonly string[] = EVENT_TYPES,
): void {
  const unknown = types.find((t) => !known.includes(t));
  if (unknown !== undefined)
    throw validation(
      field,
      `unknown event type ${JSON.stringify(unknown.slice(0, 64))}; the types are ${known.join(', ')}`,
    );
}

/** An event as the API shows it: in GET /events, the event stream and webhook deliveries alike. */
export function eventRecord(e: Pick<EventRow, 'id' | 'type' | 'created_at' | 'vm_id' | 'data'>) {
  return { id: e.id, type: e.type, created_at: e.created_at.toISOString(), vm_id: e.vm_id, data: e.data };
}
