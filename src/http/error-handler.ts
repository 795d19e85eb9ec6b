/**
 * The one place that turns any thrown error into D1's shape:
 * `{detail, code, errors?}`. A 500 names the request id and never leaks a stack.
 */
import type { FastifyError, FastifyInstance } from 'fastify';
import type { ErrorObject } from 'ajv';
import { AppError, type ErrorCode, ERROR_STATUS } from '../errors.js';
import { fieldErrors } from './validation.js';

/** Fastify's own error codes for body handling (D2). */
const FASTIFY_CODES: Record<string, { code: ErrorCode; detail: (e: FastifyError) => string }> = {
  FST_ERR_CTP_INVALID_JSON_BODY: { code: 'malformed_json', detail: (e) => `Malformed JSON body: ${e.message}` },
  FST_ERR_CTP_EMPTY_JSON_BODY: { code: 'malformed_json', detail: () => 'Malformed JSON body: the body is empty' },
  FST_ERR_CTP_BODY_TOO_LARGE: { code: 'payload_too_large', detail: () => 'Request body is larger than 64 KiB' },
  FST_ERR_CTP_INVALID_MEDIA_TYPE: {
    code: 'unsupported_media_type',
    detail: () => 'Unsupported Content-Type: send the body as application/json',
  },
  FST_ERR_CTP_INVALID_CONTENT_LENGTH: { code: 'malformed_json', detail: () => 'Content-Length does not match the body' },
  FST_ERR_CTP_INVALID_TYPE: { code: 'unsupported_media_type', detail: () => 'Invalid Content-Type header' },
};

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
      // Any other client error Fastify raised (e.g. an unsupported method/URL shape).
      const code: ErrorCode = fe.statusCode === 404 ? 'not_found' : fe.statusCode === 413 ? 'payload_too_large' : fe.statusCode === 415 ? 'unsupported_media_type' : 'validation_error';
      return reply.code(ERROR_STATUS[code]).send({ detail: fe.message, code });
    }
    req.log.error({ err }, 'unhandled error');
    return reply
      .code(500)
      .send({ detail: `Internal server error (request id ${req.id})`, code: 'internal' });
  });

  app.setNotFoundHandler((req, reply) => {
    reply.code(404).send({ detail: `Route ${req.method} ${req.url.split('?')[0]} not found`, code: 'not_found' });
  });
}
