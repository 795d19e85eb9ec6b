/**
 * The credit ledger: every change of a balance is one
 * transactions row written in the same database transaction, so
 * balance == sum(transactions.amount) always holds. `post` is the writer of
 * balances; the one other is the meter's batch close, which posts a batch's
 * usage charges in one statement under the same rule (meter.ts; the
 * statement is in meter-repository.ts). The SQL is in repository.ts.
 */
import type { Queryable } from '../../db/db.js';
import { newId } from '../../ids.js';
import * as repo from './repository.js';
import type { TransactionRow, TransactionType } from './repository.js';

export { TRANSACTION_TYPES } from './repository.js';
export type { TransactionRow, TransactionType } from './repository.js';

export interface Posting {
  userId: number;
  type: TransactionType;
  /** Signed micro-units: positive adds to the balance. */
  amountMicros: number;
  description: string;
  breakdown?: Record<string, unknown>;
  vmId?: string | null;
  now: Date;
  /** The row's id when the caller needs it before the row is written (a new one by default). */
  id?: string;
}

/** Must run inside a transaction (`tx`); returns the written row. */
export async function post(tx: Queryable, p: Posting): Promise<TransactionRow> {
  if (!Number.isSafeInteger(p.amountMicros))
    throw new RangeError('ledger: amount must be an integer number of micro-units');
  const u = await repo.addToBalance(tx, p.userId, p.amountMicros);
  if (!u) throw new Error(`ledger: user ${p.userId} does not exist`);
  return repo.insertTransaction(tx, {
    id: p.id ?? newId(),
    user_id: p.userId,
    type: p.type,
    amount_micros: p.amountMicros,
    balance_after_micros: u.balance_micros,
    description: p.description,
    breakdown: p.breakdown ?? {},
    vm_id: p.vmId ?? null,
    created_at: p.now,
  });
}

/** The balance, locking the user's row for the rest of the transaction (serializes money decisions per user). */
export async function lockBalance(tx: Queryable, userId: number): Promise<number> {
  const r = await repo.lockBalanceRow(tx, userId);
  if (!r) throw new Error(`ledger: user ${userId} does not exist`);
  return r.balance_micros;
}

/**
 * The balances of several users, locking their rows in id order: a transaction that moves more than one
 * user's money takes them all at once, in the order a close takes them (docs/billing.md#lock-order).
 */
export async function lockBalances(tx: Queryable, userIds: readonly number[]): Promise<Map<number, number>> {
  const ids = [...new Set(userIds)];
  const rows = await repo.lockBalanceRows(tx, ids);
  if (rows.length !== ids.length) throw new Error(`ledger: a user of ${ids.join(', ')} does not exist`);
  return new Map(rows.map((r) => [r.user_id, r.balance_micros]));
}

/** The balances of several users, in micro-units, by user id (unlocked: for display). */
export async function balancesOf(q: Queryable, userIds: readonly number[]): Promise<Map<number, number>> {
  const rows = userIds.length ? await repo.findBalances(q, userIds) : [];
  return new Map(rows.map((r) => [r.user_id, r.balance_micros]));
}

export async function balance(q: Queryable, userId: number): Promise<number> {
  return (await repo.findBalance(q, userId))?.balance_micros ?? 0;
}

/**
 * Marks a user whose balance a charge took to zero or below: the low-balance job stops their running
 * VMs (docs/billing.md#low-balance).
 */
export async function markLowBalance(tx: Queryable, userId: number): Promise<void> {
  await repo.markLowBalancePending(tx, userId);
}
