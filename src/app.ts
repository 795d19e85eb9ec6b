/**
 * The composition root, read as a table of contents: the services (wiring/services.ts), the reactions
 * between modules (wiring/reactions.ts) and the schedule of background work (wiring/schedule.ts);
 * then the Fastify app: cross-cutting plugins in order, then each module's routes. No listening, no
 * background loops: those belong to server.ts.
 */
import { createServer } from 'node:http';
import Fastify, { LogController, type FastifyInstance } from 'fastify';
import cors from '@fastify/cors';
import { newId } from './ids.js';
import { readForwarded, trustFunction } from './http/client-address.js';
import { refuseUpgrade } from './modules/portal/pages.js';
import { enterRequestScope } from './db/commit-hook.js';
import { validatorCompiler } from './http/validation.js';
import { LazySchemas } from './http/lazy-schemas.js';
import { frameworkErrors, registerErrorHandler } from './http/error-handler.js';
import { ErrorResponse, frameworkResponses } from './http/schemas.js';
import { registerOpenApi, API_VERSION } from './http/openapi.js';
import { consoleDir, registerConsole } from './http/console.js';
import { registerMetrics } from './http/metrics.js';
import { registerAuthentication, registerAuthorization } from './http/authenticate.js';
import { declareRoutes, registerRouteRules } from './http/route-rules.js';
import { clientErrorAnswer, drainAnswer, httpServerOptions } from './http/raw-answers.js';
import { identifier } from './modules/auth/identify.js';
import { registerRateLimit } from './http/rate-limit.js';
import { registerIdempotency } from './http/idempotency.js';
import { registerInputGuards } from './http/input-guards.js';
import { hookWhen } from './http/hooks.js';
import { systemRoutes } from './modules/system/routes.js';
import { authRoutes } from './modules/auth/routes.js';
import { apiKeyRoutes } from './modules/api-keys/routes.js';
import { eventRoutes } from './modules/events/routes.js';
import { webhookRoutes } from './modules/webhooks/routes.js';
import { sshKeyRoutes } from './modules/ssh-keys/routes.js';
import { adminRoutes } from './modules/admin/routes.js';
import { ledgerCheck } from './modules/billing/ledger-check.js';
import { inventoryRoutes } from './modules/inventory/routes.js';
import { billingRoutes } from './modules/billing/routes.js';
import { vmRoutes } from './modules/vms/routes.js';
import { simulatorRoutes } from './hypervisor/routes.js';
import { usageRoutes } from './modules/billing/usage-routes.js';
import { reservationRoutes } from './modules/reservations/routes.js';
import { templateRoutes } from './modules/templates/routes.js';
import { imageRoutes } from './modules/images/routes.js';
import { snapshotRoutes } from './modules/snapshots/routes.js';
import { buildServices, type AppDeps, type Services } from './wiring/services.js';
import { wireReactions } from './wiring/reactions.js';
import { wireSchedule } from './wiring/schedule.js';

export type { AppDeps, Services } from './wiring/services.js';
export { httpServerOptions } from './http/raw-answers.js';

export const BODY_LIMIT = 64 * 1024; // larger bodies are 413

/** Every service, with the reactions between modules wired and the background work scheduled. */
export function createServices(deps: AppDeps): Services {
  const services = buildServices(deps);
  wireReactions(services);
  wireSchedule(services, deps);
  return services;
}

declare module 'fastify' {
  interface FastifyInstance {
    services: Services;
    /** The route schemas, compiled on first use (http/lazy-schemas.ts). */
    schemas: LazySchemas;
  }
}

const REQUEST_ID_RE = /^[\w.:-]{1,128}$/;

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
    // Requests Node refuses before Fastify sees them are answered in the error shape too.
    clientErrorHandler: clientErrorAnswer(deps.config.requestTimeoutS),
    serverFactory: (handler) => {
      const server = createServer(httpServerOptions(deps.config.requestTimeoutS), (req, res) => {
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

  // Each route declares who may call it and how its answers may be cached (docs/architecture.md#route-rules).
  registerRouteRules(app);
  app.addHook('onRequest', (req, reply, done) => {
    reply.header('X-Request-Id', req.id);
    reply.header('API-Version', API_VERSION);
    reply.header('X-Content-Type-Options', 'nosniff');
    done();
  });

  if (deps.config.corsOrigins.length > 0) {
    // @fastify/cors answers preflights in its own hook, before authentication; its catch-all OPTIONS route takes no
    // route options, and a plain OPTIONS that is no preflight stays 401 without credentials.
    declareRoutes(app, (r) => r.method === 'OPTIONS' && r.url === '*', { auth: 'user', scopes: [], cache: 'public' });
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
    const readsTime = (req: { routeOptions: { config: { readsTime?: boolean } } }) =>
      req.routeOptions.config.readsTime !== false;
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

  systemRoutes(app, { ping: () => deps.db.query('SELECT 1') });
  authRoutes(app, services.auth, services.tokens);
  apiKeyRoutes(app, services.apiKeys);
  eventRoutes(app, deps.db, services.eventStreams);
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
