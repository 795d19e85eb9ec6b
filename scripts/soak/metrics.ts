/**
 * What the server's own GET /metrics says about its process (prom-client
 * defaults), sampled beside the RSS to tell a JS-heap leak from native or
 * WASM memory, leaked sockets (fds, handles) and event-loop stalls. Not part
 * of the traffic mix and not counted in its statistics; silently absent when
 * /metrics is closed to this client.
 */
import { httpCall } from './client.js';

export interface ServerMetrics {
  heapUsedMb?: number;
  externalMb?: number;
  openFds?: number;
  activeHandles?: number;
  /** Event-loop delay since the previous scrape (prom-client resets its histogram at every collect). */
  loopLagP99Ms?: number;
  loopLagMaxMs?: number;
  gcSeconds?: number;
}

/** Sum of a metric over its label sets, found by the end of its name (the server prefixes them, e.g. gpucloud_). */
function metric(text: string, suffix: string): number | undefined {
  let sum: number | undefined;
  for (const line of text.split('\n')) {
    if (line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
    if (!m || !(m[1] === suffix || m[1]!.endsWith(`_${suffix}`))) continue;
    const v = Number(m[3]);
    if (Number.isFinite(v)) sum = (sum ?? 0) + v;
  }
  return sum;
}

export async function scrapeMetrics(base: string, timeoutMs: number): Promise<ServerMetrics | undefined> {
  try {
    const r = await httpCall(base, 'GET', '/metrics', { timeoutMs });
    if (r.status !== 200) return undefined;
    const mb = (v: number | undefined) => (v === undefined ? undefined : v / 1024 / 1024);
    const ms = (v: number | undefined) => (v === undefined ? undefined : v * 1000);
    return {
      heapUsedMb: mb(metric(r.text, 'nodejs_heap_size_used_bytes')),
      externalMb: mb(metric(r.text, 'nodejs_external_memory_bytes')),
      openFds: metric(r.text, 'process_open_fds'),
      activeHandles: metric(r.text, 'nodejs_active_handles_total'),
      loopLagP99Ms: ms(metric(r.text, 'nodejs_eventloop_lag_p99_seconds')),
      loopLagMaxMs: ms(metric(r.text, 'nodejs_eventloop_lag_max_seconds')),
      gcSeconds: metric(r.text, 'nodejs_gc_duration_seconds_sum'),
    };
  } catch {
    return undefined;
  }
}
