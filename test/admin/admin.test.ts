/**
 * The admin API: access (administrators only), users (role, suspension,
 * limits) and the service clock.
 */
import { before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { describeEachDb, TEST_CLOCK_START } from '../helpers/app.js';
import { api, errorBody, type Api, type RequestBody } from '../helpers/api.js';
import { createTestDb } from '../helpers/db.js';
import { createApiKey, createUser, tokensOf, uniqueEmail, type TestUser } from '../helpers/factories.js';
import { ClockService } from '../../src/modules/clock/service.js';
import { AppError } from '../../src/errors.js';

const ADMIN_USER_FIELDS = [
  'balance',
  'created_at',
  'email',
  'id',
  'max_gpus',
  'max_vms',
  'name',
  'role',
  'suspended',
  'two_factor_enabled',
  'updated_at',
];
const MAX_ADVANCE_S = 10 * 366 * 86_400;

type UserPatch = RequestBody<'/admin/users/{user_id}', 'patch'>;

/**
 * The error body of an answer of t().req. Used only for requests the typed client cannot send: a path whose
 * {user_id} is deliberately not a user id ('abc', '1e3', '%20'...), where api() takes a number (and would encode
 * '%20'). t().req has already checked that every error answer has this shape.
 */

describeEachDb('admin API', (t) => {
  let admin: TestUser;
  let user: TestUser;
  /** Typed clients for the administrator (made in before()) and without credentials. */
  let asAdmin: Api;
  const anon = () => api(t());
  const ofUser = (id: number) => ({ params: { user_id: id } });

  const clockNow = async (): Promise<number> => {
    const r = await asAdmin.get('/admin/clock');
    assert.equal(r.status, 200, r.text);
    return Date.parse(r.body.now);
  };

  before(async () => {
    admin = await createUser(t(), { admin: true });
    user = await createUser(t());
    asAdmin = api(t(), admin.token);
  });

  describe('service clock (manual clock, advance, persistence)', () => {
    test('GET /admin/clock returns the manual clock, started at GPUCLOUD_CLOCK_START', async () => {
      const r = await asAdmin.get('/admin/clock');
      assert.equal(r.status, 200);
      assert.deepEqual(Object.keys(r.body), ['now']);
      assert.equal(r.body.now, new Date(Date.parse(TEST_CLOCK_START)).toISOString(), 'nothing has advanced it yet');
      assert.equal(Date.parse(r.body.now), t().clock.nowMs());
    });

    test('a manual clock without a start setting starts at the real time of its first start, to the second', async () => {
      const fresh = await createTestDb(t().kind);
      try {
        const before = Math.floor(Date.now() / 1000) * 1000;
        const svc = await ClockService.create(fresh.db, 'manual');
        const now = svc.now().getTime();
        assert.equal(now % 1000, 0, 'truncated to the second');
        assert.ok(now >= before && now <= Date.now(), `${new Date(now).toISOString()} is the real time`);
      } finally {
        await fresh.cleanup();
      }
    });

    test('the start setting applies to the first start only: a kept clock never moves back or forward by it', async () => {
      const fresh = await createTestDb(t().kind);
      try {
        const first = await ClockService.create(fresh.db, 'manual', Date.UTC(2030, 5, 30, 23, 59, 59));
        assert.equal(first.now().toISOString(), '2030-06-30T23:59:59.000Z');
        await first.advance(2);
        for (const other of [Date.UTC(2020, 0, 1), Date.UTC(2040, 0, 1), undefined]) {
          const restarted = await ClockService.create(fresh.db, 'manual', other);
          assert.equal(restarted.now().toISOString(), '2030-07-01T00:00:01.000Z');
        }
      } finally {
        await fresh.cleanup();
      }
    });

    test('the manual clock stands still between advances', async () => {
      const a = await clockNow();
      await new Promise((r) => setTimeout(r, 1100));
      assert.equal(await clockNow(), a);
    });

    test('POST /admin/clock/advance moves it by exactly the given seconds', async () => {
      const start = await clockNow();
      // (Access tokens live 3600 s of service time: this file keeps its advances well below that.)
      const r = await asAdmin.post('/admin/clock/advance', { body: { seconds: 1800 } });
      assert.equal(r.status, 200, r.text);
      assert.equal(Date.parse(r.body.now), start + 1_800_000);
      assert.equal(await clockNow(), start + 1_800_000);
      const one = await asAdmin.post('/admin/clock/advance', { body: { seconds: 1 } });
      assert.equal(one.status, 200, one.text);
      assert.equal(Date.parse(one.body.now), start + 1_801_000);
      // Services see the same time
      assert.equal(t().services.clock.now().getTime(), start + 1_801_000);
    });

    test('seconds must be a whole number >= 1 given as a JSON number', async () => {
      const before = await clockNow();
      const bad: unknown[] = [
        { seconds: 0 },
        { seconds: -1 },
        { seconds: 1.5 },
        { seconds: '10' },
        { seconds: null },
        { seconds: true },
        {},
        { seconds: 10, extra: 1 },
        { seconds: MAX_ADVANCE_S + 1 },
      ];
      for (const body of bad) {
        const r = await asAdmin.post('/admin/clock/advance', { rawBody: body });
        assert.equal(r.status, 422, `${JSON.stringify(body)}: ${r.text}`);
        assert.equal(r.body.code, 'validation_error');
        assert.ok(r.body.errors?.[0]?.field.startsWith('body'), r.text);
      }
      const none = await asAdmin.post('/admin/clock/advance', { rawBody: undefined });
      assert.equal(none.status, 422, none.text);
      assert.equal(await clockNow(), before, 'nothing moved');
    });

    test('the clock is admin only', async () => {
      const before = await clockNow();
      const asUser = api(t(), user.token);
      assert.equal((await anon().get('/admin/clock')).status, 401);
      assert.equal((await asUser.get('/admin/clock')).status, 403);
      const r = await asUser.post('/admin/clock/advance', { body: { seconds: 60 } });
      assert.equal(r.status, 403);
      assert.equal(r.body.code, 'forbidden');
      assert.equal((await anon().post('/admin/clock/advance', { body: { seconds: 60 } })).status, 401);
      assert.equal(await clockNow(), before);
    });

    test('the manual clock persists: a new ClockService on the same database continues from it', async () => {
      const r = await asAdmin.post('/admin/clock/advance', { body: { seconds: 600 } });
      assert.equal(r.status, 200, r.text);
      const now = Date.parse(r.body.now);
      const restarted = await ClockService.create(t().db, 'manual');
      assert.equal(restarted.now().getTime(), now);
      assert.equal(restarted.clock.mode, 'manual');
    });

    test('with the system clock, advance is 400 invalid_state and GET gives real time', async () => {
      const system = await ClockService.create(t().db, 'system');
      assert.equal(system.clock.mode, 'system');
      await assert.rejects(system.advance(60), (err: unknown) => {
        assert.ok(err instanceof AppError);
        assert.equal(err.code, 'invalid_state');
        assert.equal(err.status, 400);
        assert.match(err.detail, /manual/);
        return true;
      });
      assert.ok(Math.abs(system.now().getTime() - Date.now()) < 1000);
      // and it left the persisted manual clock alone
      assert.equal((await ClockService.create(t().db, 'manual')).now().getTime(), await clockNow());
    });

    test('advance returns after the jobs that came due have run, with the new time', async () => {
      const svc = await ClockService.create(t().db, 'manual');
      const start = svc.now().getTime();
      const seen: number[] = [];
      svc.onAdvance(async (now) => {
        await new Promise((r) => setTimeout(r, 50));
        seen.push(now.getTime());
      });
      const after = await svc.advance(30);
      assert.equal(after.getTime(), start + 30_000);
      assert.deepEqual(seen, [start + 30_000], 'the runner had finished when advance returned');
      // concurrent advances are serialized: each runner sees its own step
      const [a, b] = await Promise.all([svc.advance(10), svc.advance(5)]);
      assert.deepEqual([a.getTime(), b.getTime()], [start + 40_000, start + 45_000]);
      assert.deepEqual(seen, [start + 30_000, start + 40_000, start + 45_000]);
    });

    test('advances from two instances on one database add up and never go back', async () => {
      const a = await ClockService.create(t().db, 'manual');
      const b = await ClockService.create(t().db, 'manual');
      const start = a.now().getTime();
      assert.equal(b.now().getTime(), start);
      await a.advance(100);
      // The app reads the persisted clock on GET /admin/clock
      assert.equal(await clockNow(), start + 100_000);
      // b has not seen a's advance yet; its own advance continues from the stored time
      const bNow = await b.advance(10);
      assert.equal(bNow.getTime(), start + 110_000);
      assert.equal((await ClockService.create(t().db, 'manual')).now().getTime(), start + 110_000);
      // sync() catches a lagging instance up
      assert.equal((await a.sync()).getTime(), start + 110_000);
      assert.equal(a.now().getTime(), start + 110_000);
      // and so does an advance through the app
      const r = await asAdmin.post('/admin/clock/advance', { body: { seconds: 1 } });
      assert.equal(r.status, 200, r.text);
      assert.equal(Date.parse(r.body.now), start + 111_000);
    });
  });

  describe('access (administrators only)', () => {
    const routes = [
      ['GET /admin/users', (c: Api) => c.get('/admin/users')],
      ['GET /admin/users/1', (c: Api) => c.get('/admin/users/{user_id}', ofUser(1))],
      ['PATCH /admin/users/1', (c: Api) => c.patch('/admin/users/{user_id}', { ...ofUser(1), body: { max_vms: 3 } })],
      ['GET /admin/clock', (c: Api) => c.get('/admin/clock')],
      ['POST /admin/clock/advance', (c: Api) => c.post('/admin/clock/advance', { body: { seconds: 1 } })],
    ] as const;

    test('/admin/* is 401 without credentials and 403 for a normal user, even with a read_write key', async () => {
      const key = await createApiKey(t(), user.token, 'read_write');
      for (const [what, call] of routes) {
        const unauthenticated = await call(anon());
        assert.equal(unauthenticated.status, 401, what);
        assert.equal(unauthenticated.body.code, 'unauthorized');
        for (const token of [user.token, key]) {
          const r = await call(api(t(), token));
          assert.equal(r.status, 403, `${what}: ${r.text}`);
          assert.equal(r.body.code, 'forbidden');
          assert.match(r.body.detail, /admin/i);
        }
      }
      const me = await asAdmin.get('/admin/users/{user_id}', ofUser(user.id));
      assert.equal(me.status, 200, me.text);
      assert.equal(me.body.max_vms, null, 'the forbidden PATCH changed nothing');
    });

    test('an admin may use a read_write API key; a read_only key of an admin is refused', async () => {
      const rw = await createApiKey(t(), admin.token, 'read_write');
      const ok = await api(t(), rw).get('/admin/users');
      assert.equal(ok.status, 200);
      const ro = await createApiKey(t(), admin.token, 'read_only');
      const r = await api(t(), ro).get('/admin/users');
      assert.equal(r.status, 403);
    });
  });

  describe('users (list, inspect, role, suspension, limits)', () => {
    const tag = randomBytes(4).toString('hex');
    let tagged: TestUser[] = [];

    before(async () => {
      // Three users sharing a tag, one whose address holds a literal % and one a literal _.
      tagged = [];
      for (const local of [`Filter.${tag}.one`, `filter.${tag}.two`, `filter.${tag}.three`]) {
        tagged.push(await createUser(t(), { email: `${local}@Example.com` }));
      }
      await createUser(t(), { email: `pct%${tag}@example.com` });
      await createUser(t(), { email: `pctx${tag}@example.com` });
      await createUser(t(), { email: `und_${tag}@example.com` });
      await createUser(t(), { email: `undx${tag}@example.com` });
    });

    test('GET /admin/users lists every account, newest first, with X-Total-Count and no secrets', async () => {
      const r = await asAdmin.get('/admin/users', { query: { limit: 100 } });
      assert.equal(r.status, 200);
      assert.ok(Array.isArray(r.body));
      const total = Number(r.headers['x-total-count']);
      assert.equal(total, r.body.length);
      assert.ok(total >= 9);
      const ids = r.body.map((u) => u.id);
      assert.deepEqual(
        ids,
        [...ids].sort((a, b) => b - a),
        'newest first',
      );
      for (const u of r.body) assert.deepEqual(Object.keys(u).sort(), ADMIN_USER_FIELDS);
      const a = r.body.find((u) => u.id === admin.id);
      assert.ok(a, 'the admin is listed');
      assert.equal(a.role, 'admin');
      assert.equal(a.suspended, false);
    });

    test('the email filter is a case-insensitive substring', async () => {
      const r = await asAdmin.get('/admin/users', {
        query: { email: `FILTER.${tag.toUpperCase()}` },
      });
      assert.equal(r.status, 200);
      assert.equal(r.headers['x-total-count'], '3');
      assert.deepEqual(
        r.body.map((u) => u.email.toLowerCase()),
        [`filter.${tag}.three@example.com`, `filter.${tag}.two@example.com`, `filter.${tag}.one@example.com`],
      );
      const domain = await asAdmin.get('/admin/users', { query: { email: `${tag}.one@EXAMPLE` } });
      assert.equal(domain.status, 200, domain.text);
      assert.deepEqual(
        domain.body.map((u) => u.id),
        [tagged[0]!.id],
      );
      const none = await asAdmin.get('/admin/users', { query: { email: `nobody-${tag}` } });
      assert.deepEqual(none.body, []);
      assert.equal(none.headers['x-total-count'], '0');
    });

    test('% and _ in the filter are literal characters, not wildcards', async () => {
      const pct = await asAdmin.get('/admin/users', { query: { email: `pct%${tag}` } });
      assert.equal(pct.status, 200, pct.text);
      assert.deepEqual(
        pct.body.map((u) => u.email),
        [`pct%${tag}@example.com`],
      );
      assert.equal(pct.headers['x-total-count'], '1');
      const und = await asAdmin.get('/admin/users', { query: { email: `und_${tag}` } });
      assert.equal(und.status, 200, und.text);
      assert.deepEqual(
        und.body.map((u) => u.email),
        [`und_${tag}@example.com`],
      );
      const onlyPct = await asAdmin.get('/admin/users', { query: { email: '%' } });
      assert.equal(onlyPct.headers['x-total-count'], '1', 'a bare % matches only addresses that contain one');
      const backslash = await asAdmin.get('/admin/users', { query: { email: '\\' } });
      assert.equal(backslash.status, 200);
      assert.equal(backslash.headers['x-total-count'], '0');
    });

    test('limit and offset page through the filtered list; X-Total-Count stays the filtered total', async () => {
      const q = { email: `filter.${tag}` };
      const p1 = await asAdmin.get('/admin/users', { query: { ...q, limit: 2 } });
      assert.equal(p1.status, 200, p1.text);
      assert.deepEqual(
        p1.body.map((u) => u.id),
        [tagged[2]!.id, tagged[1]!.id],
      );
      assert.equal(p1.headers['x-total-count'], '3');
      const p2 = await asAdmin.get('/admin/users', { query: { ...q, limit: 2, offset: 2 } });
      assert.equal(p2.status, 200, p2.text);
      assert.deepEqual(
        p2.body.map((u) => u.id),
        [tagged[0]!.id],
      );
      assert.equal(p2.headers['x-total-count'], '3');
      const unknownParam = await asAdmin.get('/admin/users', { rawQuery: { role: 'admin' } });
      assert.equal(unknownParam.status, 422);
      const longFilter = await asAdmin.get('/admin/users', { query: { email: 'x'.repeat(300) } });
      assert.equal(longFilter.status, 422);
    });

    test('GET /admin/users/{id}: the record, 404 when missing, 422 when not a positive integer', async () => {
      const r = await asAdmin.get('/admin/users/{user_id}', ofUser(user.id));
      assert.equal(r.status, 200);
      assert.deepEqual(Object.keys(r.body).sort(), ADMIN_USER_FIELDS);
      assert.equal(r.body.id, user.id);
      assert.equal(r.body.email, user.email);
      assert.equal(r.body.role, 'user');
      assert.equal(r.body.suspended, false);
      assert.equal(r.body.max_vms, null);
      assert.equal(r.body.max_gpus, null);
      assert.equal(r.body.balance, 0);
      const credited = await asAdmin.post('/admin/users/{user_id}/credits', {
        ...ofUser(user.id),
        body: { amount: 12.345678, description: 'test' },
      });
      assert.equal(credited.status, 201, credited.text);
      const after = await asAdmin.get('/admin/users/{user_id}', ofUser(user.id));
      assert.equal(after.status, 200, after.text);
      assert.equal(after.body.balance, 12.345678);
      const listed = await asAdmin.get('/admin/users', { query: { email: user.email } });
      assert.equal(listed.status, 200, listed.text);
      assert.equal(listed.body[0]?.balance, 12.345678, 'the list shows balances too');
      const missing = await asAdmin.get('/admin/users/{user_id}', ofUser(987654321));
      assert.equal(missing.status, 404);
      assert.equal(missing.body.code, 'not_found');
      // Ids the typed client cannot send (its user_id is a number): through t().req.
      for (const id of ['abc', '1.5', '0', '-1', '99999999999999999999', '1e3', '%20']) {
        const bad = await t().req('GET', `/admin/users/${id}`, { token: admin.token });
        assert.equal(bad.status, 422, `${id}: ${bad.text}`);
        assert.equal(errorBody(bad).errors?.[0]?.field, 'path.user_id');
      }
    });

    test('PATCH sets limits and role, null restores the default limits, updated_at follows the clock', async () => {
      const target = await createUser(t());
      await asAdmin.post('/admin/clock/advance', { body: { seconds: 5 } });
      const now = await clockNow();
      const patch = (body: UserPatch) => asAdmin.patch('/admin/users/{user_id}', { ...ofUser(target.id), body });
      const r = await patch({ max_vms: 20, max_gpus: 32 });
      assert.equal(r.status, 200, r.text);
      assert.deepEqual([r.body.max_vms, r.body.max_gpus, r.body.role, r.body.suspended], [20, 32, 'user', false]);
      assert.equal(Date.parse(r.body.updated_at), now);
      const zero = await patch({ max_vms: 0 });
      assert.equal(zero.status, 200, zero.text);
      assert.deepEqual([zero.body.max_vms, zero.body.max_gpus], [0, 32], 'only the given fields change');
      const back = await patch({ max_vms: null, max_gpus: null });
      assert.equal(back.status, 200, back.text);
      assert.deepEqual([back.body.max_vms, back.body.max_gpus], [null, null]);
      const stored = await asAdmin.get('/admin/users/{user_id}', ofUser(target.id));
      assert.equal(stored.status, 200, stored.text);
      assert.deepEqual([stored.body.max_vms, stored.body.max_gpus], [null, null]);

      // Promotion takes effect on the user's next call, with the token it already holds.
      const asTarget = api(t(), target.token);
      assert.equal((await asTarget.get('/admin/users')).status, 403);
      const up = await patch({ role: 'admin' });
      assert.equal(up.status, 200, up.text);
      assert.equal(up.body.role, 'admin');
      assert.equal((await asTarget.get('/admin/users')).status, 200);
      const demoted = await patch({ role: 'user' });
      assert.equal(demoted.status, 200, demoted.text);
      assert.equal(demoted.body.role, 'user');
      assert.equal((await asTarget.get('/admin/users')).status, 403);
      // another admin may demote an admin
      const admin2 = await createUser(t(), { admin: true });
      const d2 = await asAdmin.patch('/admin/users/{user_id}', { ...ofUser(admin2.id), body: { role: 'user' } });
      assert.equal(d2.status, 200);
      assert.equal(d2.body.role, 'user');
    });

    test('PATCH validation: empty body, unknown field or bad values are 422; a missing user is 404', async () => {
      const at = ofUser(user.id);
      const cases: [unknown, string][] = [
        [{}, 'body'],
        [{ nickname: 'x' }, 'body.nickname'],
        [{ max_vms: 3, colour: 'red' }, 'body.colour'],
        [{ role: 'root' }, 'body.role'],
        [{ role: null }, 'body.role'],
        [{ suspended: 'yes' }, 'body.suspended'],
        [{ suspended: null }, 'body.suspended'],
        [{ max_vms: -1 }, 'body.max_vms'],
        [{ max_vms: 1.5 }, 'body.max_vms'],
        [{ max_vms: '5' }, 'body.max_vms'],
        [{ max_gpus: -1 }, 'body.max_gpus'],
        [{ max_gpus: 1e9 }, 'body.max_gpus'],
        [[], 'body'],
      ];
      for (const [body, field] of cases) {
        const r = await asAdmin.patch('/admin/users/{user_id}', { ...at, rawBody: body });
        assert.equal(r.status, 422, `${JSON.stringify(body)}: ${r.text}`);
        assert.ok(
          r.body.errors?.some((e) => e.field === field),
          `${JSON.stringify(body)}: ${JSON.stringify(r.body.errors)}`,
        );
      }
      const none = await asAdmin.patch('/admin/users/{user_id}', { ...at, rawBody: undefined });
      assert.equal(none.status, 422);
      const still = await asAdmin.get('/admin/users/{user_id}', at);
      assert.equal(still.status, 200, still.text);
      assert.deepEqual(
        [still.body.role, still.body.suspended, still.body.max_vms, still.body.max_gpus],
        ['user', false, null, null],
      );
      const missing = await asAdmin.patch('/admin/users/{user_id}', { ...ofUser(987654321), body: { max_vms: 1 } });
      assert.equal(missing.status, 404);
      assert.equal(missing.body.code, 'not_found');
      // An id the typed client cannot send (its user_id is a number): through t().req.
      const badId = await t().req('PATCH', '/admin/users/abc', { token: admin.token, body: { max_vms: 1 } });
      assert.equal(badId.status, 422);
    });

    test('an admin cannot suspend or demote themself (400 invalid_state), by session or by key', async () => {
      const at = ofUser(admin.id);
      const key = await createApiKey(t(), admin.token, 'read_write');
      const bodies: UserPatch[] = [
        { suspended: true },
        { role: 'user' },
        { role: 'user', suspended: true },
        { suspended: true, max_vms: 3 },
      ];
      for (const token of [admin.token, key]) {
        for (const body of bodies) {
          const r = await api(t(), token).patch('/admin/users/{user_id}', { ...at, body });
          assert.equal(r.status, 400, `${JSON.stringify(body)}: ${r.text}`);
          assert.equal(r.body.code, 'invalid_state');
        }
      }
      const self = await asAdmin.get('/admin/users/{user_id}', at);
      assert.equal(self.status, 200, self.text);
      assert.deepEqual(
        [self.body.role, self.body.suspended, self.body.max_vms],
        ['admin', false, null],
        'nothing changed',
      );
      // harmless changes to oneself are fine
      const ok = await asAdmin.patch('/admin/users/{user_id}', {
        ...at,
        body: { role: 'admin', suspended: false, max_vms: 50 },
      });
      assert.equal(ok.status, 200, ok.text);
      assert.equal(ok.body.max_vms, 50);
      await asAdmin.patch('/admin/users/{user_id}', { ...at, body: { max_vms: null } });
    });

    test('a suspended user gets 403 on every call, by session, key, login or refresh; unsuspending restores access', async () => {
      const s = await createUser(t());
      const key = await createApiKey(t(), s.token, 'read_write');
      const roKey = await createApiKey(t(), s.token, 'read_only');
      const suspend = (suspended: boolean) =>
        asAdmin.patch('/admin/users/{user_id}', { ...ofUser(s.id), body: { suspended } });
      const sus = await suspend(true);
      assert.equal(sus.status, 200, sus.text);
      assert.equal(sus.body.suspended, true);

      const keyId = { params: { key_id: '00000000-0000-4000-8000-000000000000' } };
      const calls = [
        ['GET /account', s.token, (c: Api) => c.get('/account')],
        ['GET /account', key, (c: Api) => c.get('/account')],
        ['GET /account', roKey, (c: Api) => c.get('/account')],
        ['GET /api-keys', key, (c: Api) => c.get('/api-keys')],
        ['POST /api-keys', s.token, (c: Api) => c.post('/api-keys', { body: { name: 'nope' } })],
        [
          'DELETE /api-keys/00000000-0000-4000-8000-000000000000',
          key,
          (c: Api) => c.delete('/api-keys/{key_id}', keyId),
        ],
        ['POST /auth/2fa/setup', s.token, (c: Api) => c.post('/auth/2fa/setup')],
        ['POST /auth/logout', s.token, (c: Api) => c.post('/auth/logout', { body: { refresh_token: s.refresh } })],
        ['GET /admin/users', s.token, (c: Api) => c.get('/admin/users')],
      ] as const;
      for (const [what, token, call] of calls) {
        const r = await call(api(t(), token));
        assert.equal(r.status, 403, `${what}: ${r.text}`);
        assert.equal(r.body.code, 'forbidden');
        assert.match(r.body.detail, /suspended/i);
      }
      const login = await anon().post('/auth/login', { body: { email: s.email, password: s.password } });
      assert.equal(login.status, 403, login.text);
      assert.match(login.body.detail, /suspended/i);
      const wrong = await anon().post('/auth/login', { body: { email: s.email, password: 'not-the-password' } });
      assert.equal(wrong.status, 403, 'a wrong password gets the same answer: no oracle for the right one');
      assert.equal(wrong.body.detail, login.body.detail);
      const refresh = await anon().post('/auth/refresh', { body: { refresh_token: s.refresh } });
      assert.equal(refresh.status, 403, refresh.text);

      // suspending twice is harmless
      const again = await suspend(true);
      assert.equal(again.status, 200);
      const listed = await asAdmin.get('/admin/users', { query: { email: s.email } });
      assert.equal(listed.status, 200, listed.text);
      assert.equal(listed.body[0]?.suspended, true);

      const un = await suspend(false);
      assert.equal(un.status, 200);
      assert.equal(un.body.suspended, false);
      assert.equal((await api(t(), s.token).get('/account')).status, 200);
      assert.equal((await api(t(), key).get('/account')).status, 200);
      assert.equal((await api(t(), roKey).get('/account')).status, 200);
      const relog = await anon().post('/auth/login', { body: { email: s.email, password: s.password } });
      assert.equal(relog.status, 200);
      t().forbidSecret(tokensOf(relog.body).refresh_token);
      const refreshed = await anon().post('/auth/refresh', { body: { refresh_token: s.refresh } });
      assert.equal(refreshed.status, 200, refreshed.text);
      t().forbidSecret(refreshed.body.refresh_token);
    });

    test('a suspended admin loses the admin API too', async () => {
      const admin2 = await createUser(t(), { admin: true });
      assert.equal(
        (await asAdmin.patch('/admin/users/{user_id}', { ...ofUser(admin2.id), body: { suspended: true } })).status,
        200,
      );
      const r = await api(t(), admin2.token).patch('/admin/users/{user_id}', {
        ...ofUser(admin.id),
        body: { suspended: true },
      });
      assert.equal(r.status, 403);
      const self = await asAdmin.get('/admin/users/{user_id}', ofUser(admin.id));
      assert.equal(self.status, 200, self.text);
      assert.equal(self.body.suspended, false);
      await asAdmin.patch('/admin/users/{user_id}', { ...ofUser(admin2.id), body: { suspended: false } });
    });

    test('suspension hooks run once, inside the suspension transaction', async () => {
      const a = await createUser(t());
      const b = await createUser(t());
      const calls: number[] = [];
      t().services.adminUsers.onSuspend(async (tx, userId, now) => {
        assert.equal(now.getTime(), t().services.clock.now().getTime());
        if (userId !== a.id && userId !== b.id) return;
        // The hook runs in the suspension's transaction before the user's row is locked and changed (the
        // VMs it stops come before the balance on that row in the lock order): it reads the row unchanged.
        const row = await tx.query<{ suspended: boolean }>('SELECT suspended FROM users WHERE id = $1', [userId]);
        assert.equal(row.rows[0]!.suspended, false);
        calls.push(userId);
        if (userId === b.id) throw new Error('could not stop the VMs');
      });
      const patchA = (body: UserPatch) => asAdmin.patch('/admin/users/{user_id}', { ...ofUser(a.id), body });
      const ok = await patchA({ suspended: true });
      assert.equal(ok.status, 200);
      await patchA({ suspended: true });
      await patchA({ max_vms: 1 });
      await patchA({ suspended: false });
      assert.deepEqual(calls, [a.id], 'only on the change from active to suspended');

      // A failing hook rolls the suspension back.
      const failed = await asAdmin.patch('/admin/users/{user_id}', { ...ofUser(b.id), body: { suspended: true } });
      assert.equal(failed.status, 500);
      assert.equal(failed.body.code, 'internal');
      const bNow = await asAdmin.get('/admin/users/{user_id}', ofUser(b.id));
      assert.equal(bNow.status, 200, bNow.text);
      assert.equal(bNow.body.suspended, false);
      assert.equal((await api(t(), b.token).get('/account')).status, 200);
    });

    test('a new user registered through the API appears with role user and default limits', async () => {
      const email = uniqueEmail('fresh');
      const reg = await anon().post('/auth/register', {
        body: { email, password: 'a-long-password-fresh', name: 'Fresh' },
      });
      assert.equal(reg.status, 201);
      const r = await asAdmin.get('/admin/users', { query: { email } });
      assert.equal(r.status, 200, r.text);
      assert.equal(r.body.length, 1);
      const u = r.body[0];
      assert.ok(u);
      assert.deepEqual(
        {
          role: u.role,
          suspended: u.suspended,
          max_vms: u.max_vms,
          max_gpus: u.max_gpus,
          name: u.name,
        },
        { role: 'user', suspended: false, max_vms: null, max_gpus: null, name: 'Fresh' },
      );
    });
  });

  describe('ledger check', () => {
    test('GET /admin/ledger-check: ok on a sound ledger; a balance moved outside the ledger is named; admins only', async () => {
      const sound = await asAdmin.get('/admin/ledger-check');
      assert.equal(sound.status, 200, sound.text);
      assert.equal(sound.body.ok, true, JSON.stringify(sound.body.problems));
      assert.deepEqual(sound.body.problems, []);
      assert.equal(sound.body.checked_at, new Date(await clockNow()).toISOString());

      const victim = await createUser(t());
      await t().db.query('UPDATE balances SET balance_micros = balance_micros + 1000000 WHERE user_id = $1', [
        victim.id,
      ]);
      try {
        const broken = await asAdmin.get('/admin/ledger-check');
        assert.equal(broken.status, 200, broken.text);
        assert.equal(broken.body.ok, false);
        const mine = broken.body.problems.filter((p) => p.user_id === victim.id);
        assert.equal(mine.length, 1);
        const problem = mine[0];
        assert.ok(problem);
        assert.equal(problem.kind, 'balance');
        assert.equal(problem.email, victim.email);
        assert.match(problem.detail, /balance 1 but transactions sum to 0/);
      } finally {
        await t().db.query('UPDATE balances SET balance_micros = balance_micros - 1000000 WHERE user_id = $1', [
          victim.id,
        ]);
      }

      assert.equal((await anon().get('/admin/ledger-check')).status, 401);
      assert.equal((await api(t(), user.token).get('/admin/ledger-check')).status, 403);
      const key = await createApiKey(t(), user.token, 'read_write');
      assert.equal((await api(t(), key).get('/admin/ledger-check')).status, 403);
    });
  });
});
