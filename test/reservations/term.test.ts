/**
 * The end of a reservation: destroying a reserved VM does
 * not end its reservation; at end_at it becomes `completed` (VM gone) or
 * `converted_to_on_demand` (VM alive, which turns on_demand at on-demand
 * rates); unused remaining_balance is not refunded. A reserved VM whose
 * provisioning fails gets its reservation cancelled without fee and its whole
 * deposit back. Cancelling the reservation of a destroyed VM still refunds 75 %.
 */
import { before, test } from 'node:test';
import assert from 'node:assert/strict';
import { describeEachDb } from '../helpers/app.js';
import { ok, type Api } from '../helpers/api.js';
import { HOUR_MS, micros, reservationKit } from './helpers.js';

describeEachDb('the end of a reservation: completed, converted to on-demand or cancelled', (t) => {
  const kit = reservationKit(t, { keyName: 'term-tests', storageGb: 50 });
  const { advance, nowMs, toNextHour, newCaller, balance, txs, reservation, vm } = kit;
  /** Creates a reserved VM (asserting the 201) and returns it; a reserved VM has its reservation's id. */
  const reserved = kit.reservedVm;
  let admin: Api; // sends the administrator's key
  let node: string; // 4090 x 8

  before(async () => {
    await kit.setUp();
    admin = kit.admin();
    node = kit.node();
  });

  test('destroyed before the end -> completed; alive at the end -> converted_to_on_demand; nothing refunded', async () => {
    const c = await newCaller(1000);
    // 4090 x1, 50 GB, 1 month: 0.396 + 0.01 = 0.406/h; deposit 0.406 x 730 = 296.38 each.
    const gone = await reserved(c);
    const alive = await reserved(c);
    const afterDeposits = await balance(c);
    assert.equal(afterDeposits, micros(1000 - 2 * 296.38));
    const endAt = Date.parse((await reservation(c, alive.reservation_id)).end_at);
    assert.equal(endAt, Date.parse(alive.created_at) + 730 * HOUR_MS);

    await advance(1); // both provisioned and running from their creation
    assert.equal((await vm(c, alive.id)).status, 'running');
    await advance(10 * 3600 - 1);
    // Destroy one after exactly 10 h: its reservation stays active (the commitment goes on).
    ok(await c.api.delete('/vms/{vm_id}', { params: { vm_id: gone.id } }));
    const g = await reservation(c, gone.reservation_id);
    assert.equal(g.status, 'active');
    assert.equal(g.remaining_balance, 292.32, '296.38 - 10 x 0.406');
    // Stop the other for exactly 5 h: it draws only its storage then (0.01/h instead of 0.406/h).
    ok(await c.api.post('/vms/{vm_id}/stop', { params: { vm_id: alive.id } }));
    await advance(5 * 3600);
    assert.equal((await vm(c, alive.id)).status, 'stopped');
    ok(await c.api.post('/vms/{vm_id}/start', { params: { vm_id: alive.id } }));

    // Up to one second before the end: both still active.
    await advance(Math.round((endAt - (await nowMs())) / 1000) - 1);
    assert.equal((await reservation(c, gone.reservation_id)).status, 'active');
    assert.equal((await reservation(c, alive.reservation_id)).status, 'active');
    assert.equal((await vm(c, alive.id)).rental_type, 'reserved');
    await advance(1);
    assert.equal(await nowMs(), endAt);

    const done = await reservation(c, gone.reservation_id);
    assert.equal(done.status, 'completed');
    assert.equal(done.remaining_balance, 292.32, 'unused balance is kept by the provider, not refunded');
    assert.equal(done.refund_amount, 0);
    assert.equal(done.cancellation_fee, 0);
    assert.equal(done.cancelled_at, null);

    const conv = await reservation(c, alive.reservation_id);
    assert.equal(conv.status, 'converted_to_on_demand');
    assert.equal(conv.remaining_balance, 1.98, 'the 5 h of unused GPU time: 5 x 0.396');
    assert.equal(conv.refund_amount, 0);
    const v = await vm(c, alive.id);
    assert.equal(v.status, 'running');
    assert.equal(v.rental_type, 'on_demand');
    assert.equal(v.gpu_hourly_rate, 0.44);
    assert.equal(v.storage_hourly_rate, 0.01);
    assert.equal(v.hourly_rate, 0.45);

    // No refund and no charge up to the end: the reservations paid for everything.
    assert.equal(await balance(c), afterDeposits);
    assert.deepEqual(
      (await txs(c)).map((x) => x.type),
      ['deposit', 'deposit', 'credit'],
    );

    // From then on the VM is billed on demand from the credit balance.
    await toNextHour();
    const b0 = await balance(c);
    await advance(3600);
    assert.equal(b0 - (await balance(c)), micros(0.45));
    const [charge] = await txs(c);
    assert.ok(charge, 'the newest transaction');
    assert.equal(charge.type, 'charge');
    assert.equal(charge.amount, -0.45);
    // An ended reservation cannot be cancelled.
    for (const id of [gone.reservation_id, alive.reservation_id]) {
      const r = await c.api.delete('/reservations/{reservation_id}', { params: { reservation_id: id } });
      assert.equal(r.status, 400, r.text);
      assert.equal(r.body.code, 'invalid_state');
    }
    ok(await c.api.delete('/vms/{vm_id}', { params: { vm_id: alive.id } }));
    // Ending is final: the statuses do not move again.
    await advance(3600);
    assert.equal((await reservation(c, gone.reservation_id)).status, 'completed');
    assert.equal((await reservation(c, alive.reservation_id)).status, 'converted_to_on_demand');
  });

  test('the reservation of a destroyed VM may still be cancelled: 75 % of what remains comes back', async () => {
    const c = await newCaller(500);
    const v = await reserved(c);
    await advance(1);
    await advance(2 * 3600 - 1);
    ok(await c.api.delete('/vms/{vm_id}', { params: { vm_id: v.id } }));
    const before = await balance(c);
    const r = ok(
      await c.api.delete('/reservations/{reservation_id}', { params: { reservation_id: v.reservation_id } }),
    );
    // 296.38 - 2 x 0.406 = 295.568; fee 73.892, refund 221.676
    assert.equal(r.status, 'cancelled');
    assert.equal(r.cancellation_fee, 73.892);
    assert.equal(r.refund_amount, 221.676);
    assert.equal(r.remaining_balance, 0);
    assert.equal(await balance(c), before + micros(221.676));
    const after = await vm(c, v.id);
    assert.equal(after.status, 'destroyed');
    assert.equal(after.rental_type, 'reserved', 'a destroyed VM is not converted');
  });

  test('a cancel after end_at, before the end job ran, ends the term (nothing refunded) and is refused', async () => {
    const c = await newCaller(500);
    const v = await reserved(c);
    await advance(1);
    const endAt = Date.parse((await reservation(c, v.reservation_id)).end_at);
    await advance(3600);
    // A worker running late (system clock): time has passed end_at, no job has run since.
    t().clock.set(endAt + 1000);
    const before = await balance(c);
    const r = await c.api.delete('/reservations/{reservation_id}', {
      params: { reservation_id: v.reservation_id },
    });
    assert.equal(r.status, 400, r.text);
    assert.equal(r.body.code, 'invalid_state');
    assert.match(r.body.detail, /converted_to_on_demand/);
    const after = await reservation(c, v.reservation_id);
    assert.equal(after.status, 'converted_to_on_demand');
    assert.equal(after.refund_amount, 0);
    assert.equal(await balance(c), before, 'no refund');
    assert.equal((await vm(c, v.id)).rental_type, 'on_demand');
    await advance(1); // the jobs catch up; the VM is billed on demand from end_at
    ok(await c.api.delete('/vms/{vm_id}', { params: { vm_id: v.id } }));
    const { ledgerCheck } = await import('../../src/modules/billing/ledger-check.js');
    assert.deepEqual(await ledgerCheck(t().db), []);
  });

  test('a stop after end_at, before the end job ran, draws nothing after the term from the reservation', async () => {
    const c = await newCaller(500);
    const v = await reserved(c);
    await advance(1);
    const endAt = Date.parse((await reservation(c, v.reservation_id)).end_at);
    t().clock.set(endAt + 1800_000); // a worker running half an hour late
    ok(await c.api.post('/vms/{vm_id}/stop', { params: { vm_id: v.id } }));
    await advance(1);
    const late = await t().db.query<{ n: number }>(
      'SELECT count(*)::int AS n FROM usage_logs WHERE vm_id = $1 AND from_reservation_micros > 0 AND period_end > $2',
      [v.id, new Date(endAt)],
    );
    assert.equal(late.rows[0]!.n, 0, 'usage after end_at is not paid by the reservation');
    ok(await c.api.delete('/vms/{vm_id}', { params: { vm_id: v.id } }));
  });

  test('a reserved VM whose provisioning fails: reservation cancelled, fee 0, the whole deposit refunded', async () => {
    const c = await newCaller(400);
    const f = await admin.post('/admin/simulator/faults', { body: { node, action: 'provision' } });
    assert.equal(f.status, 200, f.text);
    const v = await reserved(c);
    assert.equal(await balance(c), micros(400 - 296.38));
    await advance(1);
    assert.equal((await vm(c, v.id)).status, 'failed');
    const r = await reservation(c, v.reservation_id);
    assert.equal(r.status, 'cancelled');
    assert.equal(r.cancellation_fee, 0);
    assert.equal(r.refund_amount, 296.38);
    assert.equal(r.remaining_balance, 0);
    assert.ok(r.cancelled_at);
    const [refund] = await txs(c);
    assert.ok(refund, 'the newest transaction');
    assert.equal(refund.type, 'refund');
    assert.equal(refund.amount, 296.38);
    assert.equal(refund.breakdown.cancellation_fee, 0);
    assert.equal(refund.breakdown.remaining_balance, 296.38);
    assert.equal(await balance(c), micros(400));
    // Nothing was billed for a VM that never ran.
    await advance(3600);
    assert.equal(await balance(c), micros(400));
    assert.deepEqual(
      (await txs(c)).map((x) => x.type),
      ['refund', 'deposit', 'credit'],
    );
  });
});
