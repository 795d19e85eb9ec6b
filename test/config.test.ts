/**
 * Configuration from the environment (docs/configuration.md): defaults, and every bad
 * value stops the start with a ConfigError that names the variable.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { ConfigError, loadConfig } from '../src/config.js';

const SECRET = 's'.repeat(32);
const PG_URL = 'postgres://gpucloud@db.internal:5432/gpucloud';

/** Asserts that loadConfig(env) throws a ConfigError naming `variable` (in the field and in the message). */
function assertRejects(env: Record<string, string>, variable: string): ConfigError {
  let caught: unknown;
  try {
    loadConfig(env);
  } catch (err) {
    caught = err;
  }
  assert.ok(caught instanceof ConfigError, `expected a ConfigError for ${JSON.stringify(env)}, got ${String(caught)}`);
  assert.equal(caught.variable, variable, caught.message);
  assert.ok(caught.message.includes(variable), `message should name ${variable}: ${caught.message}`);
  assert.equal(caught.name, 'ConfigError');
  return caught;
}

describe('config defaults, as documented', () => {
  test('loadConfig({}) gives the documented defaults', () => {
    const c = loadConfig({});
    assert.equal(c.port, 8080);
    assert.equal(c.host, '127.0.0.1');
    assert.equal(c.databaseUrl, undefined);
    assert.equal(c.dataDir, './data');
    assert.equal(c.redisUrl, undefined);
    assert.equal(c.jwtSecret, undefined);
    assert.equal(c.hypervisor, 'simulator');
    assert.equal(c.clock, 'system');
    assert.equal(c.simProvisionMs, 3000);
    assert.equal(c.billingIntervalS, 3600);
    assert.equal(c.demo, true, 'demo data is on for the embedded database');
    assert.equal(c.adminEmail, undefined);
    assert.equal(c.adminPassword, undefined);
    assert.deepEqual(c.corsOrigins, [], 'no CORS origins by default');
    assert.equal(c.logLevel, 'info');
    assert.deepEqual(c.rateLimits, {
      login: 5,
      loginAccount: 20,
      loginPerIp: 30,
      loginGlobal: 600,
      auth: 10,
      vmMutations: 30,
      default: 300,
      windowMs: 60_000,
    });
    assert.equal(c.nodeEnv, 'development');
    assert.deepEqual(
      [
        c.agentHeartbeatS,
        c.agentStopTimeoutS,
        c.agentBootTimeoutS,
        c.localAgent,
        c.requestTimeoutS,
        c.metricsToken,
        c.metricsLoopback,
        c.sessionMaxDays,
        c.clockStartMs,
      ],
      [10, 60, 240, false, 30, undefined, true, 30, undefined],
    );
    assert.equal(c.redisPrefix, 'gpucloud:');
    assert.equal(loadConfig({ GPUCLOUD_REDIS_PREFIX: 'staging:gpucloud:' }).redisPrefix, 'staging:gpucloud:');
    assert.equal(c.publicUrl, '/');
    assert.equal(c.supportEmail, undefined);
    assert.equal(
      loadConfig({ GPUCLOUD_PUBLIC_URL: 'https://api.gpucloud.test/' }).publicUrl,
      'https://api.gpucloud.test',
      'without the trailing slash',
    );
    assert.equal(
      loadConfig({ GPUCLOUD_PUBLIC_URL: 'https://gpucloud.test/api/v1/' }).publicUrl,
      'https://gpucloud.test/api/v1',
    );
    assert.equal(loadConfig({ GPUCLOUD_SUPPORT_EMAIL: 'help@gpucloud.test' }).supportEmail, 'help@gpucloud.test');
  });

  test('empty and blank values count as unset', () => {
    const c = loadConfig({
      PORT: '',
      HOST: '   ',
      GPUCLOUD_CLOCK: '',
      GPUCLOUD_DEMO: ' ',
      GPUCLOUD_RATE_LIMIT_LOGIN: '',
    });
    assert.equal(c.port, 8080);
    assert.equal(c.host, '127.0.0.1');
    assert.equal(c.clock, 'system');
    assert.equal(c.demo, true);
    assert.equal(c.rateLimits.login, 5);
  });

  test('failed logins to one email from all addresses default to four times the limit from one address', () => {
    assert.equal(loadConfig({ GPUCLOUD_RATE_LIMIT_LOGIN: '7' }).rateLimits.loginAccount, 28);
    assert.equal(
      loadConfig({ GPUCLOUD_RATE_LIMIT_LOGIN: '7', GPUCLOUD_RATE_LIMIT_LOGIN_ACCOUNT: '9' }).rateLimits.loginAccount,
      9,
    );
  });

  test('every variable is read', () => {
    const c = loadConfig({
      PORT: '9000',
      HOST: '0.0.0.0',
      DATABASE_URL: PG_URL,
      GPUCLOUD_DATA_DIR: '/var/lib/gpucloud',
      GPUCLOUD_REDIS_URL: 'redis://cache:6379/2',
      GPUCLOUD_JWT_SECRET: SECRET,
      GPUCLOUD_HYPERVISOR: 'proxmox',
      GPUCLOUD_CLOCK: 'manual',
      GPUCLOUD_SIM_PROVISION_MS: '0',
      GPUCLOUD_BILLING_INTERVAL_S: '60',
      GPUCLOUD_DEMO: '1',
      GPUCLOUD_ADMIN_EMAIL: 'ops@example.com',
      GPUCLOUD_ADMIN_PASSWORD: 'a-long-admin-password',
      GPUCLOUD_CORS_ORIGINS: 'https://console.example.com, http://localhost:3000',
      LOG_LEVEL: 'debug',
      GPUCLOUD_RATE_LIMIT_LOGIN: '1',
      GPUCLOUD_RATE_LIMIT_AUTH: '2',
      GPUCLOUD_RATE_LIMIT_VM_MUTATIONS: '3',
      GPUCLOUD_RATE_LIMIT_DEFAULT: '4',
      GPUCLOUD_RATE_LIMIT_LOGIN_IP: '5',
      GPUCLOUD_RATE_LIMIT_LOGIN_GLOBAL: '6',
      GPUCLOUD_RATE_LIMIT_LOGIN_ACCOUNT: '7',
      GPUCLOUD_AGENT_HEARTBEAT_S: '7',
      GPUCLOUD_AGENT_STOP_TIMEOUT_S: '8',
      GPUCLOUD_AGENT_BOOT_TIMEOUT_S: '90',
      GPUCLOUD_LOCAL_AGENT: '1',
      GPUCLOUD_REQUEST_TIMEOUT_S: '11',
      GPUCLOUD_METRICS_TOKEN: 'm'.repeat(32),
      GPUCLOUD_METRICS_LOOPBACK: '0',
      GPUCLOUD_SESSION_MAX_DAYS: '12',
    });
    assert.equal(c.port, 9000);
    assert.equal(c.host, '0.0.0.0');
    assert.equal(c.databaseUrl, PG_URL);
    assert.equal(c.dataDir, '/var/lib/gpucloud');
    assert.equal(c.redisUrl, 'redis://cache:6379/2');
    assert.equal(c.jwtSecret, SECRET);
    assert.equal(c.hypervisor, 'proxmox');
    assert.equal(c.clock, 'manual');
    assert.equal(c.simProvisionMs, 0);
    assert.equal(c.billingIntervalS, 60);
    assert.equal(c.demo, true);
    assert.equal(c.adminEmail, 'ops@example.com');
    assert.equal(c.adminPassword, 'a-long-admin-password');
    assert.deepEqual(c.corsOrigins, ['https://console.example.com', 'http://localhost:3000']);
    assert.equal(c.logLevel, 'debug');
    assert.deepEqual(c.rateLimits, {
      login: 1,
      loginAccount: 7,
      loginPerIp: 5,
      loginGlobal: 6,
      auth: 2,
      vmMutations: 3,
      default: 4,
      windowMs: 60_000,
    });
    assert.deepEqual(
      [
        c.agentHeartbeatS,
        c.agentStopTimeoutS,
        c.agentBootTimeoutS,
        c.localAgent,
        c.requestTimeoutS,
        c.metricsToken,
        c.metricsLoopback,
        c.sessionMaxDays,
      ],
      [7, 8, 90, true, 11, 'm'.repeat(32), false, 12],
    );
  });

  test('demo data: on without DATABASE_URL, off with it unless GPUCLOUD_DEMO=1', () => {
    assert.equal(loadConfig({}).demo, true);
    assert.equal(loadConfig({ GPUCLOUD_DEMO: '0' }).demo, false);
    assert.equal(loadConfig({ GPUCLOUD_DEMO: 'false' }).demo, false);
    assert.equal(loadConfig({ DATABASE_URL: PG_URL, GPUCLOUD_JWT_SECRET: SECRET }).demo, false);
    assert.equal(loadConfig({ DATABASE_URL: PG_URL, GPUCLOUD_JWT_SECRET: SECRET, GPUCLOUD_DEMO: '1' }).demo, true);
    assert.equal(loadConfig({ DATABASE_URL: PG_URL, GPUCLOUD_JWT_SECRET: SECRET, GPUCLOUD_DEMO: 'true' }).demo, true);
    // A published login with credit is never made in production unless asked for.
    assert.equal(loadConfig({ NODE_ENV: 'production' }).demo, false);
    assert.equal(loadConfig({ NODE_ENV: 'production', GPUCLOUD_DEMO: '1' }).demo, true);
    assert.equal(loadConfig({ NODE_ENV: 'test' }).demo, true);
    assert.equal(loadConfig({ DATABASE_URL: PG_URL, GPUCLOUD_JWT_SECRET: SECRET, GPUCLOUD_DEMO: '0' }).demo, false);
  });

  test('postgresql:// URLs, rediss:// URLs and a 32-character secret are accepted', () => {
    const c = loadConfig({
      DATABASE_URL: 'postgresql://u:p@localhost/db',
      GPUCLOUD_JWT_SECRET: 'x'.repeat(32),
      GPUCLOUD_REDIS_URL: 'rediss://:pw@redis.example.com:6380',
    });
    assert.equal(c.databaseUrl, 'postgresql://u:p@localhost/db');
    assert.equal(c.redisUrl, 'rediss://:pw@redis.example.com:6380');
  });

  test('webhooks: private addresses off and a 10 s deadline by default; both can be set, the deadline within 1..30', () => {
    assert.deepEqual([loadConfig({}).webhookAllowPrivate, loadConfig({}).webhookTimeoutS], [false, 10]);
    const c = loadConfig({ GPUCLOUD_WEBHOOK_ALLOW_PRIVATE: '1', GPUCLOUD_WEBHOOK_TIMEOUT_S: '3' });
    assert.deepEqual([c.webhookAllowPrivate, c.webhookTimeoutS], [true, 3]);
    for (const [name, value] of [
      ['GPUCLOUD_WEBHOOK_ALLOW_PRIVATE', 'maybe'],
      ['GPUCLOUD_WEBHOOK_TIMEOUT_S', '0'],
      ['GPUCLOUD_WEBHOOK_TIMEOUT_S', '31'],
    ]) {
      assert.throws(
        () => loadConfig({ [name!]: value! }),
        (e: unknown) => e instanceof ConfigError && e.variable === name,
      );
    }
  });

  test("a worker's metrics port: none by default, any port (0: a free one) when set", () => {
    assert.equal(loadConfig({}).metricsPort, undefined);
    assert.equal(loadConfig({ GPUCLOUD_METRICS_PORT: '9464' }).metricsPort, 9464);
    assert.equal(loadConfig({ GPUCLOUD_METRICS_PORT: '0' }).metricsPort, 0);
  });

  test('the cheap password hash is for test suites only: refused in production', () => {
    assert.equal(loadConfig({}).passwordHashCost, 'standard');
    assert.equal(loadConfig({ GPUCLOUD_PASSWORD_HASH_COST: 'test' }).passwordHashCost, 'test');
    assert.throws(
      () => loadConfig({ GPUCLOUD_PASSWORD_HASH_COST: 'test', NODE_ENV: 'production' }),
      (e: unknown) =>
        e instanceof ConfigError && e.variable === 'GPUCLOUD_PASSWORD_HASH_COST' && /production/.test(e.message),
    );
    assert.throws(
      () => loadConfig({ GPUCLOUD_PASSWORD_HASH_COST: 'cheap' }),
      /GPUCLOUD_PASSWORD_HASH_COST: must be one of standard, test/,
    );
  });

  test('the manual clock is allowed outside production', () => {
    assert.equal(loadConfig({ GPUCLOUD_CLOCK: 'manual', NODE_ENV: 'test' }).clock, 'manual');
    assert.equal(loadConfig({ GPUCLOUD_CLOCK: 'system', NODE_ENV: 'production' }).clock, 'system');
  });

  test('CORS: "*" and a list of origins', () => {
    assert.deepEqual(loadConfig({ GPUCLOUD_CORS_ORIGINS: '*' }).corsOrigins, ['*']);
    assert.deepEqual(
      loadConfig({ GPUCLOUD_CORS_ORIGINS: 'https://a.example.com,https://b.example.com:8443' }).corsOrigins,
      ['https://a.example.com', 'https://b.example.com:8443'],
    );
  });

  test('GPUCLOUD_CLOCK_START: an ISO 8601 instant with a zone, to the second; unset means the real time', () => {
    assert.equal(loadConfig({ GPUCLOUD_CLOCK: 'manual' }).clockStartMs, undefined);
    const at = (v: string) => loadConfig({ GPUCLOUD_CLOCK: 'manual', GPUCLOUD_CLOCK_START: v }).clockStartMs;
    assert.equal(at('2026-01-01T00:00:00Z'), Date.UTC(2026, 0, 1));
    assert.equal(at('2026-01-01T01:00:00+01:00'), Date.UTC(2026, 0, 1), 'an offset names the same instant');
    assert.equal(
      at('2028-02-29T23:59:59.999Z'),
      Date.UTC(2028, 1, 29, 23, 59, 59),
      'a leap day; truncated to the second',
    );
    assert.equal(at(' 2026-12-31T23:40:00Z '), Date.UTC(2026, 11, 31, 23, 40));
  });

  test('PORT 0 (any free port) and 65535 are valid', () => {
    assert.equal(loadConfig({ PORT: '0' }).port, 0);
    assert.equal(loadConfig({ PORT: '65535' }).port, 65535);
  });
});

describe('config errors name the variable and stop the start', () => {
  const cases: [string, Record<string, string>, string][] = [
    ['PORT not a number', { PORT: 'abc' }, 'PORT'],
    ['PORT negative', { PORT: '-1' }, 'PORT'],
    ['PORT too large', { PORT: '65536' }, 'PORT'],
    ['PORT fractional', { PORT: '80.5' }, 'PORT'],
    ['clock unknown', { GPUCLOUD_CLOCK: 'moon' }, 'GPUCLOUD_CLOCK'],
    ['manual clock in production', { GPUCLOUD_CLOCK: 'manual', NODE_ENV: 'production' }, 'GPUCLOUD_CLOCK'],
    ['a Redis prefix with a space', { GPUCLOUD_REDIS_PREFIX: 'my prefix' }, 'GPUCLOUD_REDIS_PREFIX'],
    ['a public URL that is not a URL', { GPUCLOUD_PUBLIC_URL: 'api.gpucloud.test' }, 'GPUCLOUD_PUBLIC_URL'],
    ['a public URL that is not http(s)', { GPUCLOUD_PUBLIC_URL: 'ftp://api.gpucloud.test' }, 'GPUCLOUD_PUBLIC_URL'],
    ['a public URL with a query', { GPUCLOUD_PUBLIC_URL: 'https://api.gpucloud.test/?x=1' }, 'GPUCLOUD_PUBLIC_URL'],
    ['a support address that is not an email', { GPUCLOUD_SUPPORT_EMAIL: 'support' }, 'GPUCLOUD_SUPPORT_EMAIL'],
    ['a short metrics token', { GPUCLOUD_METRICS_TOKEN: 'short' }, 'GPUCLOUD_METRICS_TOKEN'],
    ['a metrics token with a space', { GPUCLOUD_METRICS_TOKEN: `${'x'.repeat(32)} y` }, 'GPUCLOUD_METRICS_TOKEN'],
    ['metrics loopback not a boolean', { GPUCLOUD_METRICS_LOOPBACK: 'maybe' }, 'GPUCLOUD_METRICS_LOOPBACK'],
    ['a metrics port that is not a number', { GPUCLOUD_METRICS_PORT: 'nine' }, 'GPUCLOUD_METRICS_PORT'],
    ['a metrics port out of range', { GPUCLOUD_METRICS_PORT: '65536' }, 'GPUCLOUD_METRICS_PORT'],
    ['request timeout zero', { GPUCLOUD_REQUEST_TIMEOUT_S: '0' }, 'GPUCLOUD_REQUEST_TIMEOUT_S'],
    ['clock start without the manual clock', { GPUCLOUD_CLOCK_START: '2026-01-01T00:00:00Z' }, 'GPUCLOUD_CLOCK_START'],
    [
      'clock start without a zone',
      { GPUCLOUD_CLOCK: 'manual', GPUCLOUD_CLOCK_START: '2026-01-01T00:00:00' },
      'GPUCLOUD_CLOCK_START',
    ],
    [
      'clock start as a date only',
      { GPUCLOUD_CLOCK: 'manual', GPUCLOUD_CLOCK_START: '2026-01-01' },
      'GPUCLOUD_CLOCK_START',
    ],
    [
      'clock start as epoch seconds',
      { GPUCLOUD_CLOCK: 'manual', GPUCLOUD_CLOCK_START: '1767225600' },
      'GPUCLOUD_CLOCK_START',
    ],
    [
      'clock start on a day that does not exist',
      { GPUCLOUD_CLOCK: 'manual', GPUCLOUD_CLOCK_START: '2026-02-30T00:00:00Z' },
      'GPUCLOUD_CLOCK_START',
    ],
    [
      'clock start at hour 24',
      { GPUCLOUD_CLOCK: 'manual', GPUCLOUD_CLOCK_START: '2026-01-01T24:00:00Z' },
      'GPUCLOUD_CLOCK_START',
    ],
    ['clock start garbage', { GPUCLOUD_CLOCK: 'manual', GPUCLOUD_CLOCK_START: 'tomorrow' }, 'GPUCLOUD_CLOCK_START'],
    [
      'clock start before 1970',
      { GPUCLOUD_CLOCK: 'manual', GPUCLOUD_CLOCK_START: '1969-12-31T23:59:59Z' },
      'GPUCLOUD_CLOCK_START',
    ],
    ['DATABASE_URL without a JWT secret', { DATABASE_URL: PG_URL }, 'GPUCLOUD_JWT_SECRET'],
    ['short JWT secret', { GPUCLOUD_JWT_SECRET: 'x'.repeat(31) }, 'GPUCLOUD_JWT_SECRET'],
    [
      'short JWT secret with DATABASE_URL',
      { DATABASE_URL: PG_URL, GPUCLOUD_JWT_SECRET: 'short' },
      'GPUCLOUD_JWT_SECRET',
    ],
    ['DATABASE_URL not a URL', { DATABASE_URL: 'not a url', GPUCLOUD_JWT_SECRET: SECRET }, 'DATABASE_URL'],
    [
      'DATABASE_URL of another database',
      { DATABASE_URL: 'mysql://u@h/db', GPUCLOUD_JWT_SECRET: SECRET },
      'DATABASE_URL',
    ],
    ['redis URL without a scheme', { GPUCLOUD_REDIS_URL: 'localhost:6379' }, 'GPUCLOUD_REDIS_URL'],
    ['redis URL with http', { GPUCLOUD_REDIS_URL: 'http://cache:6379' }, 'GPUCLOUD_REDIS_URL'],
    ['redis URL garbage', { GPUCLOUD_REDIS_URL: '::::' }, 'GPUCLOUD_REDIS_URL'],
    ['redis URL without a host', { GPUCLOUD_REDIS_URL: 'redis://' }, 'GPUCLOUD_REDIS_URL'],
    ['demo flag not a boolean', { GPUCLOUD_DEMO: 'maybe' }, 'GPUCLOUD_DEMO'],
    ['CORS origin with a path', { GPUCLOUD_CORS_ORIGINS: 'https://console.example.com/app' }, 'GPUCLOUD_CORS_ORIGINS'],
    ['CORS origin without a scheme', { GPUCLOUD_CORS_ORIGINS: 'console.example.com' }, 'GPUCLOUD_CORS_ORIGINS'],
    ['CORS origin with another scheme', { GPUCLOUD_CORS_ORIGINS: 'ftp://files.example.com' }, 'GPUCLOUD_CORS_ORIGINS'],
    [
      'CORS: one bad origin in a list',
      { GPUCLOUD_CORS_ORIGINS: 'https://ok.example.com,not an origin' },
      'GPUCLOUD_CORS_ORIGINS',
    ],
    ['hypervisor unknown', { GPUCLOUD_HYPERVISOR: 'vmware' }, 'GPUCLOUD_HYPERVISOR'],
    ['log level unknown', { LOG_LEVEL: 'verbose' }, 'LOG_LEVEL'],
    ['provision delay negative', { GPUCLOUD_SIM_PROVISION_MS: '-5' }, 'GPUCLOUD_SIM_PROVISION_MS'],
    ['provision delay not a number', { GPUCLOUD_SIM_PROVISION_MS: '3s' }, 'GPUCLOUD_SIM_PROVISION_MS'],
    ['billing interval zero', { GPUCLOUD_BILLING_INTERVAL_S: '0' }, 'GPUCLOUD_BILLING_INTERVAL_S'],
    ['billing interval not a number', { GPUCLOUD_BILLING_INTERVAL_S: 'hourly' }, 'GPUCLOUD_BILLING_INTERVAL_S'],
    ['login limit zero', { GPUCLOUD_RATE_LIMIT_LOGIN: '0' }, 'GPUCLOUD_RATE_LIMIT_LOGIN'],
    ['login limit fractional', { GPUCLOUD_RATE_LIMIT_LOGIN: '5.5' }, 'GPUCLOUD_RATE_LIMIT_LOGIN'],
    ['account login limit zero', { GPUCLOUD_RATE_LIMIT_LOGIN_ACCOUNT: '0' }, 'GPUCLOUD_RATE_LIMIT_LOGIN_ACCOUNT'],
    ['auth limit not a number', { GPUCLOUD_RATE_LIMIT_AUTH: 'ten' }, 'GPUCLOUD_RATE_LIMIT_AUTH'],
    ['VM limit negative', { GPUCLOUD_RATE_LIMIT_VM_MUTATIONS: '-30' }, 'GPUCLOUD_RATE_LIMIT_VM_MUTATIONS'],
    ['default limit not a number', { GPUCLOUD_RATE_LIMIT_DEFAULT: '300/min' }, 'GPUCLOUD_RATE_LIMIT_DEFAULT'],
    [
      'admin email not an email',
      { GPUCLOUD_ADMIN_EMAIL: 'ops', GPUCLOUD_ADMIN_PASSWORD: 'a-long-admin-password' },
      'GPUCLOUD_ADMIN_EMAIL',
    ],
    ['admin email without a password', { GPUCLOUD_ADMIN_EMAIL: 'ops@example.com' }, 'GPUCLOUD_ADMIN_PASSWORD'],
    ['admin password without an email', { GPUCLOUD_ADMIN_PASSWORD: 'a-long-admin-password' }, 'GPUCLOUD_ADMIN_EMAIL'],
    [
      'admin password too short',
      { GPUCLOUD_ADMIN_EMAIL: 'ops@example.com', GPUCLOUD_ADMIN_PASSWORD: 'short' },
      'GPUCLOUD_ADMIN_PASSWORD',
    ],
  ];
  for (const [name, env, variable] of cases) {
    test(`${name} -> ${variable}`, () => {
      assertRejects(env, variable);
    });
  }

  test('the message quotes the bad value so the operator can find it', () => {
    const e = assertRejects({ PORT: 'abc' }, 'PORT');
    assert.match(e.message, /abc/);
    const e2 = assertRejects({ GPUCLOUD_CLOCK: 'moon' }, 'GPUCLOUD_CLOCK');
    assert.match(e2.message, /moon/);
    assert.match(e2.message, /system/, 'lists the allowed values');
  });

  test('a bad DATABASE_URL never echoes its password', () => {
    const e = assertRejects(
      { DATABASE_URL: 'mysql://root:hunter2hunter2@db/x', GPUCLOUD_JWT_SECRET: SECRET },
      'DATABASE_URL',
    );
    assert.ok(!e.message.includes('hunter2'), e.message);
  });
});
