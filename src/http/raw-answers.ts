/**
 * The answers the service writes on the raw connection, where Fastify has no say: requests the HTTP
 * parser refused, and every request while the instance stops (docs/operations.md).
 */
import type { ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import { newId } from '../ids.js';
import { API_VERSION } from './openapi.js';

/** What the HTTP parser refused, by its error code (llhttp's `HPE_*`), for the detail of the 400 it gets. */
const NOT_HTTP: Record<string, string> = {
  HPE_INVALID_URL: 'the request target has a character that is not allowed (percent-encode bytes outside ASCII)',
  HPE_INVALID_METHOD: 'the request line does not start with a method',
  HPE_INVALID_VERSION: 'the HTTP version is not supported',
  HPE_INVALID_HEADER_TOKEN: 'a header name or value has a character that is not allowed',
  HPE_INVALID_CONTENT_LENGTH: 'the body cannot be framed: Content-Length is not valid',
  HPE_UNEXPECTED_CONTENT_LENGTH: 'the body cannot be framed: Content-Length is repeated or not allowed here',
  HPE_INVALID_TRANSFER_ENCODING:
    'the body cannot be framed: Transfer-Encoding is not chunked, or comes with Content-Length',
  HPE_INVALID_CHUNK_SIZE: 'the body cannot be framed: a chunk size is not valid',
};
const notHttpDetail = (code: string | undefined): string => {
  const what = code === undefined ? undefined : NOT_HTTP[code];
  return what ? `The request is not valid HTTP: ${what}` : 'The request is not valid HTTP';
};
/**
 * The answer of a stopping instance: 503, and the connection closed after it, so a proxy that sent the
 * request on a kept-alive connection learns to retry elsewhere instead of meeting a reset.
 */
export function drainAnswer(res: ServerResponse): void {
  const body = JSON.stringify({ detail: 'This instance is stopping: send the request again', code: 'internal' });
  res.writeHead(503, {
    'content-type': 'application/json; charset=utf-8',
    'content-length': Buffer.byteLength(body),
    connection: 'close',
    'retry-after': '1',
    'x-request-id': newId(),
    'api-version': API_VERSION,
  });
  res.end(body);
}

/**
 * The timeouts of every HTTP server of the service (the API's, the portal's on its own): a client has
 * GPUCLOUD_REQUEST_TIMEOUT_S to send a whole request (headers within a third of it, at most 10 s), an
 * idle keep-alive connection closes after 5 s; checked every second.
 */
export function httpServerOptions(requestTimeoutS: number) {
  const requestMs = requestTimeoutS * 1000;
  return {
    requestTimeout: requestMs,
    headersTimeout: Math.min(requestMs, Math.max(1000, Math.floor(requestMs / 3)), 10_000),
    keepAliveTimeout: 5000,
    connectionsCheckingInterval: 1000,
  };
}

/**
 * Requests Node refuses before Fastify sees them (headers too large, a malformed request line, a
 * timeout) are answered in the error shape too, and the connection is closed cleanly.
 */
export function clientErrorAnswer(requestTimeoutS: number) {
  return (err: NodeJS.ErrnoException, socket: Duplex): void => {
    if (err.code === 'ECONNRESET' || !socket.writable) {
      socket.destroy();
      return;
    }
    const [status, reason, detail] =
      err.code === 'HPE_HEADER_OVERFLOW'
        ? [431, 'Request Header Fields Too Large', 'The request headers are too large (at most 16 KiB in all)']
        : err.code === 'ERR_HTTP_REQUEST_TIMEOUT'
          ? [408, 'Request Timeout', `The request did not arrive within ${requestTimeoutS} s`]
          : [400, 'Bad Request', notHttpDetail(err.code)];
    const requestId = newId();
    // Never `malformed_json`: no body was parsed. The closed list's code for a request that is not acceptable as
    // sent is `validation_error`, whatever the status (docs/errors.md#request-bodies).
    const body = JSON.stringify({ detail: `${detail} (request id ${requestId})`, code: 'validation_error' });
    socket.end(
      `HTTP/1.1 ${status} ${reason}\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: ${Buffer.byteLength(body)}\r\n` +
        `X-Request-Id: ${requestId}\r\nAPI-Version: ${API_VERSION}\r\nX-Content-Type-Options: nosniff\r\nConnection: close\r\n\r\n${body}`,
    );
  };
}
