/**
 * Answers serialized once per snapshot. A public answer made only from an
 * immutable snapshot (the offers) is the same bytes for every caller until the
 * snapshot is replaced, so its serialized body is kept with the snapshot: a
 * WeakMap keyed by the snapshot object, so a replaced snapshot takes its
 * bodies with it and no body outlives the data it was made from. Only the
 * serialization is saved; headers, rate limits and metrics run per request.
 */
import type { FastifyReply } from 'fastify';

interface Body {
  bytes: Buffer;
  total: number | undefined;
}

/** Distinct queries kept per snapshot; beyond it, answers are serialized per request. */
const MAX_PER_SNAPSHOT = 256;

export class SnapshotBodies<Snapshot extends object> {
  private readonly bodies = new WeakMap<Snapshot, Map<string, Body>>();

  /**
   * Sends the answer for `key` made from `snapshot`: the kept bytes, or what
   * `make` returns, serialized with the route's response schema (200) and kept.
   * `total`, when given, is sent as X-Total-Count.
   */
  async send(
    reply: FastifyReply,
    snapshot: Snapshot,
    key: string,
    make: () => Promise<{ payload: unknown; total?: number }>,
  ): Promise<FastifyReply> {
    let forSnapshot = this.bodies.get(snapshot);
    let body = forSnapshot?.get(key);
    if (!body) {
      const made = await make();
      const serialized = reply.serialize(made.payload);
      body = {
        bytes: typeof serialized === 'string' ? Buffer.from(serialized) : Buffer.from(serialized as Uint8Array),
        total: made.total,
      };
      if (!forSnapshot) this.bodies.set(snapshot, (forSnapshot = new Map()));
      if (forSnapshot.size < MAX_PER_SNAPSHOT) forSnapshot.set(key, body);
    }
    return write(reply, body);
  }

  /**
   * As `send`, answering at once, with no promise, when `current` (the
   * snapshot already loaded, if it is still current) has its body for `key`
   * kept: what nearly every request finds. Otherwise waits for `load` and
   * sends the answer `make` gives for that snapshot.
   */
  sendNow(
    reply: FastifyReply,
    current: Snapshot | undefined,
    key: string,
    load: () => Promise<Snapshot>,
    make: (snapshot: Snapshot) => Promise<{ payload: unknown; total?: number }>,
  ): void | Promise<void> {
    const body = current && this.bodies.get(current)?.get(key);
    if (body) {
      write(reply, body);
      return;
    }
    return load().then(async (snapshot) => {
      await this.send(reply, snapshot, key, () => make(snapshot));
    });
  }
}

function write(reply: FastifyReply, body: Body): FastifyReply {
  if (body.total !== undefined) reply.header('X-Total-Count', String(body.total));
  return reply.type('application/json; charset=utf-8').send(body.bytes);
}

/** The query string of a request URL, without the `?` ('' when there is none). */
export function queryString(url: string): string {
  const at = url.indexOf('?');
  return at < 0 ? '' : url.slice(at + 1);
}
