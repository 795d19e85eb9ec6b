/**
 * Requests the service makes to addresses its customers name (webhook
 * endpoints), safe against server-side request forgery: only http and https;
 * every address a name resolves to must be outside every range of the IANA
 * special-purpose address registries (loopback, private, link-local and the
 * cloud metadata addresses among them) and outside multicast, checked on the
 * connection itself so a name cannot resolve to one address when checked and
 * another when used; no redirects; at most 64 KB of the answer read; one
 * deadline for the whole exchange. See docs/webhooks.md, "Safety".
 */
import { BlockList, isIP } from 'node:net';
import { lookup as dnsLookup, type LookupAddress } from 'node:dns';
import http from 'node:http';
import https from 'node:https';

/** A range of addresses no webhook is sent to. */
export interface SpecialRange {
  /** The range in CIDR notation, as its registry writes it. */
  cidr: string;
  /** What it is for, as the message of a refusal names it. */
  name: string;
  /** Where it is defined. */
  rfc: string;
}

/**
 * Every entry of the IANA IPv4 Special-Purpose Address Registry, whether the registry marks it globally
 * reachable or not (an anycast service or a relay is no receiver of webhooks, and one rule without exceptions
 * leaves nothing to get wrong), plus multicast. Keep it in step with the registry and docs/webhooks.md#safety.
 */
export const SPECIAL_PURPOSE_V4: readonly SpecialRange[] = [
  { cidr: '0.0.0.0/8', name: '"this network"', rfc: 'RFC 791' },
  { cidr: '0.0.0.0/32', name: '"this host on this network"', rfc: 'RFC 1122' },
  { cidr: '10.0.0.0/8', name: 'private use', rfc: 'RFC 1918' },
  { cidr: '100.64.0.0/10', name: 'shared address space (carrier-grade NAT)', rfc: 'RFC 6598' },
  { cidr: '127.0.0.0/8', name: 'loopback', rfc: 'RFC 1122' },
  { cidr: '169.254.0.0/16', name: 'link-local (cloud metadata services)', rfc: 'RFC 3927' },
  { cidr: '172.16.0.0/12', name: 'private use', rfc: 'RFC 1918' },
  { cidr: '192.0.0.0/24', name: 'IETF protocol assignments', rfc: 'RFC 6890' },
  { cidr: '192.0.0.0/29', name: 'IPv4 service continuity prefix', rfc: 'RFC 7335' },
  { cidr: '192.0.0.8/32', name: 'IPv4 dummy address', rfc: 'RFC 7600' },
  { cidr: '192.0.0.9/32', name: 'Port Control Protocol anycast', rfc: 'RFC 7723' },
  { cidr: '192.0.0.10/32', name: 'TURN anycast', rfc: 'RFC 8155' },
  { cidr: '192.0.0.170/32', name: 'NAT64/DNS64 discovery', rfc: 'RFC 8880' },
  { cidr: '192.0.0.171/32', name: 'NAT64/DNS64 discovery', rfc: 'RFC 8880' },
  { cidr: '192.0.2.0/24', name: 'documentation (TEST-NET-1)', rfc: 'RFC 5737' },
  { cidr: '192.31.196.0/24', name: 'AS112-v4', rfc: 'RFC 7535' },
  { cidr: '192.52.193.0/24', name: 'AMT', rfc: 'RFC 7450' },
  { cidr: '192.88.99.0/24', name: 'deprecated 6to4 relay anycast', rfc: 'RFC 7526' },
  { cidr: '192.88.99.2/32', name: '6a44 relay anycast', rfc: 'RFC 6751' },
  { cidr: '192.168.0.0/16', name: 'private use', rfc: 'RFC 1918' },
  { cidr: '192.175.48.0/24', name: 'direct delegation AS112 service', rfc: 'RFC 7534' },
  { cidr: '198.18.0.0/15', name: 'benchmarking', rfc: 'RFC 2544' },
  { cidr: '198.51.100.0/24', name: 'documentation (TEST-NET-2)', rfc: 'RFC 5737' },
  { cidr: '203.0.113.0/24', name: 'documentation (TEST-NET-3)', rfc: 'RFC 5737' },
  { cidr: '240.0.0.0/4', name: 'reserved', rfc: 'RFC 1112' },
  { cidr: '255.255.255.255/32', name: 'limited broadcast', rfc: 'RFC 919' },
  // Not in the special-purpose registry (it has one of its own), never a receiver:
  { cidr: '224.0.0.0/4', name: 'multicast', rfc: 'RFC 5771' },
];

/**
 * Every entry of the IANA IPv6 Special-Purpose Address Registry, globally reachable or not, plus multicast and
 * the forms that carry an IPv4 address or were retired from unicast use. Whole ranges are refused, never judged
 * by an IPv4 address they may carry: a translator's or a relay's own mapping is not the service's to read.
 */
export const SPECIAL_PURPOSE_V6: readonly SpecialRange[] = [
  { cidr: '::1/128', name: 'loopback', rfc: 'RFC 4291' },
  { cidr: '::/128', name: 'unspecified', rfc: 'RFC 4291' },
  { cidr: '::ffff:0:0/96', name: 'IPv4-mapped', rfc: 'RFC 4291' },
  { cidr: '64:ff9b::/96', name: 'IPv4-IPv6 translation (NAT64)', rfc: 'RFC 6052' },
  { cidr: '64:ff9b:1::/48', name: 'IPv4-IPv6 translation, local use (NAT64)', rfc: 'RFC 8215' },
  { cidr: '100::/64', name: 'discard-only', rfc: 'RFC 6666' },
  { cidr: '100:0:0:1::/64', name: 'dummy IPv6 prefix', rfc: 'RFC 9780' },
  { cidr: '2001::/23', name: 'IETF protocol assignments', rfc: 'RFC 2928' },
  { cidr: '2001::/32', name: 'Teredo', rfc: 'RFC 4380' },
  { cidr: '2001:1::1/128', name: 'Port Control Protocol anycast', rfc: 'RFC 7723' },
  { cidr: '2001:1::2/128', name: 'TURN anycast', rfc: 'RFC 8155' },
  { cidr: '2001:1::3/128', name: 'DNS-SD service registration anycast', rfc: 'RFC 9665' },
  { cidr: '2001:2::/48', name: 'benchmarking', rfc: 'RFC 5180' },
  { cidr: '2001:3::/32', name: 'AMT', rfc: 'RFC 7450' },
  { cidr: '2001:4:112::/48', name: 'AS112-v6', rfc: 'RFC 7535' },
  { cidr: '2001:10::/28', name: 'deprecated ORCHID', rfc: 'RFC 4843' },
  { cidr: '2001:20::/28', name: 'ORCHIDv2', rfc: 'RFC 7343' },
  { cidr: '2001:30::/28', name: 'drone remote ID entity tags', rfc: 'RFC 9374' },
  { cidr: '2001:db8::/32', name: 'documentation', rfc: 'RFC 3849' },
  { cidr: '2002::/16', name: '6to4', rfc: 'RFC 3056' },
  { cidr: '2620:4f:8000::/48', name: 'direct delegation AS112 service', rfc: 'RFC 7534' },
  { cidr: '3fff::/20', name: 'documentation', rfc: 'RFC 9637' },
  { cidr: '5f00::/16', name: 'segment routing (SRv6) SIDs', rfc: 'RFC 9602' },
  { cidr: 'fc00::/7', name: 'unique local (AWS metadata service)', rfc: 'RFC 4193' },
  { cidr: 'fe80::/10', name: 'link-local', rfc: 'RFC 4291' },
  // Not in the special-purpose registry, never a receiver:
  { cidr: '::/96', name: 'IPv4-compatible (deprecated)', rfc: 'RFC 4291' },
  { cidr: '::ffff:0:0:0/96', name: 'IPv4-translated', rfc: 'RFC 2765' },
  { cidr: 'fec0::/10', name: 'site-local (deprecated)', rfc: 'RFC 3879' },
  { cidr: 'ff00::/8', name: 'multicast', rfc: 'RFC 4291' },
];

interface Compiled extends SpecialRange {
  prefix: number;
  list: BlockList;
}

/**
 * One BlockList per range, each holding one family only: a BlockList with an IPv6 rule for ::ffff:0:0/96 also
 * matches every IPv4 address it is asked about, so the families never share a list.
 */
function compile(ranges: readonly SpecialRange[], family: 'ipv4' | 'ipv6'): Compiled[] {
  return ranges.map((r) => {
    const [net, bits] = r.cidr.split('/') as [string, string];
    const list = new BlockList();
    list.addSubnet(net, Number(bits), family);
    return { ...r, prefix: Number(bits), list };
  });
}
const V4 = compile(SPECIAL_PURPOSE_V4, 'ipv4');
const V6 = compile(SPECIAL_PURPOSE_V6, 'ipv6');

/** An address without its IPv6 zone (fe80::1%eth0: the zone says which interface, not where). */
const unzoned = (address: string) => address.split('%')[0]!;

/** The special-purpose range `address` is in (the narrowest, when ranges nest), or undefined (also for a non-IP). */
export function specialRangeOf(address: string): SpecialRange | undefined {
  const a = unzoned(address);
  const family = isIP(a);
  if (family === 0) return undefined;
  let found: Compiled | undefined;
  for (const r of family === 4 ? V4 : V6) {
    if ((found === undefined || r.prefix > found.prefix) && r.list.check(a, family === 4 ? 'ipv4' : 'ipv6')) found = r;
  }
  return found && { cidr: found.cidr, name: found.name, rfc: found.rfc };
}

/** Whether a webhook may never be sent to this address: in a special-purpose range, or not an IP address at all. */
export function isForbiddenAddress(address: string): boolean {
  return isIP(unzoned(address)) === 0 || specialRangeOf(address) !== undefined;
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

/** Why `address` (what `host` resolves to) cannot receive a webhook: the special-purpose range it is in. */
const forbiddenMessage = (host: string, address: string) => {
  const r = specialRangeOf(address);
  const what = r ? `a special-purpose address (${r.cidr}, ${r.name})` : 'not an IP address';
  return host === address ? `${address} is ${what}` : `${host} resolves to ${address}, ${what}`;
};

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
