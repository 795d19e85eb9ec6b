/**
 * Prometheus metrics at GET /metrics: process defaults, HTTP request counts and latencies, and the background work's
 * (jobs/metrics.ts).
 */
import Fastify, { type FastifyInstance } from 'fastify';
import { metricsAllowed, type MetricsAccess } from './authenticate.js';
import { Counter, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import { errorResponses } from './schemas.js';

/** `background`: the registry of the background work's metrics, served with these. */
export function registerMetrics(app: FastifyInstance, background?: Registry): Registry {
  const registry = new Registry();
  collectDefaultMetrics({ register: registry, prefix: 'gpucloud_' });
  const requests = new Counter({
    name: 'gpucloud_http_requests_total',
    help: 'HTTP requests by method, route and status',
    labelNames: ['method', 'route', 'status'] as const,
    registers: [registry],
  });
  const duration = new Histogram({
    name: 'gpucloud_http_request_duration_seconds',
    help: 'HTTP request latency by method and route',
    labelNames: ['method', 'route'] as const,
    buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5],
    registers: [registry],
  });
  // The series of a method, route and status, found once: prom-client hashes a label set on every call.
  const series = new Map<string, { count: { inc(): void }; time: { observe(v: number): void } }>();
  app.addHook('onResponse', (req, reply, done) => {
    const route = req.routeOptions.url ?? 'unmatched';
    const key = `${req.method} ${reply.statusCode} ${route}`;
    let s = series.get(key);
    if (!s) {
      s = {
        count: requests.labels({ method: req.method, route, status: String(reply.statusCode) }),
        time: duration.labels({ method: req.method, route }),
      };
      series.set(key, s);
    }
    s.count.inc();
    s.time.observe(reply.elapsedTime / 1000);
    done();
  });
  app.get(
    '/metrics',
    {
      schema: {
        tags: ['system'],
        operationId: 'getMetrics',
        summary: 'Prometheus metrics',
        description:
          "Prometheus text exposition format: the process, HTTP requests by route and status, and the background work (passes of each job, hypervisor actions, webhook attempts, missed agent heartbeats). Needs the metrics token (GPUCLOUD_METRICS_TOKEN) as a Bearer token, or an administrator's session or read_write key; a client on this machine's loopback needs nothing unless GPUCLOUD_METRICS_LOOPBACK=0.",
        response: {
          200: {
            description: 'Prometheus text exposition format',
            content: { 'text/plain': { schema: { type: 'string' } } },
          },
          ...errorResponses(401, 403),
        },
      },
      config: { auth: 'metrics', rateLimit: false },
    },
    async (_req, reply) => {
      reply.type(registry.contentType);
      return background ? Registry.merge([registry, background]).metrics() : registry.metrics();
    },
  );
  return registry;
}

/**
 * What a worker (no API) serves on GPUCLOUD_METRICS_PORT: GET /metrics (the
 * process's and the background work's metrics, to the metrics token or a
 * loopback client, as on the API) and GET /healthz.
 */
export async function serveWorkerMetrics(
  background: Registry,
  access: MetricsAccess,
  port: number,
  host: string,
): Promise<FastifyInstance> {
  const registry = new Registry();
  collectDefaultMetrics({ register: registry, prefix: 'gpucloud_' });
  const app = Fastify({ logger: false });
  app.get('/healthz', async () => ({ status: 'ok' }));
  app.get('/metrics', async (req, reply) => {
    if (!metricsAllowed(req, access)) {
      reply.code(401).header('www-authenticate', 'Bearer realm="gpucloud"');
      return { detail: 'Metrics need the metrics token (GPUCLOUD_METRICS_TOKEN)', code: 'unauthorized' };
    }
    reply.type(registry.contentType);
    return Registry.merge([registry, background]).metrics();
  });
  await app.listen({ port, host });
  return app;
}
