/**
 * The SQL of billing outside metering (that is in meter-repository.ts): the
 * balances and the ledger (docs/billing.md#the-ledger), usage reports and
 * current spend, and the ledger check's queries (docs/billing.md#ledger-check).
 */
import type { Queryable } from '../../db/db.js';
import type { Row } from '../../db/rows.js';

export const TRANSACTION_TYPES = ['credit', 'charge', 'deposit', 'refund', 'adjustment'] as const;
export type TransactionType = (typeof TRANSACTION_TYPES)[number];

export type TransactionRow = Omit<Row<'transactions'>, 'breakdown'> & {
  breakdown: Record<string, unknown>;
};

/** A transactions row to write (its balance_after already known). */
export interface NewTransaction {
  id: string;
  user_id: number;
  type: TransactionType;
  amount_micros: number;
  balance_after_micros: number;
  description: string;
  breakdown: Record<string, unknown>;
  vm_id: string | null;
  created_at: Date;
}

export type BalanceRow = Pick<Row<'balances'>, 'balance_micros'>;

/** A usage log with its VM's vmid and GPU type (usage report). */
export type UsageLogRow = Pick<
  Row<'usage_logs'>,
  | 'id'
  | 'vm_id'
  | 'period_end'
  | 'gpu_ms'
  | 'gpu_count'
  | 'storage_gb'
  | 'network_bytes'
  | 'gpu_cost_micros'
  | 'storage_cost_micros'
  | 'network_cost_micros'
  | 'total_cost_micros'
> & {
  vmid: number;
  gpu_type: string;
};

/** A VM's rates, as current spend reads them. */
export interface SpendVmRow {
  id: string;
  vmid: number;
  gpu_type: string;
  gpu_count: number;
  storage_gb: number;
  status: string;
  gpu_hourly_rate_micros: number;
  storage_hourly_rate_micros: number;
}

export interface UnbalancedAccountRow {
  user_id: number;
  email: string;
  balance_micros: number;
  sum_micros: number;
}

export interface CoverageBreakRow {
  vm_id: string;
  vmid: number;
  user_id: number;
  email: string;
  problem: string;
  span_start: Date;
  span_end: Date;
}

export interface BrokenChainRow {
  id: string;
  user_id: number;
  email: string;
  type: string;
  amount_micros: number;
  balance_after_micros: number;
  running_micros: number;
}

export interface UnpostedReservationRow {
  id: string;
  user_id: number;
  email: string;
  deposit_micros: number;
  refund_micros: number;
  deposited_micros: number;
  refunded_micros: number;
}

export interface UnpaidUsageRow {
  id: string;
  vm_id: string;
  user_id: number;
  email: string;
  total_cost_micros: number;
  from_reservation_micros: number;
  charged_micros: number;
}

/** Adds a signed amount to the user's balance (locking the row as an UPDATE does); undefined for an unknown user. */
export async function addToBalance(
  q: Queryable,
  userId: number,
  amountMicros: number,
): Promise<BalanceRow | undefined> {
  return (
    await q.query<BalanceRow>(
      'UPDATE balances SET balance_micros = balance_micros + $2 WHERE user_id = $1 RETURNING balance_micros',
      [userId, amountMicros],
    )
  ).rows[0];
}

export async function insertTransaction(q: Queryable, t: NewTransaction): Promise<TransactionRow> {
  const r = await q.query<TransactionRow>(
    `INSERT INTO transactions (id, user_id, type, amount_micros, balance_after_micros, description, breakdown, vm_id, created_at)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING *`,
    [
      t.id,
      t.user_id,
      t.type,
      t.amount_micros,
      t.balance_after_micros,
      t.description,
      JSON.stringify(t.breakdown),
      t.vm_id,
      t.created_at,
    ],
  );
  return r.rows[0]!;
}

/** Whether the user has a credit with this description (a one-time credit, such as the demo's). */
export async function hasCredit(q: Queryable, userId: number, description: string): Promise<boolean> {
  const r = await q.query(`SELECT 1 FROM transactions WHERE user_id = $1 AND type = 'credit' AND description = $2`, [
    userId,
    description,
  ]);
  return r.rows.length > 0;
}

/** The balance, locking the user's row for the rest of the transaction; undefined for an unknown user. */
export async function markLowBalancePending(q: Queryable, userId: number): Promise<void> {
  await q.query('UPDATE balances SET low_balance_pending = true WHERE user_id = $1', [userId]);
}

export async function lockBalanceRow(q: Queryable, userId: number): Promise<BalanceRow | undefined> {
  return (
    await q.query<BalanceRow>('SELECT balance_micros FROM balances WHERE user_id = $1 FOR NO KEY UPDATE', [userId])
  ).rows[0];
}

/** The balances of several users, their rows locked in id order (the order every close takes balances in). */
export async function lockBalanceRows(
  q: Queryable,
  userIds: readonly number[],
): Promise<Pick<Row<'balances'>, 'user_id' | 'balance_micros'>[]> {
  return (
    await q.query<Pick<Row<'balances'>, 'user_id' | 'balance_micros'>>(
      'SELECT user_id, balance_micros FROM balances WHERE user_id = ANY($1::int8[]) ORDER BY user_id FOR NO KEY UPDATE',
      [userIds],
    )
  ).rows;
}

/** The balances of several users (unlocked). */
export async function findBalances(
  q: Queryable,
  userIds: readonly number[],
): Promise<Pick<Row<'balances'>, 'user_id' | 'balance_micros'>[]> {
  return (
    await q.query<Pick<Row<'balances'>, 'user_id' | 'balance_micros'>>(
      'SELECT user_id, balance_micros FROM balances WHERE user_id = ANY($1::int8[])',
      [userIds],
    )
  ).rows;
}

export async function findBalance(q: Queryable, userId: number): Promise<BalanceRow | undefined> {
  return (await q.query<BalanceRow>('SELECT balance_micros FROM balances WHERE user_id = $1', [userId])).rows[0];
}

/** The user's transactions, newest first (in the order they were written), and how many there are. */
export async function listTransactions(
  q: Queryable,
  userId: number,
  limit: number,
  offset: number,
): Promise<{ rows: TransactionRow[]; total: number }> {
  const rows = await q.query<TransactionRow>(
    'SELECT * FROM transactions WHERE user_id = $1 ORDER BY seq DESC LIMIT $2 OFFSET $3',
    [userId, limit, offset],
  );
  const total = await q.query<{ n: number }>('SELECT count(*)::int8 AS n FROM transactions WHERE user_id = $1', [
    userId,
  ]);
  return { rows: rows.rows, total: total.rows[0]!.n };
}

/** The user's usage logs whose period ends after `after` and at or before `upTo`, newest first. */
export async function usageLogsOfUser(q: Queryable, userId: number, after: Date, upTo: Date): Promise<UsageLogRow[]> {
  return (
    await q.query<UsageLogRow>(
      `SELECT l.id, l.vm_id, v.vmid, v.gpu_type, l.period_end, l.gpu_ms, l.gpu_count, l.storage_gb, l.network_bytes,
                l.gpu_cost_micros, l.storage_cost_micros, l.network_cost_micros, l.total_cost_micros
           FROM usage_logs l JOIN vms v ON v.id = l.vm_id
          WHERE l.user_id = $1 AND l.period_end > $2 AND l.period_end <= $3
          ORDER BY l.period_end DESC, l.seq DESC`,
      [userId, after, upTo],
    )
  ).rows;
}

/** The user's VMs that accrue (running, or have run) and are not destroyed, newest first. */
export async function accruingVmsOfUser(q: Queryable, userId: number): Promise<SpendVmRow[]> {
  return (
    await q.query<SpendVmRow>(
      `SELECT id, vmid, gpu_type, gpu_count, storage_gb, status, gpu_hourly_rate_micros, storage_hourly_rate_micros
           FROM vms WHERE user_id = $1 AND status <> 'destroyed' AND (status = 'running' OR EXISTS (SELECT 1 FROM vm_meters m WHERE m.vm_id = vms.id))
          ORDER BY seq DESC`,
      [userId],
    )
  ).rows;
}

/** The user's image storage usage logs with period_end in (after, upTo], newest first, with each image's name. */
export async function imageUsageLogsOfUser(
  q: Queryable,
  userId: number,
  after: Date,
  upTo: Date,
): Promise<(Row<'image_usage_logs'> & { name: string })[]> {
  return (
    await q.query<Row<'image_usage_logs'> & { name: string }>(
      `SELECT l.*, u.name FROM image_usage_logs l JOIN user_images u ON u.id = l.image_id
        WHERE l.user_id = $1 AND l.period_end > $2 AND l.period_end <= $3 ORDER BY l.period_end DESC, l.seq DESC`,
      [userId, after, upTo],
    )
  ).rows;
}

/** The user's ready images: their storage accrues now. */
export async function readyImagesOfUser(
  q: Queryable,
  userId: number,
): Promise<Pick<Row<'user_images'>, 'id' | 'name' | 'size_bytes'>[]> {
  return (
    await q.query<Pick<Row<'user_images'>, 'id' | 'name' | 'size_bytes'>>(
      `SELECT id, name, size_bytes FROM user_images WHERE user_id = $1 AND state = 'ready' ORDER BY seq DESC`,
      [userId],
    )
  ).rows;
}

/** Accounts whose cached balance differs from the sum of their transactions (ledger check). */
export async function unbalancedAccounts(q: Queryable): Promise<UnbalancedAccountRow[]> {
  return (
    await q.query<UnbalancedAccountRow>(
      `SELECT u.id AS user_id, u.email, b.balance_micros, COALESCE(SUM(t.amount_micros), 0)::int8 AS sum_micros
         FROM users u JOIN balances b ON b.user_id = u.id LEFT JOIN transactions t ON t.user_id = u.id
        GROUP BY u.id, b.balance_micros
       HAVING b.balance_micros <> COALESCE(SUM(t.amount_micros), 0)
        ORDER BY u.id`,
    )
  ).rows;
}

/**
 * The first break in each VM's usage periods: a span of its billable time no
 * period covers ("no usage period"), covered twice ("overlapping periods"), or
 * billed outside that time ("billed outside its time"). Billable time runs
 * from the first start to the destroy, or to billed_until while the VM lives
 * (the open period after it is not closed yet).
 */
export async function uncoveredTime(q: Queryable): Promise<CoverageBreakRow[]> {
  return (
    await q.query<CoverageBreakRow>(
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
export async function brokenChains(q: Queryable): Promise<BrokenChainRow[]> {
  return (
    await q.query<BrokenChainRow>(
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
export async function unpostedReservations(q: Queryable): Promise<UnpostedReservationRow[]> {
  return (
    await q.query<UnpostedReservationRow>(
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
export async function unpaidUsage(q: Queryable): Promise<UnpaidUsageRow[]> {
  return (
    await q.query<UnpaidUsageRow>(
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
