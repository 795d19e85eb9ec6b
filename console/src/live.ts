/**
 * Live pages: instead of reading the API on a timer, a page follows the
 * caller's events (GET /events/stream, through the SDK) and reloads what it
 * shows when one of the types it cares about happens. The stream reconnects
 * by itself without losing an event; when it cannot be followed at all (a
 * proxy that refuses it), the page falls back to reloading on a timer.
 */
import { useEffect, useRef } from 'preact/hooks';
import { client } from './api.js';

/** Every event type that changes what a VM page shows. */
export const VM_EVENTS = ['vm.created', 'vm.status_changed', 'vm.interrupted', 'vm.restarted', 'vm.destroyed'];
/** Every event type that changes a reservation's status (a VM's changes end or convert it). */
export const RESERVATION_EVENTS = [
  'reservation.created',
  'reservation.cancelled',
  'reservation.expired',
  'reservation.exhausted',
  'vm.status_changed',
];

/**
 * Calls `onChange` when an event of `types` (about `vmId`, if given) happens,
 * and when the stream (re)opens (what changed before it opened). Stops when
 * the page goes.
 */
export function useLiveEvents(
  types: string[],
  onChange: () => void,
  opts: { vmId?: string; fallbackMs?: number } = {},
): void {
  const ref = useRef(onChange);
  ref.current = onChange;
  const key = `${types.join(',')}|${opts.vmId ?? ''}`;
  useEffect(() => {
    const stop = new AbortController();
    let timer: ReturnType<typeof setInterval> | undefined;
    const follow = async () => {
      try {
        const events = client.followEvents({
          types,
          signal: stop.signal,
          ...(opts.vmId ? { vmId: opts.vmId } : {}),
          // The page loaded before the stream opened: read again, so nothing falls in between.
          onOpen: () => ref.current(),
        });
        for await (const _ of events) ref.current();
      } catch {
        if (stop.signal.aborted) return;
        timer = setInterval(() => {
          if (document.visibilityState === 'visible') ref.current();
        }, opts.fallbackMs ?? 5000);
      }
    };
    void follow();
    return () => {
      stop.abort();
      if (timer) clearInterval(timer);
    };
    // Runs again only when the listed values change, not on every value it reads.
  }, [key]);
}
