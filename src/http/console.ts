/**
 * The web console, served by the API server itself at /console/ (same origin:
 * the console calls the API without CORS). The files come from the Vite build
 * in dist/console (`npm run build`); every /console/* path that is not a file
 * answers the app's index.html, so deep links and reloads work. `/` redirects
 * to the console.
 *
 * The console's pages carry a strict Content Security Policy: scripts, styles
 * and connections from this origin only, no framing. It keeps injected
 * scripts away from the session the console keeps in this origin's storage.
 */
import { existsSync, readFileSync } from 'node:fs';
import { dirname, join, sep } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { FastifyInstance, FastifyReply } from 'fastify';
import fastifyStatic from '@fastify/static';
import { declareRoutes } from './route-rules.js';

export const CONSOLE_PATH = '/console/';

const CSP = [
  "default-src 'self'",
  "script-src 'self'",
  "style-src 'self' 'unsafe-inline'",
  "img-src 'self' data:",
  "connect-src 'self'",
  "font-src 'self'",
  "object-src 'none'",
  "base-uri 'none'",
  "form-action 'self'",
  "frame-ancestors 'none'",
].join('; ');

/** dist/console next to the compiled server (dist/http/console.js), or from the sources (src/http/console.ts). */
export function consoleDir(): string | undefined {
  const here = dirname(fileURLToPath(import.meta.url));
  for (const dir of [join(here, '..', 'console'), join(here, '..', '..', 'dist', 'console')]) {
    if (existsSync(join(dir, 'index.html'))) return dir;
  }
  return undefined;
}

function securityHeaders(reply: FastifyReply): void {
  reply.header('Content-Security-Policy', CSP);
  reply.header('X-Frame-Options', 'DENY');
  reply.header('Referrer-Policy', 'same-origin');
}

/**
 * The console's pages and files: the same for everyone (they set their own Cache-Control), never rate limited, and
 * they read no time.
 */
const CONSOLE_ROUTE = { auth: 'public', rateLimit: false, readsTime: false, cache: 'public' } as const;

export async function registerConsole(app: FastifyInstance, dir: string | undefined): Promise<void> {
  const route = { schema: { hide: true }, config: CONSOLE_ROUTE };
  app.get('/', route, async (_req, reply) => reply.redirect(CONSOLE_PATH, 302));

  let index: Buffer | undefined;
  try {
    if (dir) index = readFileSync(join(dir, 'index.html'));
  } catch {
    index = undefined; // not built (or removed since it was found)
  }
  if (!dir || !index) {
    const notBuilt = async (_req: unknown, reply: FastifyReply) =>
      reply
        .code(404)
        .type('text/plain; charset=utf-8')
        .send(
          'The web console is not built. Run `npm run build` (npm install does it too), then restart the server.\n',
        );
    app.get('/console/', route, notBuilt);
    app.get('/console/*', route, notBuilt);
    return;
  }
  const page = index;
  const sendIndex = async (_req: unknown, reply: FastifyReply) => {
    securityHeaders(reply);
    // The page names the current build's hashed files: never cache it.
    return reply.header('Cache-Control', 'no-cache').type('text/html; charset=utf-8').send(page);
  };

  // @fastify/static takes no route options: its routes, one per file of the build, are declared as they are
  // added (they carry the build's directory as their root).
  const root = dir.split(sep).join('/').replace(/\/?$/, '/');
  declareRoutes(app, (r) => (r.config as { rootPath?: string } | undefined)?.rootPath === root, CONSOLE_ROUTE);
  await app.register(fastifyStatic, {
    root: dir,
    prefix: CONSOLE_PATH,
    // Precompressed .br and .gz copies sit next to every text file of the build.
    preCompressed: true,
    index: false,
    wildcard: false,
    cacheControl: false,
    decorateReply: false,
    schemaHide: true,
    setHeaders: (res, path) => {
      // Hashed asset names change with their content: cache them for a year.
      res.setHeader(
        'Cache-Control',
        /[\\/]assets[\\/]/.test(path) ? 'public, max-age=31536000, immutable' : 'no-cache',
      );
      res.setHeader('Content-Security-Policy', CSP);
      res.setHeader('X-Frame-Options', 'DENY');
    },
  });
  app.get('/console/', route, sendIndex);
  // Any other path is a page of the app (its router reads the URL); a missing asset is a real 404.
  app.get('/console/*', route, async (req, reply) => {
    if (req.url.startsWith('/console/assets/')) {
      return reply
        .code(404)
        .send({ detail: `No console asset at ${req.url.split('?')[0]!.slice(0, 200)}`, code: 'not_found' });
    }
    return sendIndex(req, reply);
  });
}
