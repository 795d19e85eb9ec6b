/**
 * Prometheus metrics at GET /metrics: process defaults, HTTP request counts and latencies, and the background work's
 * (background/metrics.ts).
 */
import Fastify, { type FastifyInstance } from 'fastify';
import { metricsAllowed, type MetricsAccess } from './authenticate.js';
import { Registry, collectDefaultMetrics } from 'prom-client';
import { errorResponses } from './schemas.js';

/** Latency buckets of gpucloud_http_request_duration_seconds, in seconds. */
const LATENCY_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5];

interface RequestCount {
  labels: string;
  count: number;
}

interface Latency {
  labels: string;
  /** Requests per bucket (not cumulative); the last counts those over the largest bound. */
  buckets: number[];
  sum: number;
  count: number;
}

/** A label value in the text format: backslash, double quote and newline escaped. */
const labelValue = (v: string) => v.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n');

/**
 * HTTP request counts by method, route and status, and latencies by method
 * and route, kept as plain numbers and written in the Prometheus text format
 * when /metrics is read. Counting through prom-client hashes a series' labels
 * on every observation, which cost each request more than the rest of the
 * hook; here a request costs a map lookup and three additions.
 */
export class HttpMetrics {
  private readonly requests = new Map<string, RequestCount>();
  private readonly latencies = new Map<string, Latency>();

  record(method: string, route: string, status: number, seconds: number): void {
    const countKey = `${method} ${status} ${route}`;
    let c = this.requests.get(countKey);
    if (!c) {
      c = { labels: `method="${labelValue(method)}",route="${labelValue(route)}",status="${status}"`, count: 0 };
      this.requests.set(countKey, c);
    }
    c.count += 1;
    const timeKey = `${method} ${route}`;
    let l = this.latencies.get(timeKey);
    if (!l) {
      l = {
        labels: `method="${labelValue(method)}",route="${labelValue(route)}"`,
        buckets: new Array<number>(LATENCY_BUCKETS.length + 1).fill(0),
        sum: 0,
        count: 0,
      };
      this.latencies.set(timeKey, l);
    }
    let b = 0;
    while (b < LATENCY_BUCKETS.length && seconds > LATENCY_BUCKETS[b]!) b++;
    l.buckets[b]! += 1;
    l.sum += seconds;
    l.count += 1;
  }

  /** Both metrics in the Prometheus text exposition format (0.0.4). */
  text(): string {
    const lines = [
      '# HELP gpucloud_http_requests_total HTTP requests by method, route and status',
      '# TYPE gpucloud_http_requests_total counter',
    ];
    for (const c of this.requests.values()) lines.push(`gpucloud_http_requests_total{${c.labels}} ${c.count}`);
    lines.push(
      '',
      '# HELP gpucloud_http_request_duration_seconds HTTP request latency by method and route',
      '# TYPE gpucloud_http_request_duration_seconds histogram',
    );
    const name = 'gpucloud_http_request_duration_seconds';
    for (const l of this.latencies.values()) {
      let cumulative = 0;
      LATENCY_BUCKETS.forEach((le, i) => {
        cumulative += l.buckets[i]!;
        lines.push(`${name}_bucket{le="${le}",${l.labels}} ${cumulative}`);
      });
      lines.push(`${name}_bucket{le="+Inf",${l.labels}} ${l.count}`);
      lines.push(`${name}_sum{${l.labels}} ${l.sum}`);
      lines.push(`${name}_count{${l.labels}} ${l.count}`);
    }
    return `${lines.join('\n')}\n`;
  }
}

/** `background`: the registry of the background work's metrics, served with these. */
export function registerMetrics(app: FastifyInstance, background?: Registry): Registry {
  const registry = new Registry();
  collectDefaultMetrics({ register: registry, prefix: 'gpucloud_' });
  const http = new HttpMetrics();
  app.addHook('onResponse', (req, reply, done) => {
    http.record(req.method, req.routeOptions.url ?? 'unmatched', reply.statusCode, reply.elapsedTime / 1000);
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
      // For operators (scopes: the metrics token, or an administrator's session or read_write key); read while
      // the database is away, and the same whoever reads them.
      config: { auth: 'metrics', scopes: [], rateLimit: false, readsTime: false, cache: 'public' },
    },
    async (_req, reply) => {
      reply.type(registry.contentType);
      const others = await (background ? Registry.merge([registry, background]) : registry).metrics();
      return `${others}\n${http.text()}`;
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
