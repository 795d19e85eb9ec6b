/**
 * The agent's side of the access portal's tunnel: an HTTP upgrade
 * `GET /v1/vms/{id}/tunnel?port=N` (`Upgrade: gpucloud-tunnel`, the agent
 * token) becomes a raw TCP stream to that web port of that VM. Rules:
 *
 * - The token is checked as on every agent route (constant time); the id must
 *   be a UUID and the port one the VM was provisioned with (its template's web
 *   services and the customer's HTTP ports). Nothing else is ever reached: the
 *   target is the guest's bridge address or QEMU's loopback forward, never an
 *   address from the request.
 * - The agent connects first and answers `101 Switching Protocols` only once
 *   the guest accepted; otherwise an ordinary HTTP error `{detail, code}`
 *   (401, 403 `port_not_declared`, 404, 409 `not_running`, 502
 *   `guest_unreachable` when nothing listens on the port yet).
 * - After the 101 the bytes are passed through as they are, both ways; either
 *   side closing or failing closes the other.
 */
import net from 'node:net';
import type { IncomingMessage } from 'node:http';
import type { Duplex } from 'node:stream';
import { TUNNEL_PROTOCOL } from './api.js';
import { AgentError, UUID } from './errors.js';
import type { VmManager } from './vms.js';
import { rawAnswer, splice } from '../net/streams.js';

const PATH = /^\/v1\/vms\/([^/?]+)\/tunnel\?port=([1-9][0-9]{0,4})$/;
const CONNECT_TIMEOUT_MS = 5000;

/** Handles one upgrade request on the agent's server; `authorized` checks the Authorization header. */
export function handleTunnel(
  vms: VmManager,
  authorized: (header: string | undefined) => boolean,
  req: IncomingMessage,
  socket: Duplex,
  head: Buffer,
): void {
  socket.on('error', () => socket.destroy());
  if (!authorized(req.headers.authorization))
    return rawAnswer(socket, 401, 'unauthorized', 'a valid agent token is required');
  const m = PATH.exec(req.url ?? '');
  if (req.method !== 'GET' || !m) return rawAnswer(socket, 404, 'not_found', 'no such route');
  if ((req.headers.upgrade ?? '').toLowerCase() !== TUNNEL_PROTOCOL)
    return rawAnswer(socket, 400, 'bad_request', `the upgrade must be ${TUNNEL_PROTOCOL}`);
  const [id, port] = [decodeURIComponent(m[1]!), Number(m[2])];
  if (!UUID.test(id) || port > 65535) return rawAnswer(socket, 404, 'not_found', 'no such VM or port');
  let target: { host: string; port: number };
  try {
    target = vms.tunnelTarget(id, port);
  } catch (err) {
    if (err instanceof AgentError) return rawAnswer(socket, err.status, err.code, err.message);
    throw err;
  }
  const upstream = net.connect({ host: target.host, port: target.port });
  upstream.setTimeout(CONNECT_TIMEOUT_MS, () =>
    upstream.destroy(new Error(`no answer within ${CONNECT_TIMEOUT_MS / 1000} s`)),
  );
  let open = false;
  upstream.once('connect', () => {
    open = true;
    upstream.setTimeout(0);
    upstream.setNoDelay(true);
    socket.write(`HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: ${TUNNEL_PROTOCOL}\r\n\r\n`);
    if (head.length) upstream.write(head);
    splice(socket, upstream);
  });
  upstream.on('error', (err) => {
    if (!open)
      return rawAnswer(socket, 502, 'guest_unreachable', `nothing answers on port ${port} of the VM: ${err.message}`);
    socket.destroy();
  });
  // Until it connects, a closing socket ends the attempt; after that splice joins the two.
  socket.on('close', () => {
    if (!open) upstream.destroy();
  });
}
