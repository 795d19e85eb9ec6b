/**
 * Starting the service: configuration, database, migrations, secrets, the
 * administrator from GPUCLOUD_ADMIN_EMAIL/PASSWORD, demo data, the HTTP API and
 * the background jobs, by role (`serve --role api|worker|portal|all`).
 */
import { createServer, type Server } from 'node:http';
import net from 'node:net';
import { startFromTemplate } from './db/template.js';
import { DataDirInUse, holdDataDir } from './db/pid-file.js';
import { chmodSync, existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import type { FastifyInstance } from 'fastify';
import type { Config } from './config.js';
import { openDb, type Db } from './db/db.js';
import { migrate } from './db/migrate.js';
import { randomToken } from './ids.js';
import { buildApp, createServices, httpServerOptions, type Services } from './app.js';
import { readForwarded, trustFunction } from './http/client-address.js';
import { ClockService } from './modules/clock/service.js';
import { startLocalAgent, type LocalAgent } from './local-host-agent.js';
import { ConfigError, localUrl } from './config.js';
import { createLogger } from './log.js';
import { createRateLimitStore, type RateLimitStoreKind } from './http/rate-limit.js';
import { serveWorkerMetrics } from './http/metrics.js';
import { seedDemo, type DemoLogin } from './seed.js';
import { refuseUpgrade } from './modules/portal/pages.js';

export type Role = 'api' | 'worker' | 'portal' | 'all';

export interface RunningServer {
  app?: FastifyInstance;
  url?: string;
  db: Db;
  services: Services;
  demo?: DemoLogin;
  localAgent?: LocalAgent;
  /** Where rate-limit counters live: Redis, the PostgreSQL database, or this process's memory. */
  rateLimitStore: RateLimitStoreKind;
  /** A worker's /metrics, when GPUCLOUD_METRICS_PORT is set. */
  metricsUrl?: string;
  /** Where the access portal answers: VMID-SERVICE under this base (docs/portal.md). */
  portalUrl?: string;
  close(): Promise<void>;
}

/**
 * The token signing secret: GPUCLOUD_JWT_SECRET (required with DATABASE_URL, so that every instance
 * signs alike); on the embedded database, generated once and kept in the data dir.
 */
export function resolveJwtSecret(config: Config): string {
  if (config.jwtSecret) return config.jwtSecret;
  const dir = resolve(config.dataDir);
  const file = join(dir, 'jwt-secret');
  if (existsSync(file)) {
    chmodSync(file, 0o600);
    return readFileSync(file, 'utf8').trim();
  }
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const secret = randomToken(48);
  writeFileSync(file, secret + '\n', { mode: 0o600 });
  chmodSync(file, 0o600);
  return secret;
}

/**
 * The embedded database and the generated secrets live in the data
 * directory: only this user may read them (password hashes, TOTP secrets,
 * the signing secret). Made 0700 with files 0600, and corrected at every
 * start in case something loosened them.
 */
export function secureDataDir(dir: string): void {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const walk = (d: string) => {
    chmodSync(d, 0o700);
    for (const e of readdirSync(d, { withFileTypes: true })) {
      const p = join(d, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.isFile()) chmodSync(p, 0o600);
    }
  };
  walk(resolve(dir));
}

/** Opens and migrates the database; the names of the migrations this call applied go to `applied`. */
export async function openDatabase(config: Config, applied: string[] = []): Promise<Db> {
  if (!config.databaseUrl) {
    // Files the embedded database creates from now on are this user's alone.
    process.umask(0o077);
    secureDataDir(config.dataDir);
  }
  const db = await openDb({
    databaseUrl: config.databaseUrl,
    dataDir: config.databaseUrl ? undefined : join(resolve(config.dataDir), 'pg'),
    template: (dir) => startFromTemplate(dir),
  });
  applied.push(...(await migrate(db)));
  // The embedded database sets its own file modes as it creates files: tighten what it made. Files it
  // makes later sit in folders no one else can enter, and the next start tightens them too.
  if (!config.databaseUrl) secureDataDir(config.dataDir);
  return db;
}

/** The URL a local client reaches a listening app at. */
function urlOf(app: FastifyInstance, config: Config): string {
  const addr = app.server.address();
  return localUrl(config.host, typeof addr === 'object' && addr ? addr.port : config.port);
}

export async function startServer(config: Config, role: Role = 'all'): Promise<RunningServer> {
  // Something stays scheduled until the server is up. When the event loop has nothing left to wait for, even for a
  // moment, Node first waits for V8's background work to finish: here the optimising compile of the embedded
  // database's WebAssembly, which the database's first queries set off. That stalled an embedded start by 0.2 to
  // 0.6 s with the process otherwise idle.
  const awake = setInterval(() => {}, 3_600_000);
  try {
    return await start(config, role);
  } finally {
    clearInterval(awake);
  }
}

/**
 * `serve --role portal`: the access portal on its own, for instances behind a load balancer of their
 * own. Requests to a VM service's host name go to the portal; `/healthz` answers on any other name.
 */
async function servePortal(services: Services, config: Config): Promise<Server> {
  const trust = trustFunction(config.trustProxy);
  const server = createServer(httpServerOptions(config.requestTimeoutS), (req, res) => {
    readForwarded(req, trust);
    const target = services.portal.target(req);
    if (target) return void services.portal.handle(req, res, target);
    const health = req.url === '/healthz' || req.url === '/readyz';
    const body = JSON.stringify(
      health
        ? { status: 'ok' }
        : {
            detail: `This is the gpucloud access portal: VM services answer on VMID-SERVICE names under ${services.portal.links.base}`,
            code: 'not_found',
          },
    );
    res.writeHead(health ? 200 : 404, { 'content-type': 'application/json; charset=utf-8' });
    res.end(body);
  });
  server.on('upgrade', (req, socket, head) => {
    readForwarded(req, trust);
    const target = services.portal.target(req);
    if (target) void services.portal.upgrade(req, socket, head, target);
    else refuseUpgrade(socket, 404, 'not_found', 'Not a VM service of this portal');
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(config.port, config.host, () => resolve());
  });
  return server;
}

/**
 * Marks the embedded database's data directory as this server's while it runs (db/pid-file.ts): another server,
 * or a restore, refuses to touch it meanwhile. Returns what releases it; nothing to hold on PostgreSQL.
 */
function holdEmbedded(config: Config): () => void {
  if (config.databaseUrl) return () => {};
  mkdirSync(resolve(config.dataDir), { recursive: true, mode: 0o700 });
  try {
    return holdDataDir(config.dataDir);
  } catch (err) {
    if (err instanceof DataDirInUse) throw new ConfigError('GPUCLOUD_DATA_DIR', err.message);
    throw err;
  }
}

async function start(config: Config, role: Role): Promise<RunningServer> {
  const release = holdEmbedded(config);
  try {
    return await startHolding(config, role, release);
  } catch (err) {
    release();
    throw err;
  }
}

async function startHolding(config: Config, role: Role, release: () => void): Promise<RunningServer> {
  const db = await openDatabase(config);
  const jwtSecret = resolveJwtSecret(config);
  const clock = await ClockService.create(db, config.clock, config.clockStartMs);
  const { store: rateLimitStore, kind: rateLimitKind } = createRateLimitStore(config.redisUrl, {
    prefix: config.redisPrefix,
    db,
  });
  const deps = {
    config,
    db,
    clock,
    rateLimitStore,
    jwtSecret,
    // One structured log for requests and background work (a worker has no HTTP server, but logs the same way).
    log: createLogger({ level: config.logLevel, format: config.logFormat }),
  };
  const services = createServices(deps);
  await services.inventory.ensureDefaultPricing();

  if (config.adminEmail && config.adminPassword) {
    await services.auth.ensureUser(config.adminEmail, config.adminPassword, 'admin');
  }
  const demo = config.demo ? await seedDemo(db, services) : undefined;

  let localAgent: LocalAgent | undefined;
  if (config.localAgent) {
    try {
      localAgent = await startLocalAgent(config, services);
    } catch (err) {
      await rateLimitStore.close();
      await db.close();
      throw new ConfigError('GPUCLOUD_LOCAL_AGENT', `the local agent cannot start: ${(err as Error).message}`);
    }
  }

  let app: FastifyInstance | undefined;
  let url: string | undefined;
  if (role === 'api' || role === 'all') {
    app = await buildApp(deps, services);
    await app.listen({ port: config.port, host: config.host });
    url = urlOf(app, config);
    // Without an absolute GPUCLOUD_PUBLIC_URL, host agents download images from this instance.
    if (!/^https?:\/\//.test(config.publicUrl)) services.templates.useBaseUrl(url);
  }
  // The portal alone: VM services on their host names, and a health check for a load balancer.
  let portalServer: Server | undefined;
  if (role === 'portal') portalServer = await servePortal(services, config);
  // The local default names the port the server listens on, known only now when it was 0.
  const listening = (app?.server ?? portalServer)?.address();
  if (config.port === 0 && config.portalLocal && listening && typeof listening === 'object')
    services.portal.links.setBase(`http://localhost:${listening.port}`);
  const portalUrl = role === 'worker' ? undefined : services.portal.links.base;
  // Background jobs: with a system clock, a loop claims due work every second. With the manual
  // clock work runs only when POST /admin/clock/advance settles it, so states are deterministic.
  const runJobs = role === 'worker' || role === 'all';
  // Heartbeats to host agents and webhook deliveries run on real time under either clock (they deal with processes
  // outside); the rest only under the system clock (docs/architecture.md#background-loops).
  if (runJobs) services.scheduler.start(1000, { serviceTime: config.clock === 'system' });
  // A worker has no API: its metrics (and a health check) on a port of their own, when asked for.
  let metricsApp: FastifyInstance | undefined;
  let metricsUrl: string | undefined;
  if (role === 'worker' && config.metricsPort !== undefined) {
    metricsApp = await serveWorkerMetrics(
      services.metrics.registry,
      { token: config.metricsToken, loopback: config.metricsLoopback },
      config.metricsPort,
      config.host,
    );
    metricsUrl = `${urlOf(metricsApp, config)}/metrics`;
  }

  return {
    app,
    url,
    db,
    services,
    demo,
    localAgent,
    rateLimitStore: rateLimitKind,
    metricsUrl,
    portalUrl,
    // Stopping (docs/operations.md#stopping-and-restarting): listening ends at once and new requests on open
    // connections get 503, requests in flight finish, event streams end with a reconnect hint, background work
    // finishes what it holds; whatever is still open after GPUCLOUD_SHUTDOWN_TIMEOUT_S (a client that never
    // finishes its body, say) is cut, so the process always ends.
    close: async () => {
      const cut = setTimeout(() => {
        app?.server.closeAllConnections();
        portalServer?.closeAllConnections();
      }, config.shutdownTimeoutS * 1000);
      cut.unref();
      if (app) {
        // Listening ends; connections already open stay, each request on them answered 503 with
        // Connection: close, until none is left or GPUCLOUD_SHUTDOWN_DRAIN_S passed. Closing a kept-alive
        // connection at once would reset a request a proxy had just sent on it (a POST it cannot retry).
        services.stopping.draining = true;
        net.Server.prototype.close.call(app.server);
        const until = Date.now() + Math.min(config.shutdownDrainS, config.shutdownTimeoutS) * 1000;
        const open = () => new Promise<number>((r) => app!.server.getConnections((_e, n) => r(n ?? 0)));
        while (Date.now() < until && (await open()) > 0) await new Promise((r) => setTimeout(r, 100));
      }
      const portalClosed = portalServer
        ? new Promise<void>((r) => {
            portalServer!.close(() => r());
            portalServer!.closeIdleConnections();
          })
        : Promise.resolve();
      await Promise.all([
        app?.close(),
        portalClosed,
        (async () => {
          await localAgent?.close();
          await services.scheduler.stop();
          await metricsApp?.close();
        })(),
      ]);
      clearTimeout(cut);
      services.portal.close();
      await rateLimitStore.close();
      await db.close();
      release();
    },
  };
}
