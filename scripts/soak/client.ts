/** HTTP calls to the API (fetch, keep-alive), each with its own X-Request-Id and timeout. */

export interface Reply {
  status: number;
  /** Parsed JSON body, or undefined when the body was not JSON. */
  body: unknown;
  text: string;
  requestId: string;
}

let seq = 0;
const run = Math.random().toString(36).slice(2, 8);

export function nextRequestId(): string {
  return `soak-${run}-${++seq}`;
}

export interface CallOptions {
  token?: string;
  body?: unknown;
  headers?: Record<string, string>;
  timeoutMs: number;
  requestId?: string;
}

/** One request; rejects on network errors and timeouts (the error names the request id). */
export async function httpCall(base: string, method: string, path: string, o: CallOptions): Promise<Reply> {
  const requestId = o.requestId ?? nextRequestId();
  const headers: Record<string, string> = { 'x-request-id': requestId, ...o.headers };
  if (o.token) headers.authorization = `Bearer ${o.token}`;
  if (o.body !== undefined) headers['content-type'] = 'application/json';
  const res = await fetch(`${base}${path}`, {
    method,
    headers,
    body: o.body === undefined ? undefined : JSON.stringify(o.body),
    signal: AbortSignal.timeout(o.timeoutMs),
  });
  const text = await res.text();
  let body: unknown;
  try {
    body = text ? JSON.parse(text) : undefined;
  } catch {
    body = undefined;
  }
  return { status: res.status, body, text, requestId };
}

/** The error code of an error answer, if it has one. */
export function errorCode(r: Reply): string | undefined {
  const b = r.body as { code?: unknown } | undefined;
  return typeof b?.code === 'string' ? b.code : undefined;
}

/** A call that must succeed (setup, teardown): throws with the answer otherwise. */
export async function must<T>(
  base: string,
  method: string,
  path: string,
  o: CallOptions,
  okStatus: number[] = [200, 201],
): Promise<T> {
  const r = await httpCall(base, method, path, o);
  if (!okStatus.includes(r.status))
    throw new Error(`${method} ${path}: ${r.status} ${r.text.slice(0, 500)} (x-request-id ${r.requestId})`);
  return r.body as T;
}
