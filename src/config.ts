/**
 * Configuration from the environment, validated once at start (every variable
 * is described in docs/configuration.md).
 * A bad value stops the start with a message naming the variable.
 */
import { parseTrustProxy, type TrustProxy } from './http/client-address.js';
import { join, resolve } from 'node:path';
import type { RateLimitConfig } from './http/rate-limit.js';

export type HypervisorKind = 'simulator' | 'proxmox';
export type ClockMode = 'system' | 'manual';

export interface Config {
  port: number;
  host: string;
  databaseUrl: string | undefined;
  dataDir: string;
  redisUrl: string | undefined;
  jwtSecret: string | undefined;
  hypervisor: HypervisorKind;
  clock: ClockMode;
  /** Where a manual clock starts on its first start (epoch ms), or undefined for the real time. */
  clockStartMs: number | undefined;
  simProvisionMs: number;
  billingIntervalS: number;
  demo: boolean;
  adminEmail: string | undefined;
  adminPassword: string | undefined;
  corsOrigins: string[];
  logLevel: string;
  /** The reverse proxies whose forwarding headers name the client (src/http/client-address.ts). */
  trustProxy: TrustProxy;
  /** JSON lines, or readable lines for a terminal; auto: readable when stdout is a terminal (src/log.ts). */
  logFormat: 'auto' | 'json' | 'pretty';
  rateLimits: RateLimitConfig;
  nodeEnv: string;
  /** Price per GB of VM network traffic, in micro-units, added to each usage period (default 0). */
  networkPricePerGbMicros: number;
  /**
   * The access portal's base (docs/portal.md): each VM's web service gets the host name
   * `VMID-SERVICE.` + this host, on this scheme and port. Always `scheme://host[:port]`.
   */
  portalUrl: string;
  /** Whether portalUrl is the local default (neither GPUCLOUD_PORTAL_URL nor GPUCLOUD_PORTAL_DOMAIN set). */
  portalLocal: boolean;
  /** Max password hashes computed at once (memory bound for login floods). */
  passwordHashConcurrency: number;
  /** argon2id's cost: `test` (cheap) only for test suites, refused in production. */
  passwordHashCost: 'standard' | 'test';
  /** Host agents: seconds between heartbeats, ACPI power-down grace, boot deadline. */
  agentHeartbeatS: number;
  agentStopTimeoutS: number;
  agentBootTimeoutS: number;
  /** Also run a host agent in this process and register this host as a node (`serve --local-agent`). */
  localAgent: boolean;
  /**
   * The local agent's options given to `serve` (`--fake-gpus 2`, ...: those of `gpucloud agent`); they win over its
   * GPUCLOUD_AGENT_* variables.
   */
  localAgentArgs?: string[];
  /** Seconds a client has to send a whole request. */
  requestTimeoutS: number;
  /** Seconds a stopping instance waits for requests in flight before it cuts what is left. */
  shutdownTimeoutS: number;
  /** Seconds a stopping instance keeps its open connections, answering 503, before it closes them. */
  shutdownDrainS: number;
  /** Bearer token for Prometheus scrapers; loopback clients need none unless metricsLoopback is off. */
  metricsToken: string | undefined;
  metricsLoopback: boolean;
  /** A `--role worker` process serves /metrics and /healthz on this port (none when unset). */
  metricsPort: number | undefined;
  /** Days a login session lasts at most, however often it is refreshed. */
  sessionMaxDays: number;
  /** Prefix of this deployment's keys in Redis (several deployments may share one Redis). */
  redisPrefix: string;
  /**
   * Where clients reach the API (the OpenAPI document's `servers`): an absolute URL, or `/` for "wherever this
   * document came from".
   */
  publicUrl: string;
  /** The image store's directory (docs/templates.md#the-image-store); shared by every instance. */
  imageStore: string;
  /** The largest image, file and disk alike, in GB. */
  imageMaxGb: number;
  /** Customer images' storage, per GB-hour (docs/images.md#billing). */
  imagePriceGbHourMicros: number;
  /** Per account: how many customer images, and how many GB they may hold together. */
  maxImages: number;
  maxImageGb: number;
  /** Where customers write for help (the OpenAPI document's `contact`), if the operator names one. */
  supportEmail: string | undefined;
  /** Webhooks may go to loopback and private addresses (tests, receivers on the operator's own network). */
  webhookAllowPrivate: boolean;
  /** Seconds a webhook endpoint has to answer a delivery. */
  webhookTimeoutS: number;
}

export class ConfigError extends Error {
  constructor(
    readonly variable: string,
    message: string,
  ) {
    super(`${variable}: ${message}`);
    this.name = 'ConfigError';
  }
}

type Env = Record<string, string | undefined>;

function str(env: Env, name: string): string | undefined {
  const v = env[name];
  return v === undefined || v.trim() === '' ? undefined : v.trim();
}

function int(env: Env, name: string, def: number, min: number, max: number): number {
  const raw = str(env, name);
  if (raw === undefined) return def;
  if (!/^\d+$/.test(raw)) throw new ConfigError(name, `must be a whole number, got "${raw}"`);
  const n = Number(raw);
  if (n < min || n > max) throw new ConfigError(name, `must be between ${min} and ${max}, got ${n}`);
  return n;
}

function oneOf<T extends string>(env: Env, name: string, allowed: readonly T[], def: T): T {
  const raw = str(env, name);
  if (raw === undefined) return def;
  if (!(allowed as readonly string[]).includes(raw)) {
    throw new ConfigError(name, `must be one of ${allowed.join(', ')}, got "${raw}"`);
  }
  return raw as T;
}

function bool(env: Env, name: string): boolean | undefined {
  const raw = str(env, name);
  if (raw === undefined) return undefined;
  if (['1', 'true', 'yes', 'on'].includes(raw.toLowerCase())) return true;
  if (['0', 'false', 'no', 'off'].includes(raw.toLowerCase())) return false;
  throw new ConfigError(name, `must be 1 or 0 (true/false), got "${raw}"`);
}

/** A non-negative decimal amount with at most 6 decimals, as exact integer micro-units (never a float). */
function money(env: Env, name: string): number {
  const raw = str(env, name);
  if (raw === undefined) return 0;
  const m = /^(\d{1,9})(?:\.(\d{1,6}))?$/.exec(raw);
  if (!m) throw new ConfigError(name, `must be an amount like 0.01 (at most 6 decimals), got "${raw}"`);
  return Number(m[1]) * 1_000_000 + Number((m[2] ?? '').padEnd(6, '0'));
}

/**
 * An instant in ISO 8601 with an explicit zone, like 2026-01-01T00:00:00Z or
 * 2026-01-01T01:00:00+01:00, as epoch milliseconds truncated to the second.
 */
function instant(env: Env, name: string): number | undefined {
  const raw = str(env, name);
  if (raw === undefined) return undefined;
  const m = /^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.\d{1,9})?(Z|[+-]\d{2}:\d{2})$/.exec(raw);
  const ms = m ? Date.parse(raw) : NaN;
  // Date.parse rolls impossible dates over (02-30 -> 03-02); a round trip of the date part refuses them.
  const sameDay =
    m &&
    !Number.isNaN(ms) &&
    new Date(Date.UTC(+m[1]!, +m[2]! - 1, +m[3]!)).toISOString().slice(0, 10) === `${m[1]}-${m[2]}-${m[3]}`;
  if (!m || Number.isNaN(ms) || !sameDay || +m[4]! > 23 || +m[5]! > 59 || +m[6]! > 59) {
    throw new ConfigError(name, `must be an instant like 2026-01-01T00:00:00Z (ISO 8601 with a zone), got "${raw}"`);
  }
  if (ms < 0 || ms > Date.UTC(9999, 11, 31)) throw new ConfigError(name, `must be between 1970 and 9999, got "${raw}"`);
  return Math.floor(ms / 1000) * 1000;
}

function url(env: Env, name: string, protocols: string[], requireHost = false): string | undefined {
  const raw = str(env, name);
  if (raw === undefined) return undefined;
  let parsed: URL;
  try {
    parsed = new URL(raw);
  } catch {
    throw new ConfigError(name, 'is not a valid URL');
  }
  if (!protocols.includes(parsed.protocol)) {
    throw new ConfigError(name, `must use ${protocols.join(' or ')}, got "${parsed.protocol}"`);
  }
  // PostgreSQL may name its host in the query (unix sockets); Redis needs one in the URL.
  if (requireHost && parsed.hostname === '') throw new ConfigError(name, 'must name a host, like redis://cache:6379');
  return raw;
}

const DOMAIN_RE = /^(?=.{1,200}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$/;

/**
 * The access portal's base URL: GPUCLOUD_PORTAL_URL (`https://portal.example.com`, a port allowed, no
 * path), or GPUCLOUD_PORTAL_DOMAIN (`portal.example.com`, meaning https on 443), else the local default
 * `http://localhost:PORT`, whose `*.localhost` names browsers resolve to this machine. The host must be
 * a domain name: each VM's service is a name under it.
 */
function portalBase(env: Env, port: number): string {
  const fromUrl = url(env, 'GPUCLOUD_PORTAL_URL', ['https:', 'http:'], true);
  const domain = str(env, 'GPUCLOUD_PORTAL_DOMAIN');
  if (fromUrl !== undefined && domain !== undefined)
    throw new ConfigError('GPUCLOUD_PORTAL_DOMAIN', 'set GPUCLOUD_PORTAL_URL or GPUCLOUD_PORTAL_DOMAIN, not both');
  const name = fromUrl !== undefined ? 'GPUCLOUD_PORTAL_URL' : 'GPUCLOUD_PORTAL_DOMAIN';
  if (fromUrl === undefined && domain === undefined) return `http://localhost:${port === 0 ? 8080 : port}`;
  const u = new URL(fromUrl ?? `https://${domain}`);
  if ((u.pathname !== '/' && u.pathname !== '') || u.search || u.hash || u.username || u.password)
    throw new ConfigError(name, 'must be a scheme, a host and an optional port, like https://portal.example.com');
  if (!DOMAIN_RE.test(u.hostname))
    throw new ConfigError(name, `must name a domain (each VM gets a name under it), got "${u.hostname}"`);
  return `${u.protocol}//${u.host}`;
}

function trustProxy(env: Env): TrustProxy {
  try {
    return parseTrustProxy(str(env, 'GPUCLOUD_TRUST_PROXY'));
  } catch (err) {
    throw new ConfigError('GPUCLOUD_TRUST_PROXY', (err as Error).message);
  }
}

/** A base URL clients are given: http(s), a host, no query or fragment; kept without a trailing slash. Unset: `/`. */
function publicUrl(env: Env, name: string): string {
  const raw = url(env, name, ['https:', 'http:'], true);
  if (raw === undefined) return '/';
  const u = new URL(raw);
  if (u.search || u.hash || raw.includes('?') || raw.includes('#'))
    throw new ConfigError(name, 'must not have a query or a fragment');
  return raw.replace(/\/+$/, '');
}

function email(env: Env, name: string): string | undefined {
  const raw = str(env, name);
  if (raw === undefined) return undefined;
  if (!/^[^\s@]+@[^\s@]+\.[^\s@]+$/.test(raw) || raw.length > 254)
    throw new ConfigError(name, 'is not an email address');
  return raw;
}

export function loadConfig(env: Env = process.env): Config {
  const nodeEnv = str(env, 'NODE_ENV') ?? 'development';
  const databaseUrl = url(env, 'DATABASE_URL', ['postgres:', 'postgresql:']);
  const redisUrl = url(env, 'GPUCLOUD_REDIS_URL', ['redis:', 'rediss:'], true);
  const jwtSecret = str(env, 'GPUCLOUD_JWT_SECRET');
  if (databaseUrl && !jwtSecret) {
    throw new ConfigError(
      'GPUCLOUD_JWT_SECRET',
      'is required when DATABASE_URL is set (every instance must sign with the same secret)',
    );
  }
  if (jwtSecret && jwtSecret.length < 32) {
    throw new ConfigError('GPUCLOUD_JWT_SECRET', 'must be at least 32 characters');
  }
  const clock = oneOf(env, 'GPUCLOUD_CLOCK', ['system', 'manual'] as const, 'system');
  if (clock === 'manual' && nodeEnv === 'production') {
    throw new ConfigError('GPUCLOUD_CLOCK', 'manual is refused when NODE_ENV=production');
  }
  const passwordHashCost = oneOf(env, 'GPUCLOUD_PASSWORD_HASH_COST', ['standard', 'test'] as const, 'standard');
  if (passwordHashCost === 'test' && nodeEnv === 'production') {
    throw new ConfigError('GPUCLOUD_PASSWORD_HASH_COST', 'test is refused when NODE_ENV=production');
  }
  const metricsToken = str(env, 'GPUCLOUD_METRICS_TOKEN');
  if (metricsToken !== undefined && (metricsToken.length < 32 || !/^[\x21-\x7e]+$/.test(metricsToken))) {
    throw new ConfigError('GPUCLOUD_METRICS_TOKEN', 'must be at least 32 printable characters without spaces');
  }
  const redisPrefix = str(env, 'GPUCLOUD_REDIS_PREFIX') ?? 'gpucloud:';
  if (!/^[A-Za-z0-9:_.-]{1,64}$/.test(redisPrefix)) {
    throw new ConfigError('GPUCLOUD_REDIS_PREFIX', `must be 1 to 64 letters, digits or : _ . -, got "${redisPrefix}"`);
  }
  const clockStartMs = instant(env, 'GPUCLOUD_CLOCK_START');
  if (clockStartMs !== undefined && clock !== 'manual') {
    throw new ConfigError('GPUCLOUD_CLOCK_START', 'only applies to the manual clock: set GPUCLOUD_CLOCK=manual too');
  }
  const adminEmail = str(env, 'GPUCLOUD_ADMIN_EMAIL');
  const adminPassword = str(env, 'GPUCLOUD_ADMIN_PASSWORD');
  if (adminEmail && !/^[^\s@]+@[^\s@]+$/.test(adminEmail)) {
    throw new ConfigError('GPUCLOUD_ADMIN_EMAIL', 'is not an email address');
  }
  if (adminEmail && !adminPassword)
    throw new ConfigError('GPUCLOUD_ADMIN_PASSWORD', 'is required with GPUCLOUD_ADMIN_EMAIL');
  if (adminPassword && !adminEmail)
    throw new ConfigError('GPUCLOUD_ADMIN_EMAIL', 'is required with GPUCLOUD_ADMIN_PASSWORD');
  if (adminPassword && adminPassword.length < 12) {
    throw new ConfigError('GPUCLOUD_ADMIN_PASSWORD', 'must be at least 12 characters');
  }
  const demoFlag = bool(env, 'GPUCLOUD_DEMO');
  const cors = str(env, 'GPUCLOUD_CORS_ORIGINS');
  const corsOrigins = cors
    ? cors
        .split(',')
        .map((s) => s.trim())
        .filter(Boolean)
    : [];
  for (const o of corsOrigins) {
    if (o !== '*' && !/^https?:\/\/[^/\s]+$/.test(o)) {
      throw new ConfigError('GPUCLOUD_CORS_ORIGINS', `"${o}" is not an origin like https://console.example.com`);
    }
  }
  // Failed logins per email from one address; from all addresses together, four times as many by default.
  const loginLimit = int(env, 'GPUCLOUD_RATE_LIMIT_LOGIN', 5, 1, 1_000_000);
  return {
    port: int(env, 'PORT', 8080, 0, 65535),
    host: str(env, 'HOST') ?? '127.0.0.1',
    databaseUrl,
    dataDir: str(env, 'GPUCLOUD_DATA_DIR') ?? './data',
    redisUrl,
    jwtSecret,
    hypervisor: oneOf(env, 'GPUCLOUD_HYPERVISOR', ['simulator', 'proxmox'] as const, 'simulator'),
    clock,
    clockStartMs,
    simProvisionMs: int(env, 'GPUCLOUD_SIM_PROVISION_MS', 3000, 0, 3_600_000),
    billingIntervalS: int(env, 'GPUCLOUD_BILLING_INTERVAL_S', 3600, 1, 86_400),
    // Demo data (a published login with credit) only where the embedded database runs outside
    // production; with DATABASE_URL or NODE_ENV=production it takes GPUCLOUD_DEMO=1.
    demo: demoFlag ?? (!databaseUrl && nodeEnv !== 'production'),
    adminEmail,
    adminPassword,
    corsOrigins,
    logLevel: oneOf(env, 'LOG_LEVEL', ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const, 'info'),
    trustProxy: trustProxy(env),
    logFormat: oneOf(env, 'GPUCLOUD_LOG_FORMAT', ['auto', 'json', 'pretty'] as const, 'auto'),
    rateLimits: {
      login: loginLimit,
      loginAccount: int(env, 'GPUCLOUD_RATE_LIMIT_LOGIN_ACCOUNT', 4 * loginLimit, 1, 10_000_000),
      loginPerIp: int(env, 'GPUCLOUD_RATE_LIMIT_LOGIN_IP', 30, 1, 1_000_000),
      loginGlobal: int(env, 'GPUCLOUD_RATE_LIMIT_LOGIN_GLOBAL', 600, 1, 10_000_000),
      auth: int(env, 'GPUCLOUD_RATE_LIMIT_AUTH', 10, 1, 1_000_000),
      vmMutations: int(env, 'GPUCLOUD_RATE_LIMIT_VM_MUTATIONS', 30, 1, 1_000_000),
      default: int(env, 'GPUCLOUD_RATE_LIMIT_DEFAULT', 300, 1, 1_000_000),
      windowMs: 60_000,
    },
    nodeEnv,
    networkPricePerGbMicros: money(env, 'GPUCLOUD_NETWORK_PRICE_GB'),
    portalUrl: portalBase(env, int(env, 'PORT', 8080, 0, 65535)),
    portalLocal: str(env, 'GPUCLOUD_PORTAL_URL') === undefined && str(env, 'GPUCLOUD_PORTAL_DOMAIN') === undefined,
    passwordHashConcurrency: int(env, 'GPUCLOUD_PASSWORD_HASH_CONCURRENCY', 4, 1, 64),
    passwordHashCost,
    agentHeartbeatS: int(env, 'GPUCLOUD_AGENT_HEARTBEAT_S', 10, 1, 3600),
    agentStopTimeoutS: int(env, 'GPUCLOUD_AGENT_STOP_TIMEOUT_S', 60, 0, 240),
    // Within the 5-minute claim of a hypervisor action, with room for the rest of the action.
    agentBootTimeoutS: int(env, 'GPUCLOUD_AGENT_BOOT_TIMEOUT_S', 240, 10, 270),
    localAgent: bool(env, 'GPUCLOUD_LOCAL_AGENT') ?? false,
    requestTimeoutS: int(env, 'GPUCLOUD_REQUEST_TIMEOUT_S', 30, 1, 600),
    shutdownTimeoutS: int(env, 'GPUCLOUD_SHUTDOWN_TIMEOUT_S', 20, 1, 600),
    shutdownDrainS: int(env, 'GPUCLOUD_SHUTDOWN_DRAIN_S', 5, 0, 600),
    metricsToken,
    metricsLoopback: bool(env, 'GPUCLOUD_METRICS_LOOPBACK') ?? true,
    metricsPort:
      str(env, 'GPUCLOUD_METRICS_PORT') === undefined ? undefined : int(env, 'GPUCLOUD_METRICS_PORT', 0, 0, 65535),
    sessionMaxDays: int(env, 'GPUCLOUD_SESSION_MAX_DAYS', 30, 1, 365),
    redisPrefix,
    publicUrl: publicUrl(env, 'GPUCLOUD_PUBLIC_URL'),
    imageStore: resolve(str(env, 'GPUCLOUD_IMAGE_STORE') ?? join(str(env, 'GPUCLOUD_DATA_DIR') ?? './data', 'images')),
    imageMaxGb: int(env, 'GPUCLOUD_IMAGE_MAX_GB', 200, 1, 100_000),
    imagePriceGbHourMicros:
      str(env, 'GPUCLOUD_IMAGE_PRICE_GB_HOUR') === undefined ? 100 : money(env, 'GPUCLOUD_IMAGE_PRICE_GB_HOUR'),
    maxImages: int(env, 'GPUCLOUD_MAX_IMAGES', 10, 0, 100_000),
    maxImageGb: int(env, 'GPUCLOUD_MAX_IMAGE_GB', 1000, 0, 10_000_000),
    supportEmail: email(env, 'GPUCLOUD_SUPPORT_EMAIL'),
    webhookAllowPrivate: bool(env, 'GPUCLOUD_WEBHOOK_ALLOW_PRIVATE') ?? false,
    webhookTimeoutS: int(env, 'GPUCLOUD_WEBHOOK_TIMEOUT_S', 10, 1, 30),
  };
}

/**
 * The URL a client on this machine reaches a server listening on `host`:`port` at: a wildcard
 * address becomes loopback, an IPv6 address is bracketed.
 */
export function localUrl(host: string, port: number): string {
  const h = host === '0.0.0.0' || host === '::' ? '127.0.0.1' : host;
  return `http://${h.includes(':') ? `[${h}]` : h}:${port}`;
}
