/**
 * A small real HTTP server standing in for the control plane's image store in
 * the agent's image tests: `GET /images/SHA256` with the agent's token,
 * `Range: bytes=N-` answered 206, and faults on demand (a response cut half
 * way, one held until released, 401/404, wrong bytes, a slow pace). It
 * records each request (its range, its token, the time) and how many
 * responses were under way at once.
 */
import { createHash } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

export interface SourceRequest {
  sha256: string;
  range: string | undefined;
  authorization: string | undefined;
  at: number;
}

/** How the source answers one image; each fault applies to the next response only when `once` is set. */
export interface Fault {
  status?: number;
  /** Ends the connection after this many bytes of the image (an absolute offset). */
  cutAt?: number;
  /** Stops sending at this offset until `release()`. */
  holdAt?: number;
  /** Sends these bytes instead of the image's. */
  wrong?: Buffer;
  /** Answers 200 with the whole image even to a Range request. */
  ignoreRange?: boolean;
  once?: boolean;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export class ImageSource {
  readonly requests: SourceRequest[] = [];
  readonly images = new Map<string, Buffer>();
  readonly faults = new Map<string, Fault>();
  /** Called as each request arrives (the tests look at the agent's part file then). */
  onRequest: ((r: SourceRequest) => void) | null = null;
  /** A pause between 64 KiB chunks, to make downloads last. */
  chunkDelayMs = 0;
  active = 0;
  maxActive = 0;
  held = 0;
  private releases: (() => void)[] = [];
  private server: Server | null = null;
  url = '';

  constructor(private readonly token: string) {}

  /** Adds an image; answers its SHA-256. */
  add(bytes: Buffer): string {
    const sha = createHash('sha256').update(bytes).digest('hex');
    this.images.set(sha, bytes);
    return sha;
  }

  release(): void {
    for (const r of this.releases.splice(0)) r();
  }

  async start(): Promise<void> {
    this.server = createServer((req, res) => void this.handle(req, res));
    await new Promise<void>((r) => this.server!.listen(0, '127.0.0.1', r));
    this.url = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }

  async stop(): Promise<void> {
    this.release();
    this.server?.closeAllConnections();
    await new Promise((r) => this.server?.close(r));
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const sha = /^\/images\/([0-9a-f]{64})$/.exec(req.url ?? '')?.[1] ?? '';
    const record = { sha256: sha, range: req.headers.range, authorization: req.headers.authorization, at: Date.now() };
    this.requests.push(record);
    this.onRequest?.(record);
    const json = (status: number, detail: string, code: string): void => {
      res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify({ detail, code }));
    };
    if (req.headers.authorization !== `Bearer ${this.token}`)
      return json(401, 'this node agent token is not valid', 'unauthorized');
    const image = this.images.get(sha);
    const fault = this.faults.get(sha) ?? {};
    if (fault.once) this.faults.delete(sha);
    if (fault.status) return json(fault.status, `refused with ${fault.status}`, 'refused');
    if (!image) return json(404, 'no such image', 'not_found');
    const bytes = fault.wrong ?? image;
    let from = 0;
    const m = fault.ignoreRange ? null : /^bytes=(\d+)-$/.exec(req.headers.range ?? '');
    if (m) {
      from = Number(m[1]);
      if (from >= bytes.length) {
        res.writeHead(416, { 'content-range': `bytes */${bytes.length}` }).end();
        return;
      }
      res.writeHead(206, {
        'content-length': bytes.length - from,
        'content-range': `bytes ${from}-${bytes.length - 1}/${bytes.length}`,
      });
    } else {
      res.writeHead(200, { 'content-length': bytes.length, 'accept-ranges': 'bytes' });
    }
    this.active++;
    this.maxActive = Math.max(this.maxActive, this.active);
    let open = true;
    res.on('close', () => {
      open = false;
      this.active--;
    });
    for (let at = from; at < bytes.length && open;) {
      if (fault.holdAt !== undefined && at >= fault.holdAt) {
        this.held++;
        await new Promise<void>((r) => this.releases.push(r));
        this.held--;
        fault.holdAt = undefined;
        if (!open) return;
      }
      let end = Math.min(bytes.length, at + 65536);
      if (fault.holdAt !== undefined && at < fault.holdAt) end = Math.min(end, fault.holdAt);
      if (fault.cutAt !== undefined && end >= fault.cutAt) {
        res.write(bytes.subarray(at, fault.cutAt));
        await sleep(50);
        res.socket?.destroy();
        return;
      }
      if (!res.write(bytes.subarray(at, end)))
        await new Promise<void>((r) => {
          const done = () => {
            res.off('drain', done);
            res.off('close', done);
            r();
          };
          res.on('drain', done);
          res.on('close', done);
        });
      at = end;
      if (this.chunkDelayMs) await sleep(this.chunkDelayMs);
    }
    if (open) res.end();
  }
}
