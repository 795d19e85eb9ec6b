/**
 * The gpucloud SDK: a typed client generated from the service's own OpenAPI
 * document. `paths`, `components` and `operations` are the
 * generated types (src/sdk/schema.ts; regenerate with
 * `node --import tsx scripts/generate-sdk.ts`).
 */
export { GpuCloudClient } from './client.js';
export { GpuCloudError } from './errors.js';
export { retryAfterMs } from './transport.js';
export type {
  Account,
  ApiEvent,
  CreateVmRequest,
  ErrorBody,
  Image,
  ImageUpload,
  FieldError,
  FollowEventsOptions,
  GpuCloudClientOptions,
  ListVmsQuery,
  LoginResponse,
  Offer,
  SessionTokens,
  Template,
  TokenPair,
  TwoFactorChallenge,
  Vm,
  VmStatus,
  WaitForVmOptions,
  Webhook,
  WebhookDelivery,
} from './types.js';
export type { components, operations, paths } from './schema.js';
