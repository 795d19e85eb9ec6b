/**
 * The gpucloud SDK: a typed client generated from the service's own OpenAPI
 * document. `paths`, `components` and `operations` are the
 * generated types (src/sdk/schema.ts; regenerate with
 * `node --import tsx scripts/generate-sdk.ts`).
 */
export {
  GpuCloudClient,
  GpuCloudError,
  retryAfterMs,
  type Account,
  type ApiEvent,
  type CreateVmRequest,
  type ErrorBody,
  type Image,
  type ImageUpload,
  type FieldError,
  type FollowEventsOptions,
  type GpuCloudClientOptions,
  type ListVmsQuery,
  type LoginResponse,
  type Offer,
  type SessionTokens,
  type Template,
  type TokenPair,
  type TwoFactorChallenge,
  type Vm,
  type VmStatus,
  type WaitForVmOptions,
  type Webhook,
  type WebhookDelivery,
} from './client.js';
export type { components, operations, paths } from './schema.js';
