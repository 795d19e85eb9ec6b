/**
 * Clients behind reverse proxies (src/http/client-address.ts): with
 * GPUCLOUD_TRUST_PROXY naming the proxy, each client behind it has its own
 * login and request limits; a sender that is not trusted cannot choose its
 * address with a forged header; /metrics needs credentials from anything a
 * proxy forwarded, even from loopback. The setting's forms and the reading of
 * `Forwarded` are checked on their own.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { IncomingMessage } from 'node:http';
import { describeEachDb } from '../helpers/app.js';
import { api } from '../helpers/api.js';
import { createUser } from '../helpers/factories.js';
import { clientAddress, parseTrustProxy, readForwarded, trustFunction } from '../../src/http/client-address.js';
import { loadConfig } from '../../src/config.js';

const fakeReq = (peer: string, headers: Record<string, string>) =>
  ({ socket: { remoteAddress: peer }, connection: { remoteAddress: peer }, headers }) as unknown as IncomingMessage;

test('GPUCLOUD_TRUST_PROXY: off, a hop count, addresses and CIDRs; anything else is refused at start', () => {
  for (const off of [undefined, '', 'off', 'false', '0']) assert.equal(parseTrustProxy(off), false);
  assert.deepEqual(parseTrustProxy('2'), { hops: 2 });
  assert.deepEqual(parseTrustProxy('10.0.0.0/8, 127.0.0.1,loopback, ::1, fd00::/8'), {
    addresses: ['10.0.0.0/8', '127.0.0.1', 'loopback', '::1', 'fd00::/8'],
  });
  for (const bad of ['11', 'nginx.local', '10.0.0.0/33', '::1/129', '10.0.0.1/8/8', '1.2.3']) {
    assert.throws(() => loadConfig({ GPUCLOUD_TRUST_PROXY: bad }), /GPUCLOUD_TRUST_PROXY/, bad);
  }
  // Hop count: that many proxies in front, whatever their addresses.
  const two = trustFunction({ hops: 2 });
  assert.equal(
    clientAddress(fakeReq('10.1.1.1', { 'x-forwarded-for': '6.6.6.6, 198.51.100.4, 10.0.0.9' }), two),
    '198.51.100.4',
  );
  // Addresses: the first untrusted address from the right.
  const lb = trustFunction({ addresses: ['10.0.0.0/8'] });
  assert.equal(clientAddress(fakeReq('10.1.1.1', { 'x-forwarded-for': '198.51.100.4, 10.2.2.2' }), lb), '198.51.100.4');
  assert.equal(clientAddress(fakeReq('203.0.113.5', { 'x-forwarded-for': '198.51.100.4' }), lb), '203.0.113.5');
  assert.equal(clientAddress(fakeReq('203.0.113.5', { 'x-forwarded-for': '1.1.1.1' }), null), '203.0.113.5');
});

test('Forwarded (RFC 7239) is read like X-Forwarded-For, from a trusted peer only', () => {
  const lb = trustFunction({ addresses: ['127.0.0.1'] });
  const req = fakeReq('127.0.0.1', { forwarded: 'for=192.0.2.60;proto=https, for="[2001:db8::17]:4711"' });
  readForwarded(req, lb);
  assert.equal(req.headers['x-forwarded-for'], '192.0.2.60, 2001:db8::17');
  assert.equal(clientAddress(req, lb), '2001:db8::17');
  const untrusted = fakeReq('203.0.113.5', { forwarded: 'for=192.0.2.60' });
  readForwarded(untrusted, lb);
  assert.equal(untrusted.headers['x-forwarded-for'], undefined);
  const both = fakeReq('127.0.0.1', { forwarded: 'for=192.0.2.60', 'x-forwarded-for': '198.51.100.1' });
  readForwarded(both, lb);
  assert.equal(both.headers['x-forwarded-for'], '198.51.100.1', 'X-Forwarded-For wins when both are sent');
});

describeEachDb(
  'behind a trusted proxy',
  (t) => {
    test('each client behind the proxy has its own login limit; a forged header from elsewhere changes nothing', async () => {
      const owner = await createUser(t());
      const login = (password: string, headers: Record<string, string>, remoteAddress = '127.0.0.1') =>
        api(t()).post('/auth/login', { body: { email: owner.email, password }, headers, remoteAddress });
      const attacker = { 'x-forwarded-for': '198.51.100.2' };
      for (let i = 0; i < 5; i++) assert.equal((await login('wrong password!!', attacker)).status, 401);
      assert.equal((await login('wrong password!!', attacker)).status, 429, "the attacker's address is limited");
      const ok = await login(owner.password, { 'x-forwarded-for': '198.51.100.3' });
      assert.equal(ok.status, 200, `the owner, from another address behind the same proxy: ${ok.text}`);
      // Not through the proxy: the forged header is ignored, the sender is counted as itself.
      const forger = '203.0.113.50';
      for (let i = 0; i < 5; i++)
        assert.equal(
          (await login('wrong password!!', { 'x-forwarded-for': `198.51.100.${100 + i}` }, forger)).status,
          401,
        );
      assert.equal((await login(owner.password, { 'x-forwarded-for': '198.51.100.200' }, forger)).status, 429);
    });

    test('/metrics: loopback reads it only when nothing was forwarded', async () => {
      const get = async (headers: Record<string, string>) => ({
        status: (await t().app.inject({ method: 'GET', url: '/metrics', remoteAddress: '127.0.0.1', headers }))
          .statusCode,
      });
      assert.equal((await get({})).status, 200, 'a client on this machine');
      const forwarded: Record<string, string>[] = [
        { 'x-forwarded-for': '127.0.0.1' },
        { forwarded: 'for=127.0.0.1' },
        { 'x-real-ip': '127.0.0.1' },
      ];
      for (const h of forwarded) {
        const r = await get(h);
        assert.equal(r.status, 401, `${JSON.stringify(h)}: a proxy on this machine forwards others`);
      }
    });
  },
  {
    env: { GPUCLOUD_TRUST_PROXY: '127.0.0.1', GPUCLOUD_RATE_LIMIT_LOGIN: '5', GPUCLOUD_RATE_LIMIT_LOGIN_ACCOUNT: '20' },
  },
);
