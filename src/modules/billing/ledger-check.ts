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
 */
import type { Db } from '../../db/db.js';
import { toAmount } from '../../money.js';
import { unbalancedAccounts } from './ledger.js';
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

/**
 * The first break in each VM's usage periods: a span of its billable time no
 * period covers ("no usage period"), covered twice ("overlapping periods"), or
 * billed outside that time ("billed outside its time"). Billable time runs
 * from the first start to the destroy, or to billed_until while the VM lives
 * (the open period after it is not closed yet).
 */
async function uncoveredTime(db: Db) {
  return (
    await db.query<{ vm_id: string; vmid: number; user_id: number; email: string; problem: string; span_start: Date; span_end: Date }>(
      `WITH l AS (
         SELECT vm_id, period_start, period_end,
                LAG(period_end) OVER (PARTITION BY vm_id ORDER BY period_start, period_end) AS prev_end,
                LEAD(period_start) OVER (PARTITION BY vm_id ORDER BY period_start, period_end) AS next_start
           FROM usage_logs),
       v AS (
         SELECT vms.id, vmid, user_id, first_started_at AS from_at,
                CASE WHEN status = 'destroyed' THEN destroyed_at ELSE m.billed_until END AS to_at
           FROM vms LEFT JOIN vm_meters m ON m.vm_id = vms.id),
       breaks AS (
         SELECT v.id AS vm_id, v.vmid, v.user_id, 'billed outside its time' AS problem, l.period_start AS span_start, l.period_end AS span_end
           FROM l JOIN v ON v.id = l.vm_id
          WHERE v.from_at IS NULL OR l.period_start < v.from_at OR v.to_at IS NULL OR l.period_end > v.to_at
         UNION ALL
         SELECT v.id, v.vmid, v.user_id, 'no usage period', v.from_at, l.period_start
           FROM l JOIN v ON v.id = l.vm_id
          WHERE l.prev_end IS NULL AND l.period_start > v.from_at
         UNION ALL
         SELECT v.id, v.vmid, v.user_id, 'no usage period', l.prev_end, l.period_start
           FROM l JOIN v ON v.id = l.vm_id
          WHERE l.period_start > l.prev_end
         UNION ALL
         SELECT v.id, v.vmid, v.user_id, 'overlapping periods', l.period_start, LEAST(l.prev_end, l.period_end)
           FROM l JOIN v ON v.id = l.vm_id
          WHERE l.period_start < l.prev_end
         UNION ALL
         SELECT v.id, v.vmid, v.user_id, 'no usage period', l.period_end, v.to_at
           FROM l JOIN v ON v.id = l.vm_id
          WHERE l.next_start IS NULL AND l.period_end < v.to_at
         UNION ALL
         SELECT v.id, v.vmid, v.user_id, 'no usage period', v.from_at, v.to_at
           FROM v
          WHERE v.from_at IS NOT NULL AND v.to_at > v.from_at AND NOT EXISTS (SELECT 1 FROM usage_logs u WHERE u.vm_id = v.id))
       SELECT DISTINCT ON (b.vm_id) b.vm_id, b.vmid, b.user_id, u.email, b.problem, b.span_start, b.span_end
         FROM breaks b JOIN users u ON u.id = b.user_id
        ORDER BY b.vm_id, b.span_start`,
    )
  ).rows;
}

/** The first transaction of each user whose balance_after is not the running sum up to it. */
async function brokenChains(db: Db) {
  return (
    await db.query<{ id: string; user_id: number; email: string; type: string; amount_micros: number; balance_after_micros: number; running_micros: number }>(
      `SELECT DISTINCT ON (c.user_id) c.id, c.user_id, u.email, c.type, c.amount_micros, c.balance_after_micros, c.running_micros
         FROM (SELECT t.id, t.user_id, t.seq, t.type, t.amount_micros, t.balance_after_micros,
                      (SUM(t.amount_micros) OVER (PARTITION BY t.user_id ORDER BY t.seq))::int8 AS running_micros
                 FROM transactions t) c
         JOIN users u ON u.id = c.user_id
        WHERE c.balance_after_micros <> c.running_micros
        ORDER BY c.user_id, c.seq`,
    )
  ).rows;
}

/** Reservations whose deposit and refund do not match the `deposit` and `refund` transactions naming them. */
async function unpostedReservations(db: Db) {
  return (
    await db.query<{ id: string; user_id: number; email: string; deposit_micros: number; refund_micros: number; deposited_micros: number; refunded_micros: number }>(
      `SELECT r.id, r.user_id, u.email, r.deposit_micros, r.refund_micros,
              COALESCE(t.deposited, 0)::int8 AS deposited_micros, COALESCE(t.refunded, 0)::int8 AS refunded_micros
         FROM reservations r
         JOIN users u ON u.id = r.user_id
         LEFT JOIN (SELECT breakdown->>'reservation_id' AS reservation_id, user_id,
                           -SUM(amount_micros) FILTER (WHERE type = 'deposit') AS deposited,
                           SUM(amount_micros) FILTER (WHERE type = 'refund') AS refunded
                      FROM transactions
                     WHERE type IN ('deposit', 'refund') AND breakdown ? 'reservation_id'
                     GROUP BY 1, 2) t ON t.reservation_id = r.id::text AND t.user_id = r.user_id
        WHERE r.deposit_micros <> COALESCE(t.deposited, 0) OR r.refund_micros <> COALESCE(t.refunded, 0)
        ORDER BY r.user_id, r.seq`,
    )
  ).rows;
}

/** Usage logs whose cost is not what the reservation paid plus the charge: each period is paid once, in full. */
async function unpaidUsage(db: Db) {
  return (
    await db.query<{ id: string; vm_id: string; user_id: number; email: string; total_cost_micros: number; from_reservation_micros: number; charged_micros: number }>(
      `SELECT l.id, l.vm_id, l.user_id, u.email, l.total_cost_micros, l.from_reservation_micros,
              COALESCE(-t.amount_micros, 0)::int8 AS charged_micros
         FROM usage_logs l
         JOIN users u ON u.id = l.user_id
         LEFT JOIN transactions t ON t.id = l.transaction_id AND t.type = 'charge' AND t.user_id = l.user_id
        WHERE l.total_cost_micros <> l.from_reservation_micros + COALESCE(-t.amount_micros, 0)
           OR (l.transaction_id IS NOT NULL AND t.id IS NULL)
           OR (l.from_reservation_micros > 0 AND l.reservation_id IS NULL)
        ORDER BY l.user_id, l.seq`,
    )
  ).rows;
}
