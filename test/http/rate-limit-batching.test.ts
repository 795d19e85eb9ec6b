import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import { MemoryRateLimitStore, RedisRateLimitStore } from '../../src/http/rate-limit-store.js';
import { BatchingRateLimitStore } from '../../src/http/rate-limit-batching.js';

/** A window far longer than any test run, so that no window ends under a test. */
const WINDOW = 2 ** 40;
const NOW = Date.now();
const REDIS_URL = process.env.GPUCLOUD_REDIS_URL;

/** The in-memory store as the store instances share, counting how often it is asked. */
class SharedMemory extends MemoryRateLimitStore {
  adds = 0;
  override async add(key: string, windowMs: number, nowMs: number, n: number) {
    this.adds += 1;
    return super.add(key, windowMs, nowMs, n);
  }
  /** The shared count, without adding to it. */
  async total(key: string, windowMs = WINDOW, nowMs = NOW): Promise<number> {
    return (await super.add(key, windowMs, nowMs, 0)).count;
  }
}

describe('BatchingRateLimitStore', () => {
  test('on one instance every count is exact, with a fraction of the round trips', async () => {
    const shared = new SharedMemory();
    const store = new BatchingRateLimitStore(shared);
    const counts: number[] = [];
    for (let i = 0; i < 1000; i++) counts.push((await store.hit('k', WINDOW, NOW, { localBelow: 600 })).count);
    assert.deepEqual(
      counts,
      Array.from({ length: 1000 }, (_, i) => i + 1),
    );
    // the first hit, then one per hit from the 600th on
    assert.equal(shared.adds, 1 + 401);
    assert.equal(await shared.total('k'), 1000);
    await store.close();
  });

  test('below localBelow hits wait for the flush; from it on each is counted in the shared store', async () => {
    const shared = new SharedMemory();
    const store = new BatchingRateLimitStore(shared, { flushEveryMs: 60_000 });
    for (let i = 1; i <= 9; i++) assert.equal((await store.hit('k', WINDOW, NOW, { localBelow: 10 })).count, i);
    assert.equal(await shared.total('k'), 1, 'only the first hit has been sent');
    assert.equal((await store.hit('k', WINDOW, NOW, { localBelow: 10 })).count, 10);
    assert.equal(await shared.total('k'), 10, 'the 10th hit took the 8 local ones with it');
    assert.equal((await store.hit('k', WINDOW, NOW, { localBelow: 10 })).count, 11);
    assert.equal(await shared.total('k'), 11);
    await store.close();
  });

  test('unhit takes back a local hit not yet sent, else one in the shared store', async () => {
    const shared = new SharedMemory();
    const store = new BatchingRateLimitStore(shared, { flushEveryMs: 60_000 });
    for (let i = 1; i <= 4; i++) await store.hit('k', WINDOW, NOW, { localBelow: 10 });
    assert.equal(await store.unhit('k', WINDOW, NOW), 3, 'a local hit');
    assert.equal(await shared.total('k'), 1, 'the shared store was not asked');
    await store.flush();
    assert.equal(await shared.total('k'), 3);
    assert.equal(await store.unhit('k', WINDOW, NOW), 2, 'nothing local left: the shared store');
    assert.equal(await shared.total('k'), 2);
    // The login counters: every hit in the shared store, and so every unhit.
    for (let i = 1; i <= 3; i++) await store.hit('login', WINDOW, NOW);
    assert.equal(await store.unhit('login', WINDOW, NOW), 2);
    assert.equal((await store.hit('login', WINDOW, NOW)).count, 3);
    assert.equal(await shared.total('login'), 3);
    await store.close();
  });

  test('without localBelow every hit is counted in the shared store', async () => {
    const shared = new SharedMemory();
    const store = new BatchingRateLimitStore(shared);
    for (let i = 1; i <= 5; i++) assert.equal((await store.hit('login', WINDOW, NOW)).count, i);
    assert.equal(shared.adds, 5);
    await store.close();
  });

  test("another instance sees this one's hits after a flush, and the limit holds across both", async () => {
    const shared = new SharedMemory();
    const a = new BatchingRateLimitStore(shared, { flushEveryMs: 60_000 });
    const b = new BatchingRateLimitStore(shared, { flushEveryMs: 60_000 });
    for (let i = 0; i < 20; i++) await a.hit('k', WINDOW, NOW, { localBelow: 100 });
    assert.equal(await shared.total('k'), 1);
    await a.flush();
    assert.equal(await shared.total('k'), 20);
    assert.equal((await b.hit('k', WINDOW, NOW, { localBelow: 100 })).count, 21);

    // Near the limit (10, counted locally below 5) the two instances, alternating and never
    // flushed, let exactly 10 hits through.
    const key = 'near';
    const allowed: string[] = [];
    for (let i = 0; i < 20; i++) {
      const [name, s] = i % 2 ? (['b', b] as const) : (['a', a] as const);
      const hit = await s.hit(key, WINDOW, NOW, { localBelow: 5 });
      if (hit.count <= 10) allowed.push(name);
    }
    assert.equal(allowed.length, 10, allowed.join(''));
    assert.equal(await shared.total(key), 20);
    await Promise.all([a.close(), b.close()]);
  });

  test('a key not read from the shared store for longer than freshForMs is counted there again', async () => {
    const shared = new SharedMemory();
    const a = new BatchingRateLimitStore(shared, { flushEveryMs: 60_000, freshForMs: 1000 });
    const b = new BatchingRateLimitStore(shared, { flushEveryMs: 60_000 });
    assert.equal((await a.hit('k', WINDOW, NOW, { localBelow: 100 })).count, 1);
    for (let i = 0; i < 30; i++) await b.hit('k', WINDOW, NOW, { localBelow: 100 });
    await b.flush();
    assert.equal((await a.hit('k', WINDOW, NOW + 1000, { localBelow: 100 })).count, 2, 'still fresh: local');
    assert.equal((await a.hit('k', WINDOW, NOW + 1001, { localBelow: 100 })).count, 33, 'stale: shared');
    await Promise.all([a.close(), b.close()]);
  });

  test('the timer sends local hits on its own, and close() sends what is left', async () => {
    const shared = new SharedMemory();
    const store = new BatchingRateLimitStore(shared, { flushEveryMs: 20 });
    for (let i = 0; i < 5; i++) await store.hit('k', WINDOW, NOW, { localBelow: 100 });
    for (let i = 0; i < 50 && (await shared.total('k')) < 5; i++) await sleep(20);
    assert.equal(await shared.total('k'), 5);

    // close() closes the shared store too; this one stays open to be read
    const notClosed = Object.assign(Object.create(shared) as SharedMemory, { close: async () => undefined });
    const later = new BatchingRateLimitStore(notClosed, { flushEveryMs: 60_000 });
    for (let i = 0; i < 7; i++) await later.hit('j', WINDOW, NOW, { localBelow: 100 });
    await later.close();
    assert.equal(await shared.total('j'), 7);
    await assert.rejects(later.hit('j', WINDOW, NOW), /closed/);
    await store.close();
  });

  test('a new window starts a new count; the ended window is dropped at the next flush', async () => {
    const shared = new SharedMemory();
    const store = new BatchingRateLimitStore(shared, { flushEveryMs: 60_000 });
    const minute = 60_000;
    const start = Math.floor(NOW / minute) * minute - 10 * minute; // two ended windows
    assert.equal((await store.hit('k', minute, start, { localBelow: 100 })).count, 1);
    assert.equal((await store.hit('k', minute, start + 1, { localBelow: 100 })).count, 2);
    assert.equal((await store.hit('k', minute, start + minute, { localBelow: 100 })).count, 1);
    // A hit for the earlier window (a clock step back) is counted in the shared store, not locally.
    const adds = shared.adds;
    await store.hit('k', minute, start + 5, { localBelow: 100 });
    assert.equal(shared.adds, adds + 1);
    assert.equal(await shared.total('k', minute, start + minute), 1, 'the later window is untouched');
    assert.equal(store.size(), 1);
    await store.flush();
    assert.equal(store.size(), 0);
    await store.close();
  });

  test('keys seen once (each hit counted in the shared store) are dropped when their window ends', async () => {
    const shared = new SharedMemory();
    const store = new BatchingRateLimitStore(shared, { flushEveryMs: 10, sweepEveryMs: 20 });
    const windowMs = 50;
    for (let i = 0; i < 100; i++) await store.hit(`ip-${i}`, windowMs, Date.now());
    assert.ok(store.size() > 0);
    for (let i = 0; i < 100 && store.size() > 0; i++) await sleep(10);
    assert.equal(store.size(), 0, 'no counter outlives its window');
    await store.close();
  });

  test('a failing shared store: the hit rejects and the local hits it carried are sent later', async () => {
    const shared = new SharedMemory();
    let failing = false;
    const flaky = Object.assign(Object.create(shared) as SharedMemory, {
      add: (key: string, windowMs: number, nowMs: number, n: number) =>
        failing ? Promise.reject(new Error('rate-limit store: down')) : shared.add(key, windowMs, nowMs, n),
    });
    const store = new BatchingRateLimitStore(flaky, { flushEveryMs: 60_000 });
    for (let i = 0; i < 4; i++) await store.hit('k', WINDOW, NOW, { localBelow: 100 });
    failing = true;
    await assert.rejects(store.hit('k', WINDOW, NOW), /down/);
    await store.flush();
    assert.equal(await shared.total('k'), 1, 'nothing more reached the store');
    failing = false;
    await store.flush();
    assert.equal(await shared.total('k'), 4, 'the three local hits arrived; the failed one was let through uncounted');
    await store.close();
  });
});

describe('BatchingRateLimitStore over Redis', { skip: !REDIS_URL }, () => {
  test('two instances share one count through Redis', async () => {
    const prefix = `gpucloud-test-${randomUUID()}:`;
    const a = new BatchingRateLimitStore(new RedisRateLimitStore(REDIS_URL ?? '', { prefix }));
    const b = new BatchingRateLimitStore(new RedisRateLimitStore(REDIS_URL ?? '', { prefix }));
    const admin = new Redis(REDIS_URL ?? '');
    try {
      const minute = 60_000;
      const now = Date.now();
      const counts = [];
      for (let i = 0; i < 40; i++) counts.push((await a.hit('k', minute, now, { localBelow: 150 })).count);
      assert.deepEqual(
        counts,
        Array.from({ length: 40 }, (_, i) => i + 1),
      );
      await a.flush();
      const windowStart = Math.floor(now / minute) * minute;
      assert.equal(await admin.get(`${prefix}rl:k:${windowStart}`), '40');
      assert.equal((await b.hit('k', minute, now, { localBelow: 150 })).count, 41);
      assert.ok((await admin.pttl(`${prefix}rl:k:${windowStart}`)) > 0, 'the counter expires');
    } finally {
      await Promise.all([a.close(), b.close()]);
      const keys = await admin.keys(`${prefix}*`);
      if (keys.length > 0) await admin.del(...keys);
      await admin.quit();
    }
  });
});
