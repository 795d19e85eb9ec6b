/**
 * `gpucloud admin ledger-check`: every user's balance equals the sum of their
 * transactions, and every reservation's remaining balance equals its deposit
 * minus draws, refund and fee. Returns the problems found (empty when sound).
 */
import type { Db } from '../../db/db.js';
import { toAmount } from '../../money.js';
import { unbalancedAccounts } from './ledger.js';
import { unbalancedReservations } from '../reservations/repository.js';

export interface LedgerProblem {
  kind: 'balance' | 'reservation';
  user_id: number;
  email: string;
  detail: string;
}

export async function ledgerCheck(db: Db): Promise<LedgerProblem[]> {
  const problems: LedgerProblem[] = [];
  for (const a of await unbalancedAccounts(db)) {
    problems.push({
      kind: 'balance',
      user_id: a.user_id,
      email: a.email,
      detail: `balance ${toAmount(a.balance_micros)} but transactions sum to ${toAmount(a.sum_micros)}`,
    });
  }
  for (const r of await unbalancedReservations(db)) {
    problems.push({
      kind: 'reservation',
      user_id: r.user_id,
      email: r.email,
      detail: `reservation ${r.id}: remaining ${toAmount(r.remaining_micros)} but deposit - draws - refund - fee = ${toAmount(r.expected_micros)}`,
    });
  }
  return problems;
}
