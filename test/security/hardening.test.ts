/**
 * Hardening found by an outside audit: TOTP secrets sealed at rest, sessions
 * with an absolute lifetime, no control or formatting characters in names
 * that reach terminals, nosniff everywhere, a restrictive CSP on /docs whose
 * Swagger UI keeps no token.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { describeEachDb } from '../helpers/app.js';
import { challengeOf, createApiKey, createUser, tokensOf } from '../helpers/factories.js';
import { api } from '../helpers/api.js';
import { stepAt, totpAt } from '../../src/modules/auth/totp.js';
import { generateKey } from '../ssh-keys/keygen.js';
import { sha256Hex } from '../../src/ids.js';

const DAY_S = 86_400;

describeEachDb(
  'hardening',
  (t) => {
    test('TOTP secrets are sealed at rest; a secret stored before sealing still works', async () => {
      const u = await createUser(t());
      const c = api(t(), u.token);
      const s = await c.post('/auth/2fa/setup');
      assert.equal(s.status, 200, s.text);
      const secret = s.body.secret;
      t().forbidSecret(secret);
      const pending = (
        await t().db.query<{ v: string }>('SELECT totp_pending_secret AS v FROM users WHERE id = $1', [u.id])
      ).rows[0]!.v;
      assert.match(pending, /^v1:/);
      assert.ok(!pending.includes(secret));
      const e = await c.post('/auth/2fa/enable', {
        body: { code: totpAt(secret, stepAt(t().clock.nowMs())) },
      });
      assert.equal(e.status, 200, e.text);
      for (const code of e.body.recovery_codes) t().forbidSecret(code);
      const stored = (await t().db.query<{ v: string }>('SELECT totp_secret AS v FROM users WHERE id = $1', [u.id]))
        .rows[0]!.v;
      assert.match(stored, /^v1:/);
      assert.ok(!stored.includes(secret));
      // A secret written before sealing existed (plain base32) keeps working.
      await t().db.query('UPDATE users SET totp_secret = $2 WHERE id = $1', [u.id, secret]);
      await t().services.clock.advance(30);
      const login = await api(t()).post('/auth/login', { body: { email: u.email, password: u.password } });
      assert.equal(login.status, 200, login.text);
      const v = await api(t()).post('/auth/2fa/verify', {
        body: {
          challenge_token: challengeOf(login.body).challenge_token,
          code: totpAt(secret, stepAt(t().clock.nowMs())),
        },
      });
      assert.equal(v.status, 200, v.text);
      t().forbidSecret(v.body.refresh_token);
    });

    test('a session ends GPUCLOUD_SESSION_MAX_DAYS after its login, however often it is refreshed', async () => {
      const u = await createUser(t());
      let refresh = u.refresh;
      // Refreshed every day: fine for two days (the setting here) ...
      for (let day = 1; day < 2; day++) {
        await t().services.clock.advance(DAY_S);
        const r = await api(t()).post('/auth/refresh', { body: { refresh_token: refresh } });
        assert.equal(r.status, 200, `day ${day}: ${r.text}`);
        t().forbidSecret(r.body.refresh_token);
        refresh = r.body.refresh_token;
      }
      const row = await t().db.query<{ e: Date }>('SELECT expires_at AS e FROM refresh_tokens WHERE token_hash = $1', [
        sha256Hex(refresh),
      ]);
      assert.equal(
        row.rows[0]!.e.getTime(),
        t().clock.nowMs() + DAY_S * 1000,
        'the newest refresh token ends with the session, not 30 days on',
      );
      // ... and then it is over, even refreshed a minute ago.
      await t().services.clock.advance(DAY_S);
      const over = await api(t()).post('/auth/refresh', { body: { refresh_token: refresh } });
      assert.equal(over.status, 401, over.text);
      assert.match(over.body.detail, /log in again/);
      const again = await api(t()).post('/auth/login', { body: { email: u.email, password: u.password } });
      assert.equal(again.status, 200, 'a new login starts a new session');
      t().forbidSecret(tokensOf(again.body).refresh_token);
    });

    test('names that reach terminals refuse control and formatting characters; other unicode is fine', async () => {
      const u = await createUser(t());
      const c = api(t(), u.token);
      for (const name of ['evil\u001b[2J', 'bell\u0007', 'del\u007f', 'rtl\u202egnp.exe', 'c1\u009b31m', 'tab\there']) {
        const r = await c.post('/api-keys', { body: { name, scope: 'read_only' } });
        assert.equal(r.status, 422, `${JSON.stringify(name)}: ${r.text}`);
        assert.equal(r.body.errors?.[0]?.field, 'body.name');
        assert.equal(
          r.body.errors?.[0]?.message,
          'must not contain control characters or invisible formatting characters',
          'said in words, not as a regular expression',
        );
      }
      const ok = await c.post('/api-keys', {
        body: { name: 'Büro ключ 鍵 🔑', scope: 'read_only' },
      });
      assert.equal(ok.status, 201, ok.text);
      t().forbidSecret(ok.body.key);
      const key = generateKey('ed25519').line;
      const bad = await c.post('/ssh-keys', {
        body: { ssh_public_key: key, label: 'laptop\u001b]0;pwned\u0007' },
      });
      assert.equal(bad.status, 422, bad.text);
      assert.equal(bad.body.errors?.[0]?.field, 'body.label');
      assert.match(
        String(bad.body.errors?.[0]?.message),
        /^must not contain control characters or invisible formatting characters/,
      );
      const good = await c.post('/ssh-keys', {
        body: { ssh_public_key: key, label: 'laptop (work)' },
      });
      assert.equal(good.status, 201, good.text);
    });

    test('every response says nosniff; /docs has a restrictive CSP and its Swagger UI keeps no token', async () => {
      const u = await createUser(t());
      const key = await createApiKey(t(), u.token, 'read_only');
      for (const [url, token] of [
        ['/account', key],
        ['/nope', undefined],
        ['/openapi.json', undefined],
        ['/docs', undefined],
      ] as const) {
        // A table of routes, one not in the OpenAPI document (/nope, /openapi.json, /docs): headers only, untyped.
        const r = await t().req('GET', url, token ? { token } : {});
        assert.equal(r.headers['x-content-type-options'], 'nosniff', url);
      }
      const docs = await t().req('GET', '/docs');
      const csp = String(docs.headers['content-security-policy']);
      for (const d of ["default-src 'self'", "object-src 'none'", "script-src 'self'", "frame-ancestors 'self'"])
        assert.ok(csp.includes(d), `${d} in ${csp}`);
      const init = await t().req('GET', '/docs/static/swagger-initializer.js');
      assert.equal(init.status, 200);
      assert.match(init.text, /"persistAuthorization":false/);
    });
  },
  { env: { GPUCLOUD_SESSION_MAX_DAYS: '2' } },
);
