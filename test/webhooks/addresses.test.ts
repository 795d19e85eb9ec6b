/**
 * The addresses a webhook may never go to: every range of the IANA IPv4 and
 * IPv6 Special-Purpose Address Registries (those the registry marks globally
 * reachable too), multicast, and the IPv6 forms that carry an IPv4 address or
 * were retired. Written out here by hand from the registries, not read from
 * src/, so that the service is checked against them: each range's first and
 * last address is refused by the check itself, and one address of each range
 * is refused by POST /webhooks (422 on body.url, the range named). Public
 * addresses, also those right next to a range, still pass.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { isIP } from 'node:net';
import { describeEachDb } from '../helpers/app.js';
import { createApiKey, createUser } from '../helpers/factories.js';
import { api } from '../helpers/api.js';
import { isForbiddenAddress, specialRangeOf } from '../../src/modules/webhooks/outbound.js';

/** IANA IPv4 Special-Purpose Address Registry, every entry, and multicast. */
const V4 = [
  '0.0.0.0/8',
  '0.0.0.0/32',
  '10.0.0.0/8',
  '100.64.0.0/10',
  '127.0.0.0/8',
  '169.254.0.0/16',
  '172.16.0.0/12',
  '192.0.0.0/24',
  '192.0.0.0/29',
  '192.0.0.8/32',
  '192.0.0.9/32',
  '192.0.0.10/32',
  '192.0.0.170/32',
  '192.0.0.171/32',
  '192.0.2.0/24',
  '192.31.196.0/24',
  '192.52.193.0/24',
  '192.88.99.0/24',
  '192.88.99.2/32',
  '192.168.0.0/16',
  '192.175.48.0/24',
  '198.18.0.0/15',
  '198.51.100.0/24',
  '203.0.113.0/24',
  '240.0.0.0/4',
  '255.255.255.255/32',
  '224.0.0.0/4',
];

/** IANA IPv6 Special-Purpose Address Registry, every entry; multicast; IPv4-compatible, IPv4-translated, site-local. */
const V6 = [
  '::1/128',
  '::/128',
  '::ffff:0:0/96',
  '64:ff9b::/96',
  '64:ff9b:1::/48',
  '100::/64',
  '100:0:0:1::/64',
  '2001::/23',
  '2001::/32',
  '2001:1::1/128',
  '2001:1::2/128',
  '2001:1::3/128',
  '2001:2::/48',
  '2001:3::/32',
  '2001:4:112::/48',
  '2001:10::/28',
  '2001:20::/28',
  '2001:30::/28',
  '2001:db8::/32',
  '2002::/16',
  '2620:4f:8000::/48',
  '3fff::/20',
  '5f00::/16',
  'fc00::/7',
  'fe80::/10',
  'ff00::/8',
  '::/96',
  '::ffff:0:0:0/96',
  'fec0::/10',
];

/** Public addresses, several right next to a refused range: they must pass. */
const PUBLIC = [
  '8.8.8.8',
  '1.1.1.1',
  '93.184.216.34',
  '9.255.255.255',
  '11.0.0.0',
  '100.63.255.255',
  '100.128.0.0',
  '172.15.255.255',
  '172.32.0.0',
  '192.0.1.0',
  '192.0.3.0',
  '192.31.195.255',
  '192.31.197.0',
  '192.88.98.255',
  '192.88.100.0',
  '192.167.255.255',
  '192.169.0.0',
  '198.17.255.255',
  '198.20.0.0',
  '223.255.255.255',
  '2606:4700:4700::1111',
  '2a00:1450:4001:80b::200e',
  '2001:200::1',
  '2003::1',
  '2620:4f:7fff:ffff:ffff:ffff:ffff:ffff',
  '2620:4f:8001::1',
  '3fff:1000::1',
  '2001:db9::1',
];

/** The 16 bytes of an IPv6 address as a bigint. */
function v6ToBig(a: string): bigint {
  const [head, tail] = a.includes('::') ? a.split('::') : [a, undefined];
  const h = head ? head.split(':') : [];
  const t = tail ? tail.split(':') : [];
  const groups = tail === undefined ? h : [...h, ...Array<string>(8 - h.length - t.length).fill('0'), ...t];
  assert.equal(groups.length, 8, a);
  return groups.reduce((n, g) => (n << 16n) | BigInt(parseInt(g, 16)), 0n);
}

const bigToV6 = (n: bigint) =>
  Array.from({ length: 8 }, (_, i) => ((n >> BigInt(16 * (7 - i))) & 0xffffn).toString(16)).join(':');
const v4ToBig = (a: string) => a.split('.').reduce((n, o) => (n << 8n) | BigInt(o), 0n);
const bigToV4 = (n: bigint) => [24n, 16n, 8n, 0n].map((s) => String((n >> s) & 0xffn)).join('.');

/** The first, a middle and the last address of a range. */
function addressesOf(cidr: string): { first: string; middle: string; last: string } {
  const [net, bitsText] = cidr.split('/') as [string, string];
  const v4 = isIP(net) === 4;
  const width = v4 ? 32n : 128n;
  const host = width - BigInt(bitsText);
  const first = v4 ? v4ToBig(net) : v6ToBig(net);
  const last = first | ((1n << host) - 1n);
  const middle = first + ((last - first) >> 1n);
  const fmt = v4 ? bigToV4 : bigToV6;
  return { first: fmt(first), middle: fmt(middle), last: fmt(last) };
}

/** Whether `address` is in `cidr`. */
function contains(cidr: string, address: string): boolean {
  const [net, bitsText] = cidr.split('/') as [string, string];
  const v4 = isIP(net) === 4;
  if (v4 !== (isIP(address) === 4)) return false;
  const host = (v4 ? 32n : 128n) - BigInt(bitsText);
  const toBig = v4 ? v4ToBig : v6ToBig;
  return toBig(address) >> host === toBig(net) >> host;
}

/** The narrowest range of the lists above that holds `address` (the one a refusal names). */
const narrowest = (address: string) =>
  [...V4, ...V6]
    .filter((c) => contains(c, address))
    .sort((a, b) => Number(b.split('/')[1]) - Number(a.split('/')[1]))[0];

const urlOf = (address: string) => (isIP(address) === 6 ? `http://[${address}]/hook` : `http://${address}/hook`);

/** The two forms that once passed: IPv4-translated loopback, and loopback behind the local-use NAT64 prefix. */
const ONCE_PASSED = ['http://[::ffff:0:7f00:1]/', 'http://[64:ff9b:1::7f00:1]/', 'http://[64:ff9b:1:7f00:1::]/'];

describe('the address check', () => {
  for (const cidr of [...V4, ...V6]) {
    test(`refuses every address of ${cidr}`, () => {
      const { first, middle, last } = addressesOf(cidr);
      for (const a of [first, middle, last]) {
        assert.ok(isForbiddenAddress(a), `${a} of ${cidr} is refused`);
        assert.equal(specialRangeOf(a)?.cidr, narrowest(a), `${a} of ${cidr}: the narrowest range holding it is named`);
      }
    });
  }

  test('lets public addresses through, also those right next to a refused range', () => {
    for (const a of PUBLIC) assert.equal(isForbiddenAddress(a), false, `${a} is public`);
  });

  test('an IPv6 zone does not hide a link-local address; something that is not an address is refused', () => {
    assert.ok(isForbiddenAddress('fe80::1%eth0'));
    assert.ok(isForbiddenAddress('example.com'));
    assert.ok(isForbiddenAddress(''));
  });

  test('the IPv4-translated and local-use NAT64 forms of loopback are refused', () => {
    assert.equal(specialRangeOf('::ffff:0:7f00:1')?.cidr, '::ffff:0:0:0/96');
    assert.equal(specialRangeOf('64:ff9b:1::7f00:1')?.cidr, '64:ff9b:1::/48');
    assert.equal(specialRangeOf('64:ff9b:1:7f00:1::')?.cidr, '64:ff9b:1::/48');
    // The well-known NAT64 prefix is refused whole, whatever IPv4 address it carries.
    assert.equal(specialRangeOf('64:ff9b::808:808')?.cidr, '64:ff9b::/96');
  });
});

describeEachDb('webhooks: special-purpose addresses through the API', (t) => {
  const refuse = async (url: string, what: string, range?: string) => {
    const u = await user();
    const r = await api(t(), u).post('/webhooks', { body: { url } });
    assert.equal(r.status, 422, `${what}: ${url} is refused: ${r.text}`);
    assert.equal(r.body.code, 'validation_error', what);
    assert.equal(r.body.errors?.[0]?.field, 'body.url', what);
    assert.match(r.body.detail, /cannot receive webhooks: .* is a special-purpose address \(/, what);
    if (range) assert.ok(r.body.detail.includes(`(${range}, `), `${what}: the detail names ${range}: ${r.body.detail}`);
  };
  let key: string | undefined;
  const user = async () => {
    if (key === undefined) key = await createApiKey(t(), (await createUser(t())).token, 'read_write');
    return key;
  };

  for (const cidr of [...V4, ...V6]) {
    test(`POST /webhooks refuses ${cidr}`, async () => {
      const { middle } = addressesOf(cidr);
      // The middle address of a range that holds narrower ones may fall in one of them: the detail names that one.
      await refuse(urlOf(middle), cidr, narrowest(middle));
    });
  }

  test('POST /webhooks refuses the IPv4-translated and the local-use NAT64 forms', async () => {
    for (const url of ONCE_PASSED) await refuse(url, url);
    await refuse('http://[::ffff:0:7f00:1]/', 'IPv4-translated loopback', '::ffff:0:0:0/96');
    await refuse('http://[64:ff9b:1::7f00:1]/', 'local-use NAT64 loopback', '64:ff9b:1::/48');
  });

  test('POST /webhooks takes a public address next to a refused range', async () => {
    for (const a of ['172.32.0.1', '2620:4f:8001::1', '2001:200::1']) {
      const r = await api(t(), await user()).post('/webhooks', { body: { url: urlOf(a) } });
      assert.equal(r.status, 201, `${a}: ${r.text}`);
      t().forbidSecret(r.body.secret);
      const d = await api(t(), await user()).delete('/webhooks/{webhook_id}', { params: { webhook_id: r.body.id } });
      assert.equal(d.status, 204);
    }
  });
});
