/**
 * `gpucloud admin ledger-check` (docs/billing.md#ledger-check): verifies, in
 * SQL over the whole database, that
 *  - every user's balance equals the sum of their transactions;
 *  - every transaction's balance_after is the running sum of the user's
 *    transactions up to it (in order of writing), so no balance ever moved
 *    without a transaction;
 *  - every reservation's remaining balance equals its deposit minus what
 *    usage drew from it, its refund and its fee, and its deposit and refund
 *    were really written as `deposit` and `refund` transactions;
 *  - every usage log's cost is exactly what its reservation paid plus its
 *    `charge` transaction;
 *  - every VM's usage periods tile its billable time, from its first start to
 *    its destroy (or, while it lives, to where billing has reached): no gap,
 *    no overlap, nothing outside it.
 * Returns the problems found, each naming the account (empty when sound).
 * The queries are in repository.ts.
 */
import type { Db } from '../../db/db.js';
import { toAmount } from '../../money.js';
import { brokenChains, unbalancedAccounts, uncoveredTime, unpaidUsage, unpostedReservations } from './repository.js';
import { unbalancedReservations } from '../reservations/repository.js';

export interface LedgerProblem {
  kind: 'balance' | 'transaction' | 'reservation' | 'usage' | 'coverage';
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
  for (const b of await brokenChains(db)) {
    problems.push({
      kind: 'transaction',
      user_id: b.user_id,
      email: b.email,
      detail: `transaction ${b.id} (${b.type} ${toAmount(b.amount_micros)}) says balance_after ${toAmount(b.balance_after_micros)} but the running sum is ${toAmount(b.running_micros)}`,
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
  for (const r of await unpostedReservations(db)) {
    problems.push({
      kind: 'reservation',
      user_id: r.user_id,
      email: r.email,
      detail:
        `reservation ${r.id}: deposit ${toAmount(r.deposit_micros)} and refund ${toAmount(r.refund_micros)}, ` +
        `but its transactions hold a deposit of ${toAmount(r.deposited_micros)} and refunds of ${toAmount(r.refunded_micros)}`,
    });
  }
  for (const u of await unpaidUsage(db)) {
    problems.push({
      kind: 'usage',
      user_id: u.user_id,
      email: u.email,
      detail: `usage log ${u.id} of VM ${u.vm_id}: cost ${toAmount(u.total_cost_micros)} but the reservation paid ${toAmount(u.from_reservation_micros)} and the charge ${toAmount(u.charged_micros)}`,
    });
  }
  for (const c of await uncoveredTime(db)) {
    problems.push({
      kind: 'coverage',
      user_id: c.user_id,
      email: c.email,
      detail: `VM ${c.vmid} (${c.vm_id}): ${c.problem} from ${c.span_start.toISOString()} to ${c.span_end.toISOString()}`,
    });
  }
  return problems;
}
