/**
 * Is SSH up inside a VM, and which host port can forward to it. Rules:
 *
 * - QEMU's user networking accepts a forwarded TCP connection before the
 *   guest listens (and then drops it), so a successful connect proves
 *   nothing: SSH is up only when the server's identification line
 *   (`SSH-2.0-...`, or `SSH-1.99-...` from servers that also speak 1.x)
 *   arrives. RFC 4253 lets a server send other lines first; up to 8 KiB of
 *   them are skipped.
 * - `sshBanner` never throws: a refused, reset, silent or non-SSH peer, a
 *   timeout and bad arguments all give null. It sends nothing.
 * - `freePortInRange` returns the lowest port of [from, to] outside `taken`
 *   that can be bound on `host` right now, and leaves it in `taken`: each
 *   candidate is added to `taken` before its probe and removed again if the
 *   probe fails, so callers that share one set never get the same port, however
 *   their probes interleave. The probe's socket is closed again: a program
 *   outside the agent may still take the port before QEMU does. Ports in use
 *   or refused (EADDRINUSE, EACCES) are skipped; any other bind error (an
 *   address that is not local, say) is thrown, as it would fail for every port.
 */
import net from 'node:net';

const MAX_PRE_BANNER = 8 * 1024;

export function sshBanner(host: string, port: number, timeoutMs: number): Promise<string | null> {
  return new Promise((resolve) => {
    let socket: net.Socket;
    let settled = false;
    let timer: NodeJS.Timeout | undefined;
    const finish = (v: string | null): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      socket?.destroy();
      resolve(v);
    };
    try {
      if (!Number.isInteger(port) || port < 1 || port > 65535 || !(timeoutMs >= 0)) return finish(null);
      timer = setTimeout(() => finish(null), timeoutMs);
      socket = net.createConnection({ host, port });
    } catch {
      return finish(null);
    }
    let buf = '';
    socket.setEncoding('latin1');
    socket.on('data', (chunk: string) => {
      buf += chunk;
      let nl: number;
      while ((nl = buf.indexOf('\n')) >= 0) {
        const line = buf.slice(0, nl).replace(/\r$/, '');
        buf = buf.slice(nl + 1);
        if (line.startsWith('SSH-'))
          return finish(line.startsWith('SSH-2.0-') || line.startsWith('SSH-1.99-') ? line : null);
      }
      if (buf.length > MAX_PRE_BANNER) finish(null);
    });
    socket.on('error', () => finish(null));
    socket.on('close', () => finish(null));
  });
}

export async function freePortInRange(
  from: number,
  to: number,
  taken: Set<number>,
  host: string,
): Promise<number | null> {
  for (const [v, what] of [
    [from, 'from'],
    [to, 'to'],
  ] as const) {
    if (!Number.isInteger(v) || v < 1 || v > 65535) throw new RangeError(`bad port ${what}: ${v}`);
  }
  for (let port = from; port <= to; port++) {
    if (taken.has(port)) continue;
    taken.add(port); // claimed before the first await: a concurrent caller skips it
    let free = false;
    try {
      free = await canBind(host, port);
    } finally {
      if (!free) taken.delete(port);
    }
    if (free) return port;
  }
  return null;
}

/** A TCP port on 127.0.0.1 that is free now (the system's choice); the caller binds it soon after. */
export function loopbackPort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once('error', reject);
    server.listen({ host: '127.0.0.1', port: 0, exclusive: true }, () => {
      const port = (server.address() as net.AddressInfo).port;
      server.close(() => resolve(port));
    });
  });
}

function canBind(host: string, port: number): Promise<boolean> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once('error', (err: NodeJS.ErrnoException) => {
      if (err.code === 'EADDRINUSE' || err.code === 'EACCES') resolve(false);
      else reject(err);
    });
    server.listen({ host, port, exclusive: true }, () => server.close(() => resolve(true)));
  });
}
