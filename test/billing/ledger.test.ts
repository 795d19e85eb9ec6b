/**
 * The credit ledger (balance == sum of transactions), admin credits (with
 * Idempotency-Key), balance and transactions (pagination, newest first,
 * no-store), and the demo seed's credit.
 * After every test the ledger invariants are checked in SQL.
 */
import { afterEach, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { describeEachDb } from '../helpers/app.js';
import { api, type BodyFor, type RequestBody } from '../helpers/api.js';
import { createApiKey, createUser, tokensOf, type TestUser } from '../helpers/factories.js';
import * as ledger from '../../src/modules/billing/ledger.js';
import { DEMO_LOGIN, seedDemo } from '../../src/seed.js';

const TX_KEYS = ['amount', 'balance_after', 'breakdown', 'created_at', 'description', 'id', 'type'];
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

type Tx = BodyFor<'/billing/transactions', 'get', 200>[number];
type Grant = RequestBody<'/admin/users/{user_id}/credits', 'post'>;

describeEachDb('credit ledger', (t) => {
  let admin: TestUser;
  let user: TestUser;

  const grant = (userId: number, body: Grant, headers?: Record<string, string>) =>
    api(t(), admin.token).post('/admin/users/{user_id}/credits', {
      params: { user_id: userId },
      body,
      ...(headers ? { headers } : {}),
    });
  /** A deliberately invalid body, sent as given. */
  const grantRaw = (userId: number, body: unknown) =>
    api(t(), admin.token).post('/admin/users/{user_id}/credits', { params: { user_id: userId }, rawBody: body });
  const balanceOf = async (u: TestUser): Promise<number> => {
    const r = await api(t(), u.token).get('/billing/balance');
    assert.equal(r.status, 200, r.text);
    return r.body.balance;
  };
  const txsOf = async (
    u: TestUser,
    query: { limit?: number; offset?: number } = {},
  ): Promise<{ items: Tx[]; total: number }> => {
    const r = await api(t(), u.token).get('/billing/transactions', { query });
    assert.equal(r.status, 200, r.text);
    return { items: r.body, total: Number(r.headers['x-total-count']) };
  };
  /** The balance in micro-units straight from the database. */
  const dbBalance = async (userId: number): Promise<number> =>
    (await t().db.query<{ b: number }>('SELECT balance_micros AS b FROM balances WHERE user_id = $1', [userId]))
      .rows[0]!.b;

  before(async () => {
    admin = await createUser(t(), { admin: true });
    user = await createUser(t());
  });

  // The ledger's rule: balance == sum(transactions.amount) for every account, each row's balance_after is the running
  // sum in insertion order, and the newest balance_after is the balance.
  afterEach(async () => {
    const db = t().db;
    const unbalanced = await db.query(
      `SELECT b.user_id, b.balance_micros, COALESCE(SUM(t.amount_micros), 0)::int8 AS sum
         FROM balances b LEFT JOIN transactions t ON t.user_id = b.user_id
        GROUP BY b.user_id HAVING b.balance_micros <> COALESCE(SUM(t.amount_micros), 0)`,
    );
    assert.deepEqual(unbalanced.rows, [], 'balance == sum(transactions)');
    const broken = await db.query(
      `SELECT id FROM (
         SELECT id, balance_after_micros,
                SUM(amount_micros) OVER (PARTITION BY user_id ORDER BY seq ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS running
           FROM transactions) x
        WHERE balance_after_micros <> running`,
    );
    assert.deepEqual(broken.rows, [], 'balance_after is the running sum');
    const stale = await db.query(
      `SELECT b.user_id FROM balances b
        WHERE EXISTS (SELECT 1 FROM transactions t WHERE t.user_id = b.user_id)
          AND b.balance_micros <> (SELECT balance_after_micros FROM transactions t WHERE t.user_id = b.user_id ORDER BY seq DESC LIMIT 1)`,
    );
    assert.deepEqual(stale.rows, [], 'the newest balance_after is the balance');
    assert.deepEqual(await t().services.billing.ledgerProblems(), []);
  });

  describe('admin credits: a credit when positive, an adjustment when negative', () => {
    test('a positive amount is 201 with a `credit` transaction; the balance follows', async () => {
      const u = await createUser(t());
      assert.equal(await balanceOf(u), 0);
      const r = await grant(u.id, { amount: 25.5, description: 'Welcome credit' });
      assert.equal(r.status, 201, r.text);
      assert.equal(r.headers['cache-control'], 'no-store');
      assert.deepEqual(Object.keys(r.body).sort(), TX_KEYS);
      assert.match(r.body.id, UUID);
      assert.equal(r.body.type, 'credit');
      assert.equal(r.body.amount, 25.5);
      assert.equal(r.body.balance_after, 25.5);
      assert.equal(r.body.description, 'Welcome credit');
      assert.equal(typeof r.body.breakdown, 'object');
      assert.equal(r.body.created_at, t().clock.now().toISOString());
      assert.equal(await balanceOf(u), 25.5);
      assert.equal(await dbBalance(u.id), 25_500_000);
      const list = await txsOf(u);
      assert.deepEqual(list.items, [r.body], 'the same record in the list');
      // No description: a default one
      const r2 = await grant(u.id, { amount: 1 });
      assert.equal(r2.status, 201, r2.text);
      assert.ok(r2.body.description.length > 0);
      const r3 = await grant(u.id, { amount: 1, description: '   ' });
      assert.equal(r3.status, 201, r3.text);
      assert.ok(r3.body.description.trim().length > 0, 'a blank description gets the default');
      assert.equal(r3.body.balance_after, 27.5);
    });

    test('a negative amount is an `adjustment`; it may take the balance below zero', async () => {
      const u = await createUser(t());
      await grant(u.id, { amount: 10 });
      const r = await grant(u.id, { amount: -3.25, description: 'Refund reversal' });
      assert.equal(r.status, 201, r.text);
      assert.equal(r.body.type, 'adjustment');
      assert.equal(r.body.amount, -3.25);
      assert.equal(r.body.balance_after, 6.75);
      assert.equal(r.body.description, 'Refund reversal');
      const below = await grant(u.id, { amount: -10 });
      assert.equal(below.status, 201, below.text);
      assert.equal(below.body.type, 'adjustment');
      assert.equal(below.body.balance_after, -3.25);
      assert.deepEqual(
        await api(t(), u.token)
          .get('/billing/balance')
          .then((x) => x.body),
        {
          balance: -3.25,
          currency: 'USD',
        },
      );
      const list = await txsOf(u);
      assert.deepEqual(
        list.items.map((x) => [x.type, x.amount, x.balance_after]),
        [
          ['adjustment', -10, -3.25],
          ['adjustment', -3.25, 6.75],
          ['credit', 10, 10],
        ],
      );
    });

    test('validation: zero, 7 decimals, more than 10 million, wrong types, unknown or missing fields are 422; nothing is written', async () => {
      const u = await createUser(t());
      await grant(u.id, { amount: 5 });
      const cases: Array<[unknown, string]> = [
        [{ amount: 0 }, 'body.amount'],
        [{ amount: -0 }, 'body.amount'],
        [{ amount: 0.0000001 }, 'body.amount'],
        [{ amount: 1.0000001 }, 'body.amount'],
        [{ amount: -2.1234567 }, 'body.amount'],
        [{ amount: 10_000_000.000001 }, 'body.amount'],
        [{ amount: 10_000_001 }, 'body.amount'],
        [{ amount: -10_000_001 }, 'body.amount'],
        [{ amount: 1e21 }, 'body.amount'],
        [{ amount: 1e300 }, 'body.amount'],
        [{ amount: '10' }, 'body.amount'],
        [{ amount: null }, 'body.amount'],
        [{ amount: true }, 'body.amount'],
        [{ description: 'no amount' }, 'body.amount'],
        [{ amount: 5, currency: 'EUR' }, 'body.currency'],
        [{ amount: 5, description: 'x'.repeat(501) }, 'body.description'],
        [{ amount: 5, description: 7 }, 'body.description'],
      ];
      for (const [body, field] of cases) {
        const r = await grantRaw(u.id, body);
        assert.equal(r.status, 422, `${JSON.stringify(body)}: ${r.text}`);
        assert.equal(r.body.code, 'validation_error');
        assert.ok(
          r.body.errors?.some((e) => e.field === field),
          `${JSON.stringify(body)}: ${r.text}`,
        );
        assert.equal(r.headers['cache-control'], 'no-store');
      }
      const none = await grantRaw(u.id, undefined); // no body at all
      assert.equal(none.status, 422);
      assert.equal(await balanceOf(u), 5);
      assert.equal((await txsOf(u)).total, 1);
      // The edges that are allowed: 10 million either way, and one micro-unit
      for (const amount of [10_000_000, -10_000_000, 0.000001, -0.000001]) {
        const r = await grant(u.id, { amount });
        assert.equal(r.status, 201, `${amount}: ${r.text}`);
      }
      assert.equal(await balanceOf(u), 5);
    });

    test('unknown user 404; bad user id 422; a user 403; no token 401: nothing is written', async () => {
      const before = await balanceOf(user);
      const missing = await grant(987_654_321, { amount: 5 });
      assert.equal(missing.status, 404, missing.text);
      assert.equal(missing.body.code, 'not_found');
      // Untyped: user_id is a number in the OpenAPI document, and these ids are deliberately not numbers (or, like
      // '1e3', not sent as a number would be).
      for (const id of ['0', '-1', 'abc', '1.5', '1e3']) {
        const r = await t().req('POST', `/admin/users/${id}/credits`, { token: admin.token, body: { amount: 5 } });
        assert.equal(r.status, 422, `${id}: ${r.text}`);
      }
      const credits = { params: { user_id: user.id }, body: { amount: 5 } };
      const self = await api(t(), user.token).post('/admin/users/{user_id}/credits', credits);
      assert.equal(self.status, 403, self.text);
      assert.equal(self.body.code, 'forbidden');
      const key = await createApiKey(t(), user.token, 'read_write');
      assert.equal((await api(t(), key).post('/admin/users/{user_id}/credits', credits)).status, 403);
      const anon = await api(t()).post('/admin/users/{user_id}/credits', credits);
      assert.equal(anon.status, 401);
      assert.equal(anon.body.code, 'unauthorized');
      assert.equal(await balanceOf(user), before);
      const { rows } = await t().db.query('SELECT 1 FROM transactions WHERE user_id = 987654321');
      assert.equal(rows.length, 0);
    });

    test('Idempotency-Key: a replay credits once and returns the first response; another body is 422', async () => {
      const u = await createUser(t());
      const key = { 'Idempotency-Key': `credit-${u.id}` };
      const first = await grant(u.id, { amount: 12.34, description: 'Top-up' }, key);
      assert.equal(first.status, 201, first.text);
      const again = await grant(u.id, { description: 'Top-up', amount: 12.34 }, key);
      assert.equal(again.status, 201, again.text);
      assert.deepEqual(again.body, first.body, 'the same transaction');
      assert.equal(again.headers['idempotent-replayed'], 'true');
      // Concurrent replays too
      const many = await Promise.all(
        Array.from({ length: 5 }, () => grant(u.id, { amount: 12.34, description: 'Top-up' }, key)),
      );
      for (const r of many) {
        assert.equal(r.status, 201, r.text);
        assert.equal(r.body.id, first.body.id);
      }
      assert.equal(await balanceOf(u), 12.34);
      assert.equal((await txsOf(u)).total, 1);
      const other = await grant(u.id, { amount: 99, description: 'Top-up' }, key);
      assert.equal(other.status, 422, other.text);
      assert.equal(other.body.code, 'idempotency_mismatch');
      // Another user in the path is another request
      const v = await createUser(t());
      const otherUser = await grant(v.id, { amount: 12.34, description: 'Top-up' }, key);
      assert.equal(otherUser.status, 422);
      assert.equal(await balanceOf(v), 0);
      // A new key acts again
      const fresh = await grant(
        u.id,
        { amount: 12.34, description: 'Top-up' },
        { 'Idempotency-Key': `credit-${u.id}-2` },
      );
      assert.equal(fresh.status, 201);
      assert.notEqual(fresh.body.id, first.body.id);
      assert.equal(await balanceOf(u), 24.68);
      // Concurrent first requests with one fresh key: exactly one credit
      const race = await Promise.all(
        Array.from({ length: 6 }, () => grant(u.id, { amount: 1 }, { 'Idempotency-Key': `race-${u.id}` })),
      );
      assert.equal(
        new Set(race.map((r) => (r.status === 201 ? r.body.id : undefined))).size,
        1,
        race.map((r) => r.text).join('\n'),
      );
      assert.equal(await balanceOf(u), 25.68);
    });
  });

  describe('balance and transactions', () => {
    test('GET /billing/balance is {balance, currency: "USD"}, per user, no-store; 401 without a token', async () => {
      const u = await createUser(t());
      const r = await api(t(), u.token).get('/billing/balance');
      assert.equal(r.status, 200, r.text);
      assert.deepEqual(r.body, { balance: 0, currency: 'USD' });
      assert.equal(r.headers['cache-control'], 'no-store');
      await grant(u.id, { amount: 42.000001 });
      assert.deepEqual((await api(t(), u.token).get('/billing/balance')).body, {
        balance: 42.000001,
        currency: 'USD',
      });
      const bo = await createApiKey(t(), u.token, 'billing_only');
      assert.deepEqual((await api(t(), bo).get('/billing/balance')).body, {
        balance: 42.000001,
        currency: 'USD',
      });
      const anon = await api(t()).get('/billing/balance');
      assert.equal(anon.status, 401);
      assert.equal(anon.headers['cache-control'], 'no-store');
    });

    test('amounts are exact decimals: 0.1 then 0.2 is 0.3; micro-units add up', async () => {
      const u = await createUser(t());
      await grant(u.id, { amount: 0.1 });
      const r = await grant(u.id, { amount: 0.2 });
      assert.equal(r.status, 201, r.text);
      assert.equal(r.body.balance_after, 0.3);
      assert.equal(await balanceOf(u), 0.3);
      assert.equal(await dbBalance(u.id), 300_000);
      for (let i = 0; i < 7; i++) await grant(u.id, { amount: 0.000001 });
      assert.equal(await balanceOf(u), 0.300007);
      await grant(u.id, { amount: -0.300006 });
      assert.equal(await balanceOf(u), 0.000001);
      const r2 = await grant(u.id, { amount: 1234567.891011 });
      assert.equal(r2.status, 201, r2.text);
      assert.equal(r2.body.amount, 1234567.891011);
      assert.equal(r2.body.balance_after, 1234567.891012);
      const list = await txsOf(u, { limit: 3 });
      assert.deepEqual(
        list.items.map((x) => x.balance_after),
        [1234567.891012, 0.000001, 0.300007],
      );
    });

    test('GET /billing/transactions: newest first, balance_after, limit (default 50, 1..100), offset, X-Total-Count, no-store', async () => {
      const u = await createUser(t());
      const amounts: number[] = [];
      for (let i = 1; i <= 120; i++) amounts.push(i % 7 === 0 ? -(i / 100) : i / 100);
      // Written in order (each one after the previous): newest first is the reverse
      for (const amount of amounts) assert.equal((await grant(u.id, { amount })).status, 201);
      const expected: Array<[number, number]> = [];
      let running = 0;
      for (const a of amounts) {
        running += Math.round(a * 1e6);
        expected.push([a, running / 1e6]);
      }
      expected.reverse();
      const def = await api(t(), u.token).get('/billing/transactions');
      assert.equal(def.status, 200, def.text);
      assert.equal(def.headers['cache-control'], 'no-store');
      assert.equal(def.headers['x-total-count'], '120');
      assert.equal(def.body.length, 50, 'default limit 50');
      assert.deepEqual(
        def.body.map((x) => [x.amount, x.balance_after]),
        expected.slice(0, 50),
      );
      for (const x of def.body) {
        assert.deepEqual(Object.keys(x).sort(), TX_KEYS);
        assert.equal(x.type, x.amount > 0 ? 'credit' : 'adjustment');
      }
      const max = await txsOf(u, { limit: 100 });
      assert.equal(max.items.length, 100);
      assert.equal(max.total, 120);
      assert.deepEqual(
        max.items.map((x) => [x.amount, x.balance_after]),
        expected.slice(0, 100),
      );
      const rest = await txsOf(u, { limit: 100, offset: 100 });
      assert.deepEqual(
        rest.items.map((x) => [x.amount, x.balance_after]),
        expected.slice(100),
      );
      const mid = await txsOf(u, { limit: 7, offset: 13 });
      assert.deepEqual(
        mid.items.map((x) => [x.amount, x.balance_after]),
        expected.slice(13, 20),
      );
      assert.deepEqual((await txsOf(u, { offset: 120 })).items, []);
      assert.equal(await balanceOf(u), expected[0]![1]);
      for (const query of [
        { limit: 101 },
        { limit: 0 },
        { limit: -1 },
        { offset: -1 },
        { limit: 'ten' },
        { count: 5 },
        { limit: '1e2' },
      ] as Array<Record<string, string | number>>) {
        const r = await api(t(), u.token).get('/billing/transactions', { rawQuery: query });
        assert.equal(r.status, 422, `${JSON.stringify(query)}: ${r.text}`);
        assert.equal(r.body.code, 'validation_error');
        assert.equal(r.headers['cache-control'], 'no-store');
      }
      // Another user sees only theirs
      const v = await createUser(t());
      assert.deepEqual(await txsOf(v), { items: [], total: 0 });
      assert.equal((await api(t()).get('/billing/transactions')).status, 401);
    });

    test('50 concurrent credits to one user all land', async () => {
      const u = await createUser(t());
      const rs = await Promise.all(Array.from({ length: 50 }, () => grant(u.id, { amount: 1.111111 })));
      const made = rs.map((r) => {
        assert.equal(r.status, 201, r.text);
        return r.body;
      });
      assert.equal(await balanceOf(u), 55.55555);
      // Each credit saw its own balance: 1 x .. 50 x the amount, once each
      const afters = made.map((x) => Math.round(x.balance_after * 1e6)).sort((a, b) => a - b);
      assert.deepEqual(
        afters,
        Array.from({ length: 50 }, (_, i) => (i + 1) * 1_111_111),
      );
      const list = await txsOf(u, { limit: 100 });
      assert.equal(list.total, 50);
      const sum = list.items.reduce((s, x) => s + Math.round(x.amount * 1e6), 0);
      assert.equal(sum, 50 * 1_111_111);
      const inDb = await t().db.query<{ s: number }>(
        'SELECT SUM(amount_micros)::int8 AS s FROM transactions WHERE user_id = $1',
        [u.id],
      );
      assert.equal(inDb.rows[0]!.s, 55_555_550);
      assert.equal(await dbBalance(u.id), 55_555_550);
      // Newest first means descending balance here
      assert.deepEqual(
        list.items.map((x) => x.balance_after),
        [...list.items.map((x) => x.balance_after)].sort((a, b) => b - a),
      );
    });

    test('credits and debits racing on one user keep every balance_after exact', async () => {
      const u = await createUser(t());
      await grant(u.id, { amount: 100 });
      const ops = Array.from({ length: 40 }, (_, i) => (i % 2 === 0 ? 0.3 : -0.1));
      const rs = await Promise.all(ops.map((amount) => grant(u.id, { amount })));
      for (const r of rs) assert.equal(r.status, 201, r.text);
      assert.equal(await balanceOf(u), 104); // 100 + 20 x 0.3 - 20 x 0.1
    });

    test('a balance may not exceed 1 billion (400 limit_exceeded); debits are still allowed', async () => {
      const u = await createUser(t());
      const rs = await Promise.all(Array.from({ length: 100 }, () => grant(u.id, { amount: 10_000_000 })));
      for (const r of rs) assert.equal(r.status, 201, r.text);
      assert.equal(await balanceOf(u), 1_000_000_000);
      const over = await grant(u.id, { amount: 0.000001 });
      assert.equal(over.status, 400, over.text);
      assert.equal(over.body.code, 'limit_exceeded');
      assert.equal(await balanceOf(u), 1_000_000_000);
      const down = await grant(u.id, { amount: -0.000001 });
      assert.equal(down.status, 201, down.text);
      assert.equal(down.body.balance_after, 999_999_999.999999);
      assert.equal(await balanceOf(u), 999_999_999.999999);
    });

    test('ledger.post: an amount that is not whole micro-units, or an unknown user, writes nothing', async () => {
      const u = await createUser(t());
      const now = t().clock.now();
      await assert.rejects(
        t().db.transaction((tx) =>
          ledger.post(tx, { userId: u.id, type: 'credit', amountMicros: 1.5, description: 'x', now }),
        ),
        RangeError,
      );
      await assert.rejects(
        t().db.transaction((tx) =>
          ledger.post(tx, { userId: 987_654_322, type: 'credit', amountMicros: 1, description: 'x', now }),
        ),
        /does not exist/,
      );
      const row = await t().db.transaction((tx) =>
        ledger.post(tx, { userId: u.id, type: 'refund', amountMicros: 7, description: 'r', breakdown: { a: 1 }, now }),
      );
      assert.deepEqual(
        [row.type, row.amount_micros, row.balance_after_micros, row.breakdown],
        ['refund', 7, 7, { a: 1 }],
      );
      assert.equal(await ledger.balance(t().db, u.id), 7);
      assert.equal(await t().db.transaction((tx) => ledger.lockBalance(tx, u.id)), 7);
      // A transaction that fails after posting leaves neither the row nor the balance change
      await assert.rejects(
        t().db.transaction(async (tx) => {
          await ledger.post(tx, {
            userId: u.id,
            type: 'credit',
            amountMicros: 1_000_000,
            description: 'rolled back',
            now,
          });
          throw new Error('boom');
        }),
        /boom/,
      );
      assert.equal(await ledger.balance(t().db, u.id), 7);
      const list = await txsOf(u);
      assert.deepEqual(
        list.items.map((x) => [x.type, x.amount, x.description, x.breakdown]),
        [['refund', 0.000007, 'r', { a: 1 }]],
      );
    });
  });

  describe('demo seed: a demo user with credit, once', () => {
    test('seedDemo twice (and twice at once): the nodes once, a demo user who can log in, exactly one credit', async () => {
      const [a, b] = await Promise.all([seedDemo(t().db, t().services), seedDemo(t().db, t().services)]);
      const c = await seedDemo(t().db, t().services);
      for (const r of [a, b, c]) assert.deepEqual(r, DEMO_LOGIN);
      const nodes = await t().db.query<{ node: string; gpu_type: string; n: number }>(
        `SELECT node, gpu_type, count(*) OVER (PARTITION BY node)::int8 AS n FROM nodes WHERE node ~ '^vm0[1-6]$' ORDER BY node`,
      );
      assert.equal(nodes.rows.length, 6, JSON.stringify(nodes.rows));
      for (const n of nodes.rows) assert.equal(n.n, 1);
      const types = nodes.rows.map((n) => n.gpu_type);
      for (const gpuType of ['5090', '4090', 'pro6000'])
        assert.ok(types.filter((x) => x === gpuType).length >= 1, `a ${gpuType} node`);
      // Offered to everyone
      const offers = await api(t()).get('/search', { query: { limit: 100 } });
      assert.equal(offers.status, 200, offers.text);
      for (const n of nodes.rows)
        assert.ok(
          offers.body.some((o) => o.node === n.node),
          `${n.node} offered`,
        );

      const login = await api(t()).post('/auth/login', { body: DEMO_LOGIN });
      assert.equal(login.status, 200, login.text);
      const demo = { token: tokensOf(login.body).access_token } as TestUser;
      const txs = await txsOf(demo);
      assert.equal(txs.total, 1);
      assert.equal(txs.items[0]!.type, 'credit');
      assert.ok(txs.items[0]!.amount > 0);
      assert.equal(await balanceOf(demo), txs.items[0]!.amount);
      const users = await t().db.query('SELECT id FROM users WHERE email_normalized = $1', [
        DEMO_LOGIN.email.toLowerCase(),
      ]);
      assert.equal(users.rows.length, 1);
    });
  });
});
