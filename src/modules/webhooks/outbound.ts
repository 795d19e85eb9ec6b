/**
 * Requests the service makes to addresses its customers name (webhook
 * endpoints), safe against server-side request forgery: only http and https;
 * every address a name resolves to must be public (not loopback, private,
 * link-local, multicast, reserved or a cloud metadata address), checked on
 * the connection itself so a name cannot resolve to one address when checked
 * and another when used; no redirects; at most 64 KB of the answer read; one
 * deadline for the whole exchange. See docs/webhooks.md, "Safety".
 */
import { BlockList, isIP } from 'node:net';
import { lookup as dnsLookup, type LookupAddress } from 'node:dns';
import http from 'node:http';
import https from 'node:https';

const blocked = new BlockList();
const V4: Array<[string, number]> = [
  ['0.0.0.0', 8], // "this network"
  ['10.0.0.0', 8], // private
  ['100.64.0.0', 10], // carrier-grade NAT (also Alibaba's metadata address, 100.100.100.200)
  ['127.0.0.0', 8], // loopback
  ['169.254.0.0', 16], // link-local, with the metadata address of most clouds (169.254.169.254)
  ['172.16.0.0', 12], // private
  ['192.0.0.0', 24], // protocol assignments (Oracle's metadata address, 192.0.0.192)
  ['192.0.2.0', 24], // documentation
  ['192.88.99.0', 24], // 6to4 relays
  ['192.168.0.0', 16], // private
  ['198.18.0.0', 15], // benchmarking
  ['198.51.100.0', 24], // documentation
  ['203.0.113.0', 24], // documentation
  ['224.0.0.0', 4], // multicast
  ['240.0.0.0', 4], // reserved, and the broadcast address
];
const V6: Array<[string, number]> = [
  ['::', 96], // unspecified, loopback and IPv4-compatible addresses
  ['100::', 64], // discard
  ['2001::', 32], // Teredo (an IPv4 address behind it cannot be checked)
  ['2001:db8::', 32], // documentation
  ['fc00::', 7], // unique local (AWS's IPv6 metadata address, fd00:ec2::254)
  ['fe80::', 10], // link-local
  ['fec0::', 10], // site-local (deprecated)
  ['ff00::', 8], // multicast
];
for (const [net, prefix] of V4) blocked.addSubnet(net, prefix, 'ipv4');
for (const [net, prefix] of V6) blocked.addSubnet(net, prefix, 'ipv6');

/** The 16 bytes of an IPv6 address (valid input assumed: it comes from isIP or the resolver). */
function ipv6Bytes(address: string): number[] {
  let a = address.split('%')[0]!;
  const dotted = /(\d+\.\d+\.\d+\.\d+)$/.exec(a);
  if (dotted) {
    const p = dotted[1]!.split('.').map(Number);
    a =
      a.slice(0, -dotted[1]!.length) + `${((p[0]! << 8) | p[1]!).toString(16)}:${((p[2]! << 8) | p[3]!).toString(16)}`;
  }
  const [head, tail] = a.includes('::') ? a.split('::') : [a, undefined];
  const h = head ? head.split(':') : [];
  const t = tail ? tail.split(':') : [];
  const groups = tail === undefined ? h : [...h, ...Array<string>(8 - h.length - t.length).fill('0'), ...t];
  return groups.flatMap((g) => {
    const n = parseInt(g, 16);
    return [n >> 8, n & 0xff];
  });
}

/** An IPv4 address carried inside an IPv6 one (NAT64 64:ff9b::/96, 6to4 2002::/16), if any. */
function embeddedV4(address: string): string | undefined {
  const b = ipv6Bytes(address);
  if (b.slice(0, 12).join('.') === '0.100.255.155.0.0.0.0.0.0.0.0') return b.slice(12).join('.');
  if (b[0] === 0x20 && b[1] === 0x02) return b.slice(2, 6).join('.');
  return undefined;
}

/** Whether a webhook may never be sent to this address (IPv4-mapped IPv6 addresses count as their IPv4 address). */
export function isForbiddenAddress(address: string): boolean {
  const family = isIP(address);
  if (family === 4) return blocked.check(address, 'ipv4');
  if (family !== 6) return true;
  if (blocked.check(address, 'ipv6')) return true;
  const v4 = embeddedV4(address);
  return v4 !== undefined && blocked.check(v4, 'ipv4');
}

/** Why this URL can never receive a webhook (its form alone), or undefined. */
export function urlFormProblem(raw: string): string | undefined {
  let u: URL;
  try {
    u = new URL(raw);
  } catch {
    return 'must be an absolute http or https URL';
  }
  if (u.protocol !== 'http:' && u.protocol !== 'https:')
    return `must use http or https, not ${u.protocol.replace(/:$/, '')}`;
  if (!u.hostname) return 'must name a host';
  return undefined;
}

const hostOf = (u: URL) => u.hostname.replace(/^\[|\]$/g, '');

class ForbiddenAddress extends Error {
  readonly code = 'EFORBIDDEN';
}

/** The first of `addresses` a webhook may not go to (none when private addresses are allowed). */
const firstForbidden = (addresses: readonly LookupAddress[], allowPrivate: boolean) =>
  allowPrivate ? undefined : addresses.find((a) => isForbiddenAddress(a.address));

/** All the addresses a name resolves to, in the resolver's order. */
const resolveAll = (host: string, family = 0) =>
  new Promise<LookupAddress[]>((resolve, reject) =>
    dnsLookup(host, { all: true, verbatim: true, family }, (err, addresses) =>
      err ? reject(err) : resolve(addresses),
    ),
  );

const forbiddenMessage = (host: string, address: string) =>
  host === address
    ? `${address} is a loopback, private, link-local, multicast or reserved address`
    : `${host} resolves to ${address}, a loopback, private, link-local, multicast or reserved address`;

/**
 * Why the URL's host cannot receive webhooks now (a forbidden address, a name
 * that does not exist), or undefined. A resolver that cannot answer at all is
 * no reason: every delivery checks again.
 */
export async function hostProblem(raw: string, allowPrivate: boolean): Promise<string | undefined> {
  const host = hostOf(new URL(raw));
  if (isIP(host)) return !allowPrivate && isForbiddenAddress(host) ? forbiddenMessage(host, host) : undefined;
  let addresses: LookupAddress[];
  try {
    addresses = await resolveAll(host);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    return code === 'ENOTFOUND' || code === 'ENODATA' ? `${host} does not resolve` : undefined;
  }
  const bad = firstForbidden(addresses, allowPrivate);
  return bad ? forbiddenMessage(host, bad.address) : undefined;
}

/** A resolver for http.request that refuses names resolving to forbidden addresses, on the connection itself. */
function safeLookup(allowPrivate: boolean) {
  return (
    hostname: string,
    options: { all?: boolean; family?: number },
    callback: (...args: unknown[]) => void,
  ): void => {
    resolveAll(hostname, options.family ?? 0).then((addresses) => {
      const bad = firstForbidden(addresses, allowPrivate);
      if (bad) return callback(new ForbiddenAddress(forbiddenMessage(hostname, bad.address)));
      if (addresses.length === 0)
        return callback(Object.assign(new Error(`${hostname} does not resolve`), { code: 'ENOTFOUND' }));
      if (options.all) return callback(null, addresses);
      callback(null, addresses[0]!.address, addresses[0]!.family);
    }, callback);
  };
}

export interface PostOutcome {
  /** The HTTP status, when an answer came. */
  status?: number;
  /** Why there was no answer (or the answer could not be read). */
  error?: string;
  durationMs: number;
}

/** How much of an answer is read at most; the rest is dropped with the connection. */
export const MAX_ANSWER_BYTES = 64 * 1024;

const errorText = (err: Error & { code?: string }, host: string): string => {
  if (err instanceof ForbiddenAddress) return err.message;
  switch (err.code) {
    case 'ECONNREFUSED':
      return `connection refused by ${host}`;
    case 'ENOTFOUND':
      return `${host} does not resolve`;
    case 'ECONNRESET':
      return `connection reset by ${host}`;
    default:
      return err.message.slice(0, 300) || String(err.code ?? 'request failed');
  }
};

/**
 * POSTs `body` to `url` and reports the answer's status or why there was
 * none. Never throws; never follows a redirect (a 3xx is an answer like
 * any other); resolves within `timeoutMs` whatever the other end does.
 */
export function postJson(
  url: string,
  headers: Record<string, string>,
  body: string,
  o: { timeoutMs: number; allowPrivate: boolean },
): Promise<PostOutcome> {
  const started = performance.now();
  const took = () => Math.round(performance.now() - started);
  const problem = urlFormProblem(url);
  if (problem) return Promise.resolve({ error: `the URL ${problem}`, durationMs: 0 });
  const u = new URL(url);
  const host = hostOf(u);
  if (isIP(host) && !o.allowPrivate && isForbiddenAddress(host))
    return Promise.resolve({ error: forbiddenMessage(host, host), durationMs: 0 });
  return new Promise<PostOutcome>((resolve) => {
    let done = false;
    const finish = (r: Omit<PostOutcome, 'durationMs'>) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      resolve({ ...r, durationMs: took() });
    };
    const req = (u.protocol === 'https:' ? https : http).request(u, {
      method: 'POST',
      agent: false,
      lookup: safeLookup(o.allowPrivate) as never,
      headers: {
        ...headers,
        'content-type': 'application/json',
        'content-length': String(Buffer.byteLength(body)),
        'user-agent': 'gpucloud-webhooks/1',
      },
    });
    const timer = setTimeout(() => {
      finish({ error: `no answer within ${Math.round(o.timeoutMs / 1000)} s` });
      req.destroy();
    }, o.timeoutMs);
    req.on('error', (err) => finish({ error: errorText(err, host) }));
    req.on('response', (res) => {
      let read = 0;
      res.on('data', (chunk: Buffer) => {
        read += chunk.length;
        if (read > MAX_ANSWER_BYTES) {
          // Enough: the status is what counts; the connection goes.
          finish({ status: res.statusCode });
          res.destroy();
        }
      });
      res.on('end', () => finish({ status: res.statusCode }));
      res.on('error', (err) => finish({ status: res.statusCode, error: errorText(err, host) }));
      res.on('close', () => finish({ status: res.statusCode }));
    });
    req.end(body);
  });
}
