/**
 * The credit ledger: every change of a balance is one
 * transactions row written in the same database transaction, so
 * balance == sum(transactions.amount) always holds. `post` is the writer of
 * balances; the one other is the meter's batch close, which posts a batch's
 * usage charges in one statement under the same rule (meter.ts).
 */
import type { Queryable } from '../../db/db.js';
import { newId } from '../../ids.js';

export const TRANSACTION_TYPES = ['credit', 'charge', 'deposit', 'refund', 'adjustment'] as const;
export type TransactionType = (typeof TRANSACTION_TYPES)[number];

export interface TransactionRow {
  id: string;
  seq: number;
  user_id: number;
  type: TransactionType;
  amount_micros: number;
  balance_after_micros: number;
  description: string;
  breakdown: Record<string, unknown>;
  vm_id: string | null;
  created_at: Date;
}

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
  if (!Number.isSafeInteger(p.amountMicros)) throw new RangeError('ledger: amount must be an integer number of micro-units');
  const u = await tx.query<{ balance_micros: number }>(
    'UPDATE users SET balance_micros = balance_micros + $2 WHERE id = $1 RETURNING balance_micros',
    [p.userId, p.amountMicros],
  );
  if (!u.rows[0]) throw new Error(`ledger: user ${p.userId} does not exist`);
  const r = await tx.query<TransactionRow>(
    `INSERT INTO transactions (id, user_id, type, amount_micros, balance_after_micros, description, breakdown, vm_id, created_at)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING *`,
    [p.id ?? newId(), p.userId, p.type, p.amountMicros, u.rows[0].balance_micros, p.description, JSON.stringify(p.breakdown ?? {}), p.vmId ?? null, p.now],
  );
  return r.rows[0]!;
}

/** The balance, locking the user's row for the rest of the transaction (serializes money decisions per user). */
export async function lockBalance(tx: Queryable, userId: number): Promise<number> {
  const r = await tx.query<{ balance_micros: number }>('SELECT balance_micros FROM users WHERE id = $1 FOR UPDATE', [userId]);
  if (!r.rows[0]) throw new Error(`ledger: user ${userId} does not exist`);
  return r.rows[0].balance_micros;
}

export async function balance(q: Queryable, userId: number): Promise<number> {
  const r = await q.query<{ balance_micros: number }>('SELECT balance_micros FROM users WHERE id = $1', [userId]);
  return r.rows[0]?.balance_micros ?? 0;
}

export async function listTransactions(q: Queryable, userId: number, limit: number, offset: number) {
  const rows = await q.query<TransactionRow>(
    'SELECT * FROM transactions WHERE user_id = $1 ORDER BY seq DESC LIMIT $2 OFFSET $3',
    [userId, limit, offset],
  );
  const total = await q.query<{ n: number }>('SELECT count(*)::int8 AS n FROM transactions WHERE user_id = $1', [userId]);
  return { rows: rows.rows, total: total.rows[0]!.n };
}

/** Accounts whose cached balance differs from the sum of their transactions (ledger check). */
export async function unbalancedAccounts(q: Queryable) {
  return (
    await q.query<{ user_id: number; email: string; balance_micros: number; sum_micros: number }>(
      `SELECT u.id AS user_id, u.email, u.balance_micros, COALESCE(SUM(t.amount_micros), 0)::int8 AS sum_micros
         FROM users u LEFT JOIN transactions t ON t.user_id = u.id
        GROUP BY u.id
       HAVING u.balance_micros <> COALESCE(SUM(t.amount_micros), 0)
        ORDER BY u.id`,
    )
  ).rows;
}
