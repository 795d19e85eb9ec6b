/**
 * The closed list of machine-readable error codes (docs/errors.md#error-codes)
 * and the HTTP status each one maps to. Every error response is
 * `{ detail, code, errors? }`; nothing else decides a status.
 */
export const ERROR_STATUS = {
  insufficient_balance: 400,
  gpu_unavailable: 400,
  invalid_state: 400,
  not_found: 404,
  rate_limited: 429,
  validation_error: 422,
  malformed_json: 400,
  payload_too_large: 413,
  unsupported_media_type: 415,
  invalid_code: 400,
  unauthorized: 401,
  forbidden: 403,
  limit_exceeded: 400,
  conflict: 400,
  template_unavailable: 400,
  idempotency_mismatch: 422,
  internal: 500,
} as const;

export type ErrorCode = keyof typeof ERROR_STATUS;
export const ERROR_CODES = Object.keys(ERROR_STATUS) as ErrorCode[];

export interface FieldError {
  field: string;
  message: string;
}

export class AppError extends Error {
  readonly status: number;
  constructor(
    readonly code: ErrorCode,
    readonly detail: string,
    readonly errors?: FieldError[],
    readonly headers?: Record<string, string>,
  ) {
    super(detail);
    this.name = 'AppError';
    this.status = ERROR_STATUS[code];
  }
}

export const notFound = (what: string) => new AppError('not_found', `${what} not found`);
export const invalidState = (detail: string) => new AppError('invalid_state', detail);
export const unauthorized = (detail = 'Missing or invalid credentials') => new AppError('unauthorized', detail);
export const forbidden = (detail: string) => new AppError('forbidden', detail);
export const validation = (field: string, message: string) =>
  new AppError('validation_error', `${field}: ${message}`, [{ field, message }]);
