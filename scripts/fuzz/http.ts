/** A small HTTP client on node:http: any method with any body, raw paths, keep-alive. */
import http from 'node:http';

export interface RawRequest {
  method: string;
  /** Path and query, already encoded. */
  path: string;
  headers: [string, string][];
  body: Buffer | undefined;
}

export interface RawResponse {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: Buffer;
  /** Set when no response arrived (timeout, reset, refused). */
  error?: string;
  ms: number;
}

const MAX_BODY = 4 * 1024 * 1024;

export class HttpClient {
  private readonly agent: http.Agent;
  private readonly base: URL;

  constructor(
    baseUrl: string,
    concurrency: number,
    private readonly timeoutMs = 30_000,
  ) {
    this.base = new URL(baseUrl);
    this.agent = new http.Agent({ keepAlive: true, maxSockets: concurrency, maxFreeSockets: concurrency });
  }

  /** Requests sent again on a fresh connection after a reset on a pooled one. */
  retries = 0;

  /**
   * Sends one request. A keep-alive connection the server has closed (it
   * answers 431 without `Connection: close`, then hangs up) fails the next
   * request on it with ECONNRESET before any response: such a request is sent
   * again once, on a fresh connection, where a reset counts. Requests with
   * very large headers go on a connection of their own, not the pool's.
   */
  async send(req: RawRequest): Promise<RawResponse> {
    const headerBytes = req.headers.reduce((n, [k, v]) => n + k.length + v.length + 4, req.path.length);
    const own = headerBytes > 8 * 1024;
    const first = await this.sendOnce(req, own);
    if (!first.retryable) return first;
    this.retries++;
    return this.sendOnce(req, true);
  }

  private sendOnce(req: RawRequest, fresh = false): Promise<RawResponse & { retryable?: boolean }> {
    const started = performance.now();
    return new Promise((resolve) => {
      let done = false;
      const finish = (r: Omit<RawResponse, 'ms'> & { retryable?: boolean }) => {
        if (done) return;
        done = true;
        resolve({ ...r, ms: performance.now() - started });
      };
      let cr: http.ClientRequest;
      let gotResponse = false;
      try {
        const headers: Record<string, string | string[]> = {};
        for (const [k, v] of req.headers) {
          const prev = headers[k];
          headers[k] = prev === undefined ? v : Array.isArray(prev) ? [...prev, v] : [prev, v];
        }
        if (req.body !== undefined) headers['Content-Length'] = String(req.body.length);
        cr = http.request({
          host: this.base.hostname,
          port: this.base.port,
          method: req.method,
          path: (this.base.pathname.replace(/\/$/, '') || '') + req.path,
          headers,
          agent: fresh ? false : this.agent,
          // Fuzzed headers may be large: let the server, not the client, refuse them.
          maxHeaderSize: 1024 * 1024,
        });
      } catch (e) {
        finish({
          status: -1,
          headers: {},
          body: Buffer.alloc(0),
          error: `client refused to send: ${(e as Error).message}`,
        });
        return;
      }
      cr.setTimeout(this.timeoutMs, () => {
        cr.destroy(new Error(`no response in ${this.timeoutMs} ms`));
      });
      cr.on('error', (e: NodeJS.ErrnoException) => {
        // (A request queued in the agent and handed a freed socket is not marked reusedSocket.)
        const retryable = !fresh && !gotResponse && (e.code === 'ECONNRESET' || e.code === 'EPIPE');
        const how = fresh
          ? ' (on a fresh connection)'
          : cr.reusedSocket
            ? ' (on a reused keep-alive connection)'
            : ' (on a pooled connection)';
        finish({
          status: 0,
          headers: {},
          body: Buffer.alloc(0),
          error: `${e.code ?? ''} ${e.message}${how}`.trim(),
          retryable,
        });
      });
      cr.on('response', (res) => {
        gotResponse = true;
        const chunks: Buffer[] = [];
        let size = 0;
        res.on('data', (c: Buffer) => {
          size += c.length;
          if (size <= MAX_BODY) chunks.push(c);
        });
        res.on('end', () => finish({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks) }));
        res.on('error', (e) =>
          finish({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks), error: e.message }),
        );
      });
      cr.end(req.body);
    });
  }

  close(): void {
    this.agent.destroy();
  }
}
