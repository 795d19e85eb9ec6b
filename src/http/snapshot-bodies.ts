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

/** Where the snapshot comes from. */
export interface SnapshotSource<Snapshot> {
  /** The snapshot already loaded, if it is still current (no promise: what nearly every request finds). */
  current(): Snapshot | undefined;
  /** The current snapshot, loaded if need be. */
  load(): Promise<Snapshot>;
}

export class SnapshotBodies<Snapshot extends object> {
  private readonly bodies = new WeakMap<Snapshot, Map<string, Body>>();

  constructor(private readonly source: SnapshotSource<Snapshot>) {}

  /**
   * Sends the answer for `key`: at once, with no promise, when the current
   * snapshot has its body kept; otherwise, once the snapshot is loaded, what
   * `make` returns for it, serialized with the route's response schema (200)
   * and kept. `total`, when given, is sent as X-Total-Count.
   */
  send(
    reply: FastifyReply,
    key: string,
    make: (snapshot: Snapshot) => Promise<{ payload: unknown; total?: number }>,
  ): void | Promise<void> {
    const current = this.source.current();
    const body = current && this.bodies.get(current)?.get(key);
    if (body) {
      write(reply, body);
      return;
    }
    return this.source.load().then(async (snapshot) => {
      write(reply, await this.bodyOf(reply, snapshot, key, () => make(snapshot)));
    });
  }

  /** The kept body for `key` of `snapshot`, or the one `make` gives, serialized and kept. */
  private async bodyOf(
    reply: FastifyReply,
    snapshot: Snapshot,
    key: string,
    make: () => Promise<{ payload: unknown; total?: number }>,
  ): Promise<Body> {
    let forSnapshot = this.bodies.get(snapshot);
    const kept = forSnapshot?.get(key);
    if (kept) return kept;
    const made = await make();
    const serialized = reply.serialize(made.payload);
    const body = {
      bytes: typeof serialized === 'string' ? Buffer.from(serialized) : Buffer.from(serialized as Uint8Array),
      total: made.total,
    };
    if (!forSnapshot) this.bodies.set(snapshot, (forSnapshot = new Map()));
    if (forSnapshot.size < MAX_PER_SNAPSHOT) forSnapshot.set(key, body);
    return body;
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
