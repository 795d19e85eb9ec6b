import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { Redis } from 'ioredis';
import { createTestDb } from '../helpers/db.js';
import {
  MemoryRateLimitStore,
  PostgresRateLimitStore,
  RedisRateLimitStore,
  type RateLimitStore,
} from '../../src/http/rate-limit-store.js';
import { BatchingRateLimitStore } from '../../src/http/rate-limit-batching.js';
import { createRateLimitStore } from '../../src/http/rate-limit.js';

const WINDOW = 60_000;
/** Start of a real, epoch-aligned 60 s window. */
const BASE = Math.floor(Date.now() / WINDOW) * WINDOW;
const REDIS_URL = process.env.GPUCLOUD_REDIS_URL;

/** The behaviour every RateLimitStore implementation must have. */
function behaviouralSuite(getStore: () => RateLimitStore, uniq: () => string): void {
  test('counts hits within one window', async () => {
    const store = getStore();
    const key = `count-${uniq()}`;
    assert.equal((await store.hit(key, WINDOW, BASE)).count, 1);
    assert.equal((await store.hit(key, WINDOW, BASE + 10)).count, 2);
    assert.equal((await store.hit(key, WINDOW, BASE + 30_000)).count, 3);
    assert.equal((await store.hit(key, WINDOW, BASE + WINDOW - 1)).count, 4);
  });

  test('a new window restarts at 1', async () => {
    const store = getStore();
    const key = `restart-${uniq()}`;
    assert.equal((await store.hit(key, WINDOW, BASE + 59_999)).count, 1);
    assert.equal((await store.hit(key, WINDOW, BASE + 59_999)).count, 2);
    // 1 ms later is the next epoch-aligned window
    assert.equal((await store.hit(key, WINDOW, BASE + WINDOW)).count, 1);
    assert.equal((await store.hit(key, WINDOW, BASE + WINDOW + 5)).count, 2);
    // skipping a whole window also restarts
    assert.equal((await store.hit(key, WINDOW, BASE + 3 * WINDOW + 1)).count, 1);
  });

  test('resetMs follows epoch alignment of the window', async () => {
    const store = getStore();
    const key = `reset-${uniq()}`;
    assert.deepEqual(await store.hit(key, WINDOW, BASE), { count: 1, resetMs: 60_000 });
    assert.deepEqual(await store.hit(key, WINDOW, BASE + 12_345), { count: 2, resetMs: 47_655 });
    assert.deepEqual(await store.hit(key, WINDOW, BASE + WINDOW - 1), { count: 3, resetMs: 1 });
    // absolute values: 1_700_000_012_345 is 12_345 ms past a multiple of 60_000
    const abs = await store.hit(`${key}-abs`, WINDOW, 1_700_000_012_345 - (1_700_000_000_000 % WINDOW));
    assert.equal(abs.resetMs, 47_655);
    // other window sizes align the same way
    const small = await store.hit(`${key}-small`, 1_000, 1_700_000_000_250);
    assert.deepEqual(small, { count: 1, resetMs: 750 });
  });

  test('different keys are independent', async () => {
    const store = getStore();
    const a = `indep-a-${uniq()}`;
    const b = `indep-b-${uniq()}`;
    assert.equal((await store.hit(a, WINDOW, BASE + 1)).count, 1);
    assert.equal((await store.hit(a, WINDOW, BASE + 2)).count, 2);
    assert.equal((await store.hit(b, WINDOW, BASE + 3)).count, 1);
    assert.equal((await store.hit(a, WINDOW, BASE + 4)).count, 3);
    assert.equal((await store.hit(b, WINDOW, BASE + 5)).count, 2);
  });

  test('concurrent hits are each counted exactly once', async () => {
    const store = getStore();
    const key = `concurrent-${uniq()}`;
    const hits = await Promise.all(Array.from({ length: 50 }, (_, i) => store.hit(key, WINDOW, BASE + i)));
    const counts = hits.map((h) => h.count).sort((x, y) => x - y);
    assert.deepEqual(
      counts,
      Array.from({ length: 50 }, (_, i) => i + 1),
    );
  });

  test('rejects an invalid window size', async () => {
    const store = getStore();
    await assert.rejects(store.hit(`bad-${uniq()}`, 0, BASE), RangeError);
  });

  test('unhit takes back one hit of its window, never below zero, and never touches another window', async () => {
    const store = getStore();
    const key = `unhit-${uniq()}`;
    assert.equal(await store.unhit(key, WINDOW, BASE + 1), 0, 'nothing to take back');
    assert.equal((await store.hit(key, WINDOW, BASE + 2)).count, 1, 'nothing was left below zero');
    assert.equal((await store.hit(key, WINDOW, BASE + 3)).count, 2);
    assert.equal(await store.unhit(key, WINDOW, BASE + 4), 1);
    assert.equal((await store.hit(key, WINDOW, BASE + 5)).count, 2);
    assert.equal(await store.unhit(key, WINDOW, BASE + 2 * WINDOW + 1), 0, 'a later window has nothing of it');
    assert.equal((await store.hit(key, WINDOW, BASE + 6)).count, 3, 'its own window kept its count');
    for (const left of [2, 1, 0, 0]) assert.equal(await store.unhit(key, WINDOW, BASE + 7), left);
    assert.equal((await store.hit(key, WINDOW, BASE + 8)).count, 1);
  });

  test('concurrent hits and unhits leave the exact difference', async () => {
    const store = getStore();
    const key = `unhit-concurrent-${uniq()}`;
    for (let i = 0; i < 30; i++) await store.hit(key, WINDOW, BASE + 1);
    await Promise.all(
      Array.from({ length: 40 }, (_, i) =>
        i % 2 ? store.unhit(key, WINDOW, BASE + 2) : store.hit(key, WINDOW, BASE + 2),
      ),
    );
    assert.equal((await store.hit(key, WINDOW, BASE + 3)).count, 31);
  });
}

describe('MemoryRateLimitStore', () => {
  const store = new MemoryRateLimitStore();
  let n = 0;
  after(() => store.close());

  behaviouralSuite(
    () => store,
    () => String(++n),
  );

  test('drops the previous window of a key when a new one starts', async () => {
    const s = new MemoryRateLimitStore();
    await s.hit('k', WINDOW, BASE);
    await s.hit('k', WINDOW, BASE + 1);
    assert.equal(s.size(), 1);
    await s.hit('k', WINDOW, BASE + WINDOW);
    assert.equal(s.size(), 1);
    await s.close();
  });

  test('sweeps expired windows lazily so it does not grow without bound', async () => {
    const s = new MemoryRateLimitStore({ sweepEvery: 10 });
    for (let i = 0; i < 100; i++) await s.hit(`ip-${i}`, WINDOW, BASE + i);
    // still in their window: nothing can be dropped
    assert.equal(s.size(), 100);
    // later windows: the 100 idle keys are dropped by the lazy sweep
    for (let i = 0; i < 100; i++) await s.hit('busy', WINDOW, BASE + WINDOW + i);
    assert.equal(s.size(), 1);
    // many distinct keys over many windows stay bounded
    for (let w = 2; w < 50; w++) {
      for (let i = 0; i < 20; i++) await s.hit(`w${w}-k${i}`, WINDOW, BASE + w * WINDOW + i);
    }
    assert.ok(s.size() <= 60, `size ${s.size()} should stay bounded`);
    assert.equal(s.sweep(BASE + 100 * WINDOW) >= 1, true);
    assert.equal(s.size(), 0);
    await s.close();
  });

  test('a closed store rejects hits', async () => {
    const s = new MemoryRateLimitStore();
    await s.close();
    await assert.rejects(s.hit('k', WINDOW, BASE), /closed/);
  });
});

describe('createRateLimitStore', () => {
  test('returns a memory store without a Redis URL on the embedded database', async () => {
    const db = await createTestDb('pglite');
    try {
      for (const url of [undefined, '', '  ']) {
        for (const opts of [{}, { db: db.db }]) {
          const { store: s, kind } = createRateLimitStore(url, opts);
          assert.ok(s instanceof MemoryRateLimitStore);
          assert.equal(kind, 'memory');
          await s.close();
        }
      }
    } finally {
      await db.cleanup();
    }
  });

  test(
    'returns a PostgreSQL store without a Redis URL on PostgreSQL',
    { skip: !process.env.DATABASE_URL },
    async () => {
      const db = await createTestDb('postgres');
      try {
        const { store: s, kind } = createRateLimitStore(undefined, { db: db.db });
        assert.ok(s instanceof BatchingRateLimitStore && s.shared instanceof PostgresRateLimitStore);
        assert.equal(kind, 'postgres');
        await s.close();
      } finally {
        await db.cleanup();
      }
    },
  );

  test('returns a Redis store with a Redis URL', { skip: !REDIS_URL }, async () => {
    const prefix = `gpucloud-test-${randomUUID()}:`;
    const { store: s, kind } = createRateLimitStore(REDIS_URL, { prefix });
    assert.equal(kind, 'redis');
    try {
      assert.ok(s instanceof BatchingRateLimitStore && s.shared instanceof RedisRateLimitStore);
      assert.equal(s.shared.prefix, prefix);
      assert.equal((await s.hit('factory', WINDOW, BASE)).count, 1);
    } finally {
      await s.close();
      const admin = new Redis(REDIS_URL ?? '');
      await deleteByPrefix(admin, prefix);
      await admin.quit();
    }
  });
});

describe('RedisRateLimitStore (unreachable Redis)', () => {
  test('hit() rejects with an Error instead of hanging', async () => {
    // nothing listens on port 1
    const s = new RedisRateLimitStore('redis://127.0.0.1:1', { prefix: 'gpucloud-test-down:' });
    const started = Date.now();
    try {
      await assert.rejects(s.hit('k', WINDOW, BASE), (err: unknown) => {
        assert.ok(err instanceof Error);
        assert.match(err.message, /rate-limit store/);
        return true;
      });
      assert.ok(Date.now() - started < 5_000, 'must fail within a few seconds');
    } finally {
      await s.close();
    }
  });
});

async function deleteByPrefix(client: Redis, prefix: string): Promise<number> {
  let cursor = '0';
  let deleted = 0;
  do {
    const [next, keys] = await client.scan(cursor, 'MATCH', `${prefix}*`, 'COUNT', 500);
    cursor = next;
    if (keys.length > 0) deleted += await client.del(...keys);
  } while (cursor !== '0');
  return deleted;
}

describe('RedisRateLimitStore', { skip: !REDIS_URL }, () => {
  const prefix = `gpucloud-test-${randomUUID()}:`;
  let store: RedisRateLimitStore;
  let other: RedisRateLimitStore;
  let admin: Redis;
  let n = 0;

  before(() => {
    const url = REDIS_URL ?? '';
    store = new RedisRateLimitStore(url, { prefix });
    other = new RedisRateLimitStore(url, { prefix });
    admin = new Redis(url);
  });

  after(async () => {
    await deleteByPrefix(admin, prefix);
    assert.equal((await admin.keys(`${prefix}*`)).length, 0);
    await Promise.all([store.close(), other.close()]);
    await admin.quit();
  });

  behaviouralSuite(
    () => store,
    () => String(++n),
  );

  test('uses the key layout `${prefix}rl:${key}:${windowStart}`', async () => {
    await store.hit('layout', WINDOW, BASE + 42);
    assert.equal(await admin.get(`${prefix}rl:layout:${BASE}`), '1');
    assert.equal(store.keyFor('layout', BASE), `${prefix}rl:layout:${BASE}`);
  });

  test('defaults the prefix to gpucloud:', async () => {
    const s = new RedisRateLimitStore(REDIS_URL ?? '');
    assert.equal(s.prefix, 'gpucloud:');
    assert.equal(s.keyFor('x', 60_000), 'gpucloud:rl:x:60000');
    await s.close();
  });

  test('two instances with the same prefix share counters', async () => {
    const key = `shared-${randomUUID()}`;
    assert.equal((await store.hit(key, WINDOW, BASE + 1)).count, 1);
    assert.equal((await other.hit(key, WINDOW, BASE + 2)).count, 2);
    assert.equal((await store.hit(key, WINDOW, BASE + 3)).count, 3);
    const mixed = await Promise.all(
      Array.from({ length: 20 }, (_, i) => (i % 2 ? store : other).hit(key, WINDOW, BASE + 10 + i)),
    );
    assert.deepEqual(
      mixed.map((h) => h.count).sort((x, y) => x - y),
      Array.from({ length: 20 }, (_, i) => i + 4),
    );
  });

  test('a different prefix does not share counters', async () => {
    const s = new RedisRateLimitStore(REDIS_URL ?? '', { prefix: `${prefix}other:` });
    try {
      await store.hit('iso', WINDOW, BASE);
      assert.equal((await s.hit('iso', WINDOW, BASE)).count, 1);
    } finally {
      await s.close();
    }
  });

  test('counter keys get an expiry', async () => {
    const now = Date.now();
    const hit = await store.hit('ttl', WINDOW, now);
    const windowStart = Math.floor(now / WINDOW) * WINDOW;
    const pttl = await admin.pttl(`${prefix}rl:ttl:${windowStart}`);
    assert.ok(pttl > 0, `PTTL ${pttl} should be > 0`);
    assert.ok(pttl <= hit.resetMs + 1_000, `PTTL ${pttl} should end near the window end (${hit.resetMs} ms)`);
    // later hits keep the expiry
    await store.hit('ttl', WINDOW, now + 1);
    assert.ok((await admin.pttl(`${prefix}rl:ttl:${windowStart}`)) > 0);
  });

  test('unhit keeps the expiry and makes no key', async () => {
    const now = Date.now();
    const windowStart = Math.floor(now / WINDOW) * WINDOW;
    await store.hit('ttl-unhit', WINDOW, now);
    await store.hit('ttl-unhit', WINDOW, now);
    assert.equal(await store.unhit('ttl-unhit', WINDOW, now + 1), 1);
    assert.ok((await admin.pttl(`${prefix}rl:ttl-unhit:${windowStart}`)) > 0);
    assert.equal(await store.unhit('never-hit', WINDOW, now), 0);
    assert.equal(await admin.exists(`${prefix}rl:never-hit:${windowStart}`), 0);
  });

  test('50 concurrent hits give exactly the counts 1..50', async () => {
    const key = `burst-${randomUUID()}`;
    const hits = await Promise.all(Array.from({ length: 50 }, () => store.hit(key, WINDOW, BASE + 7)));
    assert.deepEqual(
      hits.map((h) => h.count).sort((x, y) => x - y),
      Array.from({ length: 50 }, (_, i) => i + 1),
    );
    assert.ok(hits.every((h) => h.resetMs === WINDOW - 7));
    assert.ok((await admin.pttl(`${prefix}rl:${key}:${BASE}`)) > 0);
  });
});

describe('PostgresRateLimitStore', { skip: !process.env.DATABASE_URL }, () => {
  let tdb: Awaited<ReturnType<typeof createTestDb>>;
  let store: PostgresRateLimitStore;
  let other: PostgresRateLimitStore;
  let n = 0;

  before(async () => {
    tdb = await createTestDb('postgres');
    store = new PostgresRateLimitStore(tdb.db);
    // A second instance: its own connection pool onto the same database.
    other = new PostgresRateLimitStore(await tdb.openAnother());
  });

  after(async () => {
    await Promise.all([store.close(), other.close()]);
    await tdb.cleanup();
  });

  behaviouralSuite(
    () => store,
    () => String(++n),
  );

  test('two instances on one database share counters, concurrent hits each counted once', async () => {
    const key = `shared-${randomUUID()}`;
    assert.equal((await store.hit(key, WINDOW, BASE + 1)).count, 1);
    assert.equal((await other.hit(key, WINDOW, BASE + 2)).count, 2);
    const mixed = await Promise.all(
      Array.from({ length: 20 }, (_, i) => (i % 2 ? store : other).hit(key, WINDOW, BASE + 10 + i)),
    );
    assert.deepEqual(
      mixed.map((h) => h.count).sort((a, b) => a - b),
      Array.from({ length: 20 }, (_, i) => i + 3),
    );
  });

  test('ended windows are swept away', async () => {
    const key = `sweep-${randomUUID()}`;
    const s = new PostgresRateLimitStore(tdb.db);
    await s.hit(key, WINDOW, BASE);
    // An hour later the first hit of a fresh store sweeps every window that ended.
    await s.hit(`${key}-later`, WINDOW, BASE + 3_600_000);
    const left = async () => (await tdb.db.query('SELECT 1 FROM rate_limit_hits WHERE key = $1', [key])).rows.length;
    for (let i = 0; i < 50 && (await left()) > 0; i++) await new Promise((r) => setTimeout(r, 20));
    assert.equal(await left(), 0);
  });
});
