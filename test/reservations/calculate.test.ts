/**
 * POST /reservations/calculate: the numbers, worked out by hand from the
 * shipped default prices, for 1, 3 and 6 months; the default of one month;
 * validation (422, unknown fields refused); which API key scopes may call it.
 */
import { before, test } from 'node:test';
import assert from 'node:assert/strict';
import { describeEachDb } from '../helpers/app.js';
import { api, type BodyFor, type RequestBody } from '../helpers/api.js';
import { createApiKey, createUser, type TestUser } from '../helpers/factories.js';
// The shipped defaults this file's arithmetic is worked out from (checked against GET /admin/pricing first).
import { SHIPPED_PRICES as DEFAULTS } from '../helpers/expected.js';

type QuoteRequest = RequestBody<'/reservations/calculate', 'post'>;
type Quote = BodyFor<'/reservations/calculate', 'post', 200>;

interface Case {
  body: QuoteRequest;
  expect: Pick<
    Quote,
    | 'discount_percent'
    | 'hourly_rate_after_discount'
    | 'monthly_cost'
    | 'deposit_required'
    | 'cancellation_fee_25_percent'
  >;
  why: string;
}

const CASES: Case[] = [
  {
    body: { gpu_type: '4090', gpu_count: 1, storage_gb: 100, reservation_months: 1 },
    // 1 x 0.44 x 0.90 = 0.396, + 100 x 0.0002 = 0.02 -> 0.416/h; x 730 = 303.68; x 1 month; 25 % = 75.92
    expect: {
      discount_percent: 10,
      hourly_rate_after_discount: 0.416,
      monthly_cost: 303.68,
      deposit_required: 303.68,
      cancellation_fee_25_percent: 75.92,
    },
    why: '4090 x1, 100 GB, 1 month',
  },
  {
    body: { gpu_type: '4090', gpu_count: 2, storage_gb: 50, reservation_months: 3 },
    // 2 x 0.44 x 0.80 = 0.704, + 50 x 0.0002 = 0.01 -> 0.714/h; x 730 = 521.22; x 3 = 1563.66; 25 % = 390.915
    expect: {
      discount_percent: 20,
      hourly_rate_after_discount: 0.714,
      monthly_cost: 521.22,
      deposit_required: 1563.66,
      cancellation_fee_25_percent: 390.915,
    },
    why: '4090 x2, 50 GB, 3 months',
  },
  {
    body: { gpu_type: 'pro6000', gpu_count: 8, storage_gb: 500, reservation_months: 6 },
    // 8 x 1.69 x 0.70 = 9.464, + 500 x 0.0002 = 0.1 -> 9.564/h; x 730 = 6981.72; x 6 = 41890.32; 25 % = 10472.58
    expect: {
      discount_percent: 30,
      hourly_rate_after_discount: 9.564,
      monthly_cost: 6981.72,
      deposit_required: 41890.32,
      cancellation_fee_25_percent: 10472.58,
    },
    why: 'pro6000 x8, 500 GB, 6 months',
  },
  {
    body: { gpu_type: '5090', gpu_count: 1, storage_gb: 51, reservation_months: 3 },
    // 0.69 x 0.80 = 0.552, + 51 x 0.0002 = 0.0102 -> 0.5622/h; x 730 = 410.406; x 3 = 1231.218; 25 % = 307.8045
    expect: {
      discount_percent: 20,
      hourly_rate_after_discount: 0.5622,
      monthly_cost: 410.406,
      deposit_required: 1231.218,
      cancellation_fee_25_percent: 307.8045,
    },
    why: '5090 x1, 51 GB, 3 months (six-decimal amounts)',
  },
  {
    body: { gpu_type: '5090', gpu_count: 4, storage_gb: 75, reservation_months: 6 },
    // 4 x 0.69 x 0.70 = 1.932, + 75 x 0.0002 = 0.015 -> 1.947/h; x 730 = 1421.31; x 6 = 8527.86; 25 % = 2131.965
    expect: {
      discount_percent: 30,
      hourly_rate_after_discount: 1.947,
      monthly_cost: 1421.31,
      deposit_required: 8527.86,
      cancellation_fee_25_percent: 2131.965,
    },
    why: '5090 x4, 75 GB, 6 months',
  },
];

describeEachDb('POST /reservations/calculate: the quote of a prepaid reservation', (t) => {
  let admin: TestUser;
  let user: TestUser;
  const calc = (body: QuoteRequest, token: string | null = user.token) =>
    api(t(), token ?? undefined).post('/reservations/calculate', { body });
  /** A deliberately invalid body, sent as given. */
  const calcRaw = (body: Record<string, unknown>) =>
    api(t(), user.token).post('/reservations/calculate', { rawBody: body });

  before(async () => {
    admin = await createUser(t(), { admin: true });
    user = await createUser(t());
  });

  test('the prices this file works from are the shipped defaults (GET /admin/pricing)', async () => {
    const r = await api(t(), admin.token).get('/admin/pricing');
    assert.equal(r.status, 200, r.text);
    for (const [gpuType, d] of Object.entries(DEFAULTS)) {
      // Indexed by the names of the shipped fields.
      const p: Record<string, unknown> | undefined = r.body.find((x) => x.gpu_type === gpuType);
      assert.ok(p, `pricing of ${gpuType}`);
      for (const [k, v] of Object.entries(d)) assert.equal(p[k], v, `${gpuType}.${k}`);
    }
  });

  for (const c of CASES) {
    test(`${c.why}: hand-computed quote`, async () => {
      const r = await calc(c.body);
      assert.equal(r.status, 200, r.text);
      const quote: Record<string, unknown> = r.body; // indexed by the names in c.expect
      for (const [k, v] of Object.entries(c.expect)) assert.equal(quote[k], v, `${k}: ${r.text}`);
      // deposit = monthly x months, fee = 25 % of the deposit (the whole commitment is prepaid)
      assert.equal(r.body.reservation_months, c.body.reservation_months);
      assert.equal(r.headers['cache-control'], 'no-store');
    });
  }

  test('reservation_months defaults to 1', async () => {
    const r = await calc({ gpu_type: '4090', gpu_count: 1, storage_gb: 100 });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.body.discount_percent, 10);
    assert.equal(r.body.reservation_months, 1);
    assert.equal(r.body.monthly_cost, 303.68);
    assert.equal(r.body.deposit_required, 303.68);
    assert.equal(r.body.cancellation_fee_25_percent, 75.92);
  });

  test('the quote follows a price change, and matches the rates a reserved VM gets', async () => {
    const put = await api(t(), admin.token).put('/admin/pricing/{gpu_type}', {
      params: { gpu_type: 'pro6000' },
      body: { gpu_price_hourly: 2, reserved_discount_3mo: 12.5 },
    });
    assert.equal(put.status, 200, put.text);
    try {
      const r = await calc({ gpu_type: 'pro6000', gpu_count: 2, storage_gb: 200, reservation_months: 3 });
      assert.equal(r.status, 200, r.text);
      // 2 x 2 x 0.875 = 3.5, + 200 x 0.0002 = 0.04 -> 3.54/h; x 730 = 2584.2; x 3 = 7752.6; 25 % = 1938.15
      assert.equal(r.body.discount_percent, 12.5);
      assert.equal(r.body.hourly_rate_after_discount, 3.54);
      assert.equal(r.body.monthly_cost, 2584.2);
      assert.equal(r.body.deposit_required, 7752.6);
      assert.equal(r.body.cancellation_fee_25_percent, 1938.15);
    } finally {
      const back = await api(t(), admin.token).put('/admin/pricing/{gpu_type}', {
        params: { gpu_type: 'pro6000' },
        body: { gpu_price_hourly: 1.69, reserved_discount_3mo: 20 },
      });
      assert.equal(back.status, 200, back.text);
    }
  });

  const invalid: [string, Record<string, unknown>, string][] = [
    ['gpu_count 3', { gpu_type: '4090', gpu_count: 3, storage_gb: 50 }, 'body.gpu_count'],
    ['storage_gb 49', { gpu_type: '4090', gpu_count: 1, storage_gb: 49 }, 'body.storage_gb'],
    [
      'reservation_months 2',
      { gpu_type: '4090', gpu_count: 1, storage_gb: 50, reservation_months: 2 },
      'body.reservation_months',
    ],
    [
      'reservation_months 12',
      { gpu_type: '4090', gpu_count: 1, storage_gb: 50, reservation_months: 12 },
      'body.reservation_months',
    ],
    ['an unknown field', { gpu_type: '4090', gpu_count: 1, storage_gb: 50, colour: 'red' }, 'body.colour'],
    ['an unknown gpu_type', { gpu_type: 'a100', gpu_count: 1, storage_gb: 50 }, 'body.gpu_type'],
    ['a missing gpu_count', { gpu_type: '4090', storage_gb: 50 }, 'body.gpu_count'],
  ];
  for (const [name, body, field] of invalid) {
    test(`${name} -> 422 validation_error naming ${field}`, async () => {
      const r = await calcRaw(body);
      assert.equal(r.status, 422, r.text);
      assert.equal(r.body.code, 'validation_error');
      assert.ok(
        r.body.errors?.some((e) => e.field === field),
        `errors name ${field}: ${r.text}`,
      );
    });
  }

  test('a billing_only API key may call it; read_only may not; no credential is 401', async () => {
    const body: QuoteRequest = { gpu_type: '4090', gpu_count: 1, storage_gb: 100, reservation_months: 1 };
    const billing = await createApiKey(t(), user.token, 'billing_only');
    const ok = await calc(body, billing);
    assert.equal(ok.status, 200, ok.text);
    assert.equal(ok.body.deposit_required, 303.68);
    const readOnly = await createApiKey(t(), user.token, 'read_only');
    const ro = await calc(body, readOnly);
    assert.equal(ro.status, 403, ro.text);
    assert.equal(ro.body.code, 'forbidden');
    const anon = await calc(body, null);
    assert.equal(anon.status, 401, anon.text);
    assert.equal(anon.body.code, 'unauthorized');
  });
});
