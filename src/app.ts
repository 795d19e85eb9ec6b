/**
 * Builds the Fastify app: cross-cutting plugins in order, then each module's
 * routes. No listening, no background jobs: those belong to main.ts.
 */
import { createServer } from 'node:http';
import Fastify, {
  LogController,
  type FastifyBaseLogger,
  type FastifyInstance,
  type FastifyReply,
  type FastifyRequest,
} from 'fastify';
import cors from '@fastify/cors';
import { Type } from 'typebox';
import { ConfigError, type Config } from './config.js';
import type { Db } from './db/db.js';
import { newId } from './ids.js';
import { deriveKey } from './crypto.js';
import { clientAddress, readForwarded, trustFunction } from './http/client-address.js';
import { Portal } from './modules/portal/service.js';
import { PortalLinks } from './modules/portal/links.js';
import { refuseUpgrade } from './modules/portal/pages.js';
import { enterRequestScope } from './db/commit-hook.js';
import { validatorCompiler } from './http/validation.js';
import { LazySchemas } from './http/lazy-schemas.js';
import { frameworkErrors, registerErrorHandler } from './http/error-handler.js';
import { ErrorResponse, errorResponses, frameworkResponses } from './http/schemas.js';
import { registerOpenApi, API_VERSION } from './http/openapi.js';
import { consoleDir, registerConsole } from './http/console.js';
import { registerMetrics } from './http/metrics.js';
import { registerAuthentication, registerAuthorization } from './http/authenticate.js';
import { identifier, rechecker } from './modules/auth/identify.js';
import { registerRateLimit } from './http/rate-limit.js';
import { purgeExpiredIdempotencyKeys, registerIdempotency } from './http/idempotency.js';
import { registerInputGuards } from './http/input-guards.js';
import type { RateLimitStore } from './http/rate-limit-store.js';
import { hookWhen } from './http/hooks.js';
import { PasswordHasher } from './modules/auth/passwords.js';
import { TokenService } from './modules/auth/tokens.js';
import { AuthService } from './modules/auth/service.js';
import { authRoutes } from './modules/auth/routes.js';
import { ApiKeyService } from './modules/api-keys/service.js';
import { apiKeyRoutes } from './modules/api-keys/routes.js';
import { eventRoutes } from './modules/events/routes.js';
import { WebhookService } from './modules/webhooks/service.js';
import { webhookRoutes } from './modules/webhooks/routes.js';
import { SshKeyService } from './modules/ssh-keys/service.js';
import { sshKeyRoutes } from './modules/ssh-keys/routes.js';
import { AdminUserService } from './modules/admin/service.js';
import { adminRoutes } from './modules/admin/routes.js';
import { ledgerCheck } from './modules/billing/ledger-check.js';
import type { ClockService } from './modules/clock/service.js';
import { InventoryService } from './modules/inventory/service.js';
import { inventoryRoutes } from './modules/inventory/routes.js';
import { BillingService } from './modules/billing/service.js';
import { billingRoutes } from './modules/billing/routes.js';
import { VmService } from './modules/vms/service.js';
import { vmRoutes } from './modules/vms/routes.js';
import { SimulatorDriver } from './hypervisor/simulator.js';
import type { HypervisorDriver } from './hypervisor/driver.js';
import { simulatorRoutes } from './hypervisor/routes.js';
import { Reconciler } from './jobs/reconciler.js';
import { JobMetrics } from './jobs/metrics.js';
import { earliest } from './jobs/due.js';
import { HostMonitor, agentInfoOf } from './jobs/host-monitor.js';
import { HostAgentClient } from './hypervisor/host-agent-client.js';
import { HostAgentDriver, PerNodeDriver } from './hypervisor/host-agent-driver.js';
import { Meter } from './modules/billing/meter.js';
import { UsageService } from './modules/billing/usage.js';
import { usageRoutes } from './modules/billing/usage-routes.js';
import { ReservationService } from './modules/reservations/service.js';
import { reservationRoutes } from './modules/reservations/routes.js';
import { TemplateService } from './modules/templates/service.js';
import { templateRoutes } from './modules/templates/routes.js';
import { ImageService } from './modules/images/service.js';
import { imageRoutes } from './modules/images/routes.js';
import { DirectoryImageStore } from './modules/images/store.js';
import { SnapshotService } from './modules/snapshots/service.js';
import { ImageMeter } from './modules/snapshots/meter.js';
import { snapshotRoutes } from './modules/snapshots/routes.js';

export const BODY_LIMIT = 64 * 1024; // larger bodies are 413

export interface AppDeps {
  config: Config;
  db: Db;
  clock: ClockService;
  rateLimitStore: RateLimitStore;
  jwtSecret: string;
  /** The structured log (pino) of requests and of background work; none when absent (tests). */
  log?: FastifyBaseLogger;
  /** The web console's built files (default: dist/console, if built). */
  consoleDir?: string;
}

export interface Services {
  clock: ClockService;
  /** Set while the instance stops: every request gets 503 and Connection: close (docs/operations.md). */
  stopping: { draining: boolean };
  /** The access portal: VM web services on host names of their own (docs/portal.md). */
  portal: Portal;
  passwords: PasswordHasher;
  tokens: TokenService;
  auth: AuthService;
  apiKeys: ApiKeyService;
  sshKeys: SshKeyService;
  adminUsers: AdminUserService;
  inventory: InventoryService;
  billing: BillingService;
  vms: VmService;
  meter: Meter;
  usage: UsageService;
  reservations: ReservationService;
  driver: HypervisorDriver;
  /** The simulated hypervisor of the nodes without an agent (faults and traffic for tests). */
  simulator: SimulatorDriver;
  reconciler: Reconciler;
  agents: HostMonitor;
  /** The template catalogue and what each host holds of it (docs/templates.md). */
  templates: TemplateService;
  /** Disk images: uploads, the image store, agents' downloads. */
  images: ImageService;
  /** Customer images: snapshots of VMs, and their storage billing. */
  snapshots: SnapshotService;
  imageMeter: ImageMeter;
  webhooks: WebhookService;
  /** The background work's metrics (GET /metrics serves them with the HTTP ones). */
  metrics: JobMetrics;
}

export function createServices(deps: AppDeps): Services {
  const clock = deps.clock.clock;
  const passwords = new PasswordHasher(deps.config.passwordHashConcurrency, undefined, deps.config.passwordHashCost);
  const tokens = new TokenService(deps.jwtSecret, clock);
  const sshKeys = new SshKeyService(deps.db, clock);
  const auth = new AuthService(
    deps.db,
    clock,
    passwords,
    tokens,
    deriveKey(deps.jwtSecret, 'totp-secret'),
    deps.config.sessionMaxDays * 86_400_000,
  );
  const adminUsers = new AdminUserService(deps.db, clock, auth);
  const apiKeys = new ApiKeyService(deps.db, clock);
  const inventory = new InventoryService(deps.db, clock, deps.jwtSecret, (endpoint) =>
    new HostAgentClient(endpoint, 3_000)
      .host()
      .then(agentInfoOf)
      .catch(() => null),
  );
  const billing = new BillingService(deps.db, clock);
  if (deps.config.hypervisor !== 'simulator') {
    throw new ConfigError(
      'GPUCLOUD_HYPERVISOR',
      `${deps.config.hypervisor} has no driver in this version: nodes registered with an agent_url run real VMs through their host agent, the others on the simulator (leave it unset)`,
    );
  }
  // Each node is driven by its host agent when it has one, else by the simulator.
  const simulator = new SimulatorDriver(deps.db);
  const agentDriver = new HostAgentDriver((node) => inventory.agentEndpoint(node), {
    stopTimeoutS: deps.config.agentStopTimeoutS,
    bootTimeoutS: deps.config.agentBootTimeoutS,
  });
  const driver = new PerNodeDriver((node) => inventory.hasAgent(node), agentDriver, simulator);
  const meter = new Meter(deps.db, clock, {
    intervalS: deps.config.billingIntervalS,
    networkPricePerGbMicros: deps.config.networkPricePerGbMicros,
    imagePriceGbHourMicros: deps.config.imagePriceGbHourMicros,
  });
  // The two modules need each other: a reserved VM takes its deposit at creation, and a cancelled or
  // ended reservation's VM goes on as on-demand. The conversion is called only once both exist.
  const reservations: ReservationService = new ReservationService(deps.db, clock, inventory, meter, (tx, vmId, now) =>
    vms.convertToOnDemand(tx, vmId, now),
  );
  const links = new PortalLinks(deps.config.portalUrl);
  const trusted = trustFunction(deps.config.trustProxy);
  const templates = new TemplateService(deps.db, clock, imageBaseUrl(deps.config), () => inventory.offersChanged());
  const images = new ImageService(
    deps.db,
    clock,
    new DirectoryImageStore(deps.config.imageStore),
    { maxBytes: deps.config.imageMaxGb * 1024 ** 3 },
    async (node) => (await inventory.agentEndpoint(node))?.token ?? null,
    async (node) => {
      const row = await inventory.catalogueNode(node);
      // Its templates' images, and the customer images its VMs are being built from.
      return new Set([
        ...(row ? (await templates.desiredFor(row)).map((t) => t.sha256) : []),
        ...(await snapshots.imagesForNode(node)),
      ]);
    },
    { exists: (vmid) => templates.exists(vmid), setImage: (tx, vmid, sha) => templates.setImage(tx, vmid, sha) },
  );
  const vms: VmService = new VmService(deps.db, clock, inventory, sshKeys, tokens, reservations, {
    provisionDelayMs: deps.config.simProvisionMs,
    secret: deps.jwtSecret,
    links,
    templates,
    // The two modules need each other: a VM starts from an image, an image is taken of a VM.
    images: {
      forCreate: (tx, userId, imageId, storageGb) => snapshots.forCreate(tx, userId, imageId, storageGb),
      contentOf: (imageId) => snapshots.contentOf(imageId),
    },
  });
  const imageMeter = new ImageMeter(deps.db, {
    intervalS: deps.config.billingIntervalS,
    priceGbHourMicros: deps.config.imagePriceGbHourMicros,
  });
  const snapshots: SnapshotService = new SnapshotService({
    db: deps.db,
    clock,
    meter: imageMeter,
    lockSource: (tx, userId, ref) => vms.lockSnapshotSource(tx, userId, ref),
    currentSource: (vmId) => vms.snapshotSource(vmId),
    driver,
    store: images,
    limits: { maxImages: deps.config.maxImages, maxImageGb: deps.config.maxImageGb },
    log: deps.log,
  });
  const portal = new Portal({
    db: deps.db,
    clock,
    tokens,
    links,
    agentEndpoint: (node) => inventory.agentEndpoint(node),
    templateWeb: (vmid) => templates.webOf(vmid),
    cookieKey: deriveKey(deps.jwtSecret, 'portal-cookie'),
    clientAddress: (req) => clientAddress(req, trusted),
    log: deps.log,
  });
  const usage = new UsageService(deps.db, clock, deps.config.imagePriceGbHourMicros);
  const metrics = new JobMetrics();
  const reconciler = new Reconciler(clock, driver, vms, deps.log, metrics);
  const agents = new HostMonitor(inventory, vms, templates, deps.config.agentHeartbeatS, deps.log, metrics);
  const webhooks = new WebhookService(deps.db, clock, {
    secret: deps.jwtSecret,
    allowPrivate: deps.config.webhookAllowPrivate,
    timeoutMs: deps.config.webhookTimeoutS * 1000,
    log: deps.log,
    metrics,
  });

  // Cross-module reactions, each inside the transaction of its cause.
  // billing periods close at status changes
  vms.onTransition((tx, before, after, now) => meter.onTransition(tx, before, after, now));
  vms.onBeforeStatusChanges((tx, vmIds) => meter.lockMeters(tx, vmIds));
  vms.onTransition(async (tx, before, after, now) => {
    // Interrupting others is never free: a VM that preempted any pays at least one billing period.
    if (after.status === 'destroyed' && before.status !== 'destroyed')
      await meter.chargePreemptionMinimum(tx, after.id, now);
  });
  vms.onTransition(async (tx, before, after, now) => {
    // A reserved VM that ends failed gets its whole deposit back.
    if (after.status === 'failed' && before.status !== 'failed' && after.reservation_id)
      await reservations.refundFailed(tx, after.reservation_id, now);
  });
  adminUsers.onSuspend((tx, userId, now) => vms.stopAllOf(tx, userId, now, 'suspended').then(() => undefined));
  // Offers are read from a snapshot; GPUs taken or freed replace it once their transaction commits.
  vms.onGpuUsageChange(() => inventory.offersChanged());
  // A suspension or a new role applies to remembered sessions and keys at once.
  adminUsers.onChange((userId) => {
    auth.forgetUser(userId);
    apiKeys.forgetUser(userId);
  });
  // a newly registered agent is asked at once what its host holds
  inventory.onAgentContact((node) => agents.checkNode(node));
  // an offline node takes its VMs offline
  inventory.onNodeStatusChange((tx, node, from, to, now) => vms.onNodeStatus(tx, node, from, to, now));

  // Background work, in this order on every pass: reservation ends (their usage draws on the
  // reservation up to end_at), interval closes (traffic counters read first), then low-balance stops
  // (docs/billing.md#low-balance).
  reconciler.addJob({ name: 'reservation-ends', run: (now) => reservations.endDue(now) });
  reconciler.addJob({
    name: 'billing-intervals',
    run: async (now, signal) => {
      // The counters of the VMs whose period closes are read first, so the close bills them.
      await meter.sampleTraffic(now, (node, vms) => driver.trafficBytes(node, vms));
      return meter.closeDueIntervals(now, { signal });
    },
  });
  reconciler.addJob({ name: 'image-storage', run: (now) => imageMeter.closeDue(now) });
  // Snapshots: one at a time per instance, each copied into the image store (docs/images.md).
  reconciler.addJob({ name: 'snapshots', run: () => snapshots.takeDue() });
  reconciler.addJob({
    name: 'low-balance',
    run: async (now) => {
      const users = await meter.lowBalanceUsers();
      for (const userId of users) {
        await deps.db.transaction(async (tx) => {
          // The VMs before the balance row (docs/billing.md#lock-order).
          await vms.stopAllOf(tx, userId, now, 'low_balance');
          await meter.clearLowBalance(tx, userId);
        });
      }
      return users.length;
    },
  });
  reconciler.addJob({
    name: 'housekeeping',
    everyMs: 60_000,
    run: async (now) => {
      await purgeExpiredIdempotencyKeys(deps.db, now);
      await webhooks.purge(now);
      await auth.purgeExpired(now);
      await portal.purge(now);
      return 0; // housekeeping: never a reason for another pass
    },
  });
  // An advance of the manual clock steps through every moment work comes due and returns once it
  // has run. Billing boundaries at which no balance can reach zero are not such moments: the close
  // at the next stop takes them in bulk. An advance that would close more periods than about half a
  // minute of work is refused (see docs/architecture.md, "Background loops").
  deps.clock.onAdvance(
    () => reconciler.settle(),
    async (nowMs) => {
      // Traffic counters first: unbilled traffic counts towards a balance reaching zero.
      await meter.sampleTraffic(new Date(nowMs), (node, vms) => driver.trafficBytes(node, vms), { all: true });
      return earliest([
        await vms.nextActionDue(),
        await reservations.nextEndDue(),
        await meter.nextLowBalanceBoundary(nowMs),
      ]);
    },
  );
  deps.clock.limitAdvance((toMs) => meter.refuseLargeAdvance(toMs));
  return {
    clock: deps.clock,
    portal,
    stopping: { draining: false },
    passwords,
    tokens,
    auth,
    apiKeys,
    sshKeys,
    adminUsers,
    inventory,
    billing,
    vms,
    meter,
    usage,
    reservations,
    driver,
    simulator,
    reconciler,
    agents,
    templates,
    images,
    snapshots,
    imageMeter,
    webhooks,
    metrics,
  };
}

/**
 * Where host agents download images from: GPUCLOUD_PUBLIC_URL when it is an absolute URL, else this
 * instance on its own port (a server that listens on another replaces it once it listens).
 */
function imageBaseUrl(config: Config): string {
  if (/^https?:\/\//.test(config.publicUrl)) return config.publicUrl;
  const host = config.host === '0.0.0.0' || config.host === '::' ? '127.0.0.1' : config.host;
  return `http://${host.includes(':') ? `[${host}]` : host}:${config.port}`;
}

declare module 'fastify' {
  interface FastifyInstance {
    services: Services;
    /** The route schemas, compiled on first use (http/lazy-schemas.ts). */
    schemas: LazySchemas;
  }
}

const REQUEST_ID_RE = /^[\w.:-]{1,128}$/;

/** What the HTTP parser refused, by its error code (llhttp's `HPE_*`), for the detail of the 400 it gets. */
const NOT_HTTP: Record<string, string> = {
  HPE_INVALID_URL: 'the request target has a character that is not allowed (percent-encode bytes outside ASCII)',
  HPE_INVALID_METHOD: 'the request line does not start with a method',
  HPE_INVALID_VERSION: 'the HTTP version is not supported',
  HPE_INVALID_HEADER_TOKEN: 'a header name or value has a character that is not allowed',
  HPE_INVALID_CONTENT_LENGTH: 'the body cannot be framed: Content-Length is not valid',
  HPE_UNEXPECTED_CONTENT_LENGTH: 'the body cannot be framed: Content-Length is repeated or not allowed here',
  HPE_INVALID_TRANSFER_ENCODING:
    'the body cannot be framed: Transfer-Encoding is not chunked, or comes with Content-Length',
  HPE_INVALID_CHUNK_SIZE: 'the body cannot be framed: a chunk size is not valid',
};
const notHttpDetail = (code: string | undefined): string => {
  const what = code === undefined ? undefined : NOT_HTTP[code];
  return what ? `The request is not valid HTTP: ${what}` : 'The request is not valid HTTP';
};
/**
 * The answer of a stopping instance: 503, and the connection closed after it, so a proxy that sent the
 * request on a kept-alive connection learns to retry elsewhere instead of meeting a reset.
 */
function drainAnswer(res: import('node:http').ServerResponse): void {
  const body = JSON.stringify({ detail: 'This instance is stopping: send the request again', code: 'internal' });
  res.writeHead(503, {
    'content-type': 'application/json; charset=utf-8',
    'content-length': Buffer.byteLength(body),
    connection: 'close',
    'retry-after': '1',
    'x-request-id': newId(),
    'api-version': API_VERSION,
  });
  res.end(body);
}

/**
 * The timeouts of every HTTP server of the service (the API's, the portal's on its own): a client has
 * GPUCLOUD_REQUEST_TIMEOUT_S to send a whole request (headers within a third of it, at most 10 s), an
 * idle keep-alive connection closes after 5 s; checked every second.
 */
export function httpServerOptions(config: Config) {
  const requestMs = config.requestTimeoutS * 1000;
  return {
    requestTimeout: requestMs,
    headersTimeout: Math.min(requestMs, Math.max(1000, Math.floor(requestMs / 3)), 10_000),
    keepAliveTimeout: 5000,
    connectionsCheckingInterval: 1000,
  };
}

const NO_STORE_PREFIXES = ['/auth', '/account', '/billing', '/api-keys', '/admin', '/reservations', '/images'];

export async function buildApp(deps: AppDeps, services: Services = createServices(deps)): Promise<FastifyInstance> {
  const schemas = new LazySchemas();
  const trust = trustFunction(deps.config.trustProxy);
  const app: FastifyInstance = Fastify({
    schemaController: schemas.schemaController(),
    ...(deps.log ? { loggerInstance: deps.log } : { logger: false }),
    // One line per request, when it is answered (the onResponse hook below), not Fastify's two.
    logController: new LogController({ disableRequestLogging: true }),
    bodyLimit: BODY_LIMIT,
    trustProxy: trust ?? false,
    frameworkErrors,
    // Echo a sane client X-Request-Id, otherwise make one.
    genReqId: (req) => {
      const h = req.headers['x-request-id'];
      return typeof h === 'string' && REQUEST_ID_RE.test(h) ? h : newId();
    },
    ajv: { customOptions: { strict: false } },
    routerOptions: { ignoreTrailingSlash: true },
    // A client has GPUCLOUD_REQUEST_TIMEOUT_S to send a whole request (headers within a third of it,
    // at most 10 s); an idle keep-alive connection closes after 5 s. Checked every second, so a
    // client dribbling a body a byte at a time cannot hold a connection open.
    // Requests Node refuses before Fastify sees them (headers too large, a malformed request line, a
    // timeout) are answered in the error shape too, and the connection is closed cleanly.
    clientErrorHandler: (err: NodeJS.ErrnoException, socket) => {
      if (err.code === 'ECONNRESET' || !socket.writable) {
        socket.destroy();
        return;
      }
      const [status, reason, detail] =
        err.code === 'HPE_HEADER_OVERFLOW'
          ? [431, 'Request Header Fields Too Large', 'The request headers are too large (at most 16 KiB in all)']
          : err.code === 'ERR_HTTP_REQUEST_TIMEOUT'
            ? [408, 'Request Timeout', `The request did not arrive within ${deps.config.requestTimeoutS} s`]
            : [400, 'Bad Request', notHttpDetail(err.code)];
      const requestId = newId();
      // Never `malformed_json`: no body was parsed. The closed list's code for a request that is not acceptable as
      // sent is `validation_error`, whatever the status (docs/errors.md#request-bodies).
      const body = JSON.stringify({ detail: `${detail} (request id ${requestId})`, code: 'validation_error' });
      socket.end(
        `HTTP/1.1 ${status} ${reason}\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: ${Buffer.byteLength(body)}\r\n` +
          `X-Request-Id: ${requestId}\r\nAPI-Version: ${API_VERSION}\r\nX-Content-Type-Options: nosniff\r\nConnection: close\r\n\r\n${body}`,
      );
    },
    serverFactory: (handler) => {
      const server = createServer(httpServerOptions(deps.config), (req, res) => {
        if (services.stopping.draining) return drainAnswer(res);
        readForwarded(req, trust);
        // A VM's web service, by its host name, goes to the access portal; anything else to the API.
        const target = services.portal.target(req);
        if (target) void services.portal.handle(req, res, target);
        else handler(req, res);
      });
      server.on('upgrade', (req, socket, head) => {
        readForwarded(req, trust);
        const target = services.portal.target(req);
        if (target) void services.portal.upgrade(req, socket, head, target);
        else refuseUpgrade(socket, 404, 'not_found', 'The API upgrades no connection; VM services are on the portal');
      });
      return server;
    },
  });
  app.addHook('onClose', async () => services.portal.close());
  if (deps.log) {
    app.addHook('onResponse', (req, reply, done) => {
      const ms = Math.round(reply.elapsedTime * 10) / 10;
      const user = req.principal?.userId;
      req.log.info(
        { method: req.method, url: req.url, status: reply.statusCode, ms, ip: req.ip, ...(user ? { user } : {}) },
        `${req.method} ${req.url.split('?')[0]} ${reply.statusCode} ${ms} ms`,
      );
      done();
    });
  }
  app.decorate('services', services);
  app.decorate('schemas', schemas);
  // First of all hooks, and synchronous: the request's scope for work that must commit with its change.
  app.addHook('onRequest', (req, reply, done) => {
    const exit = enterRequestScope(
      req.routeOptions.config.idempotent === true && req.headers['idempotency-key'] !== undefined,
    );
    if (exit) reply.raw.once('close', exit);
    done();
  });
  app.setValidatorCompiler(schemas.validator(validatorCompiler));
  app.addSchema(ErrorResponse);
  registerErrorHandler(app);

  // An empty body with Content-Type: application/json is "no body" (start, stop, ...), not an error.
  const defaultJson = app.getDefaultJsonParser('error', 'error');
  app.removeContentTypeParser('application/json');
  app.addContentTypeParser('application/json', { parseAs: 'string', bodyLimit: BODY_LIMIT }, (req, body, done) => {
    if (body === '' || (typeof body === 'string' && body.trim() === '')) return done(null, undefined);
    defaultJson(req, body as string, done);
  });
  // A body in any other media type is 415.
  app.removeContentTypeParser('text/plain');

  // Private answers are never cached: every path under these prefixes, a route's decided once when it is added.
  const noStore = (path: string) => NO_STORE_PREFIXES.some((p) => path === p || path.startsWith(p + '/'));
  app.addHook('onRoute', (route) => {
    route.config = { ...(route.config ?? {}), noStore: noStore(route.url) };
  });
  app.addHook('onRequest', (req, reply, done) => {
    reply.header('X-Request-Id', req.id);
    reply.header('API-Version', API_VERSION);
    reply.header('X-Content-Type-Options', 'nosniff');
    if (req.routeOptions.config.noStore ?? noStore(req.url.split('?')[0]!)) reply.header('Cache-Control', 'no-store');
    done();
  });

  if (deps.config.corsOrigins.length > 0) {
    await app.register(cors, {
      origin: deps.config.corsOrigins.includes('*') ? true : deps.config.corsOrigins,
      exposedHeaders: [
        'X-Request-Id',
        'X-Total-Count',
        'X-RateLimit-Limit',
        'X-RateLimit-Remaining',
        'X-RateLimit-Reset',
        'Retry-After',
        'API-Version',
      ],
    });
  }

  // The docs UI's and the console's files (registered by @fastify/swagger-ui and @fastify/static) are public and not
  // rate limited.
  app.addHook('onRoute', (route) => {
    if (
      route.url === '/docs' ||
      route.url.startsWith('/docs/') ||
      route.url === '/console' ||
      route.url.startsWith('/console/')
    ) {
      route.config = { ...(route.config ?? {}), auth: 'public', rateLimit: false };
    }
  });
  // Every documented operation lists the answers the framework can give before its handler runs.
  app.addHook('onRoute', (route) => {
    const schema = route.schema as { hide?: boolean; response?: Record<string, unknown> } | undefined;
    if (!schema || schema.hide || !schema.response) return;
    const methods = Array.isArray(route.method) ? route.method : [route.method];
    for (const m of methods) {
      for (const [code, ref] of Object.entries(frameworkResponses(m))) {
        if (!(code in schema.response)) schema.response[code] = ref;
      }
    }
  });
  await registerOpenApi(app, { publicUrl: deps.config.publicUrl, supportEmail: deps.config.supportEmail });
  await registerConsole(app, deps.consoleDir ?? consoleDir());
  registerMetrics(app, services.metrics.registry);

  // The manual clock is one clock for every instance: each request first catches up with the
  // persisted value, which an advance through another instance may have moved.
  // Health checks and static pages read no time and must answer while the database is away.
  if (services.clock.clock.mode === 'manual') {
    const readsTime = (req: FastifyRequest) => {
      const url = req.routeOptions.url ?? '';
      return !(
        url === '/healthz' ||
        url === '/readyz' ||
        url === '/metrics' ||
        url.startsWith('/docs') ||
        url.startsWith('/console')
      );
    };
    app.addHook(
      'onRequest',
      hookWhen(readsTime, () => services.clock.sync()),
    );
  }
  // Order matters: identify -> count -> reject (unauthenticated calls are counted by client address) -> idempotency.
  registerAuthentication(app, identifier(services.auth, services.apiKeys));
  registerRateLimit(app, deps.rateLimitStore, deps.config.rateLimits);
  registerAuthorization(app, { token: deps.config.metricsToken, loopback: deps.config.metricsLoopback });
  registerInputGuards(app); // before anything walks the body (idempotency hashes it)
  registerIdempotency(app, deps.db, services.clock.clock);

  const health = { auth: 'public' as const, rateLimit: false as const };
  app.get(
    '/healthz',
    {
      schema: {
        tags: ['system'],
        operationId: 'getLiveness',
        summary: 'Liveness',
        description: 'The process is up.',
        security: [],
        response: { 200: Type.Object({ status: Type.Literal('ok') }) },
      },
      config: health,
    },
    async () => ({ status: 'ok' as const }),
  );
  app.get(
    '/readyz',
    {
      schema: {
        tags: ['system'],
        operationId: 'getReadiness',
        summary: 'Readiness',
        description: 'The database answers; 503 otherwise.',
        security: [],
        response: { 200: Type.Object({ status: Type.Literal('ready') }), ...errorResponses(503) },
      },
      config: health,
    },
    async (_req, reply) => {
      try {
        await deps.db.query('SELECT 1');
        return { status: 'ready' as const };
      } catch {
        return (reply as FastifyReply).code(503).send({ detail: 'Database unreachable', code: 'internal' });
      }
    },
  );

  authRoutes(app, services.auth);
  app.get(
    '/.well-known/jwks.json',
    {
      schema: {
        tags: ['auth'],
        operationId: 'getLaunchTokenKeys',
        summary: 'Public keys of launch tokens',
        description:
          'The JSON Web Key Set that verifies the WebUI/Jupyter launch tokens of access-info (EdDSA, Ed25519): a portal checks them with this public key alone and cannot mint any token. Access tokens are signed otherwise and never verify against it.',
        security: [],
        response: {
          200: Type.Object({
            keys: Type.Array(
              Type.Object({
                kty: Type.String(),
                crv: Type.String(),
                x: Type.String(),
                kid: Type.String(),
                alg: Type.String(),
                use: Type.String(),
              }),
            ),
          }),
          ...errorResponses(429),
        },
      },
      config: { auth: 'public' },
    },
    async (_req, reply) => {
      reply.header('Cache-Control', 'public, max-age=300');
      return services.tokens.jwks();
    },
  );
  apiKeyRoutes(app, services.apiKeys);
  // Open streams are checked again as the requests are, from the database; the manual clock first
  // catches up with an advance made through another instance, so an access token expires everywhere.
  const recheck = rechecker(services.auth, services.apiKeys);
  eventRoutes(app, deps.db, async (credentials) => {
    await services.clock.sync();
    return recheck(credentials);
  });
  webhookRoutes(app, services.webhooks);
  sshKeyRoutes(app, services.sshKeys);
  adminRoutes(app, services.adminUsers, services.clock, () => ledgerCheck(deps.db), deps);
  inventoryRoutes(app, services.inventory, deps.config.imagePriceGbHourMicros);
  templateRoutes(app, services.templates, () => services.inventory.catalogueNodes());
  imageRoutes(app, services.images);
  snapshotRoutes(app, services.snapshots);
  billingRoutes(app, services.billing);
  vmRoutes(app, services.vms);
  usageRoutes(app, services.usage);
  reservationRoutes(app, services.reservations);
  simulatorRoutes(app, services.simulator, services.inventory);

  await app.ready();
  return app;
}
