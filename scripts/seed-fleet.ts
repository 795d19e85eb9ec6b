/**
 * A fleet seeded straight into the tables, for the metering bench and the
 * worker crash test: customers with credit (and the credit transaction that
 * explains it), ten VMs each, one in ten stopped, one in twenty reserved
 * (with its reservation), traffic on some, every one accruing and billed up
 * to the same instant. Not a demo: nothing here goes through the API.
 */
import type { Db } from '../src/db/db.js';

/** `vms` VMs of `vms / 10` customers, every one billed up to `billedUntil` (ms since the epoch). */
export async function seedFleet(db: Db, vms: number, billedUntil: number): Promise<void> {
  const t0 = new Date(billedUntil);
  const users = Math.max(1, Math.ceil(vms / 10));
  const credit = 1_000_000 * 1_000_000;
  // Everything below is the fleet's own: customers numbered after those already there (a test's).
  const first = Number(
    (await db.query<{ max: number | null }>('SELECT max(id)::int8 AS max FROM users')).rows[0]?.max ?? 0,
  );
  await db.query(
    `INSERT INTO users (email, email_normalized, password_hash, created_at, updated_at)
     SELECT 'fleet' || g || '@bench.example', 'fleet' || g || '@bench.example', 'x', $1, $1 FROM generate_series(1, $2) g`,
    [t0, users],
  );
  // Each customer's balance row was opened with the account; the credit fills it.
  await db.query('UPDATE balances SET balance_micros = $2 WHERE user_id > $1', [first, credit]);
  await db.query(
    `INSERT INTO transactions (id, user_id, type, amount_micros, balance_after_micros, description, created_at)
     SELECT gen_random_uuid(), user_id, 'credit', balance_micros, balance_micros, 'bench credit', $1 FROM balances WHERE user_id > $2`,
    [t0, first],
  );
  await db.query(
    `INSERT INTO vms (id, user_id, node, gpu_type, gpu_count, storage_gb, ram_gb, cpu_cores, template_vmid, status, holds_gpus,
                      rental_type, gpu_hourly_rate_micros, storage_hourly_rate_micros, auth_method, provisioned,
                      created_at, started_at, first_started_at, network_bytes_total)
     SELECT gen_random_uuid(), (SELECT array_agg(id ORDER BY id) FROM users WHERE id > $4)[1 + g % $2], 'node-' || (g / 8), '4090', 1 + (g % 2), 50 + (g % 7) * 10, 32, 8, 100,
            CASE WHEN g % 10 = 9 THEN 'stopped' ELSE 'running' END, g % 10 <> 9,
            CASE WHEN g % 20 = 3 THEN 'reserved' ELSE 'on_demand' END, 433333 + g % 1000, 13889,
            'password', true, $1, $1, $1, (g % 5) * 123456789
       FROM generate_series(0, $3 - 1) g`,
    [t0, users, vms, first],
  );
  // Each is billed up to t0.
  await db.query('INSERT INTO vm_meters (vm_id, billed_until) SELECT id, $1 FROM vms WHERE user_id > $2', [t0, first]);
  await db.query(
    `WITH r AS (
       INSERT INTO reservations (id, user_id, vm_id, gpu_type, gpu_count, storage_gb, reservation_months, discount_bp,
                                 deposit_micros, remaining_micros, status, created_at, end_at)
       SELECT gen_random_uuid(), user_id, id, gpu_type, gpu_count, storage_gb, 1, 1000, 50000000, 50000000, 'active', $1::timestamptz, $1::timestamptz + interval '30 days'
         FROM vms WHERE rental_type = 'reserved' AND user_id > $2
       RETURNING id, vm_id)
     UPDATE vms SET reservation_id = r.id FROM r WHERE vms.id = r.vm_id`,
    [t0, first],
  );
  // The deposits were paid from the balances, as creating a reservation does.
  await db.query(
    `INSERT INTO transactions (id, user_id, type, amount_micros, balance_after_micros, description, breakdown, created_at)
     SELECT gen_random_uuid(), d.user_id, 'deposit', -d.deposit_micros, b.balance_micros - d.paid, 'bench deposit', jsonb_build_object('reservation_id', d.id::text), $1
       FROM (SELECT id, user_id, deposit_micros, sum(deposit_micros) OVER (PARTITION BY user_id ORDER BY seq) AS paid FROM reservations WHERE user_id > $2) d
       JOIN balances b ON b.user_id = d.user_id
      ORDER BY d.user_id, d.paid`,
    [t0, first],
  );
  await db.query(
    `UPDATE balances SET balance_micros = balance_micros - d.total
       FROM (SELECT user_id, sum(deposit_micros) AS total FROM reservations WHERE user_id > $1 GROUP BY user_id) d WHERE balances.user_id = d.user_id`,
    [first],
  );
}
