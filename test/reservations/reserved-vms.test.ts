/**
 * Reserved VMs and cancellation: the deposit taken with the VM in one
 * transaction, the reservation record, the balance check on the deposit, the
 * list (newest first, paginated), usage drawing the prepaid balance down
 * instead of the credit balance, and DELETE /reservations/{id}: 25 % fee
 * (half-up to the micro-unit), 75 % refunded with a `refund` transaction, the
 * VM going on as on-demand. Time moves only through the manual clock; the
 * callers use API keys, which do not expire with service time.
 */
import { before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { describeEachDb } from '../helpers/app.js';
import { api, ok, type Api, type RequestBody } from '../helpers/api.js';
import { createApiKey, createNode, createUser, credit } from '../helpers/factories.js';
import { HOUR_MS, micros, reservationKit, type Caller } from './helpers.js';

/** round_half_up(a * b / c) on integers, the service's rounding of money to the micro-unit. */
const mulDiv = (a: number, b: number, c: number) => Number((BigInt(a) * BigInt(b) * 2n + BigInt(c)) / (2n * BigInt(c)));

/** A number from a transaction's breakdown, which the schema declares free-form (`{ [key: string]: unknown }`). */
function num(v: unknown, what: string): number {
  assert.ok(typeof v === 'number', `${what} is a number: ${JSON.stringify(v)}`);
  return v;
}

describeEachDb('reserved VMs and their reservations: deposit, draws and cancellation', (t) => {
  const kit = reservationKit(t, { keyName: 'reserved-tests', storageGb: 100 });
  const { advance, nowMs, toNextHour, newCaller, reservedVm, balance, txs, reservations, reservation, vm } = kit;
  /** POST /vms of a reserved VM, the answer as it comes. */
  const reserved = kit.reserve;
  let adminKey: string;
  let admin: Api; // sends adminKey
  let node: string; // 4090 x 8
  let proNode: string; // pro6000 x 8

  before(async () => {
    await kit.setUp();
    adminKey = kit.adminKey();
    admin = kit.admin();
    node = kit.node();
    proNode = (await createNode(t(), adminKey, { gpu_type: 'pro6000', gpu_count: 8 })).node;
  });

  describe('creation: the VM, its reservation and the deposit in one transaction', () => {
    test('the deposit, the reservation and the VM are made together', async () => {
      const c = await newCaller(2000);
      const body: RequestBody<'/reservations/calculate', 'post'> = {
        gpu_type: '4090',
        gpu_count: 2,
        storage_gb: 100,
        reservation_months: 3,
      };
      const quote = ok(await c.api.post('/reservations/calculate', { body }));
      // 2 x 0.44 x 0.80 = 0.704, + 100 x 0.0002 = 0.02 -> 0.724/h; x 730 x 3 = 1585.56
      assert.equal(quote.deposit_required, 1585.56);
      const before = await balance(c);
      const v = await reservedVm(c, body);
      assert.equal(v.rental_type, 'reserved');
      assert.equal(v.status, 'creating');
      assert.equal(v.gpu_hourly_rate, 0.704, 'gpu_price_hourly x (1 - discount) per GPU');
      assert.equal(v.storage_hourly_rate, 0.02);
      assert.equal(v.hourly_rate, 0.724);
      assert.equal(v.hourly_rate, quote.hourly_rate_after_discount);
      assert.match(v.reservation_id, /^[0-9a-f-]{36}$/);

      // The deposit transaction: type deposit, negative, the whole commitment.
      const list = await txs(c);
      const dep = list[0];
      assert.ok(dep, 'a transaction');
      assert.equal(dep.type, 'deposit');
      assert.equal(dep.amount, -1585.56);
      assert.equal(dep.balance_after, (before - micros(1585.56)) / 1e6);
      assert.equal(dep.breakdown.reservation_id, v.reservation_id);
      assert.equal(await balance(c), before - micros(1585.56));

      // The reservation record.
      const rs = await reservations(c);
      assert.equal(rs.length, 1);
      const r = rs[0];
      assert.ok(r, 'a reservation');
      assert.equal(r.id, v.reservation_id);
      assert.equal(r.user_id, c.id);
      assert.equal(r.vm_id, v.id);
      assert.equal(r.reservation_months, 3);
      assert.equal(r.discount_percent, 20);
      assert.equal(r.deposit_amount, 1585.56);
      assert.equal(r.remaining_balance, 1585.56);
      assert.equal(r.status, 'active');
      assert.equal(r.created_at, v.created_at);
      assert.equal(
        Date.parse(r.end_at) - Date.parse(r.created_at),
        3 * 730 * HOUR_MS,
        'end_at = created_at + months x 730 h',
      );
      assert.equal(r.cancelled_at, null);
      assert.equal(r.cancellation_fee, 0);
      assert.equal(r.refund_amount, 0);
      ok(await c.api.delete('/vms/{vm_id}', { params: { vm_id: v.id } }));
    });

    test('a balance short of the deposit -> 400 insufficient_balance naming required and available; nothing is written', async () => {
      const c = await newCaller(300);
      const r = await reserved(c); // 0.416/h x 730 = 303.68 > 300
      assert.equal(r.status, 400, r.text);
      assert.equal(r.body.code, 'insufficient_balance');
      assert.match(r.body.detail, /required 303\.68\b/);
      assert.match(r.body.detail, /available 300(\.00)?\b/);
      assert.deepEqual(await reservations(c), []);
      assert.deepEqual(
        (await txs(c)).map((x) => x.type),
        ['credit'],
      );
      assert.equal(await balance(c), micros(300));
      assert.deepEqual(ok(await c.api.get('/vms')), []);
      // Exactly the deposit is enough: the reserved VM does not need an hour of on-demand money on top.
      await credit(t(), adminKey, c.id, 3.68);
      const v = await reservedVm(c);
      assert.equal(await balance(c), 0);
      ok(await c.api.delete('/vms/{vm_id}', { params: { vm_id: v.id } }));
    });

    test('GET /reservations lists newest first with X-Total-Count and paginates', async () => {
      const c = await newCaller(2000);
      const a = await reservedVm(c);
      await advance(1);
      const b = await reservedVm(c, { reservation_months: 3, storage_gb: 50 });
      const r = await c.api.get('/reservations');
      assert.equal(r.status, 200, r.text);
      assert.equal(r.headers['x-total-count'], '2');
      assert.deepEqual(
        r.body.map((x) => x.vm_id),
        [b.id, a.id],
      );
      const p = await c.api.get('/reservations', { query: { limit: 1, offset: 1 } });
      assert.equal(p.status, 200, p.text);
      assert.equal(p.headers['x-total-count'], '2');
      assert.deepEqual(
        p.body.map((x) => x.vm_id),
        [a.id],
      );
      assert.equal((await c.api.get('/reservations', { query: { limit: 0 } })).status, 422);
      // Per user: another caller sees none of them.
      const other = await newCaller(0);
      const o = await other.api.get('/reservations');
      assert.deepEqual(o.body, []);
      assert.equal(o.headers['x-total-count'], '0');
      for (const v of [a, b]) ok(await c.api.delete('/vms/{vm_id}', { params: { vm_id: v.id } }));
    });

    test('Idempotency-Key: a replayed reserved create takes one deposit and makes one reservation', async () => {
      const c = await newCaller(1000);
      const body: RequestBody<'/vms', 'post'> = {
        node,
        gpu_type: '4090',
        gpu_count: 1,
        storage_gb: 100,
        template_vmid: 100,
        rental_type: 'reserved',
        reservation_months: 1,
      };
      const headers = { 'idempotency-key': `reserve-${randomUUID()}` };
      const a = await c.api.post('/vms', { body, headers });
      const b = await c.api.post('/vms', { body, headers });
      assert.equal(a.status, 201, a.text);
      assert.equal(b.status, 201, b.text);
      assert.deepEqual(b.body, a.body);
      assert.equal((await reservations(c)).length, 1);
      assert.deepEqual(
        (await txs(c)).map((x) => x.type),
        ['deposit', 'credit'],
      );
      assert.equal(await balance(c), micros(1000 - 303.68));
      ok(await c.api.delete('/vms/{vm_id}', { params: { vm_id: a.body.id } }));
    });

    test("concurrent reserved creates never spend the same money twice (one user's creates are serialized)", async () => {
      const c = await newCaller(500); // one deposit of 303.68 fits, two do not
      const res = await Promise.all([reserved(c), reserved(c), reserved(c)]);
      const codes = res.map((r) => r.status).sort();
      assert.deepEqual(codes, [201, 400, 400], res.map((r) => r.text).join('\n'));
      for (const r of res.filter((x) => x.status === 400)) assert.equal(r.body.code, 'insufficient_balance');
      assert.equal((await reservations(c)).length, 1);
      assert.equal(await balance(c), micros(500 - 303.68));
      for (const r of res.filter((x) => x.status === 201))
        ok(await c.api.delete('/vms/{vm_id}', { params: { vm_id: r.body.id } }));
    });

    test('a reserved VM preempts interruptible VMs like an on-demand one', async () => {
      const small = (await createNode(t(), adminKey, { gpu_type: '4090', gpu_count: 2 })).node;
      const spot = await newCaller(100);
      const ids: string[] = [];
      for (let i = 0; i < 2; i++) {
        ids.push(
          ok(
            await spot.api.post('/vms', {
              body: {
                node: small,
                gpu_type: '4090',
                gpu_count: 1,
                storage_gb: 50,
                template_vmid: 100,
                rental_type: 'interruptible',
              },
            }),
            201,
          ).id,
        );
      }
      await advance(1);
      const c = await newCaller(1000);
      const v = await reservedVm(c, { node: small, gpu_count: 2 });
      for (const id of ids) assert.equal((await vm(spot, id)).status, 'interrupted');
      const first = ids[0];
      assert.ok(first, 'two interruptible VMs');
      const history = ok(await spot.api.get('/vms/{vm_id}/interruption-history', { params: { vm_id: first } }));
      assert.ok(history[0], 'an interruption');
      assert.equal(history[0].preempted_by_vm_id, v.id);
      ok(await c.api.delete('/vms/{vm_id}', { params: { vm_id: v.id } }));
      for (const id of ids) ok(await spot.api.delete('/vms/{vm_id}', { params: { vm_id: id } }));
    });

    test('API key scopes: read_only lists reservations, billing_only may only calculate', async () => {
      const u = await createUser(t());
      const ro = await createApiKey(t(), u.token, 'read_only');
      const bo = await createApiKey(t(), u.token, 'billing_only');
      const list = await api(t(), ro).get('/reservations');
      assert.equal(list.status, 200, list.text);
      assert.equal(list.headers['cache-control'], 'no-store');
      const denied = await api(t(), bo).get('/reservations');
      assert.equal(denied.status, 403, denied.text);
      assert.equal(denied.body.code, 'forbidden');
      assert.equal((await api(t()).get('/reservations')).status, 401);
      assert.equal((await api(t(), u.token).get('/reservations', { query: { limit: 101 } })).status, 422);
      assert.equal((await api(t(), u.token).get('/reservations', { query: { offset: -1 } })).status, 422);
    });

    test('usage draws remaining_balance down by exactly the hourly rate per hour, with no charge transactions', async () => {
      const c = await newCaller(1000);
      const v = await reservedVm(c, { gpu_count: 2, storage_gb: 100, reservation_months: 1 });
      const deposit = micros(592.76); // 2 x 0.396 + 0.02 = 0.812/h, x 730
      await advance(1); // provisioned and running (the simulator takes no time in tests)
      assert.equal((await vm(c, v.id)).status, 'running');
      await toNextHour();
      const r0 = micros((await reservation(c, v.reservation_id)).remaining_balance);
      assert.ok(r0 < deposit, 'the partial first hour was drawn');
      const afterDeposit = await balance(c);
      for (const hours of [1, 3]) {
        const before = micros((await reservation(c, v.reservation_id)).remaining_balance);
        await advance(hours * 3600);
        const after = micros((await reservation(c, v.reservation_id)).remaining_balance);
        assert.equal(before - after, hours * micros(0.812), `${hours} h draw ${hours} x 0.812`);
      }
      // Stopped, a reserved VM draws only its storage rate.
      ok(await c.api.post('/vms/{vm_id}/stop', { params: { vm_id: v.id } }));
      await advance(1);
      assert.equal((await vm(c, v.id)).status, 'stopped');
      await toNextHour();
      const s0 = micros((await reservation(c, v.reservation_id)).remaining_balance);
      await advance(2 * 3600);
      assert.equal(s0 - micros((await reservation(c, v.reservation_id)).remaining_balance), 2 * micros(0.02));
      // The credit balance never moved and no charge was written.
      assert.equal(await balance(c), afterDeposit);
      assert.deepEqual(
        (await txs(c)).map((x) => x.type),
        ['deposit', 'credit'],
      );
      // Usage is still reported in GET /billing/usage although the reservation paid for it.
      const usage = ok(await c.api.get('/billing/usage'));
      assert.equal(
        micros(usage.total_cost),
        deposit - micros((await reservation(c, v.reservation_id)).remaining_balance),
      );
      ok(await c.api.delete('/vms/{vm_id}', { params: { vm_id: v.id } }));
    });
  });

  describe('DELETE /reservations/{id}: 25 % fee, 75 % refunded', () => {
    test('25 % of the remaining balance is kept, 75 % refunded; the VM goes on as on-demand at on-demand rates', async () => {
      const c = await newCaller(1000);
      const v = await reservedVm(c); // 4090 x1, 100 GB, 1 month: 0.416/h, deposit 303.68
      await advance(1);
      await toNextHour();
      await advance(5 * 3600);
      const closed = micros((await reservation(c, v.reservation_id)).remaining_balance);
      const extraS = 17 * 60 + 13;
      await advance(extraS);
      const balanceBefore = await balance(c);
      // The open period (since the last top of the hour) is drawn first, at the reserved rate.
      const remaining =
        closed - mulDiv(micros(0.396), extraS * 1000, HOUR_MS) - mulDiv(micros(0.02), extraS * 1000, HOUR_MS);
      const fee = mulDiv(remaining, 25, 100);
      const refund = remaining - fee;

      const res = await c.api.delete('/reservations/{reservation_id}', {
        params: { reservation_id: v.reservation_id },
      });
      const r = ok(res);
      assert.equal(r.id, v.reservation_id);
      assert.equal(r.status, 'cancelled');
      assert.equal(r.cancelled_at, new Date(await nowMs()).toISOString());
      assert.equal(micros(r.cancellation_fee), fee);
      assert.equal(micros(r.refund_amount), refund);
      assert.equal(r.remaining_balance, 0);
      assert.equal(r.deposit_amount, 303.68);
      assert.equal(res.headers['cache-control'], 'no-store');
      assert.deepEqual(await reservation(c, v.reservation_id), r, 'the list shows the same record');

      // The refund transaction carries the fee and the remaining balance.
      const [tx] = await txs(c);
      assert.ok(tx, 'the newest transaction');
      assert.equal(tx.type, 'refund');
      assert.equal(micros(tx.amount), refund);
      assert.equal(micros(num(tx.breakdown.cancellation_fee, 'breakdown.cancellation_fee')), fee);
      assert.equal(micros(num(tx.breakdown.remaining_balance, 'breakdown.remaining_balance')), remaining);
      assert.equal(tx.breakdown.reservation_id, v.reservation_id);
      assert.equal(await balance(c), balanceBefore + refund);

      // The VM goes on, on demand: 0.44 + 0.02 = 0.46 per hour from the credit balance.
      const after = await vm(c, v.id);
      assert.equal(after.status, 'running');
      assert.equal(after.rental_type, 'on_demand');
      assert.equal(after.gpu_hourly_rate, 0.44);
      assert.equal(after.storage_hourly_rate, 0.02);
      assert.equal(after.hourly_rate, 0.46);
      await toNextHour();
      const b0 = await balance(c);
      await advance(3600);
      assert.equal(b0 - (await balance(c)), micros(0.46), 'a full hour on demand is charged 0.46');
      const [charge] = await txs(c);
      assert.ok(charge, 'the newest transaction');
      assert.equal(charge.type, 'charge');
      assert.equal(charge.amount, -0.46);

      // Twice: 400 invalid_state naming the state.
      const again = await c.api.delete('/reservations/{reservation_id}', {
        params: { reservation_id: v.reservation_id },
      });
      assert.equal(again.status, 400, again.text);
      assert.equal(again.body.code, 'invalid_state');
      assert.match(again.body.detail, /cancelled/);
      ok(await c.api.delete('/vms/{vm_id}', { params: { vm_id: v.id } }));
    });

    test('a stopped reserved VM holds its GPUs; cancelled, it becomes on-demand and lets them go', async () => {
      const small = (await createNode(t(), adminKey, { gpu_type: '4090', gpu_count: 2 })).node;
      const c = await newCaller(1000);
      const v = await reservedVm(c, { node: small, gpu_count: 2 });
      await advance(1);
      ok(await c.api.post('/vms/{vm_id}/stop', { params: { vm_id: v.id } }));
      await advance(1);
      assert.equal((await vm(c, v.id)).status, 'stopped');
      const nodeInfo = async () => ok(await admin.get('/admin/nodes/{node}', { params: { node: small } }));
      assert.equal((await nodeInfo()).gpus_allocated, 2, 'held while stopped');
      const other = await newCaller(100);
      const refused = await other.api.post('/vms', {
        body: { node: small, gpu_type: '4090', gpu_count: 1, storage_gb: 50, template_vmid: 100 },
      });
      assert.equal(refused.status, 400, refused.text);
      assert.equal(refused.body.code, 'gpu_unavailable');
      ok(await c.api.delete('/reservations/{reservation_id}', { params: { reservation_id: v.reservation_id } }));
      const after = await vm(c, v.id);
      assert.equal(after.rental_type, 'on_demand');
      assert.equal(after.status, 'stopped');
      assert.equal((await nodeInfo()).gpus_allocated, 0, 'an on-demand stopped VM holds no GPUs');
      const taker = ok(
        await other.api.post('/vms', {
          body: { node: small, gpu_type: '4090', gpu_count: 1, storage_gb: 50, template_vmid: 100 },
        }),
        201,
      );
      const start = await c.api.post('/vms/{vm_id}/start', { params: { vm_id: v.id } });
      assert.equal(start.status, 400, start.text);
      assert.equal(start.body.code, 'gpu_unavailable');
      ok(await other.api.delete('/vms/{vm_id}', { params: { vm_id: taker.id } }));
      ok(await c.api.delete('/vms/{vm_id}', { params: { vm_id: v.id } }));
    });

    test('the fee is rounded half-up to the micro-unit', async () => {
      // pro6000 storage at 0.000201/GB-h: 1.521 + 51 x 0.000201 = 1.531251/h; x 730 = 1117.81323,
      // a quarter of which is 279.4533075 -> fee 279.453308, refund 838.359922.
      ok(
        await admin.put('/admin/pricing/{gpu_type}', {
          params: { gpu_type: 'pro6000' },
          body: { storage_price_gb_hourly: 0.000201 },
        }),
      );
      try {
        const c = await newCaller(2000);
        const v = await reservedVm(c, { node: proNode, gpu_type: 'pro6000', storage_gb: 51 });
        assert.equal(v.hourly_rate, 1.531251);
        // Cancelled while still creating: nothing drawn yet, the whole deposit remains.
        const r = ok(
          await c.api.delete('/reservations/{reservation_id}', { params: { reservation_id: v.reservation_id } }),
        );
        assert.equal(r.cancellation_fee, 279.453308);
        assert.equal(r.refund_amount, 838.359922);
        assert.equal(await balance(c), micros(2000) - micros(279.453308));
        const after = await vm(c, v.id);
        assert.equal(after.rental_type, 'on_demand');
        assert.equal(after.hourly_rate, 1.700251, 'on-demand prices at the cancellation');
        ok(await c.api.delete('/vms/{vm_id}', { params: { vm_id: v.id } }));
      } finally {
        ok(
          await admin.put('/admin/pricing/{gpu_type}', {
            params: { gpu_type: 'pro6000' },
            body: { storage_price_gb_hourly: 0.0002 },
          }),
        );
      }
    });

    test('a cancel racing a stop, a destroy and a clock advance: no 5xx, cancelled once, the ledger adds up', async () => {
      const { ledgerCheck } = await import('../../src/modules/billing/ledger-check.js');
      for (let round = 0; round < 4; round++) {
        const c = await newCaller(1000);
        const v = await reservedVm(c);
        await advance(1);
        await advance(1800 + round * 7);
        const calls = [
          c.api.delete('/reservations/{reservation_id}', { params: { reservation_id: v.reservation_id } }),
          c.api.delete('/reservations/{reservation_id}', { params: { reservation_id: v.reservation_id } }),
          round % 2
            ? c.api.delete('/vms/{vm_id}', { params: { vm_id: v.id } })
            : c.api.post('/vms/{vm_id}/stop', { params: { vm_id: v.id } }),
          admin.post('/admin/clock/advance', { body: { seconds: 3600 } }),
        ];
        const res = await Promise.all(calls);
        for (const r of res) assert.ok(r.status < 500, r.text);
        const cancels = res
          .slice(0, 2)
          .map((r) => r.status)
          .sort();
        assert.deepEqual(cancels, [200, 400], 'exactly one cancel succeeds');
        const r = await reservation(c, v.reservation_id);
        assert.equal(r.status, 'cancelled');
        const refunds = (await txs(c)).filter((x) => x.type === 'refund');
        assert.equal(refunds.length, 1);
        assert.ok(refunds[0], 'a refund');
        assert.equal(refunds[0].amount, r.refund_amount);
        assert.deepEqual(await ledgerCheck(t().db), []);
        const after = await vm(c, v.id);
        if (after.status !== 'destroyed') {
          assert.equal(after.rental_type, 'on_demand');
          ok(await c.api.delete('/vms/{vm_id}', { params: { vm_id: v.id } }));
        }
      }
    });

    test("another user's reservation, an unknown id and a non-uuid are 404", async () => {
      const owner = await newCaller(1000);
      const other = await newCaller(1000);
      const v = await reservedVm(owner);
      for (const [who, id] of [
        [other, v.reservation_id],
        [owner, randomUUID()],
        [owner, 'not-a-uuid'],
        [owner, '12345'],
      ] as [Caller, string][]) {
        const r = await who.api.delete('/reservations/{reservation_id}', { params: { reservation_id: id } });
        assert.equal(r.status, 404, r.text);
        assert.equal(r.body.code, 'not_found');
      }
      assert.equal((await reservation(owner, v.reservation_id)).status, 'active', 'untouched');
      // Cancelling needs a read_write credential.
      const ro = await api(t(), await createApiKey(t(), (await createUser(t())).token, 'read_only')).delete(
        '/reservations/{reservation_id}',
        { params: { reservation_id: v.reservation_id } },
      );
      assert.equal(ro.status, 403, ro.text);
      assert.equal(
        (await api(t()).delete('/reservations/{reservation_id}', { params: { reservation_id: v.reservation_id } }))
          .status,
        401,
      );
      ok(await owner.api.delete('/vms/{vm_id}', { params: { vm_id: v.id } }));
    });
  });
});
