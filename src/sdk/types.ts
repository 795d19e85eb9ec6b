/**
 * The SDK's types: the shapes of the API derived from the generated schema (src/sdk/schema.ts), and the
 * options of the client and its helpers.
 */
import type { components, paths } from './schema.js';

type JsonOf<R> = R extends { content: { 'application/json': infer B } } ? B : never;

/** The body of an error response: `{detail, code, errors?}` (docs/errors.md). */
export type ErrorBody = components['schemas']['ErrorResponse'];
export type FieldError = NonNullable<ErrorBody['errors']>[number];
export type Vm = JsonOf<paths['/vms/{vm_id}']['get']['responses'][200]>;
export type VmStatus = Vm['status'];
export type CreateVmRequest = paths['/vms']['post']['requestBody']['content']['application/json'];
export type ListVmsQuery = NonNullable<paths['/vms']['get']['parameters']['query']>;
export type LoginResponse = JsonOf<paths['/auth/login']['post']['responses'][200]>;
/** The token pair of login, 2FA verify and refresh. */
export type TokenPair = Extract<LoginResponse, { access_token: string }>;
/** What login answers instead of tokens when two-factor authentication is on. */
export type TwoFactorChallenge = Extract<LoginResponse, { two_factor_required: true }>;
export type Account = JsonOf<paths['/account']['get']['responses'][200]>;
export type Offer = JsonOf<paths['/search']['get']['responses'][200]>[number];

/** The credentials of a login session, as handed to `onTokens` and accepted by the constructor. */
export interface SessionTokens {
  accessToken: string;
  refreshToken: string;
}

export interface GpuCloudClientOptions {
  /** The API's root URL, e.g. `http://127.0.0.1:8080`. */
  baseUrl: string;
  /** An API key (`gpc_...`). Takes precedence over the session tokens; never refreshed. */
  apiKey?: string;
  /** A JWT access token from login (valid 3600 s). */
  accessToken?: string;
  /** The session's refresh token: lets the client renew an expired access token by itself. */
  refreshToken?: string;
  /**
   * Called with the new pair after every login, 2FA verification and
   * automatic refresh. Refresh tokens are single use: persist the pair
   * here, or the next run starts with a dead refresh token.
   */
  onTokens?: (tokens: SessionTokens) => void | Promise<void>;
  /** The fetch to send requests with (default: the global fetch). */
  fetch?: (input: Request) => Promise<Response>;
  /** Retries after the first attempt, for 429, 5xx and network errors (default 3). */
  maxRetries?: number;
  /** Waits between retries and polls (default: setTimeout). */
  sleep?: (ms: number) => Promise<void>;
  /** Makes an Idempotency-Key for a create the caller gave none for (default: a random UUID). */
  idempotencyKey?: () => string;
  /** First backoff delay for 5xx and network errors, doubled on each retry (default 250 ms, at most 8 s). */
  retryBaseMs?: number;
}

export type ApiEvent = JsonOf<paths['/events']['get']['responses'][200]>[number];
/** A template of the catalogue (GET /templates). */
export type Template = JsonOf<paths['/templates/{template_vmid}']['get']['responses'][200]>;
/** A disk image in the image store (GET /admin/images). */
export type Image = JsonOf<paths['/admin/images/uploads/{upload_id}/complete']['post']['responses'][201]>;
/** An image upload in progress: `received_bytes` is where its next range starts. */
export type ImageUpload = JsonOf<paths['/admin/images/uploads/{upload_id}']['get']['responses'][200]>;
export type Webhook = JsonOf<paths['/webhooks/{webhook_id}']['get']['responses'][200]>;
export type WebhookDelivery = JsonOf<paths['/webhooks/{webhook_id}/deliveries']['get']['responses'][200]>[number];

export interface FollowEventsOptions {
  /** Resume after this event id (its missed events come first); from now on without it. */
  after?: string;
  /** Only these types. */
  types?: readonly string[];
  /** Only events about this VM (its uuid). */
  vmId?: string;
  signal?: AbortSignal;
  /**
   * Called each time a connection is established (the first, and after a
   * reconnection): from then on no event is missed, so this is the moment to
   * read the state the events will keep up to date.
   */
  onOpen?: () => void;
}

export interface WaitForVmOptions {
  /** Give up after this long (default 10 minutes). */
  timeoutMs?: number;
  /** Read the VM this often instead of following its events (and between reads without the event stream: 2000 ms). */
  intervalMs?: number;
  /** Called with the VM whenever its status changes (and on the first poll). */
  onStatus?: (vm: Vm) => void | Promise<void>;
}
