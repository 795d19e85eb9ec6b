/**
 * The portal's side of a host agent's tunnel (src/host-agent/tunnel.ts): a TCP
 * stream to one web port of one VM, opened with an authenticated HTTP upgrade
 * to the agent. The portal reaches a VM only this way, so guest ports are
 * never open on a host's public address, and the portal and the agents may
 * run on different machines (the agent's URL may be https).
 *
 * `TunnelPool` keeps an HTTP keep-alive pool per (VM, port): each pooled
 * connection is one tunnel, reused for request after request, so a page's
 * many requests do not each cost an upgrade.
 */
import http from 'node:http';
import https from 'node:https';
import type { Socket } from 'node:net';
import { Pool } from 'undici';
import { TUNNEL_PROTOCOL } from '../host-agent/api.js';
import type { AgentEndpoint } from './host-agent-client.js';

/** The agent refused or could not open the tunnel: its HTTP status and code, or status 0 when unreachable. */
export class TunnelError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
    this.name = 'TunnelError';
  }
}

const OPEN_TIMEOUT_MS = 10_000;

/** Opens one tunnel: resolves with the raw stream once the agent answered 101. */
export function openTunnel(endpoint: AgentEndpoint, vmId: string, port: number): Promise<Socket> {
  const url = new URL(`${endpoint.url.replace(/\/+$/, '')}/v1/vms/${encodeURIComponent(vmId)}/tunnel?port=${port}`);
  const lib = url.protocol === 'https:' ? https : http;
  return new Promise((resolve, reject) => {
    const req = lib.request(url, {
      method: 'GET',
      agent: false,
      headers: { authorization: `Bearer ${endpoint.token}`, connection: 'Upgrade', upgrade: TUNNEL_PROTOCOL },
      timeout: OPEN_TIMEOUT_MS,
    });
    req.on('upgrade', (_res, socket: Socket, head: Buffer) => {
      if (head.length) socket.unshift(head);
      socket.setNoDelay(true);
      resolve(socket);
    });
    req.on('response', (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (d: string) => {
        if (body.length < 4096) body += d;
      });
      res.on('end', () => {
        let parsed: { detail?: unknown; code?: unknown } = {};
        try {
          parsed = JSON.parse(body) as typeof parsed;
        } catch {
          // not the agent's JSON: the status says enough
        }
        reject(
          new TunnelError(
            res.statusCode ?? 502,
            typeof parsed.code === 'string' ? parsed.code : 'agent_error',
            typeof parsed.detail === 'string' ? parsed.detail.slice(0, 300) : `the agent answered ${res.statusCode}`,
          ),
        );
      });
    });
    req.on('timeout', () => req.destroy(new Error(`no answer within ${OPEN_TIMEOUT_MS / 1000} s`)));
    req.on('error', (err) => reject(new TunnelError(0, 'agent_unreachable', `the host agent: ${err.message}`)));
    req.end();
  });
}

/**
 * The pools, by VM run and port: an undici Pool whose every connection is a
 * tunnel (undici parses and writes HTTP/1.1 about twice as fast as node:http's
 * client, which was the portal's main cost). A pool of a run that ended is
 * closed with its connections.
 */
export class TunnelPool {
  private readonly pools = new Map<string, Pool>();

  /** The pool for one web port of one run of a VM (`run`: its started_at, so a restarted VM gets fresh tunnels). */
  get(endpoint: AgentEndpoint, vmId: string, run: number, port: number): Pool {
    const key = `${vmId}/${run}/${port}/${endpoint.url}`;
    let pool = this.pools.get(key);
    if (!pool) {
      // Pools of the VM's earlier runs lead nowhere any more.
      for (const [k, old] of this.pools) {
        if (k.startsWith(`${vmId}/`) && !k.startsWith(`${vmId}/${run}/`)) {
          void old.destroy();
          this.pools.delete(k);
        }
      }
      if (this.pools.size >= 1000) {
        const [k, oldest] = this.pools.entries().next().value!;
        void oldest.destroy();
        this.pools.delete(k);
      }
      pool = new Pool('http://tunnel.invalid', {
        // As many connections kept as may be busy: a burst must not open and drop a tunnel per request.
        connections: 256,
        keepAliveTimeout: 60_000,
        headersTimeout: 0,
        bodyTimeout: 0,
        connect: (_opts, cb) => {
          openTunnel(endpoint, vmId, port).then(
            (socket) => cb(null, socket),
            (err: Error) => cb(err, null),
          );
        },
      });
      this.pools.set(key, pool);
    }
    return pool;
  }

  close(): void {
    for (const p of this.pools.values()) void p.destroy();
    this.pools.clear();
  }
}
