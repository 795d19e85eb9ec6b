/**
 * buildTestApp: the real app on a real database with the manual clock, and a
 * request helper that checks every response for leaked secrets (no password,
 * TOTP secret, refresh-token or API-key hash ever appears in a response).
 */
import { after, before, describe } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { FastifyInstance } from 'fastify';
import { loadConfig, type Config } from '../../src/config.js';
import { buildApp, createServices, type Services } from '../../src/app.js';
import type { Db } from '../../src/db/db.js';
import { ClockService } from '../../src/modules/clock/service.js';
import { ManualClock } from '../../src/clock.js';
import { MemoryRateLimitStore, RedisRateLimitStore, type RateLimitStore } from '../../src/http/rate-limit-store.js';
import { BatchingRateLimitStore } from '../../src/http/rate-limit-batching.js';
import { createTestDb, DB_KINDS, type DbKind, type TestDb } from './db.js';

export interface TestAppOptions {
  /** Extra environment for loadConfig (e.g. lower rate limits). */
  env?: Record<string, string>;
  /** Use Redis for rate limits when available (default: on PostgreSQL runs). */
  redis?: boolean;
  /** Serve the web console from this build (default: dist/console, if built). */
  consoleDir?: string;
}

export interface Res {
  status: number;
  body: unknown;
  headers: Record<string, string | string[] | number | undefined>;
  text: string;
}

export interface ReqOpts {
  token?: string;
  /** The client's address (default 127.0.0.1). */
  remoteAddress?: string;
  body?: unknown;
  headers?: Record<string, string>;
  /** An array value repeats the parameter (`type=a&type=b`). */
  query?: Record<string, string | number | boolean | readonly (string | number | boolean)[]>;
}

export interface TestApp {
  kind: DbKind;
  app: FastifyInstance;
  db: Db;
  testDb: TestDb;
  config: Config;
  services: Services;
  clock: ManualClock;
  rateLimitStore: RateLimitStore;
  /** Values that must never appear in any response from now on. */
  forbidSecret(value: string): void;
  req(method: string, url: string, opts?: ReqOpts): Promise<Res>;
  /** Another app instance on the same database (and the same Redis, if any). */
  another(): Promise<FastifyInstance>;
  close(): Promise<void>;
}

export const JWT_SECRET = 'test-secret-'.padEnd(48, 'x');
/**
 * Where every test app's manual clock starts, so that no test depends on the
 * date or hour it runs at. Midnight at the start of a year: the suite's day,
 * month and year arithmetic starts on a boundary. GPUCLOUD_CLOCK_START in the
 * test runner's environment overrides it (a replay, or trying another start).
 */
export const TEST_CLOCK_START = process.env.GPUCLOUD_CLOCK_START || '2026-01-01T00:00:00Z';
const HASH_PATTERNS = [
  /\$argon2/i,
  /password_hash/i,
  /key_hash/i,
  /token_hash/i,
  /code_hash/i,
  /totp_secret/i,
  /totp_pending/i,
];

export function assertNoSecrets(text: string, forbidden: Iterable<string>, where: string): void {
  for (const re of HASH_PATTERNS) assert.doesNotMatch(text, re, `${where}: response leaks a secret (${re})`);
  for (const s of forbidden) assert.ok(!text.includes(s), `${where}: response leaks a secret value`);
}

export function testConfig(env: Record<string, string> = {}): Config {
  return loadConfig({
    GPUCLOUD_CLOCK: 'manual',
    GPUCLOUD_CLOCK_START: TEST_CLOCK_START,
    // Cheap argon2 (never in production): the suite's time goes to behaviour, not to hashing.
    GPUCLOUD_PASSWORD_HASH_COST: 'test',
    LOG_LEVEL: 'silent',
    GPUCLOUD_JWT_SECRET: JWT_SECRET,
    GPUCLOUD_RATE_LIMIT_LOGIN: '1000',
    GPUCLOUD_RATE_LIMIT_LOGIN_IP: '100000',
    GPUCLOUD_RATE_LIMIT_LOGIN_GLOBAL: '1000000',
    GPUCLOUD_RATE_LIMIT_AUTH: '1000',
    GPUCLOUD_RATE_LIMIT_VM_MUTATIONS: '1000',
    GPUCLOUD_RATE_LIMIT_DEFAULT: '10000',
    GPUCLOUD_SIM_PROVISION_MS: '0',
    ...env,
  });
}

export async function buildTestApp(kind: DbKind, opts: TestAppOptions = {}): Promise<TestApp> {
  const testDb = await createTestDb(kind);
  // Each app's image store is a directory of its own, removed with it.
  const imageStore = mkdtempSync(join(tmpdir(), 'gpucloud-images-'));
  const config = testConfig({ GPUCLOUD_IMAGE_STORE: imageStore, ...opts.env });
  const useRedis = (opts.redis ?? kind === 'postgres') && !!process.env.GPUCLOUD_REDIS_URL;
  const prefix = `gpucloud-test-${randomBytes(6).toString('hex')}:`;
  const stores: RateLimitStore[] = [];
  const makeStore = () => {
    // As in production: Redis behind the batching that spares busy keys a round trip per request.
    const s = useRedis
      ? new BatchingRateLimitStore(new RedisRateLimitStore(process.env.GPUCLOUD_REDIS_URL!, { prefix }))
      : new MemoryRateLimitStore();
    stores.push(s);
    return s;
  };
  const sharedMemory = useRedis ? undefined : makeStore();
  const rateLimitStore = sharedMemory ?? makeStore();
  const clockService = await ClockService.create(testDb.db, 'manual', config.clockStartMs);
  const deps = {
    config,
    db: testDb.db,
    clock: clockService,
    rateLimitStore,
    jwtSecret: JWT_SECRET,
    ...(opts.consoleDir ? { consoleDir: opts.consoleDir } : {}),
  };
  const services = createServices(deps);
  await services.inventory.ensureDefaultPricing();
  const app = await buildApp(deps, services);
  const apps: FastifyInstance[] = [app];
  const secrets = new Set<string>();

  const t: TestApp = {
    kind,
    app,
    db: testDb.db,
    testDb,
    config,
    services,
    clock: clockService.clock as ManualClock,
    rateLimitStore,
    forbidSecret: (v) => secrets.add(v),
    req: (method, url, o = {}) => request(app, secrets, method, url, o),
    another: async () => {
      // A second instance: its own pool, its own store client, its own clock object over the same rows.
      const db2 = await testDb.openAnother();
      const clock2 = await ClockService.create(db2, 'manual', config.clockStartMs);
      const store2 = useRedis ? makeStore() : new MemoryRateLimitStore();
      const deps2 = { config, db: db2, clock: clock2, rateLimitStore: store2, jwtSecret: JWT_SECRET };
      const a = await buildApp(deps2, createServices(deps2));
      apps.push(a);
      return a;
    },
    close: async () => {
      await Promise.all(apps.map((a) => a.close()));
      await Promise.all(stores.map((s) => s.close()));
      await testDb.cleanup();
      rmSync(imageStore, { recursive: true, force: true });
    },
  };
  return t;
}

export async function request(
  app: FastifyInstance,
  secrets: Set<string>,
  method: string,
  url: string,
  o: ReqOpts = {},
): Promise<Res> {
  const headers: Record<string, string> = { ...(o.headers ?? {}) };
  if (o.token) headers.authorization = `Bearer ${o.token}`;
  let payload: string | undefined;
  if (o.body !== undefined) {
    payload = typeof o.body === 'string' ? o.body : JSON.stringify(o.body);
    headers['content-type'] ??= 'application/json';
  }
  const query = o.query
    ? Object.fromEntries(Object.entries(o.query).map(([k, v]) => [k, Array.isArray(v) ? v.map(String) : String(v)]))
    : undefined;
  const res = await app.inject({
    method: method as 'GET',
    url,
    headers,
    payload,
    query,
    ...(o.remoteAddress ? { remoteAddress: o.remoteAddress } : {}),
  });
  assertNoSecrets(res.body, secrets, `${method} ${url}`);
  let body: unknown = undefined;
  if (res.body && String(res.headers['content-type'] ?? '').includes('json')) body = JSON.parse(res.body);
  // Every response carries the request id and the API version.
  assert.ok(res.headers['x-request-id'], `${method} ${url}: no X-Request-Id`);
  assert.equal(res.headers['api-version'], '1.0.0');
  if (res.statusCode >= 400) {
    assert.equal(
      typeof (body as { detail?: unknown })?.detail,
      'string',
      `${method} ${url}: error without detail: ${res.body}`,
    );
    assert.equal(
      typeof (body as { code?: unknown })?.code,
      'string',
      `${method} ${url}: error without code: ${res.body}`,
    );
  }
  return { status: res.statusCode, body, headers: res.headers, text: res.body };
}

/** Registers one describe block per database, each with its own app. */
export function describeEachDb(name: string, fn: (t: () => TestApp) => void, opts: TestAppOptions = {}): void {
  for (const kind of DB_KINDS) {
    describe(`${name} [${kind}]`, () => {
      let ta: TestApp | undefined;
      before(async () => {
        ta = await buildTestApp(kind, opts);
      });
      after(async () => {
        await ta?.close();
      });
      fn(() => {
        if (!ta) throw new Error('test app not built');
        return ta;
      });
    });
  }
}
