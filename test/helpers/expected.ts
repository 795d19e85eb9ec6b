/**
 * What the service promises, written out by hand so that tests check the
 * service against it (never read from src/): the prices it ships with and the
 * closed list of error codes.
 */

/** The prices that ship with the service (GET /admin/pricing on a new database). */
export const SHIPPED_PRICES = {
  '5090': {
    gpu_ram_mb: 32_768,
    gpu_price_hourly: 0.69,
    interruptible_rate: 0.35,
    storage_price_gb_hourly: 0.0002,
    reserved_discount_1mo: 10,
    reserved_discount_3mo: 20,
    reserved_discount_6mo: 30,
  },
  '4090': {
    gpu_ram_mb: 24_576,
    gpu_price_hourly: 0.44,
    interruptible_rate: 0.22,
    storage_price_gb_hourly: 0.0002,
    reserved_discount_1mo: 10,
    reserved_discount_3mo: 20,
    reserved_discount_6mo: 30,
  },
  pro6000: {
    gpu_ram_mb: 98_304,
    gpu_price_hourly: 1.69,
    interruptible_rate: 0.85,
    storage_price_gb_hourly: 0.0002,
    reserved_discount_1mo: 10,
    reserved_discount_3mo: 20,
    reserved_discount_6mo: 30,
  },
} as const;

/** The closed list of error codes an error response may carry. */
export const ERROR_CODES: ReadonlySet<string> = new Set([
  'insufficient_balance',
  'gpu_unavailable',
  'invalid_state',
  'not_found',
  'rate_limited',
  'validation_error',
  'malformed_json',
  'payload_too_large',
  'unsupported_media_type',
  'invalid_code',
  'unauthorized',
  'forbidden',
  'limit_exceeded',
  'conflict',
  'idempotency_mismatch',
  'internal',
]);
