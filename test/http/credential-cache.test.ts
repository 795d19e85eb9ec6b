/**
 * Remembered credentials: what a change through this instance
 * does at once, what a change through another instance does within a
 * second, and the cache's own rules (TTL, forgetting a user, a load that
 * overlapped a change is not kept).
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import type { FastifyInstance } from 'fastify';
import { CredentialCache } from '../../src/credential-cache.js';
import { describeEachDb, request } from '../helpers/app.js';
import { api } from '../helpers/api.js';
import { createApiKey, createUser } from '../helpers/factories.js';
import { within } from '../helpers/wait.js';

describe('CredentialCache', () => {
  test('answers from memory until the TTL, then loads again', async () => {
    let now = 0;
    const cache = new CredentialCache<number | null>(1000, 100, () => now);
    let loads = 0;
    const load = async () => ++loads;
    assert.equal(await cache.through('k', load, () => 7), 1);
    now = 999;
    assert.equal(await cache.through('k', load, () => 7), 1, 'still remembered');
    now = 1000;
    assert.equal(await cache.through('k', load, () => 7), 2, 'expired: loaded again');
  });

  test("forgetUser drops that user's answers only; a negative answer is remembered too", async () => {
    const cache = new CredentialCache<string | null>(1000, 100, () => 0);
    await cache.through(
      'a',
      async () => 'alice',
      () => 1,
    );
    await cache.through(
      'b',
      async () => 'bob',
      () => 2,
    );
    await cache.through(
      'nobody',
      async () => null,
      () => undefined,
    );
    cache.forgetUser(1);
    assert.equal(cache.get('a'), undefined);
    assert.equal(cache.get('b'), 'bob');
    assert.equal(cache.get('nobody'), null);
  });

  test('a load that overlapped a forget is returned but not remembered', async () => {
    const cache = new CredentialCache<string>(1000, 100, () => 0);
    let release!: () => void;
    const slow = cache.through(
      'a',
      () => new Promise<string>((r) => (release = () => r('before the change'))),
      () => 1,
    );
    cache.forgetUser(1); // the change committed while the read was in flight
    release();
    assert.equal(await slow, 'before the change');
    assert.equal(cache.get('a'), undefined, 'the stale answer was not kept');
  });

  test('holds at most maxEntries, dropping the oldest', async () => {
    const cache = new CredentialCache<number>(1000, 3, () => 0);
    for (const k of ['a', 'b', 'c', 'd'])
      await cache.through(
        k,
        async () => 1,
        () => 1,
      );
    assert.equal(cache.get('a'), undefined);
    assert.equal(cache.get('d'), 1);
  });
});

describeEachDb('remembered credentials across instances', (t) => {
  const on = (app: FastifyInstance, method: string, url: string, opts: { token?: string; body?: unknown } = {}) =>
    request(app, new Set(), method, url, opts);

  test('a revoked API key is refused at once by the instance that revoked it, within a second by another', async () => {
    const u = await createUser(t());
    const key = await createApiKey(t(), u.token, 'read_only');
    const b = await t().another();
    const c = api(t(), u.token);
    // Both instances have seen the key (and remember it).
    assert.equal((await c.as(key).get('/account')).status, 200);
    assert.equal((await on(b, 'GET', '/account', { token: key })).status, 200);
    const list = await c.get('/api-keys');
    assert.equal(list.status, 200, list.text);
    const first = list.body[0];
    assert.ok(first, 'the key is listed');
    const revoked = await c.delete('/api-keys/{key_id}', { params: { key_id: first.id } });
    assert.equal(revoked.status, 204, revoked.text);
    assert.equal((await c.as(key).get('/account')).status, 401, 'at once where it was revoked');
    const ms = await within(
      1500,
      async () => (await on(b, 'GET', '/account', { token: key })).status === 401,
      'the other instance refuses it',
    );
    assert.ok(ms <= 1500);
  });

  test('a suspension and a logout apply at once on the instance that made them, within a second on another', async () => {
    const admin = await createUser(t(), { admin: true });
    const u = await createUser(t());
    const b = await t().another();
    const c = api(t(), u.token);
    const a = api(t(), admin.token);
    assert.equal((await on(b, 'GET', '/account', { token: u.token })).status, 200);
    assert.equal((await c.get('/account')).status, 200);
    const s = await a.patch('/admin/users/{user_id}', { params: { user_id: u.id }, body: { suspended: true } });
    assert.equal(s.status, 200, s.text);
    assert.equal((await c.get('/account')).status, 403, 'suspended at once here');
    await within(
      1500,
      async () => (await on(b, 'GET', '/account', { token: u.token })).status === 403,
      'suspended on the other instance',
    );
    assert.equal(
      (await a.patch('/admin/users/{user_id}', { params: { user_id: u.id }, body: { suspended: false } })).status,
      200,
    );
    assert.equal((await c.get('/account')).status, 200, 'back at once');

    const out = await c.post('/auth/logout', { body: { refresh_token: u.refresh } });
    assert.equal(out.status, 204, out.text);
    assert.equal((await c.get('/account')).status, 401, 'logged out at once here');
    await within(
      1500,
      async () => (await on(b, 'GET', '/account', { token: u.token })).status === 401,
      'logged out on the other instance',
    );
  });
});
