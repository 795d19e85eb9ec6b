/**
 * Work that must commit together with a request's business transaction: the
 * idempotency layer records the request's response inside the very
 * transaction that makes the change, so a crash can never leave a change
 * without its recorded answer (a retry would apply it twice) or an answer
 * without its change.
 *
 * A request sets a hook with `bindToNextCommit`; the first transaction that
 * reaches its commit in that request runs it just before COMMIT, with the
 * transaction's own connection and the value the transaction returns. A hook
 * that throws rolls the transaction back. Work outside requests (background
 * jobs) has no scope and no hook.
 */
import { AsyncLocalStorage } from 'node:async_hooks';
import type { Queryable } from './queryable.js';

export type BeforeCommit = (tx: Queryable, result: unknown) => Promise<void>;

interface Slot {
  hook: BeforeCommit;
  /** Set once a transaction carrying the hook committed. */
  committed: boolean;
}

/**
 * One holder per request that may bind a hook. AsyncLocalStorage costs every
 * promise in the process something while it is enabled (Node 20 tracks each
 * one), so it is enabled only while such a request is in flight.
 */
const requests = new AsyncLocalStorage<{ slot: Slot | null }>();
let requestsInFlight = 0;
/** What other requests see while the storage is enabled: a holder no hook is ever bound to. */
const NO_HOLDER = Object.freeze({ slot: null });

/**
 * Call synchronously at the very start of every request (the first onRequest
 * hook, callback style), so that everything that runs for the request
 * afterwards, the handler included, shares what it sets. A request that may
 * bind a hook (`mayBind`) gets a holder of its own and must call the function
 * returned once its response is over; any other request is only kept from
 * seeing another's holder (the storage is keyed by async resources, and a
 * keep-alive connection's resources outlive a request).
 */
export function enterRequestScope(mayBind: boolean): (() => void) | undefined {
  if (!mayBind) {
    if (requestsInFlight > 0) requests.enterWith(NO_HOLDER);
    return undefined;
  }
  requestsInFlight++;
  const holder: { slot: Slot | null } = { slot: null };
  requests.enterWith(holder);
  let open = true;
  return () => {
    if (!open) return;
    open = false;
    holder.slot = null; // found later on a reused connection, it binds nothing
    if (--requestsInFlight === 0) requests.disable();
  };
}

/** From here on in this request, the first transaction to commit runs `hook` first. */
export function bindToNextCommit(hook: BeforeCommit): void {
  const holder = requests.getStore();
  if (!holder || holder === NO_HOLDER) throw new Error('bindToNextCommit outside a request scope');
  holder.slot = { hook, committed: false };
}

/** Called by Db.transaction between the transaction's work and its COMMIT; returns a function to call after COMMIT. */
export async function runBeforeCommit(tx: Queryable, result: unknown): Promise<() => void> {
  if (requestsInFlight === 0) return () => {};
  const slot = requests.getStore()?.slot;
  if (!slot || slot.committed) return () => {};
  await slot.hook(tx, result);
  return () => {
    slot.committed = true;
  };
}

/** The after-commit work of each open transaction, by the transaction object its body receives. */
const afterCommitOf = new WeakMap<Queryable, (() => void)[]>();

/**
 * Work to do once `tx` has committed, and never if it rolls back: telling a
 * cache that what it holds changed, say. When `q` is not a transaction (a
 * statement on its own commits at once) it runs at once.
 */
export function afterCommit(q: Queryable, fn: () => void): void {
  const list = afterCommitOf.get(q);
  if (list) list.push(fn);
  else fn();
}

/** Db.transaction: the list of work `afterCommit` collects for `tx`, to run after COMMIT. */
export function collectAfterCommit(tx: Queryable): (() => void)[] {
  const callbacks: (() => void)[] = [];
  afterCommitOf.set(tx, callbacks);
  return callbacks;
}
