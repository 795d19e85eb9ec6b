/** Users and sessions made through the real API. */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import type { TestApp } from './app.js';

export interface TestUser {
  id: number;
  email: string;
  password: string;
  token: string;
  refresh: string;
}

let seq = 0;
export const uniqueEmail = (tag = 'user') => `${tag}-${++seq}-${randomBytes(4).toString('hex')}@example.com`;

export async function createUser(t: TestApp, opts: { admin?: boolean; email?: string; password?: string } = {}): Promise<TestUser> {
  const email = opts.email ?? uniqueEmail(opts.admin ? 'admin' : 'user');
  const password = opts.password ?? 'a-long-password-' + randomBytes(4).toString('hex');
  if (opts.admin) {
    await t.services.auth.ensureUser(email, password, 'admin');
  } else {
    const reg = await t.req('POST', '/auth/register', { body: { email, password } });
    assert.equal(reg.status, 201, reg.text);
  }
  const login = await t.req('POST', '/auth/login', { body: { email, password } });
  assert.equal(login.status, 200, login.text);
  const me = await t.req('GET', '/account', { token: login.body.access_token });
  return { id: me.body.id, email, password, token: login.body.access_token, refresh: login.body.refresh_token };
}

export async function createApiKey(t: TestApp, token: string, scope: string, name = 'k'): Promise<string> {
  const r = await t.req('POST', '/api-keys', { token, body: { name, scope } });
  assert.equal(r.status, 201, r.text);
  t.forbidSecret(r.body.key);
  return r.body.key;
}
