/** A webhook receiver on loopback: records every request and answers as the test says. */
import { createServer, type IncomingHttpHeaders, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Webhook } from 'standardwebhooks';

export interface Received {
  path: string;
  headers: IncomingHttpHeaders;
  body: string;
}

/** How to answer a request: a status, or `hang` to never answer (the connection stays open). */
export type Answer = number | 'hang' | ((res: ServerResponse) => void);

export interface Receiver {
  url: string;
  received: Received[];
  /** Decides each answer (default 200); `n` counts requests from 0. */
  answer: (r: Received, n: number) => Answer;
  /** Checks a request's signature with `standardwebhooks`, as a customer's receiver would; returns the payload. */
  verify(
    r: Received,
    secret: string,
  ): {
    type: string;
    timestamp: string;
    data: { id: string; type: string; created_at: string; vm_id: string | null; data: Record<string, unknown> };
  };
  close(): Promise<void>;
}

export async function startReceiver(): Promise<Receiver> {
  const open = new Set<ServerResponse>();
  const rec: Receiver = {
    url: '',
    received: [],
    answer: () => 200,
    verify(r, secret) {
      const headers: Record<string, string> = {};
      for (const [k, v] of Object.entries(r.headers)) if (typeof v === 'string') headers[k] = v;
      return new Webhook(secret).verify(r.body, headers) as ReturnType<Receiver['verify']>;
    },
    async close() {
      for (const res of open) res.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
  const server = createServer((req, res) => {
    let body = '';
    req.setEncoding('utf8');
    req.on('data', (c: string) => (body += c));
    req.on('end', () => {
      const r: Received = { path: req.url ?? '/', headers: req.headers, body };
      const n = rec.received.length;
      rec.received.push(r);
      const a = rec.answer(r, n);
      if (a === 'hang') {
        open.add(res);
        res.on('close', () => open.delete(res));
        return;
      }
      if (typeof a === 'function') return a(res);
      res.writeHead(a, { 'content-type': 'text/plain' }).end(String(a));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  rec.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return rec;
}
