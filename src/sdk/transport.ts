/**
 * The fetch under every call of the SDK: credentials, Idempotency-Key, refresh, retries. It
 *
 * - authenticates with an API key or an access token;
 * - on a 401, when it holds a refresh token, refreshes once (one refresh at a
 *   time for all concurrent requests: a second refresh with the rotated token
 *   would revoke the whole session), hands the rotated pair to
 *   `onTokens`, and replays the request once;
 * - retries a 429 after its Retry-After (seconds) for any request: the rate
 *   limiter refuses before anything is done;
 * - retries 5xx and network errors with exponential backoff only where that is
 *   safe: GET, HEAD, OPTIONS, and the POSTs that carry an Idempotency-Key on the
 *   routes that honour it (docs/errors.md#idempotency-keys);
 * - sends its own Idempotency-Key (a random UUID) on every POST /vms,
 *   /ssh-keys, /api-keys and /admin/users/{id}/credits unless the caller gave
 *   one, and keeps it across the retries, so a retried create never makes a
 *   second resource.
 */
import createClient, { type Client } from 'openapi-fetch';
import type { paths } from './schema.js';
import type { GpuCloudClientOptions, SessionTokens, TokenPair } from './types.js';

/** Routes that honour Idempotency-Key: the same key and body within 24 h replays the first answer. */
const IDEMPOTENT_POST = [/^\/vms$/, /^\/ssh-keys$/, /^\/api-keys$/, /^\/webhooks$/, /^\/admin\/users\/[^/]+\/credits$/];
/** Public auth routes: no credential is sent and a 401 there is an answer, not an expired session. */
const PUBLIC_AUTH = new Set(['/auth/login', '/auth/register', '/auth/refresh', '/auth/2fa/verify']);
const SAFE_METHODS = new Set(['GET', 'HEAD', 'OPTIONS']);
const RETRY_STATUS = new Set([500, 502, 503, 504]);
const MAX_BACKOFF_MS = 8000;

const defaultSleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/** Retry-After in milliseconds: delta-seconds or an HTTP date (RFC 9110). */
export function retryAfterMs(value: string | null, nowMs = Date.now()): number | undefined {
  if (value === null || value.trim() === '') return undefined;
  if (/^\s*\d+\s*$/.test(value)) return Number(value) * 1000;
  const at = Date.parse(value);
  return Number.isNaN(at) ? undefined : Math.max(0, at - nowMs);
}

async function discard(res: Response): Promise<void> {
  try {
    await res.body?.cancel();
  } catch {
    // nothing to free
  }
}

/** The session's credentials and the request policy; GpuCloudClient's `api` sends through it. */
export class Transport {
  /** The typed openapi-fetch client whose every request goes through `send`. */
  readonly api: Client<paths>;
  readonly baseUrl: string;
  /** Waits between retries and polls. */
  readonly sleep: (ms: number) => Promise<void>;
  /** Makes an Idempotency-Key for a create the caller gave none for. */
  readonly newKey: () => string;
  private readonly basePath: string;
  private apiKey: string | undefined;
  private accessToken: string | undefined;
  private refreshToken: string | undefined;
  private readonly onTokens: GpuCloudClientOptions['onTokens'];
  private readonly fetchImpl: (input: Request) => Promise<Response>;
  private readonly maxRetries: number;
  private readonly retryBaseMs: number;
  private refreshing: Promise<boolean> | undefined;

  constructor(opts: GpuCloudClientOptions) {
    this.baseUrl = opts.baseUrl.replace(/\/+$/, '');
    this.basePath = new URL(this.baseUrl).pathname.replace(/\/+$/, '');
    this.apiKey = opts.apiKey;
    this.accessToken = opts.accessToken;
    this.refreshToken = opts.refreshToken;
    this.onTokens = opts.onTokens;
    const f = opts.fetch;
    this.fetchImpl = f ?? ((input) => globalThis.fetch(input));
    this.maxRetries = Math.max(0, Math.floor(opts.maxRetries ?? 3));
    this.sleep = opts.sleep ?? defaultSleep;
    this.newKey = opts.idempotencyKey ?? (() => globalThis.crypto.randomUUID());
    this.retryBaseMs = opts.retryBaseMs ?? 250;
    this.api = createClient<paths>({ baseUrl: this.baseUrl, fetch: (input) => this.send(input) });
  }

  /** The session tokens held now (rotated by refreshes). */
  get tokens(): Partial<SessionTokens> {
    return { accessToken: this.accessToken, refreshToken: this.refreshToken };
  }

  /** Replaces the session tokens (both: one left out is forgotten). */
  setTokens(tokens: Partial<SessionTokens>): void {
    this.accessToken = tokens.accessToken;
    this.refreshToken = tokens.refreshToken;
  }

  private pathOf(url: string): string {
    let p = new URL(url).pathname;
    if (this.basePath && p.startsWith(this.basePath)) p = p.slice(this.basePath.length);
    return p.length > 1 ? p.replace(/\/+$/, '') : p;
  }

  /** `stream`: the body is streamed from what it makes (made again for a replay) instead of read whole first. */
  async send(input: Request, stream?: () => ReadableStream<Uint8Array>): Promise<Response> {
    const method = input.method.toUpperCase();
    const path = this.pathOf(input.url);
    const headers = new Headers(input.headers);
    const body = stream || input.body === null ? undefined : await input.arrayBuffer();
    const idempotentRoute = method === 'POST' && IDEMPOTENT_POST.some((re) => re.test(path));
    if (idempotentRoute && !headers.has('idempotency-key')) headers.set('idempotency-key', this.newKey());
    const safe = SAFE_METHODS.has(method) || (idempotentRoute && headers.has('idempotency-key'));
    // The caller's own Authorization header wins; public auth routes get none.
    const manageAuth = !headers.has('authorization') && !PUBLIC_AUTH.has(path);
    let retries = 0;
    let replayed = false;
    for (;;) {
      const credential = manageAuth ? (this.apiKey ?? this.accessToken) : undefined;
      if (credential) headers.set('authorization', `Bearer ${credential}`);
      else if (manageAuth) headers.delete('authorization');
      let res: Response;
      try {
        const init: RequestInit & { duplex?: 'half' } = {
          method,
          headers,
          signal: input.signal,
          redirect: input.redirect,
        };
        if (stream) {
          init.body = stream();
          init.duplex = 'half'; // a streamed request body (fetch asks for it to be said)
        } else if (body !== undefined) init.body = body;
        res = await this.fetchImpl(new Request(input.url, init));
      } catch (err) {
        // A network error: the request may or may not have been acted on.
        if (input.signal.aborted || !safe || retries >= this.maxRetries) throw err;
        await this.sleep(this.backoff(retries++));
        continue;
      }
      if (
        res.status === 401 &&
        manageAuth &&
        !replayed &&
        this.apiKey === undefined &&
        this.refreshToken !== undefined
      ) {
        replayed = true;
        if (await this.refreshAfter(credential)) {
          await discard(res);
          continue; // the replay is not a retry: a 401 means nothing was done
        }
        return res;
      }
      const retryable = res.status === 429 || (safe && RETRY_STATUS.has(res.status));
      if (retryable && retries < this.maxRetries && !input.signal.aborted) {
        const wait = retryAfterMs(res.headers.get('retry-after')) ?? this.backoff(retries);
        retries++;
        await discard(res);
        await this.sleep(wait);
        continue;
      }
      return res;
    }
  }

  private backoff(retry: number): number {
    const cap = Math.min(MAX_BACKOFF_MS, this.retryBaseMs * 2 ** retry);
    return Math.round(cap / 2 + Math.random() * (cap / 2)); // "equal jitter"
  }

  /**
   * After a 401 for `failedWith`: true once a newer access token is there to
   * replay with. Concurrent callers share one refresh; a caller whose token was
   * already replaced just replays.
   */
  private refreshAfter(failedWith: string | undefined): Promise<boolean> {
    if (this.accessToken !== undefined && this.accessToken !== failedWith) return Promise.resolve(true);
    this.refreshing ??= this.refresh().finally(() => {
      this.refreshing = undefined;
    });
    return this.refreshing;
  }

  /**
   * POST /auth/refresh. Not retried on 5xx or network errors: the server may
   * have rotated the token already, and sending the old one again would revoke
   * the whole session. A refused refresh token is forgotten.
   */
  private async refresh(): Promise<boolean> {
    const refreshToken = this.refreshToken;
    if (!refreshToken) return false;
    const { data, response } = await this.api.POST('/auth/refresh', { body: { refresh_token: refreshToken } });
    if (!response.ok || !data) {
      if (response.status === 401 && this.refreshToken === refreshToken) this.refreshToken = undefined;
      return false;
    }
    await this.adoptTokens(data);
    return true;
  }

  /** Keeps a new token pair (login, 2FA verification, refresh) and hands it to onTokens. */
  async adoptTokens(pair: TokenPair): Promise<void> {
    this.accessToken = pair.access_token;
    this.refreshToken = pair.refresh_token;
    await this.onTokens?.({ accessToken: pair.access_token, refreshToken: pair.refresh_token });
  }
}
