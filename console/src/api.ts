/**
 * The console's one connection to the API: the project's own SDK
 * (GpuCloudClient), on the same origin as the console.
 *
 * Where the session lives, and why: the access token (one hour) and the
 * refresh token (single use, rotated on every refresh) are kept in this
 * origin's localStorage. The browser gives no other origin access to it, and
 * keeping them there lets a reload, or a second tab, continue the session.
 * Refresh tokens are single use, and presenting a rotated one ends the whole
 * session (that is how a stolen token is detected), so tabs must never
 * refresh with the same token: a refresh runs under a Web Lock shared by the
 * tabs, and a tab that finds the stored token already rotated by another tab
 * adopts the new pair instead of sending its stale one. Signing out, here or
 * in another tab, clears the storage everywhere. One case is left: a tab
 * closed or reloaded in the instant between the server rotating the token
 * and the tab storing the answer (once an hour at most) loses the new token,
 * and the strict reuse rule then ends the session: the user signs in again. The console sets a strict
 * Content Security Policy (scripts from this origin only) to keep injected
 * scripts away from the storage.
 */
import { GpuCloudClient, GpuCloudError, type SessionTokens } from '../../src/sdk/index.js';

const KEY = 'gpucloud.session';

function readStored(): SessionTokens | undefined {
  try {
    const v = JSON.parse(localStorage.getItem(KEY) ?? 'null') as Partial<SessionTokens> | null;
    return v && typeof v.accessToken === 'string' && typeof v.refreshToken === 'string'
      ? (v as SessionTokens)
      : undefined;
  } catch {
    return undefined;
  }
}

function store(tokens: SessionTokens | undefined): void {
  if (tokens) localStorage.setItem(KEY, JSON.stringify(tokens));
  else localStorage.removeItem(KEY);
}

/** A random Idempotency-Key; crypto.randomUUID exists only on secure origins, getRandomValues everywhere. */
export function randomKey(): string {
  const b = crypto.getRandomValues(new Uint8Array(16));
  return Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('');
}

async function withRefreshLock<T>(fn: () => Promise<T>): Promise<T> {
  const locks = (navigator as Navigator & { locks?: LockManager }).locks;
  return locks ? locks.request('gpucloud-refresh', fn) : fn();
}

/** The fetch under the SDK: refreshes are serialized across tabs (see above). */
async function consoleFetch(req: Request): Promise<Response> {
  if (!new URL(req.url).pathname.endsWith('/auth/refresh')) return fetch(req);
  const body = (await req
    .clone()
    .json()
    .catch(() => ({}))) as { refresh_token?: string };
  return withRefreshLock(async () => {
    const stored = readStored();
    if (stored && body.refresh_token && stored.refreshToken !== body.refresh_token) {
      // Another tab rotated it already: take its pair rather than presenting a used token.
      const pair = {
        access_token: stored.accessToken,
        refresh_token: stored.refreshToken,
        token_type: 'bearer',
        expires_in: 3600,
      };
      return new Response(JSON.stringify(pair), { status: 200, headers: { 'content-type': 'application/json' } });
    }
    const res = await fetch(req);
    if (res.ok) {
      const pair = (await res.clone().json()) as { access_token: string; refresh_token: string };
      store({ accessToken: pair.access_token, refreshToken: pair.refresh_token });
    } else if (res.status === 401) {
      store(undefined);
    }
    return res;
  });
}

const stored = readStored();
export const client = new GpuCloudClient({
  baseUrl: location.origin,
  ...(stored ? { accessToken: stored.accessToken, refreshToken: stored.refreshToken } : {}),
  onTokens: (t) => store(t),
  fetch: consoleFetch,
  idempotencyKey: randomKey,
  maxRetries: 2,
});
export const api = client.api;

/** Listeners told when the session ends (sign-out here or in another tab, or a dead refresh token). */
const endListeners = new Set<() => void>();
export function onSessionEnd(fn: () => void): () => void {
  endListeners.add(fn);
  return () => endListeners.delete(fn);
}

window.addEventListener('storage', (e) => {
  if (e.key !== KEY) return;
  const t = readStored();
  client.setTokens(t ?? {});
  if (!t) endListeners.forEach((f) => f());
});

export function hasSession(): boolean {
  return client.tokens.refreshToken !== undefined;
}

export async function signOut(): Promise<void> {
  try {
    await client.logout();
  } catch {
    // The session may already be gone; forget it here regardless.
  }
  client.setTokens({});
  store(undefined);
  endListeners.forEach((f) => f());
}

/** Data of an openapi-fetch call, or a GpuCloudError with the API's message. */
export async function call<T>(p: Promise<{ data?: T; error?: unknown; response: Response }>): Promise<T> {
  const { data, error, response } = await p;
  if (error !== undefined || !response.ok) {
    const err = GpuCloudError.from(response, error);
    if (response.status === 401 && !hasSessionStill()) endListeners.forEach((f) => f());
    throw err;
  }
  return data as T;
}

function hasSessionStill(): boolean {
  return readStored() !== undefined;
}

/** The data of a list call and its X-Total-Count (the page length when the header is missing). */
export async function callWithTotal<T extends unknown[]>(
  p: Promise<{ data?: T; error?: unknown; response: Response }>,
): Promise<{ items: T; total: number }> {
  const items = await call(p);
  const { response } = await p;
  const raw = response.headers.get('x-total-count');
  const total = raw !== null && /^\d+$/.test(raw.trim()) ? Number(raw) : items.length;
  return { items, total };
}

/** The message to show for a failed action: the API's own words. */
export function errorMessage(e: unknown): string {
  if (e instanceof GpuCloudError) {
    const fields = e.errors?.length ? `: ${e.errors.map((f) => `${f.field} ${f.message}`).join('; ')}` : '';
    return e.errors?.length && e.detail.startsWith('Validation failed') ? `Validation failed${fields}` : e.detail;
  }
  if (e instanceof TypeError) return 'The API cannot be reached. Check your connection and try again.';
  return e instanceof Error ? e.message : String(e);
}

export { GpuCloudError };
