/**
 * Two byte streams joined, and the plain HTTP answer written straight on a
 * socket: shared by the host agent's tunnel (src/host-agent/tunnel.ts) and the
 * access portal (src/modules/portal/), which both pass upgraded connections on.
 */
import { STATUS_CODES } from 'node:http';
import type { Duplex } from 'node:stream';

/**
 * Passes bytes both ways between two streams until either side is done: an end from one side ends the
 * other once what is queued is written, and a close or an error of either closes both (no half-open
 * connection is kept waiting for a peer that has gone).
 */
export function splice(a: Duplex, b: Duplex): void {
  const endSoon = (s: Duplex) => (s as Duplex & { destroySoon?: () => void }).destroySoon?.() ?? s.end();
  a.pipe(b, { end: false });
  b.pipe(a, { end: false });
  a.on('end', () => endSoon(b));
  b.on('end', () => endSoon(a));
  a.on('close', () => b.destroy());
  b.on('close', () => a.destroy());
  a.on('error', () => a.destroy());
  b.on('error', () => b.destroy());
}

/** An error `{detail, code}` written as a whole HTTP answer on a socket that no HTTP server answers for. */
export function rawAnswer(socket: { end(s: string): void }, status: number, code: string, detail: string): void {
  const body = JSON.stringify({ detail, code });
  socket.end(
    `HTTP/1.1 ${status} ${STATUS_CODES[status] ?? 'Error'}\r\ncontent-type: application/json; charset=utf-8\r\n` +
      `content-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`,
  );
}
