/**
 * Property-based test of the money and capacity invariants (placement,
 * lifecycle, ledger, metering, low balance, reservations; docs/billing.md),
 * with fast-check: random sequences of
 * creates (on-demand, interruptible, reserved), stops, starts, destroys,
 * preemptions, reservation cancellations, hypervisor faults, nodes going
 * offline and coming back, and clock
 * advances (seconds to days, and jumps to the end of a reservation's term)
 * by three users with credit, against the real app over HTTP. After every
 * step:
 *  - ledgerCheck(db) finds nothing;
 *  - every balance equals the sum of its transactions (SQL);
 *  - no balance moved without a transaction: each user's balance delta over
 *    the step equals the sum of the transactions the step wrote;
 *  - no node has more GPUs held than it has, and every VM's holds_gpus is
 *    what its status and rental type say (a stopped VM releases its GPUs,
 *    a stopped reserved VM keeps them);
 *  - reservations agree with their VMs (active -> reserved VM; cancelled or
 *    converted -> on-demand VM unless it is gone; completed -> destroyed VM;
 *    cancelled -> fee = 25 % half-up, nothing left; after a settled advance
 *    no active reservation is past its end);
 *  - usage is charged exactly once: each VM's usage periods are contiguous
 *    from its first start, none after its destruction, and a VM that never
 *    ran has none;
 *  - every API call answered below 500, with a code from the closed list of
 *    error codes.
 *
 * One app per database; every run starts from fresh users and nodes and
 * destroys its VMs at the end so that the next run's clock advances stay
 * cheap. The billing interval is one day here (GPUCLOUD_BILLING_INTERVAL_S)
 * so that a jump to the end of a one-month term steps through ~30 period
 * closes instead of ~730; the hourly default is covered by the example tests.
 *
 * Replay a failure with the command it prints, which names the clock start too:
 * GPUCLOUD_CLOCK_START=<instant> PROPERTY_SEED=<seed> [PROPERTY_PATH=<path>] [PROPERTY_SHRINK=1]
 * node scripts/test.mjs test/billing/property.test.ts
 */
import { before, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import fc from 'fast-check';
import { describeEachDb, TEST_CLOCK_START, type TestApp } from '../helpers/app.js';
import { api, codeOf, isError, type RequestBody } from '../helpers/api.js';
import { createApiKey, createNode, createUser, credit } from '../helpers/factories.js';
import { ledgerCheck } from '../../src/modules/billing/ledger-check.js';
import { usageGapsSql } from '../helpers/billing-checks.js';
import { holdsGpus, type RentalType, type VmStatus } from '../../src/modules/vms/lifecycle.js';
import { quote } from '../../src/modules/reservations/service.js';
import { ERROR_CODES as CODES } from '../helpers/expected.js';

const SEED = Number(process.env.PROPERTY_SEED ?? 4_2026_1122);
const RUNS = Number(process.env.PROPERTY_RUNS ?? 24);

/**
 * The command that replays a failing run exactly: the same seed and path, the
 * same number of runs, and the same clock start (the money of a run depends on
 * where its periods fall). With DATABASE_URL set it runs on both databases again.
 */
function replayCommand(seed: number, path: string | null | undefined): string {
  const env = [`GPUCLOUD_CLOCK_START=${TEST_CLOCK_START}`, `PROPERTY_SEED=${seed}`];
  if (path) env.push(`PROPERTY_PATH=${path}`);
  if (process.env.PROPERTY_RUNS) env.push(`PROPERTY_RUNS=${RUNS}`);
  return `${env.join(' ')} node scripts/test.mjs test/billing/property.test.ts`;
}
const MAX_STEPS = 15;
const DAY_S = 86_400;

/** The inventory of every run: small nodes so that GPUs run out and preemption happens. */
const NODES = [
  { gpu_type: '4090', gpu_count: 2 },
  { gpu_type: '4090', gpu_count: 4 },
  { gpu_type: '5090', gpu_count: 8 },
] as const;
const USERS = 3;

type Cmd =
  | { k: 'create'; u: number; n: number; rental: RentalType; gpus: 1 | 2 | 4 | 8; gb: number; months: 1 | 3 | 6 }
  | { k: 'stop' | 'start' | 'destroy'; u: number; i: number }
  | { k: 'stopStart'; i: number; s: number }
  | { k: 'preempt'; u: number; n: number }
  | { k: 'cancel'; u: number; i: number }
  | { k: 'fault'; n: number; action: 'provision' | 'start' | 'stop' }
  | { k: 'node'; n: number; status: 'active' | 'offline' }
  | { k: 'advance'; s: number }
  | { k: 'toEnd' };

const user = fc.integer({ min: 0, max: USERS - 1 });
const nodeIx = fc.integer({ min: 0, max: NODES.length - 1 });
const index = fc.nat({ max: 20 });
const cmd: fc.Arbitrary<Cmd> = fc.oneof(
  {
    weight: 5,
    arbitrary: fc.record({
      k: fc.constant('create' as const),
      u: user,
      n: nodeIx,
      rental: fc.constantFrom<RentalType>('on_demand', 'interruptible', 'reserved'),
      gpus: fc.constantFrom<1 | 2 | 4 | 8>(1, 1, 2, 4, 8),
      gb: fc.constantFrom(50, 100, 500),
      months: fc.constantFrom<1 | 3 | 6>(1, 3, 6),
    }),
  },
  { weight: 3, arbitrary: fc.record({ k: fc.constant('stop' as const), u: user, i: index }) },
  { weight: 3, arbitrary: fc.record({ k: fc.constant('start' as const), u: user, i: index }) },
  { weight: 2, arbitrary: fc.record({ k: fc.constant('destroy' as const), u: user, i: index }) },
  {
    weight: 2,
    arbitrary: fc.record({ k: fc.constant('stopStart' as const), i: index, s: fc.integer({ min: 1, max: 3 * 3600 }) }),
  },
  { weight: 1, arbitrary: fc.record({ k: fc.constant('preempt' as const), u: user, n: nodeIx }) },
  { weight: 2, arbitrary: fc.record({ k: fc.constant('cancel' as const), u: user, i: index }) },
  {
    weight: 1,
    arbitrary: fc.record({
      k: fc.constant('fault' as const),
      n: nodeIx,
      action: fc.constantFrom('provision' as const, 'start' as const, 'stop' as const),
    }),
  },
  {
    weight: 1,
    arbitrary: fc.record({
      k: fc.constant('node' as const),
      n: nodeIx,
      status: fc.constantFrom('offline' as const, 'active' as const),
    }),
  },
  {
    weight: 5,
    arbitrary: fc.record({
      k: fc.constant('advance' as const),
      s: fc.oneof(
        fc.integer({ min: 1, max: 300 }),
        fc.integer({ min: 300, max: 4 * 3600 }),
        fc.integer({ min: 4 * 3600, max: 3 * DAY_S }),
      ),
    }),
  },
  { weight: 2, arbitrary: fc.constant({ k: 'toEnd' as const }) },
);
/** Credits from "cannot pay for an hour" to "can prepay six months of a big VM". */
const credits = fc.array(fc.constantFrom(0.3, 3, 40, 400, 3000, 3000, 30000, 30000), {
  minLength: USERS,
  maxLength: USERS,
});

/**
 * A hand-written run that goes through every path the random runs might miss (fast-check runs it
 * first): reserved VMs destroyed and alive at the end of their term, a cancellation, a stop and
 * start, a preemption, a user running out of credit.
 */
const EXAMPLE: [number[], Cmd[]] = [
  [30000, 3000, 3],
  [
    { k: 'create', u: 0, n: 0, rental: 'reserved', gpus: 1, gb: 50, months: 1 },
    { k: 'create', u: 0, n: 1, rental: 'reserved', gpus: 1, gb: 50, months: 1 },
    { k: 'create', u: 1, n: 2, rental: 'reserved', gpus: 2, gb: 100, months: 3 },
    { k: 'create', u: 2, n: 2, rental: 'on_demand', gpus: 1, gb: 50, months: 1 },
    { k: 'advance', s: 60 },
    { k: 'stopStart', i: 1, s: 1800 },
    { k: 'destroy', u: 0, i: 0 },
    { k: 'preempt', u: 1, n: 1 },
    { k: 'advance', s: 600 },
    { k: 'cancel', u: 0, i: 2 },
    { k: 'advance', s: 3 * DAY_S },
    { k: 'toEnd' },
    { k: 'advance', s: 2 * 3600 },
  ],
];

type GpuType = RequestBody<'/vms', 'post'>['gpu_type'];

/** The error code of an answer's body, if it has one (t().req asserts that every error answer has one). */

interface Account {
  id: number;
  email: string;
  key: string;
  vms: string[];
  reservations: string[];
}

describeEachDb(
  'billing invariants under random operations (property)',
  (t) => {
    let adminKey: string;
    let adminId: number;
    /** One real public key for every user (the same key on several accounts is allowed; ssh-keygen is slow). */
    let sshKeyLine: string;

    before(async () => {
      const admin = await createUser(t(), { admin: true });
      adminId = admin.id;
      adminKey = await createApiKey(t(), admin.token, 'read_write', 'property-admin');
      sshKeyLine = (await import('../ssh-keys/keygen.js')).generateKey('ed25519').line;
    });

    // Found by the property (PROPERTY_SEED=12 PROPERTY_RUNS=30): when the low-balance rule stops a broke user's
    // running interruptible VM, the GPU it frees lets auto-restart bring back the user's other, interrupted VM,
    // with no balance check, and it runs on credit that is used up until the next period close.
    test('low balance: a user out of credit gets no VM auto-restarted (regression of seed 12)', async () => {
      const node = (await createNode(t(), adminKey, { gpu_type: '4090', gpu_count: 2 })).node;
      const poor = await createUser(t());
      await credit(t(), adminKey, poor.id, 3);
      assert.equal(
        (await api(t(), poor.token).post('/ssh-keys', { body: { ssh_public_key: sshKeyLine } })).status,
        201,
      );
      const poorKey = await createApiKey(t(), poor.token, 'read_write');
      const rich = await createUser(t());
      await credit(t(), adminKey, rich.id, 1000);
      assert.equal(
        (await api(t(), rich.token).post('/ssh-keys', { body: { ssh_public_key: sshKeyLine } })).status,
        201,
      );
      const body = (rental: RentalType): RequestBody<'/vms', 'post'> => ({
        node,
        gpu_type: '4090',
        gpu_count: 1,
        storage_gb: 50,
        template_vmid: 100,
        rental_type: rental,
      });
      const spots: string[] = [];
      for (let i = 0; i < 2; i++) {
        const r = await api(t(), poorKey).post('/vms', { body: body('interruptible') });
        assert.equal(r.status, 201, r.text);
        spots.push(r.body.id);
      }
      const od = await api(t(), rich.token).post('/vms', { body: body('on_demand') }); // preempts one of them
      assert.equal(od.status, 201, od.text);
      // A day at 0.23/h is more than the 3 of credit: the period close leaves the balance below zero.
      assert.equal((await api(t(), adminKey).post('/admin/clock/advance', { body: { seconds: DAY_S } })).status, 200);
      const bal = await api(t(), poorKey).get('/billing/balance');
      assert.equal(bal.status, 200, bal.text);
      const balance = bal.body.balance;
      assert.ok(balance <= 0, `balance ${balance}`);
      const statuses: string[] = [];
      for (const id of spots) {
        const vm = await api(t(), poorKey).get('/vms/{vm_id}', { params: { vm_id: id } });
        assert.equal(vm.status, 200, vm.text);
        statuses.push(vm.body.status);
      }
      assert.ok(
        !statuses.includes('running') && !statuses.includes('starting'),
        `no VM of a broke user runs: ${statuses}`,
      );
      for (const id of spots) await api(t(), poorKey).delete('/vms/{vm_id}', { params: { vm_id: id } });
      await api(t(), rich.token).delete('/vms/{vm_id}', { params: { vm_id: od.body.id } });
    });

    test(`ledger, balances, capacity and reservations hold after every step (${RUNS} runs, seed ${SEED})`, async () => {
      const db = t().db;
      const statuses = new Map<string, number>();
      let trace: string[] = [];
      let runNo = 0;
      const timing = { setup: 0, perform: 0, check: 0 };

      /**
       * Every API call of the property goes through here: never a 5xx, and errors carry a code from the closed list.
       * `checked` is the test app with its request helper wrapped, so that the typed client api(checked, ...) sends
       * every call through these checks with the method and URL it sends.
       */
      const checked: TestApp = {
        ...t(),
        req: async (method, url, opts) => {
          const r = await t().req(method, url, opts);
          const what = `${method} ${url.replace(/[0-9a-f]{8}-[0-9a-f-]{27}/g, ':id').replace(/^\/admin\/nodes\/.+$/, '/admin/nodes/:node')}`;
          const code = codeOf(r.body);
          trace.push(`  ${what} -> ${r.status}${r.status >= 400 ? ` ${code}` : ''}`);
          assert.ok(r.status < 500, `${what} answered ${r.status}: ${r.text}`);
          if (r.status >= 400)
            assert.ok(
              typeof code === 'string' && CODES.has(code),
              `${what}: code ${code} is not in the closed list of error codes`,
            );
          const key = `${what} ${r.status}`;
          statuses.set(key, (statuses.get(key) ?? 0) + 1);
          return r;
        },
      };
      /** A typed client whose calls go through the checks above. */
      const call = (key: string) => api(checked, key);
      const now = async () => {
        const r = await call(adminKey).get('/admin/clock');
        assert.equal(r.status, 200, r.text);
        return Date.parse(r.body.now);
      };
      const advance = async (seconds: number) => {
        const r = await call(adminKey).post('/admin/clock/advance', { body: { seconds } });
        assert.equal(r.status, 200, r.text);
      };

      const balances = async () =>
        new Map(
          (
            await db.query<{ id: number; b: number }>('SELECT user_id AS id, balance_micros AS b FROM balances')
          ).rows.map((r) => [r.id, r.b]),
        );
      const maxSeq = async () =>
        (await db.query<{ s: number | null }>('SELECT max(seq)::int8 AS s FROM transactions')).rows[0]!.s ?? 0;

      async function checkInvariants(
        accounts: Account[],
        nodes: { node: string; gpu_count: number }[],
        before: Map<number, number>,
        seqBefore: number,
        settled: boolean,
      ) {
        // 1. The ledger check over the whole database.
        assert.deepEqual(await ledgerCheck(db), [], 'ledgerCheck finds nothing');
        // 2. balance == sum(transactions), directly.
        const off = await db.query(
          `SELECT b.user_id FROM balances b LEFT JOIN transactions t ON t.user_id = b.user_id
            GROUP BY b.user_id HAVING b.balance_micros <> COALESCE(SUM(t.amount_micros), 0)`,
        );
        assert.deepEqual(off.rows, [], 'balance == sum(transactions) for every user');
        // 3. No balance moved without a transaction written in this step.
        const after = await balances();
        const written = new Map(
          (
            await db.query<{ user_id: number; s: number }>(
              'SELECT user_id, SUM(amount_micros)::int8 AS s FROM transactions WHERE seq > $1 GROUP BY user_id',
              [seqBefore],
            )
          ).rows.map((r) => [r.user_id, r.s]),
        );
        for (const [id, b] of after) {
          assert.equal(
            b - (before.get(id) ?? 0),
            written.get(id) ?? 0,
            `user ${id}: balance moved by exactly this step's transactions`,
          );
        }
        const apiBalances = await Promise.all(accounts.map((a) => call(a.key).get('/billing/balance')));
        accounts.forEach((a, i) => {
          const r = apiBalances[i]!;
          assert.equal(r.status, 200, r.text);
          assert.equal(Math.round(r.body.balance * 1e6), after.get(a.id), 'GET /billing/balance is the ledger balance');
        });
        // 4. Capacity: held GPUs within each node; holds_gpus as the status and rental type say (holdsGpus).
        const over = await db.query(
          `SELECT n.node, n.gpu_count, COALESCE(SUM(v.gpu_count) FILTER (WHERE v.holds_gpus), 0)::int8 AS held
             FROM nodes n LEFT JOIN vms v ON v.node = n.node
            GROUP BY n.node, n.gpu_count HAVING COALESCE(SUM(v.gpu_count) FILTER (WHERE v.holds_gpus), 0) > n.gpu_count`,
        );
        assert.deepEqual(over.rows, [], 'no node has more GPUs held than it has');
        const ids = accounts.map((a) => a.id);
        const vms = (
          await db.query<{
            id: string;
            status: VmStatus;
            rental_type: RentalType;
            offline_from: VmStatus | null;
            holds_gpus: boolean;
            node: string;
          }>('SELECT id, status, rental_type, offline_from, holds_gpus, node FROM vms WHERE user_id = ANY($1)', [ids])
        ).rows;
        for (const v of vms) {
          assert.equal(
            v.holds_gpus,
            holdsGpus(v.status, v.rental_type, v.offline_from),
            `VM ${v.id} (${v.rental_type}, ${v.status}): holds_gpus`,
          );
        }
        const infos = await Promise.all(
          nodes.map((n) => call(adminKey).get('/admin/nodes/{node}', { params: { node: n.node } })),
        );
        nodes.forEach((n, i) => {
          const info = infos[i]!;
          assert.equal(info.status, 200, info.text);
          assert.ok(
            info.body.gpus_allocated <= n.gpu_count && info.body.gpus_free >= 0,
            `node ${n.node}: ${info.text}`,
          );
        });
        // 5. Reservations agree with their VMs.
        const rs = (
          await db.query<{
            id: string;
            status: string;
            remaining_micros: number;
            cancellation_fee_micros: number;
            refund_micros: number;
            end_at: Date;
            ended_at: Date | null;
            vm_status: VmStatus;
            vm_rental: RentalType;
            vm_reservation: string | null;
          }>(
            `SELECT r.id, r.status, r.remaining_micros, r.cancellation_fee_micros, r.refund_micros, r.end_at, r.ended_at,
                    v.status AS vm_status, v.rental_type AS vm_rental, v.reservation_id AS vm_reservation
               FROM reservations r JOIN vms v ON v.id = r.vm_id WHERE r.user_id = ANY($1)`,
            [ids],
          )
        ).rows;
        const nowMs = await now();
        for (const r of rs) {
          const gone = r.vm_status === 'destroyed' || r.vm_status === 'failed';
          const where = `reservation ${r.id} (${r.status}, VM ${r.vm_status} ${r.vm_rental})`;
          assert.equal(r.vm_reservation, r.id, `${where}: the VM names it`);
          if (r.status === 'active') {
            assert.equal(r.vm_rental, 'reserved', where);
            assert.notEqual(r.vm_status, 'failed', `${where}: a failed VM's reservation is cancelled`);
            if (settled)
              assert.ok(
                r.end_at.getTime() > nowMs,
                `${where}: still active past its end (a term's end converts or completes it)`,
              );
          } else if (r.status === 'cancelled') {
            assert.equal(r.remaining_micros, 0, where);
            const base = r.cancellation_fee_micros + r.refund_micros;
            if (r.vm_status === 'failed' && r.cancellation_fee_micros === 0) {
              assert.ok(r.refund_micros >= 0, where);
            } else {
              assert.equal(
                r.cancellation_fee_micros,
                Number((BigInt(base) * 25n * 2n + 100n) / 200n),
                `${where}: fee is 25 % half-up`,
              );
            }
            assert.ok(r.vm_rental === 'on_demand' || gone, `${where}: the VM goes on as on-demand`);
          } else if (r.status === 'converted_to_on_demand') {
            assert.equal(r.vm_rental, 'on_demand', where);
            assert.equal(r.ended_at?.getTime(), r.end_at.getTime(), where);
          } else if (r.status === 'completed') {
            assert.equal(r.vm_status, 'destroyed', where);
            assert.equal(r.ended_at?.getTime(), r.end_at.getTime(), where);
          }
        }
        // 6. Usage charged exactly once: contiguous periods from the first start, none after destroy, none if never
        // run.
        const gaps = await db.query(usageGapsSql(true), [ids]);
        assert.deepEqual(gaps.rows, [], 'usage periods are contiguous from the first start and end by the destroy');
        // 7. Reservations draw only within their term (until end_at or the cancellation), never after.
        const lateDraws = await db.query(
          `SELECT l.id, l.period_end, r.status, r.end_at, r.ended_at FROM usage_logs l JOIN reservations r ON r.id = l.reservation_id
            WHERE l.user_id = ANY($1) AND l.from_reservation_micros > 0 AND l.period_end > LEAST(r.end_at, COALESCE(r.ended_at, r.end_at))`,
          [ids],
        );
        assert.deepEqual(lateDraws.rows, [], 'no usage drawn from a reservation after it ended');
        // While a reservation has money left, its VM's usage is not charged to the credit balance.
        const chargedEarly = await db.query(
          `SELECT l.id FROM usage_logs l JOIN reservations r ON r.id = l.reservation_id
            WHERE l.user_id = ANY($1) AND r.status = 'active' AND r.remaining_micros > 0 AND l.transaction_id IS NOT NULL`,
          [ids],
        );
        assert.deepEqual(chargedEarly.rows, [], 'a reserved VM is charged only once its reservation is used up');
        // 8. Deposits are the reservation quote of the VM's shape; the term is months x 730 h; a failed VM's deposit
        // came back whole.
        const deposits = (
          await db.query<{
            id: string;
            gpu_type: string;
            gpu_count: number;
            storage_gb: number;
            reservation_months: 1 | 3 | 6;
            deposit_micros: number;
            created_at: Date;
            end_at: Date;
            status: string;
            refund_micros: number;
            cancellation_fee_micros: number;
            vm_status: string;
          }>(
            `SELECT r.id, r.gpu_type, r.gpu_count, r.storage_gb, r.reservation_months, r.deposit_micros, r.created_at, r.end_at,
                    r.status, r.refund_micros, r.cancellation_fee_micros, v.status AS vm_status
               FROM reservations r JOIN vms v ON v.id = r.vm_id WHERE r.user_id = ANY($1)`,
            [ids],
          )
        ).rows;
        for (const r of deposits) {
          const q = quote(
            (await t().services.inventory.pricingFor(db, r.gpu_type))!,
            r.gpu_count,
            r.storage_gb,
            r.reservation_months,
          );
          assert.equal(r.deposit_micros, q.depositMicros, `reservation ${r.id}: deposit is the quote`);
          assert.equal(r.end_at.getTime() - r.created_at.getTime(), r.reservation_months * 730 * 3_600_000);
          if (r.vm_status === 'failed') {
            assert.equal(r.status, 'cancelled');
            assert.deepEqual(
              [r.refund_micros, r.cancellation_fee_micros],
              [r.deposit_micros, 0],
              `reservation ${r.id} of a failed VM`,
            );
          }
        }
        // 9. Signs of the transaction types: credit and refund positive, charge and deposit negative.
        const badSigns = await db.query(
          `SELECT id, type, amount_micros FROM transactions WHERE user_id = ANY($1) AND NOT (
             (type = 'credit' AND amount_micros > 0) OR (type IN ('charge', 'deposit') AND amount_micros < 0) OR (type = 'refund' AND amount_micros > 0))`,
          [ids],
        );
        assert.deepEqual(badSigns.rows, []);
        // 10. Metering is settled: a destroyed VM that ran is billed up to its destruction; after an advance, every
        //     VM that accrues is billed up to the last period boundary.
        const unbilled = await db.query(
          // A destroyed VM has no meter left, and its periods end at its destruction.
          `SELECT v.id, v.status, m.billed_until, v.destroyed_at FROM vms v LEFT JOIN vm_meters m ON m.vm_id = v.id
            WHERE v.user_id = ANY($1) AND v.first_started_at IS NOT NULL AND (
             (v.status = 'destroyed' AND (m.vm_id IS NOT NULL
                OR coalesce((SELECT max(l.period_end) FROM usage_logs l WHERE l.vm_id = v.id), v.first_started_at) <> v.destroyed_at))
             OR ($2::boolean AND v.status <> 'destroyed' AND m.billed_until < to_timestamp(floor(extract(epoch FROM $3::timestamptz) / $4) * $4)))`,
          [ids, settled, new Date(nowMs), DAY_S],
        );
        assert.deepEqual(unbilled.rows, [], 'every VM is billed up to its destruction or the last boundary');
        // 11. Low balance: once the jobs have settled, a user whose balance is at or below zero has no VM running on
        // credit.
        if (settled) {
          const broke = await db.query(
            `SELECT v.id, v.status, v.rental_type, b.balance_micros FROM vms v JOIN balances b ON b.user_id = v.user_id
              WHERE v.user_id = ANY($1) AND b.balance_micros <= 0 AND v.status IN ('running', 'starting') AND v.rental_type <> 'reserved'`,
            [ids],
          );
          assert.deepEqual(broke.rows, [], 'low balance: no VM runs on credit that is used up');
        }
        const gpuOverStorage = await db.query(
          'SELECT id FROM usage_logs WHERE user_id = ANY($1) AND gpu_ms > storage_ms',
          [ids],
        );
        assert.deepEqual(gpuOverStorage.rows, []);
        const charged = await db.query<{ n: number }>(
          `SELECT count(*)::int AS n FROM transactions t JOIN vms v ON v.id = t.vm_id
            WHERE t.type = 'charge' AND t.user_id = ANY($1) AND v.first_started_at IS NULL AND NOT (t.breakdown ? 'minimum_charge')`,
          [ids],
        );
        assert.equal(
          charged.rows[0]!.n,
          0,
          'nothing is charged for a VM that never ran (but the minimum of one that interrupted others)',
        );
        // A minimum charge only for a destroyed VM that interrupted others, once, and never above one period of it.
        const minimums = await db.query<{ id: string }>(
          `SELECT t.id FROM transactions t JOIN vms v ON v.id = t.vm_id
            WHERE t.user_id = ANY($1) AND t.breakdown ? 'minimum_charge'
              AND (v.status <> 'destroyed'
                   OR NOT EXISTS (SELECT 1 FROM interruptions i WHERE i.preempted_by_vm_id = v.id)
                   OR (SELECT count(*) FROM transactions t2 WHERE t2.vm_id = v.id AND t2.breakdown ? 'minimum_charge') > 1)`,
          [ids],
        );
        assert.deepEqual(
          minimums.rows,
          [],
          'minimum charges only for destroyed VMs that interrupted others, once each',
        );
      }

      const pick = <T>(xs: T[], i: number): T | undefined => (xs.length ? xs[i % xs.length] : undefined);

      async function run(creditsOf: number[], cmds: Cmd[]): Promise<void> {
        runNo++;
        const t0 = Date.now();
        trace = [`run ${runNo}: credits ${JSON.stringify(creditsOf)}`];
        const accounts: Account[] = [];
        for (const amount of creditsOf) {
          const u = await createUser(t());
          await credit(t(), adminKey, u.id, amount);
          const key = await call(u.token).post('/ssh-keys', { body: { ssh_public_key: sshKeyLine } });
          assert.equal(key.status, 201, key.text);
          accounts.push({
            id: u.id,
            email: u.email,
            key: await createApiKey(t(), u.token, 'read_write', 'property'),
            vms: [],
            reservations: [],
          });
        }
        const nodes: { node: string; gpu_count: number; gpu_type: GpuType }[] = [];
        for (const n of NODES) nodes.push({ ...n, node: (await createNode(t(), adminKey, { ...n })).node });
        timing.setup += Date.now() - t0;
        try {
          for (const [step, c] of cmds.entries()) {
            trace.push(`step ${step}: ${JSON.stringify(c)}`);
            const before = await balances();
            const seqBefore = await maxSeq();
            let t0 = Date.now();
            await perform(c, accounts, nodes);
            timing.perform += Date.now() - t0;
            t0 = Date.now();
            await checkInvariants(
              accounts,
              nodes,
              before,
              seqBefore,
              c.k === 'advance' || c.k === 'toEnd' || c.k === 'stopStart',
            );
            timing.check += Date.now() - t0;
          }
        } catch (err) {
          const e = err instanceof Error ? err : new Error(String(err));
          e.message = `${e.message}\n--- seed ${SEED}, trace of the failing run ---\n${trace.join('\n')}`;
          throw e;
        } finally {
          // Leave nothing accruing for the next run (its advances would step through this run's periods).
          for (const a of accounts) {
            for (const id of a.vms) await api(t(), a.key).delete('/vms/{vm_id}', { params: { vm_id: id } });
          }
          await api(t(), adminKey).post('/admin/clock/advance', { body: { seconds: 1 } });
        }
      }

      async function perform(
        c: Cmd,
        accounts: Account[],
        nodes: { node: string; gpu_count: number; gpu_type: GpuType }[],
      ): Promise<void> {
        switch (c.k) {
          case 'create': {
            const a = accounts[c.u]!;
            const n = nodes[c.n]!;
            const body: RequestBody<'/vms', 'post'> = {
              node: n.node,
              gpu_type: n.gpu_type,
              gpu_count: c.gpus,
              storage_gb: c.gb,
              template_vmid: 100,
              rental_type: c.rental,
            };
            if (c.rental === 'reserved') body.reservation_months = c.months;
            const r = await call(a.key).post('/vms', { body });
            if (r.status === 201) {
              a.vms.push(r.body.id);
              if (r.body.reservation_id) a.reservations.push(r.body.reservation_id);
            } else {
              assert.ok(['insufficient_balance', 'gpu_unavailable', 'limit_exceeded'].includes(r.body.code), r.text);
            }
            return;
          }
          case 'stop':
          case 'start':
          case 'destroy': {
            // Mostly a VM of this run that the action suits (running to stop, stopped or interrupted to start),
            // acted on by its owner; now and then any VM of the run, or one of another user (which must be 404).
            const all = accounts.flatMap((a) => a.vms);
            const suits = {
              stop: ['running'],
              start: ['stopped', 'interrupted'],
              destroy: ['creating', 'starting', 'running', 'stopping', 'stopped', 'interrupted', 'failed'],
            }[c.k];
            const fit = (
              await db.query<{ id: string }>(
                'SELECT id FROM vms WHERE id = ANY($1) AND status = ANY($2) ORDER BY seq',
                [all, suits],
              )
            ).rows.map((r) => r.id);
            const id = (c.i % 5 === 4 ? pick(all, c.i) : (pick(fit, c.i) ?? pick(all, c.i))) ?? randomUUID();
            const owner = accounts.find((a) => a.vms.includes(id)) ?? accounts[c.u]!;
            const stranger = c.i % 7 === 6 && owner !== accounts[c.u];
            const actor = stranger ? accounts[c.u]! : owner;
            const vm = { params: { vm_id: id } };
            const r =
              c.k === 'destroy'
                ? await call(actor.key).delete('/vms/{vm_id}', vm)
                : c.k === 'stop'
                  ? await call(actor.key).post('/vms/{vm_id}/stop', vm)
                  : await call(actor.key).post('/vms/{vm_id}/start', vm);
            if (stranger) assert.equal(r.status, 404, `another user's VM is 404, like a missing one: ${r.text}`);
            if (isError(r))
              assert.ok(
                ['invalid_state', 'not_found', 'gpu_unavailable', 'insufficient_balance'].includes(r.body.code),
                r.text,
              );
            return;
          }
          case 'stopStart': {
            // Stop a running VM, let the hypervisor settle it, and start it again later.
            const all = accounts.flatMap((a) => a.vms);
            const running = (
              await db.query<{ id: string }>(
                `SELECT id FROM vms WHERE id = ANY($1) AND status = 'running' ORDER BY seq`,
                [all],
              )
            ).rows.map((r) => r.id);
            const id = pick(running, c.i);
            if (!id) return advance(c.s);
            const owner = accounts.find((a) => a.vms.includes(id))!;
            await call(owner.key).post('/vms/{vm_id}/stop', { params: { vm_id: id } });
            await advance(c.s);
            const r = await call(owner.key).post('/vms/{vm_id}/start', { params: { vm_id: id } });
            if (isError(r))
              assert.ok(['invalid_state', 'gpu_unavailable', 'insufficient_balance'].includes(r.body.code), r.text);
            return;
          }
          case 'preempt': {
            // Fill the node with interruptible VMs of the next user, then create an on-demand VM on it.
            const n = nodes[c.n]!;
            const filler = accounts[(c.u + 1) % accounts.length]!;
            for (let i = 0; i < n.gpu_count; i++) {
              const r = await call(filler.key).post('/vms', {
                body: {
                  node: n.node,
                  gpu_type: n.gpu_type,
                  gpu_count: 1,
                  storage_gb: 50,
                  template_vmid: 100,
                  rental_type: 'interruptible',
                },
              });
              if (r.status !== 201) break;
              filler.vms.push(r.body.id);
            }
            const a = accounts[c.u]!;
            const r = await call(a.key).post('/vms', {
              body: { node: n.node, gpu_type: n.gpu_type, gpu_count: 1, storage_gb: 50, template_vmid: 100 },
            });
            if (r.status === 201) a.vms.push(r.body.id);
            return;
          }
          case 'cancel': {
            const all = accounts.flatMap((a) => a.reservations);
            const active = (
              await db.query<{ id: string }>(
                `SELECT id FROM reservations WHERE id = ANY($1) AND status = 'active' ORDER BY seq`,
                [all],
              )
            ).rows.map((r) => r.id);
            const id = (c.i % 5 === 4 ? pick(all, c.i) : (pick(active, c.i) ?? pick(all, c.i))) ?? randomUUID();
            const owner = accounts.find((a) => a.reservations.includes(id)) ?? accounts[c.u]!;
            const stranger = c.i % 7 === 6 && owner !== accounts[c.u];
            const r = await call(stranger ? accounts[c.u]!.key : owner.key).delete('/reservations/{reservation_id}', {
              params: { reservation_id: id },
            });
            if (stranger)
              assert.equal(r.status, 404, `another user's reservation is 404, like a missing one: ${r.text}`);
            if (r.status === 200) assert.equal(r.body.status, 'cancelled');
            else assert.ok(['invalid_state', 'not_found'].includes(r.body.code), r.text);
            return;
          }
          case 'fault': {
            const r = await call(adminKey).post('/admin/simulator/faults', {
              body: { node: nodes[c.n]!.node, action: c.action },
            });
            assert.equal(r.status, 200, r.text);
            return;
          }
          case 'node': {
            // A node going offline takes its VMs with it; coming back restores them.
            const r = await call(adminKey).patch('/admin/nodes/{node}', {
              params: { node: nodes[c.n]!.node },
              body: { status: c.status },
            });
            assert.equal(r.status, 200, r.text);
            return;
          }
          case 'advance':
            return advance(c.s);
          case 'toEnd': {
            // To the end of the nearest active reservation of this run (at most 31 days ahead).
            const ids = accounts.map((a) => a.id);
            const r = await db.query<{ end_at: Date | null }>(
              `SELECT min(end_at) AS end_at FROM reservations WHERE status = 'active' AND user_id = ANY($1)`,
              [ids],
            );
            const end = r.rows[0]?.end_at?.getTime();
            const s = end === undefined ? DAY_S : Math.max(1, Math.ceil((end - (await now())) / 1000));
            return advance(Math.min(s, 31 * DAY_S));
          }
        }
      }

      // Runs replay exactly from the seed only if time starts at the same place relative to the period
      // boundaries. The test clock starts at a fixed instant (TEST_CLOCK_START); one given in the
      // environment may start mid-day, so go to the next top of the day first either way.
      const startS = Math.floor((await now()) / 1000);
      if (startS % DAY_S) await advance(DAY_S - (startS % DAY_S));
      const started = Date.now();
      const details = await fc.check(
        fc.asyncProperty(
          credits,
          fc.array(cmd, { minLength: 6, maxLength: MAX_STEPS, size: 'max' }),
          async (cs, cmds) => {
            await run(cs, cmds);
          },
        ),
        {
          numRuns: RUNS,
          seed: SEED,
          examples: [EXAMPLE],
          ...(process.env.PROPERTY_PATH ? { path: process.env.PROPERTY_PATH } : {}),
          // A shrink is a run each and the suite has a per-test timeout: report the first failure as is unless asked.
          endOnFailure: process.env.PROPERTY_SHRINK !== '1',
        },
      );
      if (details.failed) {
        const counterexample = details.counterexample
          ? `credits ${JSON.stringify(details.counterexample[0])}\n${details.counterexample[1].map((c, i) => `  ${i}: ${JSON.stringify(c)}`).join('\n')}`
          : '(none)';
        const cause =
          details.errorInstance instanceof Error ? details.errorInstance.message : String(details.errorInstance);
        assert.fail(
          `property failed after ${details.numRuns} run(s): seed ${details.seed}, path "${details.counterexamplePath}"\n` +
            `replay: ${replayCommand(details.seed, details.counterexamplePath)}\n` +
            `counterexample: ${counterexample}\n${cause}`,
        );
      }
      const took = Date.now() - started;
      if (process.env.PROPERTY_STATS)
        console.log(JSON.stringify([...statuses].sort(), null, 0), JSON.stringify(timing));
      // The runs really exercised the interesting paths (not only refusals).
      const seen = [...statuses.keys()];
      for (const must of [
        'POST /vms 201',
        'DELETE /reservations/:id 200',
        'POST /vms/:id/stop 200',
        'POST /vms/:id/start 200',
        'DELETE /vms/:id 200',
      ]) {
        assert.ok(seen.includes(must), `the runs made at least one ${must}: ${seen.join(', ')}`);
      }
      const interrupted = await db.query<{ n: number }>('SELECT count(*)::int AS n FROM interruptions');
      assert.ok(interrupted.rows[0]!.n > 0, 'some interruptible VM was preempted');
      const ended = await db.query<{ status: string }>(`SELECT DISTINCT status FROM reservations`);
      const endedStatuses = ended.rows.map((r) => r.status).sort();
      for (const s of ['cancelled', 'completed', 'converted_to_on_demand'])
        assert.ok(endedStatuses.includes(s), `some reservation ended ${s}: ${endedStatuses}`);
      const low = await db.query<{ n: number }>(
        `SELECT count(*)::int AS n FROM events WHERE type = 'billing.low_balance'`,
      );
      assert.ok(low.rows[0]!.n > 0, 'some user ran out of credit');
      t().app.log.info({ runs: RUNS, seed: SEED, ms: took, admin: adminId }, 'property done');
    });
  },
  { env: { GPUCLOUD_BILLING_INTERVAL_S: String(DAY_S) } },
);
