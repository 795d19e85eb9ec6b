/** GpuCloudError, what every refused call throws (docs/errors.md), and `unwrap`, which throws it. */
import type { ErrorBody, FieldError } from './types.js';

const STATUS_CODE: Record<number, string> = {
  401: 'unauthorized',
  403: 'forbidden',
  404: 'not_found',
  413: 'payload_too_large',
  415: 'unsupported_media_type',
  422: 'validation_error',
  429: 'rate_limited',
};

/**
 * A request the API refused, with the fields of its error body: `status`
 * (HTTP), `code` (the stable machine-readable code), `detail`, and `errors`
 * on a 422. Waiting on a VM that cannot reach the wanted status, or for too
 * long, also throws one, with `status` 0 and code `invalid_state` or `timeout`.
 */
export class GpuCloudError extends Error {
  readonly status: number;
  readonly code: string;
  readonly detail: string;
  readonly errors?: FieldError[];
  /** The X-Request-Id of the failed response, to quote to the operator. */
  readonly requestId?: string;

  constructor(init: { status: number; code: string; detail: string; errors?: FieldError[]; requestId?: string }) {
    super(init.status ? `${init.detail} (${init.status} ${init.code})` : `${init.detail} (${init.code})`);
    this.name = 'GpuCloudError';
    this.status = init.status;
    this.code = init.code;
    this.detail = init.detail;
    if (init.errors) this.errors = init.errors;
    if (init.requestId) this.requestId = init.requestId;
  }

  /** From a non-2xx response and its parsed body (a non-JSON body from a proxy gets a code by status). */
  static from(response: Response, body: unknown): GpuCloudError {
    const b = (body && typeof body === 'object' ? body : {}) as Partial<ErrorBody>;
    const text = typeof body === 'string' && body.trim() !== '' ? body.trim().slice(0, 200) : undefined;
    return new GpuCloudError({
      status: response.status,
      code:
        typeof b.code === 'string'
          ? b.code
          : (STATUS_CODE[response.status] ?? (response.status >= 500 ? 'internal' : 'unknown')),
      detail:
        typeof b.detail === 'string' ? b.detail : (text ?? `HTTP ${response.status} ${response.statusText}`.trim()),
      ...(Array.isArray(b.errors) ? { errors: b.errors } : {}),
      ...(response.headers.get('x-request-id') ? { requestId: response.headers.get('x-request-id')! } : {}),
    });
  }
}

/** The data of a 2xx answer, or a GpuCloudError. */
export async function unwrap<D>(call: Promise<{ data?: D; error?: unknown; response: Response }>): Promise<D> {
  const { data, error, response } = await call;
  if (!response.ok) throw GpuCloudError.from(response, error);
  return data as D;
}
