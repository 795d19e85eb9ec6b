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
import type { Queryable } from './db.js';

export type BeforeCommit = (tx: Queryable, result: unknown) => Promise<void>;

interface Slot {
  hook: BeforeCommit;
  /** Set once a transaction carrying the hook committed. */
  committed: boolean;
}

/** One holder per HTTP request, entered before any other hook runs, so that the whole request sees it. */
const requests = new AsyncLocalStorage<{ slot: Slot | null }>();

/**
 * Opens the request's scope. Call synchronously at the very start of the
 * request (the first onRequest hook, callback style): everything that runs for
 * the request afterwards, the handler included, shares the holder.
 */
export function enterRequestScope(): void {
  requests.enterWith({ slot: null });
}

/** From here on in this request, the first transaction to commit runs `hook` first. */
export function bindToNextCommit(hook: BeforeCommit): void {
  const holder = requests.getStore();
  if (!holder) throw new Error('bindToNextCommit outside a request scope');
  holder.slot = { hook, committed: false };
}

/** Called by Db.transaction between the transaction's work and its COMMIT; returns a function to call after COMMIT. */
export async function runBeforeCommit(tx: Queryable, result: unknown): Promise<() => void> {
  const slot = requests.getStore()?.slot;
  if (!slot || slot.committed) return () => {};
  await slot.hook(tx, result);
  return () => {
    slot.committed = true;
  };
}

/**
 * Work to do once the current transaction has committed, and never if it
 * rolls back: telling a cache that what it holds changed, say. Outside a
 * transaction it runs at once. Db.transaction opens the scope.
 */
export function afterCommit(fn: () => void): void {
  const list = transactionScope.getStore();
  if (list) list.push(fn);
  else fn();
}

const transactionScope = new AsyncLocalStorage<(() => void)[]>();

/** Runs a transaction's body with its own after-commit list; the caller runs the list after COMMIT. */
export function withAfterCommit<T>(body: () => Promise<T>): { result: Promise<T>; callbacks: (() => void)[] } {
  const callbacks: (() => void)[] = [];
  return { result: transactionScope.run(callbacks, body), callbacks };
}
