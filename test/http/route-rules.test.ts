/**
 * Route declarations (src/http/route-rules.ts): every route of the app says who may call it, which key
 * scopes may, and whether its answers may be stored; a route that does not keeps the app from starting;
 * `cache: 'no-store'` answers carry Cache-Control: no-store, errors too, and so does a request no route
 * serves.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { AddressInfo } from 'node:net';
import Fastify, { type FastifyContextConfig, type FastifyInstance } from 'fastify';
import { buildTestApp, type TestApp } from '../helpers/app.js';
import { createUser } from '../helpers/factories.js';
import {
  declaredRoutes,
  declareRoutes,
  missingDeclarations,
  registerRouteRules,
  routeName,
} from '../../src/http/route-rules.js';
import { AppError } from '../../src/errors.js';

describe('the routes of the app', () => {
  let t: TestApp;
  let consoleBuild: string;
  before(async () => {
    // A console build of two files, so that the routes @fastify/static makes for them are among those checked.
    consoleBuild = mkdtempSync(join(tmpdir(), 'gpucloud-console-'));
    mkdirSync(join(consoleBuild, 'assets'));
    writeFileSync(join(consoleBuild, 'index.html'), '<!doctype html><title>console</title>');
    writeFileSync(join(consoleBuild, 'assets', 'app-1234.js'), 'console.log(1);');
    t = await buildTestApp('pglite', { consoleDir: consoleBuild });
  });
  after(async () => {
    await t?.close();
    rmSync(consoleBuild, { recursive: true, force: true });
  });

  test('every route declares auth and cache, and scopes unless it is public', () => {
    const routes = declaredRoutes(t.app);
    const names = new Set(routes.map(routeName));
    for (const known of [
      'GET /healthz',
      'HEAD /healthz',
      'GET /readyz',
      'GET /metrics',
      'GET /openapi.json',
      'GET /docs',
      'GET /console/',
      'HEAD|GET /console/assets/app-1234.js',
      'GET /vms',
      'HEAD /vms',
      'GET /events/stream',
      'GET /.well-known/jwks.json',
      'POST /auth/login',
      'GET /agent/v1/nodes/:node/images/:sha256',
    ]) {
      assert.ok(names.has(known), `${known} is not among the routes: ${[...names].join(', ')}`);
    }
    for (const r of routes) {
      assert.deepEqual(missingDeclarations(r.config), [], routeName(r));
      assert.ok(['public', 'user', 'admin', 'metrics'].includes(String(r.config?.auth)), routeName(r));
      assert.ok(['public', 'no-store'].includes(String(r.config?.cache)), routeName(r));
      // What takes credentials is private to its caller; metrics are the same whoever reads them.
      if (r.config?.auth !== 'public' && r.config?.auth !== 'metrics') assert.equal(r.config?.cache, 'no-store');
    }
  });

  test('health, metrics, docs and console files are answered without the manual clock', () => {
    for (const r of declaredRoutes(t.app)) {
      const infrastructure = /^\/(healthz|readyz|metrics|openapi\.json|docs|console)(\/|$)|^\/$/.test(r.url);
      assert.equal(r.config?.readsTime === false, infrastructure, routeName(r));
    }
  });

  test('Cache-Control: no-store on private answers and unrouted paths, none added on public ones', async () => {
    const user = await createUser(t);
    const header = async (method: 'GET' | 'HEAD', url: string, token?: string) => {
      const res = await t.app.inject({ method, url, headers: token ? { authorization: `Bearer ${token}` } : {} });
      return [res.statusCode, res.headers['cache-control']] as const;
    };
    // Authenticated routes that no prefix covered before: answers and refusals alike.
    assert.deepEqual(await header('GET', '/vms', user.token), [200, 'no-store']);
    assert.deepEqual(await header('GET', '/vms'), [401, 'no-store']);
    assert.deepEqual(await header('HEAD', '/ssh-keys', user.token), [200, 'no-store']);
    assert.deepEqual(await header('GET', '/events', user.token), [200, 'no-store']);
    // Public answers, the same for everyone.
    assert.deepEqual(await header('GET', '/healthz'), [200, undefined]);
    assert.deepEqual(await header('GET', '/templates'), [200, undefined]);
    assert.deepEqual(await header('GET', '/.well-known/jwks.json'), [200, 'public, max-age=300']);
    assert.deepEqual(await header('GET', '/console/assets/app-1234.js'), [200, 'public, max-age=31536000, immutable']);
    assert.deepEqual(await header('GET', '/console/vms'), [200, 'no-cache']);
    // No route: a 404 is private too.
    assert.deepEqual(await header('GET', '/no-such-route'), [404, 'no-store']);
    assert.deepEqual(await header('GET', '/templates/x/y'), [404, 'no-store']);
  });

  test("the event stream, written past Fastify's reply, carries no-store too", async () => {
    const user = await createUser(t);
    await t.app.listen({ port: 0, host: '127.0.0.1' });
    const { port } = t.app.server.address() as AddressInfo;
    const abort = new AbortController();
    const res = await fetch(`http://127.0.0.1:${port}/events/stream`, {
      headers: { authorization: `Bearer ${user.token}` },
      signal: abort.signal,
    });
    assert.equal(res.status, 200);
    assert.match(res.headers.get('content-type') ?? '', /^text\/event-stream/);
    assert.equal(res.headers.get('cache-control'), 'no-store');
    abort.abort();
  });
});

/** A bare app with the route rules and the routes `add` adds, made ready. */
async function appWith(add: (app: FastifyInstance) => void | Promise<void>): Promise<FastifyInstance> {
  const app = Fastify({ logger: false });
  registerRouteRules(app);
  await add(app);
  await app.ready();
  return app;
}

describe('registerRouteRules', () => {
  const ok = async () => ({ ok: true });

  test('a route without auth, cache or (when not public) scopes keeps the app from starting, named', async () => {
    const cases: [string, FastifyContextConfig | undefined, string][] = [
      ['/none', undefined, 'GET /none (no auth, cache, scopes)'],
      ['/no-auth', { scopes: [], cache: 'no-store' }, 'GET /no-auth (no auth)'],
      ['/no-cache', { auth: 'user', scopes: [] }, 'GET /no-cache (no cache)'],
      ['/no-scopes', { auth: 'admin', cache: 'no-store' }, 'GET /no-scopes (no scopes)'],
    ];
    for (const [url, config, named] of cases) {
      await assert.rejects(
        appWith((app) => {
          app.get('/fine', { config: { auth: 'public', cache: 'public' } }, ok);
          app.get(url, { config }, ok);
        }),
        (err: Error) => {
          assert.ok(err.message.includes(named), err.message);
          // Fastify's HEAD route of the GET route is named too; the declared one is not.
          assert.ok(err.message.includes(`HEAD ${url} `), err.message);
          assert.ok(!err.message.includes('/fine'), err.message);
          return true;
        },
      );
    }
  });

  test('declarations made by an onRoute hook of a child context count', async () => {
    const app = await appWith(async (root) => {
      await root.register(async (child) => {
        declareRoutes(child, (r) => r.url.startsWith('/files/'), { auth: 'public', cache: 'public' });
        child.route({ method: ['GET', 'HEAD'], url: '/files/a.txt', handler: ok });
      });
    });
    await app.close();
  });

  test('no-store on the answers and errors of a no-store route, nothing added on a public one, no-store on a 404', async () => {
    const app = await appWith((app) => {
      app.get('/private', { config: { auth: 'user', scopes: [], cache: 'no-store' } }, ok);
      app.get('/private-error', { config: { auth: 'user', scopes: [], cache: 'no-store' } }, async () => {
        throw new AppError('not_found', 'Nothing here');
      });
      app.get('/public', { config: { auth: 'public', cache: 'public' } }, ok);
      app.get('/public-own', { config: { auth: 'public', cache: 'public' } }, async (_req, reply) => {
        reply.header('Cache-Control', 'public, max-age=60');
        return { ok: true };
      });
    });
    const cacheOf = async (method: 'GET' | 'HEAD' | 'POST', url: string) => {
      const res = await app.inject({ method, url });
      return [res.statusCode, res.headers['cache-control']] as const;
    };
    assert.deepEqual(await cacheOf('GET', '/private'), [200, 'no-store']);
    assert.deepEqual(await cacheOf('HEAD', '/private'), [200, 'no-store']);
    assert.deepEqual(await cacheOf('GET', '/private-error'), [404, 'no-store']);
    assert.deepEqual(await cacheOf('GET', '/public'), [200, undefined]);
    assert.deepEqual(await cacheOf('GET', '/public-own'), [200, 'public, max-age=60']);
    assert.deepEqual(await cacheOf('GET', '/nowhere'), [404, 'no-store']);
    assert.deepEqual(await cacheOf('POST', '/public'), [404, 'no-store']);
    await app.close();
  });
});
