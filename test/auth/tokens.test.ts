import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ManualClock } from '../../src/clock.js';
import { ACCESS_TOKEN_TTL_S, TokenService } from '../../src/modules/auth/tokens.js';
import { newId } from '../../src/ids.js';

const START = Date.UTC(2026, 0, 1);
const SECRET = 'a-test-secret-of-sufficient-length-0123456789';

test('an access token verifies alike the first time and from memory, until it expires', async () => {
  const clock = new ManualClock(START);
  const tokens = new TokenService(SECRET, clock);
  const sid = newId();
  const { token } = await tokens.signAccess(42, sid);

  const first = await tokens.verifyAccess(token);
  assert.equal(first?.userId, 42);
  assert.equal(first?.sid, sid);
  assert.deepEqual(await tokens.verifyAccess(token), first);
  // Another instance (no memory) agrees at every instant.
  const other = new TokenService(SECRET, clock);
  clock.set(START + (ACCESS_TOKEN_TTL_S - 1) * 1000);
  assert.deepEqual(await tokens.verifyAccess(token), first);
  assert.deepEqual(await other.verifyAccess(token), first);
  clock.set(START + ACCESS_TOKEN_TTL_S * 1000);
  assert.equal(await tokens.verifyAccess(token), null, 'expired, though remembered');
  assert.equal(await other.verifyAccess(token), null);
  clock.set(START);
  assert.equal((await other.verifyAccess(token)) !== null, true, 'a fresh check still accepts it before exp');
});

test('a token altered in any part, or signed with another secret, is refused even once the real one is remembered', async () => {
  const clock = new ManualClock(START);
  const tokens = new TokenService(SECRET, clock);
  const { token } = await tokens.signAccess(7, newId());
  assert.notEqual(await tokens.verifyAccess(token), null);
  const [header, payload, signature] = token.split('.') as [string, string, string];
  // The first character of a segment: the last of a base64url signature may carry only padding bits,
  // and two encodings of the same bytes are the same signature.
  const flip = (seg: string) => (seg.startsWith('A') ? 'B' : 'A') + seg.slice(1);
  for (const altered of [
    `${header}.${payload}.${flip(signature)}`,
    `${header}.${flip(payload)}.${signature}`,
    `${flip(header)}.${payload}.${signature}`,
    `${token}x`,
    `${header}.${payload}.`,
  ]) {
    assert.equal(await tokens.verifyAccess(altered), null, altered);
  }
  const stranger = new TokenService('another-secret-of-sufficient-length-98765', clock);
  const forged = (await stranger.signAccess(7, newId())).token;
  assert.equal(await tokens.verifyAccess(forged), null);
  assert.notEqual(await stranger.verifyAccess(forged), null);
});
