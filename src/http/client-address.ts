/**
 * Who the client is, behind reverse proxies (docs/operations.md#proxies).
 * GPUCLOUD_TRUST_PROXY names the proxies whose forwarding headers are
 * believed: off (the default: the peer is the client), a hop count (that many
 * proxies stand in front, whatever their addresses), or addresses and CIDRs
 * (and `loopback`, `linklocal`, `uniquelocal`). The client address is then the
 * first untrusted address of `X-Forwarded-For`, read from the right; a request
 * that carries only the standard `Forwarded` header is read the same way. A
 * sender that is not trusted has its forwarding headers ignored. Rate limits,
 * login limits, logs, sessions and the access portal all use this address.
 */
import type { IncomingMessage } from 'node:http';
import { isIP } from 'node:net';
import proxyaddr from '@fastify/proxy-addr';

export type TrustProxy = false | { hops: number } | { addresses: string[] };

export type TrustFn = (addr: string, i: number) => boolean;

const NAMED = new Set(['loopback', 'linklocal', 'uniquelocal']);

/** Parses GPUCLOUD_TRUST_PROXY; throws a message naming what is wrong. */
export function parseTrustProxy(raw: string | undefined): TrustProxy {
  const v = raw?.trim() ?? '';
  if (v === '' || v === 'off' || v === 'false' || v === '0') return false;
  if (/^\d+$/.test(v)) {
    const hops = Number(v);
    if (hops < 1 || hops > 10) throw new Error(`a hop count must be 1 to 10, got ${v}`);
    return { hops };
  }
  const addresses = v.split(',').map((s) => s.trim());
  for (const a of addresses) {
    if (NAMED.has(a)) continue;
    const [ip, prefix, more] = a.split('/');
    const family = isIP(ip ?? '');
    const max = family === 4 ? 32 : 128;
    if (!family || more !== undefined || (prefix !== undefined && !(/^\d+$/.test(prefix) && Number(prefix) <= max)))
      throw new Error(`"${a}" is not an address, a CIDR, loopback, linklocal or uniquelocal`);
  }
  return { addresses };
}

/** The trust function of proxy-addr for a setting; null when no proxy is trusted. */
export function trustFunction(tp: TrustProxy): TrustFn | null {
  if (tp === false) return null;
  if ('hops' in tp) return (_addr, i) => i < tp.hops;
  return proxyaddr.compile(tp.addresses);
}

/**
 * A request that names its client only with `Forwarded` (RFC 7239) gets the same list as
 * `X-Forwarded-For`, so one rule reads both. Only from a trusted peer; otherwise nothing changes.
 */
export function readForwarded(req: IncomingMessage, trust: TrustFn | null): void {
  const forwarded = req.headers.forwarded;
  if (!trust || !forwarded || req.headers['x-forwarded-for'] !== undefined) return;
  if (!trust(req.socket.remoteAddress ?? '', 0)) return;
  const fors: string[] = [];
  for (const element of forwarded.split(',')) {
    for (const pair of element.split(';')) {
      const m = /^\s*for\s*=\s*"?([^";]*)"?\s*$/i.exec(pair);
      if (!m) continue;
      // [2001:db8::1]:4711 and 192.0.2.60:4711 -> the address alone; obfuscated names stay as they are.
      const v = m[1]!.replace(/^\[([^\]]+)\](?::\d+)?$/, '$1').replace(/^(\d+\.\d+\.\d+\.\d+):\d+$/, '$1');
      fors.push(v);
    }
  }
  if (fors.length) req.headers['x-forwarded-for'] = fors.join(', ');
}

/** The client's address: the peer's, or, behind trusted proxies, the one they forwarded. */
export function clientAddress(req: IncomingMessage, trust: TrustFn | null): string {
  return trust ? proxyaddr(req, trust) : (req.socket.remoteAddress ?? '');
}

/** Whether a request carries any forwarding header (it came through a proxy, whatever the peer is). */
export function wasForwarded(req: IncomingMessage): boolean {
  const h = req.headers;
  return h['x-forwarded-for'] !== undefined || h.forwarded !== undefined || h['x-real-ip'] !== undefined;
}
