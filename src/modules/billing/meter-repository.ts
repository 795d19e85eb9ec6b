/**
 * The SQL of metering (docs/metering.md): the VMs' meters (vm_meters), the
 * batch charge of priced periods, the low-balance flag and the traffic
 * counters. The lock order is VM, meter, reservation, balance
 * (docs/billing.md#lock-order); meter.ts runs these in that order.
 */
import type { Queryable } from '../../db/db.js';
import type { Row } from '../../db/rows.js';

/** The VM columns metering reads, with where its billing stands (its vm_meters row: none before its first start). */
export type MeteredVm = Pick<
  Row<'vms'>,
  | 'id'
  | 'vmid'
  | 'user_id'
  | 'status'
  | 'gpu_count'
  | 'storage_gb'
  | 'gpu_hourly_rate_micros'
  | 'storage_hourly_rate_micros'
  | 'reservation_id'
  | 'network_bytes_total'
> & {
  billed_until: Date | null;
  network_bytes_billed: number;
};

/** A VM's row, as metering reads it (without its meter). */
export type MeteredVmRow = Omit<MeteredVm, 'billed_until' | 'network_bytes_billed'>;

/** Where a VM's billing stands: its vm_meters row. */
export type MeterRow = Pick<Row<'vm_meters'>, 'billed_until' | 'network_bytes_billed'>;

/** A charge that took a balance from above zero to zero or below. */
export interface Crossing {
  user_id: number;
  vm_id: string;
  balance_after: number;
  charge: number;
  transaction_id: string;
  at: string;
}

/** A reservation whose prepaid balance a close used up. */
export interface Exhausted {
  reservation_id: string;
  user_id: number;
  vm_id: string;
  at: string;
}

/** What one charge statement did. */
export interface ChargeResultRow {
  written: number;
  crossings: Crossing[] | null;
  exhausted: Exhausted[] | null;
}

/**
 * Priced periods to charge, one array per column, all in `n` order (each
 * VM's periods in order, each user's in time order). Amounts in micro-units,
 * times in ms, period ends as ISO 8601 text.
 */
export interface PeriodColumns {
  vmIds: readonly string[];
  /** Each VM's owner, vmid, GPU count, disk size and reservation, read with its meter (unchanged while it is held). */
  userIds: readonly number[];
  vmids: readonly number[];
  gpuCounts: readonly number[];
  storageGbs: readonly number[];
  reservationIds: readonly (string | null)[];
  periodStarts: readonly string[];
  periodEnds: readonly string[];
  gpuMs: readonly number[];
  storageMs: readonly number[];
  networkBytes: readonly number[];
  gpuCosts: readonly number[];
  storageCosts: readonly number[];
  networkCosts: readonly number[];
  /** The usage logs' ids. */
  logIds: readonly string[];
  /** The charge transactions' ids (used for the periods that charge the balance). */
  transactionIds: readonly string[];
}

/** An active reservation a VM draws on, and when its term ends. */
export type ReservationTermRow = Pick<Row<'reservations'>, 'id' | 'end_at'>;

/** How many VMs accrue, and where the oldest billing stands (null when none does). */
export interface MeterSummaryRow {
  vms: number;
  oldest: Date | null;
}

/** A user with a running VM: their balance and what their accruing VMs cost (nextLowBalanceBoundary). */
export interface AccrualRow {
  balance: number;
  hourly: number;
  vms: number;
  unbilled: number;
  oldest: Date;
}

/** A VM whose traffic counter is read before its period closes. */
export type TrafficVmRow = Pick<Row<'vms'>, 'id' | 'vmid' | 'node' | 'hv_ref' | 'network_bytes_total'>;

/** The VM's row, locked (the first lock of a close from a VM). */
export async function lockMeteredVm(q: Queryable, vmId: string): Promise<MeteredVmRow | undefined> {
  return (
    await q.query<MeteredVmRow>(
      `SELECT id, vmid, user_id, status, gpu_count, storage_gb, gpu_hourly_rate_micros, storage_hourly_rate_micros,
              reservation_id, network_bytes_total
         FROM vms WHERE id = $1 FOR NO KEY UPDATE`,
      [vmId],
    )
  ).rows[0];
}

/** The VM's meter, locked (after the VM): a close holding it finishes first. None before the VM's first start. */
export async function lockMeter(q: Queryable, vmId: string): Promise<MeterRow | undefined> {
  return (
    await q.query<MeterRow>('SELECT billed_until, network_bytes_billed FROM vm_meters WHERE vm_id = $1 FOR UPDATE', [
      vmId,
    ])
  ).rows[0];
}

/** The meters of several VMs, locked in VM id order (after the VMs, before any balance). */
export async function lockMeters(q: Queryable, vmIds: readonly string[]): Promise<void> {
  await q.query('SELECT 1 FROM vm_meters WHERE vm_id = ANY($1::uuid[]) ORDER BY vm_id FOR UPDATE', [vmIds]);
}

/** Opens billing at the VM's first start. */
export async function insertMeter(q: Queryable, vmId: string, billedUntil: Date): Promise<void> {
  await q.query('INSERT INTO vm_meters (vm_id, billed_until) VALUES ($1, $2)', [vmId, billedUntil]);
}

/** A destroyed VM's billing is over: its last period is closed. */
export async function deleteMeter(q: Queryable, vmId: string): Promise<void> {
  await q.query('DELETE FROM vm_meters WHERE vm_id = $1', [vmId]);
}

/**
 * The active reservations among `ids`, locked in id order (after the VMs'
 * meters: the lock order is VM, meter, reservation, balance), with the ends
 * of their terms.
 */
export async function lockActiveReservations(q: Queryable, ids: readonly string[]): Promise<ReservationTermRow[]> {
  return (
    await q.query<ReservationTermRow>(
      `SELECT id, end_at FROM reservations WHERE id = ANY($1::uuid[]) AND status = 'active' ORDER BY id FOR UPDATE`,
      [ids],
    )
  ).rows;
}

/** ISO 8601 in UTC with milliseconds, as JavaScript's toISOString writes it. */
const iso = (col: string) => `to_char(${col} AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')`;
/** micro-units -> the API's number in the major unit (exact: numeric, trailing zeros dropped). */
const amount = (col: string) => `trim_scale(${col} * 0.000001)`;

/**
 * Charges priced periods (in `n` order: each VM's periods in order, each
 * user's in time order) in one statement:
 *   - a usage log for each period not written already (the unique key);
 *   - for those, a draw on the VM's active reservation for periods inside
 *     its term (up to what is left of it, in order), and for the rest one
 *     `charge` transaction carrying the balance it leaves;
 *   - the users' balances, locked in id order (the one order every close
 *     takes them in, so two closes never deadlock) with the lock an UPDATE
 *     takes, and flagged when a charge leaves them at or below zero (the
 *     low-balance job stops their running VMs);
 *   - the VMs' billed_until, and their traffic marked billed (vm_meters).
 * Returns the number of periods written, the charges that took a
 * balance from above zero to zero or below, and the reservations whose
 * prepaid balance the draws used up. This and ledger.post are the
 * only writers of balances; both keep balance == sum(transactions).
 */
const CHARGE_PERIODS_SQL = `
WITH input AS (
  SELECT * FROM unnest($1::uuid[], $2::timestamptz[], $3::timestamptz[], $4::int8[], $5::int8[], $6::int8[], $7::int8[], $8::int8[], $9::int8[], $10::uuid[], $11::uuid[],
                       $12::int8[], $13::int4[], $14::int4[], $15::int4[], $16::uuid[])
    WITH ORDINALITY AS i(vm_id, period_start, period_end, gpu_ms, storage_ms, network_bytes, gpu_cost, storage_cost, network_cost, log_id, transaction_id,
                         user_id, vmid, gpu_count, storage_gb, reservation_id, n)
), priced AS (
  SELECT i.*, i.gpu_cost + i.storage_cost + i.network_cost AS total, r.remaining_micros AS reserved, r.end_at >= i.period_end AS in_term
    FROM input i
    LEFT JOIN reservations r ON r.id = i.reservation_id AND r.status = 'active'
), drawn AS (
  SELECT p.*,
         CASE WHEN p.in_term THEN least(p.total, greatest(0, p.reserved - coalesce(sum(p.total) FILTER (WHERE p.in_term)
                OVER (PARTITION BY p.reservation_id ORDER BY p.n ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)))
              ELSE 0 END AS from_reservation
    FROM priced p
), logs AS (
  INSERT INTO usage_logs (id, vm_id, user_id, period_start, period_end, gpu_ms, gpu_count, storage_ms, storage_gb, network_bytes,
                          gpu_cost_micros, storage_cost_micros, network_cost_micros, total_cost_micros, reservation_id,
                          from_reservation_micros, transaction_id)
  SELECT log_id, vm_id, user_id, period_start, period_end, gpu_ms, gpu_count, storage_ms, storage_gb, network_bytes,
         gpu_cost, storage_cost, network_cost, total, reservation_id, from_reservation,
         CASE WHEN total > from_reservation THEN transaction_id END
    FROM drawn ORDER BY n
  ON CONFLICT (vm_id, period_end) DO NOTHING
  RETURNING id
), written AS (
  SELECT d.* FROM drawn d JOIN logs l ON l.id = d.log_id
), draws AS (
  UPDATE reservations SET remaining_micros = remaining_micros - w.amount
    FROM (SELECT reservation_id, sum(from_reservation) AS amount FROM written WHERE from_reservation > 0 GROUP BY reservation_id) w
   WHERE reservations.id = w.reservation_id
  RETURNING reservations.id, reservations.user_id, reservations.vm_id, reservations.remaining_micros
), charges AS (
  SELECT w.*, w.total - w.from_reservation AS charge FROM written w WHERE w.total > w.from_reservation
), locked AS (
  SELECT user_id, balance_micros FROM balances WHERE user_id IN (SELECT user_id FROM charges) ORDER BY user_id FOR NO KEY UPDATE
), posted AS (
  SELECT c.*, l.balance_micros - sum(c.charge) OVER (PARTITION BY c.user_id ORDER BY c.n) AS balance_after
    FROM charges c JOIN locked l ON l.user_id = c.user_id
), balanced AS (
  UPDATE balances SET balance_micros = balances.balance_micros - t.charged, low_balance_pending = balances.low_balance_pending OR t.low
    FROM (SELECT user_id, sum(charge) AS charged, bool_or(balance_after <= 0) AS low FROM posted GROUP BY user_id) t
   WHERE balances.user_id = t.user_id
), ledger AS (
  INSERT INTO transactions (id, user_id, type, amount_micros, balance_after_micros, description, breakdown, vm_id, created_at)
  SELECT transaction_id, user_id, 'charge', -charge, balance_after, 'Usage of VM ' || vmid || ' from ' || t.start_at || ' to ' || t.end_at,
         jsonb_build_object(
           'vm_id', vm_id, 'vmid', vmid, 'period_start', t.start_at, 'period_end', t.end_at,
           'gpu_seconds', trim_scale(gpu_ms * 0.001), 'storage_gb', storage_gb, 'network_bytes', network_bytes,
           'gpu_cost', ${amount('gpu_cost')}, 'storage_cost', ${amount('storage_cost')}, 'network_cost', ${amount('network_cost')},
           'from_reservation', ${amount('from_reservation')}, 'total_cost', ${amount('total')}),
         vm_id, period_end
    FROM posted CROSS JOIN LATERAL (SELECT ${iso('period_start')} AS start_at, ${iso('period_end')} AS end_at) t
   ORDER BY n
), billed AS (
  UPDATE vm_meters m SET billed_until = b.until, network_bytes_billed = m.network_bytes_billed + b.bytes
    FROM (SELECT vm_id, max(period_end) AS until, sum(network_bytes) AS bytes FROM input GROUP BY vm_id) b
   WHERE m.vm_id = b.vm_id AND m.vm_id = ANY($1::uuid[])
)
SELECT (SELECT count(*) FROM logs)::int8 AS written,
       (SELECT json_agg(json_build_object('user_id', user_id, 'vm_id', vm_id, 'balance_after', balance_after, 'charge', charge,
                                          'transaction_id', transaction_id, 'at', period_end) ORDER BY n)
          FROM posted WHERE balance_after <= 0 AND balance_after + charge > 0) AS crossings,
       (SELECT json_agg(json_build_object('reservation_id', d.id, 'user_id', d.user_id, 'vm_id', d.vm_id,
                                          'at', (SELECT max(period_end) FROM written w WHERE w.reservation_id = d.id)))
          FROM draws d WHERE d.remaining_micros = 0) AS exhausted`;

/**
 * Runs CHARGE_PERIODS_SQL on the priced periods. The caller holds the VMs'
 * meter rows and their active reservations; the statement takes the
 * balances last.
 */
export async function chargePeriods(q: Queryable, p: PeriodColumns): Promise<ChargeResultRow> {
  const r = await q.query<ChargeResultRow>(CHARGE_PERIODS_SQL, [
    p.vmIds,
    p.periodStarts,
    p.periodEnds,
    p.gpuMs,
    p.storageMs,
    p.networkBytes,
    p.gpuCosts,
    p.storageCosts,
    p.networkCosts,
    p.logIds,
    p.transactionIds,
    p.userIds,
    p.vmids,
    p.gpuCounts,
    p.storageGbs,
    p.reservationIds,
  ]);
  return r.rows[0]!;
}

/** Whether the VM's creation preempted other VMs (an interruption names it). */
export async function preemptedOthers(q: Queryable, vmId: string): Promise<boolean> {
  const preempted = await q.query('SELECT 1 FROM interruptions WHERE preempted_by_vm_id = $1 LIMIT 1', [vmId]);
  return preempted.rows.length > 0;
}

/** What the VM's usage logs cost in all, in micro-units. */
export async function usageTotalOfVm(q: Queryable, vmId: string): Promise<{ total: number }> {
  return (
    await q.query<{ total: number }>(
      'SELECT COALESCE(SUM(total_cost_micros), 0)::int8 AS total FROM usage_logs WHERE vm_id = $1',
      [vmId],
    )
  ).rows[0]!;
}

/** Marks the user for the low-balance job (a charge left their balance at or below zero). */
export async function markLowBalance(q: Queryable, userId: number): Promise<void> {
  await q.query('UPDATE balances SET low_balance_pending = true WHERE user_id = $1', [userId]);
}

/** Clears a user's low-balance flag (after their VMs were stopped). */
export async function clearLowBalance(q: Queryable, userId: number): Promise<void> {
  await q.query('UPDATE balances SET low_balance_pending = false WHERE user_id = $1', [userId]);
}

/** Users a charge left at or below zero, by id. */
export async function lowBalanceUsers(q: Queryable): Promise<{ id: number }[]> {
  return (
    await q.query<{ id: number }>('SELECT user_id AS id FROM balances WHERE low_balance_pending ORDER BY user_id')
  ).rows;
}

/**
 * Makes the rest of the transaction read rows by key: a batch close touches a
 * few thousand rows of each table, and the planner, costing random reads as
 * if from disk, would otherwise scan whole tables for them (the VMs', users'
 * and meters' tables grow with the fleet, so a close would grow with its
 * square).
 */
export async function readByKey(q: Queryable): Promise<void> {
  await q.query('SET LOCAL enable_seqscan = off');
}

/** Where the oldest open period begins, if it began before `lastBoundary` (something is due). */
export async function oldestDueMeter(q: Queryable, lastBoundary: Date): Promise<{ billed_until: Date } | undefined> {
  return (
    await q.query<Pick<Row<'vm_meters'>, 'billed_until'>>(
      'SELECT billed_until FROM vm_meters WHERE billed_until < $1 ORDER BY billed_until LIMIT 1',
      [lastBoundary],
    )
  ).rows[0];
}

/**
 * Claims up to `limit` meters whose open period began before `lastBoundary`,
 * oldest first, with their VMs: FOR UPDATE SKIP LOCKED, so several workers
 * split a close instead of queueing on each other's locks.
 */
export async function claimDueMeters(q: Queryable, lastBoundary: Date, limit: number): Promise<MeteredVm[]> {
  return (
    await q.query<MeteredVm>(
      `SELECT v.id, v.vmid, v.user_id, v.status, v.gpu_count, v.storage_gb, v.gpu_hourly_rate_micros, v.storage_hourly_rate_micros,
              v.reservation_id, m.billed_until, v.network_bytes_total, m.network_bytes_billed
         FROM vm_meters m JOIN vms v ON v.id = m.vm_id
        WHERE m.billed_until < $1
        ORDER BY m.billed_until
        LIMIT $2
        FOR UPDATE OF m SKIP LOCKED`,
      [lastBoundary, limit],
    )
  ).rows;
}

/** How many VMs accrue, and the oldest billed_until among them. */
export async function meterSummary(q: Queryable): Promise<MeterSummaryRow> {
  return (await q.query<MeterSummaryRow>('SELECT count(*)::int8 AS vms, min(billed_until) AS oldest FROM vm_meters'))
    .rows[0]!;
}

/**
 * Per user who has a running VM: their balance, the hourly rates of their
 * accruing VMs (GPU rates of the running ones, every storage rate), how many
 * they are, their unbilled traffic and the oldest billed_until.
 */
export async function accrualOfUsersWithRunningVms(q: Queryable, imagePriceGbHourMicros = 0): Promise<AccrualRow[]> {
  // A user's ready images accrue too (their storage, at the image price), each counted like a VM for rounding.
  return (
    await q.query<AccrualRow>(
      `SELECT b.balance_micros AS balance,
              (sum(CASE WHEN v.status = 'running' THEN v.gpu_hourly_rate_micros ELSE 0 END + v.storage_hourly_rate_micros)
                + COALESCE(max(i.hourly), 0))::int8 AS hourly,
              (count(*) + COALESCE(max(i.n), 0))::int8 AS vms,
              sum(GREATEST(v.network_bytes_total - m.network_bytes_billed, 0))::int8 AS unbilled,
              min(m.billed_until) AS oldest
         FROM vm_meters m JOIN vms v ON v.id = m.vm_id JOIN balances b ON b.user_id = v.user_id
         LEFT JOIN (SELECT user_id, ceil(sum(size_bytes)::numeric * $1 / 1000000000) AS hourly, count(*) AS n
                      FROM user_images WHERE state = 'ready' GROUP BY user_id) i ON i.user_id = b.user_id
        WHERE v.user_id IN (SELECT user_id FROM vms WHERE status = 'running')
        GROUP BY b.user_id, b.balance_micros`,
      [imagePriceGbHourMicros],
    )
  ).rows;
}

/** The provisioned VMs whose open period began before `lastBoundary` ('infinity': every VM that accrues). */
export async function trafficDueVms(q: Queryable, lastBoundary: Date | 'infinity'): Promise<TrafficVmRow[]> {
  return (
    await q.query<TrafficVmRow>(
      `SELECT v.id, v.vmid, v.node, v.hv_ref, v.network_bytes_total FROM vm_meters m JOIN vms v ON v.id = m.vm_id
        WHERE m.billed_until < $1 AND v.provisioned`,
      [lastBoundary],
    )
  ).rows;
}

/** Raises the VMs' cumulative traffic counters to the values read (never lowers one). */
export async function raiseTrafficCounters(
  q: Queryable,
  vmIds: readonly string[],
  bytes: readonly number[],
): Promise<void> {
  await q.query(
    `UPDATE vms SET network_bytes_total = GREATEST(network_bytes_total, u.bytes)
           FROM unnest($1::uuid[], $2::int8[]) AS u(id, bytes) WHERE vms.id = u.id AND vms.id = ANY($1::uuid[])`,
    [vmIds, bytes],
  );
}
