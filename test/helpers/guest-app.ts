/**
 * A stand-in for the web app of a guest (the test image serves the same on
 * its web ports, see scripts/test-image.mjs), and a minimal WebSocket client.
 * No dependency: the WebSocket handshake and frames are a few lines each.
 *
 *   GET /           text/html `gpucloud-test-guest vm=NAME port=PORT`
 *   ANY /echo       text/plain: `METHOD PATH`, the headers as `name: value`, an empty line, the body
 *   GET /download   4194304 bytes: `0123456789abcde\n` repeated (`?mb=N`: N MiB of it)
 *   GET /ws         (WebSocket) echoes each text message
 */
import { createHash } from 'node:crypto';
import { createServer, type IncomingMessage, type Server } from 'node:http';
import net, { type AddressInfo } from 'node:net';
import type { Duplex } from 'node:stream';

export const DOWNLOAD_BYTES = 4 * 1024 * 1024;
const LINE = Buffer.from('0123456789abcde\n');
export const downloadBody = (): Buffer => Buffer.concat(Array.from({ length: DOWNLOAD_BYTES / 16 }, () => LINE));

const WS_GUID = '258EAFA5-E914-47DA-95CA-C5AB0DC85B11';

/** One text frame, masked as a client must send it (RFC 6455). */
export function wsFrame(text: string, masked: boolean): Buffer {
  const payload = Buffer.from(text);
  const len = payload.length;
  const head =
    len < 126
      ? Buffer.from([0x81, (masked ? 0x80 : 0) | len])
      : Buffer.from([0x81, (masked ? 0x80 : 0) | 126, len >> 8, len & 255]);
  if (!masked) return Buffer.concat([head, payload]);
  const mask = Buffer.from([1, 2, 3, 4]);
  return Buffer.concat([head, mask, Buffer.from(payload.map((b, i) => b ^ mask[i % 4]!))]);
}

/** Reads one frame's text from `buf`, or null when it is not complete yet. */
export function readFrame(buf: Buffer): { text: string; rest: Buffer } | null {
  if (buf.length < 2) return null;
  const masked = (buf[1]! & 0x80) !== 0;
  let len = buf[1]! & 0x7f;
  let off = 2;
  if (len === 126) {
    if (buf.length < 4) return null;
    len = buf.readUInt16BE(2);
    off = 4;
  }
  const maskAt = off;
  if (masked) off += 4;
  if (buf.length < off + len) return null;
  let payload = buf.subarray(off, off + len);
  if (masked) payload = Buffer.from(payload.map((b, i) => b ^ buf[maskAt + (i % 4)]!));
  return { text: payload.toString(), rest: buf.subarray(off + len) };
}

function serveWebSocket(req: IncomingMessage, socket: Duplex, head: Buffer): void {
  const key = req.headers['sec-websocket-key'];
  if (req.url !== '/ws' || typeof key !== 'string') {
    socket.end('HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n');
    return;
  }
  const accept = createHash('sha1')
    .update(key + WS_GUID)
    .digest('base64');
  socket.write(
    `HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ${accept}\r\n\r\n`,
  );
  let buf = head;
  socket.on('data', (d: Buffer) => {
    buf = Buffer.concat([buf, d]);
    for (let f = readFrame(buf); f; f = readFrame(buf)) {
      buf = f.rest;
      socket.write(wsFrame(f.text, false));
    }
  });
  socket.on('end', () => socket.end());
  socket.on('error', () => socket.destroy());
}

/** Starts the stand-in on 127.0.0.1 (any port); `name` stands for the guest's host name. */
export async function startGuestApp(name: string): Promise<{ server: Server; port: number }> {
  const server = createServer((req, res) => {
    const port = (req.socket.localAddress && (server.address() as AddressInfo).port) || 0;
    if (req.url === '/' || req.url?.startsWith('/?')) {
      res.writeHead(200, { 'content-type': 'text/html' });
      res.end(`<!doctype html><title>guest</title><p>gpucloud-test-guest vm=${name} port=${port}</p>`);
      return;
    }
    if (req.url?.startsWith('/echo')) {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        const lines = [`${req.method} ${req.url}`];
        for (let i = 0; i < req.rawHeaders.length; i += 2)
          lines.push(`${req.rawHeaders[i]!.toLowerCase()}: ${req.rawHeaders[i + 1]}`);
        res.writeHead(200, { 'content-type': 'text/plain' });
        res.end(Buffer.concat([Buffer.from(`${lines.join('\n')}\n\n`), ...chunks]));
      });
      return;
    }
    const mb = /^\/download(?:\?mb=([1-9][0-9]{0,3}))?$/.exec(req.url ?? '');
    if (mb) {
      // ?mb=N (the benchmark's large downloads): N MiB of the same pattern.
      const body = mb[1]
        ? Buffer.concat(Array.from({ length: Number(mb[1]) }, () => downloadBody().subarray(0, 1024 * 1024)))
        : downloadBody();
      res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': body.length });
      let at = 0;
      const pump = () => {
        while (at < body.length) {
          const part = body.subarray(at, at + 65536);
          at += part.length;
          if (!res.write(part)) return void res.once('drain', pump);
        }
        res.end();
      };
      pump();
      return;
    }
    res.writeHead(404, { 'content-type': 'text/plain' });
    res.end('not found');
  });
  server.on('upgrade', serveWebSocket);
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return { server, port: (server.address() as AddressInfo).port };
}

/** Opens a WebSocket at `path` on 127.0.0.1:`port` with these headers; resolves with the socket after the answer. */
export function wsConnect(
  port: number,
  path: string,
  headers: Record<string, string>,
): Promise<{ socket: net.Socket; status: number; head: string }> {
  return new Promise((resolve, reject) => {
    const socket = net.connect(port, '127.0.0.1');
    let buf = '';
    socket.setEncoding('latin1');
    const onData = (d: string) => {
      buf += d;
      const end = buf.indexOf('\r\n\r\n');
      if (end < 0) return;
      socket.off('data', onData);
      const status = Number(/^HTTP\/1\.1 (\d{3})/.exec(buf)?.[1] ?? 0);
      socket.setEncoding(undefined as unknown as BufferEncoding);
      resolve({ socket, status, head: buf.slice(0, end + 4) + (status === 101 ? '' : buf.slice(end + 4)) });
    };
    socket.on('data', onData);
    socket.on('error', reject);
    const lines = [
      `GET ${path} HTTP/1.1`,
      'Connection: Upgrade',
      'Upgrade: websocket',
      'Sec-WebSocket-Version: 13',
      `Sec-WebSocket-Key: ${Buffer.from('gpucloud-test-key').toString('base64')}`,
      ...Object.entries(headers).map(([k, v]) => `${k}: ${v}`),
    ];
    socket.write(`${lines.join('\r\n')}\r\n\r\n`);
  });
}

/** Sends one text message and resolves with the one that comes back. */
export function wsEcho(socket: net.Socket, text: string): Promise<string> {
  return new Promise((resolve, reject) => {
    let buf = Buffer.alloc(0);
    const onData = (d: Buffer | string) => {
      buf = Buffer.concat([buf, typeof d === 'string' ? Buffer.from(d, 'latin1') : d]);
      const f = readFrame(buf);
      if (f) {
        socket.off('data', onData);
        resolve(f.text);
      }
    };
    socket.on('data', onData);
    socket.once('error', reject);
    socket.write(wsFrame(text, true));
  });
}
