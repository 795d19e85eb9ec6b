/**
 * The one place that turns any thrown error into the error shape ({detail, code}, docs/errors.md):
 * `{detail, code, errors?}`. A 500 names the request id and never leaks a stack.
 */
import type { FastifyError, FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { ErrorObject } from 'ajv';
import { AppError, type ErrorCode, ERROR_STATUS } from '../errors.js';
import { fieldErrors } from './validation.js';
import { API_VERSION } from './openapi.js';

/** Fastify's own error codes for body handling (malformed JSON 400, too large 413, other media types 415). */
const FASTIFY_CODES: Record<string, { code: ErrorCode; detail: (e: FastifyError) => string }> = {
  FST_ERR_CTP_INVALID_JSON_BODY: { code: 'malformed_json', detail: (e) => `Malformed JSON body: ${e.message}` },
  FST_ERR_CTP_EMPTY_JSON_BODY: { code: 'malformed_json', detail: () => 'Malformed JSON body: the body is empty' },
  FST_ERR_CTP_BODY_TOO_LARGE: { code: 'payload_too_large', detail: () => 'Request body is larger than 64 KiB' },
  FST_ERR_CTP_INVALID_MEDIA_TYPE: {
    code: 'unsupported_media_type',
    detail: () => 'Unsupported Content-Type: send the body as application/json',
  },
  FST_ERR_CTP_INVALID_CONTENT_LENGTH: {
    code: 'malformed_json',
    detail: () => 'Content-Length does not match the body',
  },
  FST_ERR_CTP_INVALID_TYPE: { code: 'unsupported_media_type', detail: () => 'Invalid Content-Type header' },
};

/** 4xx statuses of foreign errors that map onto an error code with the same status. */
const CLIENT_STATUS_CODE: Record<number, ErrorCode> = {
  401: 'unauthorized',
  403: 'forbidden',
  404: 'not_found',
  413: 'payload_too_large',
  415: 'unsupported_media_type',
  429: 'rate_limited',
};

/**
 * Fastify's `frameworkErrors` option: errors raised while routing, before any
 * hook runs (a URL that is not valid percent-encoding, a path parameter over
 * maxParamLength). Without it Fastify answers in its own shape, without
 * X-Request-Id or API-Version. No route can match such a URL: 404.
 */
export function frameworkErrors(err: FastifyError, req: FastifyRequest, reply: FastifyReply): void {
  reply.header('X-Request-Id', req.id);
  reply.header('API-Version', API_VERSION);
  if (err.code === 'FST_ERR_BAD_URL' || err.code === 'FST_ERR_MAX_PARAM_LENGTH') {
    const path = req.raw.url?.split('?')[0] ?? '';
    const what =
      err.code === 'FST_ERR_BAD_URL' ? 'is not valid percent-encoding' : 'has a path segment that is too long';
    reply.code(404).send({
      detail: `No route matches ${req.raw.method ?? 'GET'} ${path.slice(0, 200)}: the URL ${what}`,
      code: 'not_found',
    });
    return;
  }
  req.log.error({ err }, 'framework error');
  reply.code(500).send({ detail: `Internal server error (request id ${req.id})`, code: 'internal' });
}

export function registerErrorHandler(app: FastifyInstance): void {
  app.setErrorHandler((err: FastifyError | AppError | Error, req, reply) => {
    if (err instanceof AppError) {
      if (err.headers) reply.headers(err.headers);
      const body: Record<string, unknown> = { detail: err.detail, code: err.code };
      if (err.errors) body.errors = err.errors;
      return reply.code(err.status).send(body);
    }
    const fe = err as FastifyError & { validation?: ErrorObject[]; validationContext?: string };
    if (fe.validation) {
      const errors = fieldErrors(fe.validation, fe.validationContext);
      const detail = errors.map((e) => `${e.field} ${e.message}`).join('; ') || 'Invalid request';
      return reply.code(422).send({ detail: `Validation failed: ${detail}`, code: 'validation_error', errors });
    }
    const known = fe.code ? FASTIFY_CODES[fe.code] : undefined;
    if (known) {
      return reply.code(ERROR_STATUS[known.code]).send({ detail: known.detail(fe), code: known.code });
    }
    if (err instanceof SyntaxError || (fe.statusCode === 400 && /JSON/i.test(fe.message))) {
      return reply.code(400).send({ detail: `Malformed JSON body: ${fe.message}`, code: 'malformed_json' });
    }
    if (fe.statusCode && fe.statusCode >= 400 && fe.statusCode < 500) {
      // Any other client error Fastify or a plugin raised: keep its meaning where the closed list has a code for it.
      const code: ErrorCode = CLIENT_STATUS_CODE[fe.statusCode] ?? 'validation_error';
      if (code === 'validation_error') {
        return reply.code(422).send({ detail: fe.message, code, errors: [{ field: 'request', message: fe.message }] });
      }
      return reply.code(ERROR_STATUS[code]).send({ detail: fe.message, code });
    }
    req.log.error({ err }, 'unhandled error');
    return reply.code(500).send({ detail: `Internal server error (request id ${req.id})`, code: 'internal' });
  });

  app.setNotFoundHandler((req, reply) => {
    reply
      .code(404)
      .send({ detail: `Route ${req.method} ${req.url.split('?')[0]!.slice(0, 200)} not found`, code: 'not_found' });
  });
}
