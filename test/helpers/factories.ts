/** Users and sessions made through the real API. */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import type { TestApp } from './app.js';
import { api, type BodyFor, type RequestBody } from './api.js';

export interface TestUser {
  id: number;
  email: string;
  password: string;
  token: string;
  refresh: string;
}

let seq = 0;
export const uniqueEmail = (tag = 'user') => `${tag}-${++seq}-${randomBytes(4).toString('hex')}@example.com`;

export async function createUser(
  t: TestApp,
  opts: { admin?: boolean; email?: string; password?: string } = {},
): Promise<TestUser> {
  const email = opts.email ?? uniqueEmail(opts.admin ? 'admin' : 'user');
  const password = opts.password ?? 'a-long-password-' + randomBytes(4).toString('hex');
  if (opts.admin) {
    await t.services.auth.ensureUser(email, password, 'admin');
  } else {
    const reg = await api(t).post('/auth/register', { body: { email, password } });
    assert.equal(reg.status, 201, reg.text);
  }
  const login = await api(t).post('/auth/login', { body: { email, password } });
  assert.equal(login.status, 200, login.text);
  const tokens = tokensOf(login.body);
  const me = await api(t, tokens.access_token).get('/account');
  assert.equal(me.status, 200, me.text);
  return { id: me.body.id, email, password, token: tokens.access_token, refresh: tokens.refresh_token };
}

/** A 200 from POST /auth/login: the tokens, or (with two-factor on) a challenge. */
export type LoginAnswer = BodyFor<'/auth/login', 'post', 200>;
export type TokenPair = Extract<LoginAnswer, { access_token: string }>;

/** The tokens of a login that needed no second factor (asserts it was not a challenge). */
export function tokensOf(body: LoginAnswer): TokenPair {
  assert.ok('access_token' in body, `a two-factor challenge where tokens were expected: ${JSON.stringify(body)}`);
  return body;
}

/** The challenge of a login that needs a second factor (asserts it was not tokens). */
export function challengeOf(body: LoginAnswer): Exclude<LoginAnswer, TokenPair> {
  assert.ok('challenge_token' in body, `tokens where a two-factor challenge was expected: ${JSON.stringify(body)}`);
  return body;
}

export async function createApiKey(
  t: TestApp,
  token: string,
  scope: RequestBody<'/api-keys', 'post'>['scope'],
  name = 'k',
): Promise<string> {
  const r = await api(t, token).post('/api-keys', { body: { name, scope } });
  assert.equal(r.status, 201, r.text);
  t.forbidSecret(r.body.key);
  return r.body.key;
}

let nodeSeq = 0;
/** Registers a node through the admin API. */
export async function createNode(
  t: TestApp,
  adminToken: string,
  over: Partial<RequestBody<'/admin/nodes', 'post'>> = {},
): Promise<BodyFor<'/admin/nodes', 'post', 201>> {
  const body = {
    node: `n${++nodeSeq}-${randomBytes(3).toString('hex')}`,
    gpu_type: '4090' as const,
    gpu_count: 8,
    ram_gb: 512,
    cpu_cores: 64,
    cpu_model: 'AMD EPYC 7543',
    pcie_gen: '4.0',
    max_storage_gb: 2000,
    location: 'eu-central',
    cluster_name: 'test-1',
    ...over,
  };
  const r = await api(t, adminToken).post('/admin/nodes', { body });
  assert.equal(r.status, 201, r.text);
  return r.body;
}

/** Adds credit (in the major unit) through the admin API. */
export async function credit(t: TestApp, adminToken: string, userId: number, amount: number): Promise<void> {
  const r = await api(t, adminToken).post('/admin/users/{user_id}/credits', {
    params: { user_id: userId },
    body: { amount, description: 'test credit' },
  });
  assert.equal(r.status, 201, r.text);
}

/** A real ed25519 public key line made by ssh-keygen. */
export async function uploadSshKey(t: TestApp, token: string): Promise<string> {
  const { generateKey } = await import('../ssh-keys/keygen.js');
  const k = generateKey('ed25519');
  const r = await api(t, token).post('/ssh-keys', { body: { ssh_public_key: k.line } });
  assert.equal(r.status, 201, r.text);
  return r.body.id;
}

/** Advances the manual clock through the admin API (which returns once the due work has run). */
export async function advance(t: TestApp, adminToken: string, seconds: number): Promise<void> {
  const r = await api(t, adminToken).post('/admin/clock/advance', { body: { seconds } });
  assert.equal(r.status, 200, r.text);
}

/** Advances the manual clock (settling due work) to the next top of the hour, so billing periods are whole hours. */
export async function alignToHour(t: TestApp): Promise<void> {
  const hourMs = 3_600_000;
  const now = t.clock.nowMs();
  const next = Math.ceil(now / hourMs) * hourMs;
  if (next > now) await t.services.clock.advance((next - now) / 1000);
}
