/**
 * Every route declares, in its `config`, who may call it (`auth`), the API-key scopes besides read_write
 * that may (`scopes`, docs/authentication.md#scopes) and whether its answers may be stored (`cache`,
 * docs/errors.md#caching). No rule is derived from a URL: a route that declares nothing does not start,
 * rather than falling under whatever a path prefix would have given it.
 */
import type { FastifyContextConfig, FastifyInstance, RouteOptions } from 'fastify';

const routesOf = new WeakMap<FastifyInstance, RouteOptions[]>();

/** "GET /vms/:vm_id" (methods joined by "|" for a route of several). */
export function routeName(route: Pick<RouteOptions, 'method' | 'url'>): string {
  return `${([] as string[]).concat(route.method).join('|')} ${route.url}`;
}

/** What a route lacks of the declarations every route makes (empty when none). */
export function missingDeclarations(config: FastifyContextConfig | undefined): string[] {
  const missing: string[] = [];
  if (config?.auth === undefined) missing.push('auth');
  if (config?.cache === undefined) missing.push('cache');
  if (config?.auth !== 'public' && config?.scopes === undefined) missing.push('scopes');
  return missing;
}

/**
 * Checks the declarations of every route once all are added (`ready()` fails, naming each route that
 * lacks one), and answers with `Cache-Control: no-store` where they say so. Registered on the root
 * before any plugin, so that its onRoute hook sees the routes of every context.
 */
export function registerRouteRules(app: FastifyInstance): void {
  const routes: RouteOptions[] = [];
  routesOf.set(app, routes);
  // The options object itself: hooks of child contexts run after this one and may still declare its config.
  app.addHook('onRoute', (route) => {
    routes.push(route);
  });
  app.addHook('onReady', async () => {
    const bad = routes
      .map((r) => [r, missingDeclarations(r.config)] as const)
      .filter(([, missing]) => missing.length > 0)
      .map(([r, missing]) => `${routeName(r)} (no ${missing.join(', ')})`);
    if (bad.length > 0) {
      throw new Error(
        `Routes without their declarations (config.auth, config.cache, and config.scopes unless public): ${bad.join('; ')}`,
      );
    }
  });
  app.addHook('onRequest', (req, reply, done) => {
    // A request no route matches is private too: a 404 says nothing worth storing.
    if (!req.routeOptions.url || req.routeOptions.config.cache === 'no-store')
      reply.header('Cache-Control', 'no-store');
    done();
  });
}

/** Every route added to `app` since registerRouteRules, with its config as declared (for tests and checks). */
export function declaredRoutes(app: FastifyInstance): readonly RouteOptions[] {
  const routes = routesOf.get(app);
  if (!routes) throw new Error('registerRouteRules was not called on this instance');
  return routes;
}

/**
 * Declares `config` on the routes a plugin adds without taking route options from us (@fastify/static's
 * files, Swagger UI's pages): each route added to `app` from now on that `match` names. Existing
 * config fields (a plugin's own) are kept.
 */
export function declareRoutes(
  app: FastifyInstance,
  match: (route: RouteOptions) => boolean,
  config: FastifyContextConfig,
): void {
  app.addHook('onRoute', (route) => {
    if (match(route)) route.config = { ...route.config, ...config };
  });
}
