/** The SDK's side of GET /events/stream: its text/event-stream body read as events, and reconnections. */
import type { Client } from 'openapi-fetch';
import { GpuCloudError, unwrap } from './errors.js';
import type { paths } from './schema.js';
import type { ApiEvent, FollowEventsOptions } from './types.js';

/** The events of a text/event-stream body: `data:` lines hold the event; comments and `retry:` are skipped. */
async function* readServerSentEvents(body: ReadableStream<Uint8Array>, signal?: AbortSignal): AsyncGenerator<ApiEvent> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buf = '';
  // Aborting ends the stream here (and its connection), whatever the fetch underneath does with the signal.
  const onAbort = () => void reader.cancel().catch(() => {});
  signal?.addEventListener('abort', onAbort, { once: true });
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buf += decoder.decode(value, { stream: true });
      for (let i = buf.indexOf('\n\n'); i >= 0; i = buf.indexOf('\n\n')) {
        const block = buf.slice(0, i);
        buf = buf.slice(i + 2);
        const data = block
          .split('\n')
          .filter((l) => l.startsWith('data:'))
          .map((l) => l.slice(5).replace(/^ /, ''))
          .join('\n');
        if (data) yield JSON.parse(data) as ApiEvent;
      }
    }
  } catch (err) {
    if (!signal?.aborted) throw err;
  } finally {
    signal?.removeEventListener('abort', onAbort);
    // A caller that stops reading (break, return) closes the connection too.
    void reader.cancel().catch(() => {});
  }
}

/**
 * GET /events/stream, followed across dropped connections (opened again after the last event received), with
 * `'open'` each time a connection is established: followEvents and waitForVm read it.
 */
export async function* streamEvents(
  api: Client<paths>,
  sleep: (ms: number) => Promise<void>,
  opts: FollowEventsOptions,
): AsyncGenerator<ApiEvent | 'open'> {
  let last = opts.after;
  const query: { type?: string[]; vm_id?: string } = {};
  if (opts.types?.length) query.type = [...opts.types];
  if (opts.vmId) query.vm_id = opts.vmId;
  while (!opts.signal?.aborted) {
    let body: ReadableStream<Uint8Array> | null | undefined;
    try {
      body = await unwrap(
        api.GET('/events/stream', {
          params: { query, header: last ? { 'last-event-id': last } : {} },
          parseAs: 'stream',
          ...(opts.signal ? { signal: opts.signal } : {}),
        }),
      );
    } catch (err) {
      if (opts.signal?.aborted) return;
      if (err instanceof GpuCloudError) throw err;
      await sleep(2000); // the network: try again
      continue;
    }
    yield 'open';
    for await (const e of readServerSentEvents(body!, opts.signal)) {
      last = e.id;
      yield e;
      if (opts.signal?.aborted) return;
    }
    if (!opts.signal?.aborted) await sleep(1000);
  }
}
