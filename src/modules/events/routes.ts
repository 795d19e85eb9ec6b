/**
 * GET /events and its live form, GET /events/stream: what happened to the caller's VMs, money, keys and account
 * (docs/events.md).
 */
import type { FastifyInstance } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { Type } from 'typebox';
import { DateTime, errorResponses, Nullable } from '../../http/schemas.js';
import { requirePrincipal } from '../../http/principal.js';
import { bearerOf } from '../../http/authenticate.js';
import type { CredentialWatch, CredentialLapse } from '../../http/credential-watch.js';
import { AppError, validation } from '../../errors.js';
import type { Db } from '../../db/db.js';
import { listEvents, positionOf, type EventReader, type EventRow } from './repository.js';
import { assertKnownTypes, EVENT_TYPES, eventRecord } from './service.js';
import type { EventHub } from './hub.js';
import type { Principal } from '../../http/principal.js';
import { UUID_RE } from '../../ids.js';

const Event = Type.Object(
  {
    id: Type.String({ format: 'uuid', description: 'The event id; pass it as `after` to read on from here' }),
    type: Type.String({ description: `One of: ${EVENT_TYPES.join(', ')}` }),
    created_at: DateTime('When it happened, in service time'),
    vm_id: Nullable(Type.String({ format: 'uuid', description: 'The VM it concerns, if any' })),
    data: Type.Record(Type.String(), Type.Unknown(), {
      description: 'What happened: the fields depend on the type (docs/events.md)',
    }),
  },
  {
    examples: [
      {
        id: '019ab3c4-5d6e-7f80-9a1b-2c3d4e5f6a7b',
        type: 'vm.status_changed',
        created_at: '2026-11-24T10:00:00.000Z',
        vm_id: '0b8f3c2e-3f1a-4c55-9d0e-6f1e2a3b4c5d',
        data: { vmid: 1042, from: 'running', to: 'stopped', reason: 'low_balance' },
      },
    ],
  },
);

const MAX_LIMIT = 200;

/**
 * The live streams share one hub (one poller for the instance), and their credentials are checked
 * again on each of its polls before it hands on what it read (`streams`, built with the services).
 */
export function eventRoutes(
  app: FastifyInstance,
  db: Db,
  streams: { hub: EventHub; credentials: CredentialWatch },
): void {
  const r = app.withTypeProvider<TypeBoxTypeProvider>();
  const { hub, credentials } = streams;
  const open = new Set<() => void>();
  /** Streams open on this instance, by user. */
  const streamsOf = new Map<number, number>();
  // Readable with a read_only key (docs/events.md); private to each caller.
  const eventRoute = { auth: 'user', scopes: ['read_only'], cache: 'no-store' } as const;
  r.get(
    '/events',
    {
      schema: {
        tags: ['events'],
        operationId: 'listEvents',
        summary: 'List events',
        description:
          "Your events, oldest first, after the one named by `after` (from the first without it). Administrators also see the nodes' (`node.offline`, `node.online`). To follow along, pass the last id you read as `after`. Readable with a read_only key.",
        querystring: Type.Object(
          {
            after: Type.Optional(
              Type.String({ format: 'uuid', description: 'An event id: only events written after it' }),
            ),
            type: TypeFilter,
            vm_id: VmFilter,
            limit: Type.Optional(
              Type.Integer({
                minimum: 1,
                maximum: MAX_LIMIT,
                default: 50,
                description: `At most this many (1..${MAX_LIMIT}, default 50)`,
              }),
            ),
          },
          { additionalProperties: false },
        ),
        response: { 200: Type.Array(Event), ...errorResponses(401, 403, 422, 429) },
      },
      config: eventRoute,
    },
    async (req) => {
      const reader = readerOf(req.principal);
      const types = parseTypes(req.query.type);
      const afterSeq = req.query.after ? await cursor(db, reader, req.query.after, 'query.after') : 0;
      const rows = await listEvents(db, reader, {
        afterSeq,
        types,
        vmId: req.query.vm_id ?? null,
        limit: req.query.limit ?? 50,
      });
      return rows.map(eventRecord);
    },
  );

  r.get(
    '/events/stream',
    {
      schema: {
        tags: ['events'],
        operationId: 'streamEvents',
        summary: 'Follow events as they happen',
        description:
          'Server-Sent Events (text/event-stream): each event as `id:` (its id), `event:` (its type) and `data:` (the event as GET /events gives it). ' +
          'Resumes after `Last-Event-ID` (or `after`), sending what was missed first; without either, only events from now on. An event written through any instance arrives within about a second. ' +
          'A comment line every 15 s keeps proxies from closing the connection; a client that falls more than 1 MB behind is disconnected and resumes with Last-Event-ID. ' +
          'The stream lasts only as long as its credential: within about a second of the key being revoked, the session ending, the access token expiring, the account being suspended or its role changing (through any instance), it ends with the comment line `: closed: <reason>` (`credential_revoked`, `credential_expired`, `account_suspended`, `role_changed`), and hands on no live event written after that. ' +
          `An account holds at most ${MAX_STREAMS_PER_USER} streams at once per instance; one more is 429 \`rate_limited\`.`,
        querystring: Type.Object(
          {
            after: Type.Optional(
              Type.String({
                format: 'uuid',
                description: 'An event id: resume after it (the Last-Event-ID header wins)',
              }),
            ),
            type: TypeFilter,
            vm_id: VmFilter,
          },
          { additionalProperties: false },
        ),
        headers: Type.Object({
          'last-event-id': Type.Optional(
            Type.String({ description: 'The id of the last event received: resume after it' }),
          ),
        }),
        response: {
          200: {
            description: 'The event stream',
            content: {
              'text/event-stream': {
                schema: Type.String({ description: 'id / event / data lines, one blank line after each event' }),
              },
            },
          },
          ...errorResponses(401, 403, 422, 429),
        },
      },
      config: eventRoute,
    },
    async (req, reply) => {
      const reader = readerOf(req.principal);
      const principal = requirePrincipal(req.principal);
      const credential = bearerOf(req.headers.authorization);
      if (credential === undefined) throw new Error('a stream reached without a bearer credential');
      const types = parseTypes(req.query.type);
      const header = req.headers['last-event-id'];
      const [from, field] =
        typeof header === 'string' && header !== ''
          ? [header, 'headers.last-event-id']
          : [req.query.after, 'query.after'];
      if (from !== undefined && !UUID_RE.test(from)) throw validation(field, 'must be an event id');
      const afterSeq = from !== undefined ? await cursor(db, reader, from, field) : null;
      const filter = { reader, types: types ? new Set(types) : null, vmId: req.query.vm_id ?? null };
      // Each stream holds a connection and a place in the poller: a user (every tab, script and
      // key of theirs together) holds a bounded number at once on each instance.
      const mine = streamsOf.get(reader.userId) ?? 0;
      if (mine >= MAX_STREAMS_PER_USER) {
        throw new AppError(
          'rate_limited',
          `At most ${MAX_STREAMS_PER_USER} event streams per account at once; close one first`,
          undefined,
          { 'retry-after': '5' },
        );
      }
      streamsOf.set(reader.userId, mine + 1);
      const release = () => {
        const left = (streamsOf.get(reader.userId) ?? 1) - 1;
        if (left > 0) streamsOf.set(reader.userId, left);
        else streamsOf.delete(reader.userId);
      };

      reply.hijack();
      const res = reply.raw;
      // The headers set so far (Cache-Control: no-store among them) go with the stream's.
      res.writeHead(200, {
        ...(reply.getHeaders() as Record<string, string>),
        'content-type': 'text/event-stream; charset=utf-8',
        'x-accel-buffering': 'no',
      });
      res.write('retry: 2000\n\n');
      const sent = new Set<string>();
      let ended = false;
      const send = (e: EventRow) => {
        if (ended || sent.has(e.id)) return;
        sent.add(e.id);
        if (sent.size > SENT_MEMORY) sent.delete(sent.values().next().value!);
        res.write(`id: ${e.id}\nevent: ${e.type}\ndata: ${JSON.stringify(eventRecord(e))}\n\n`);
        if (res.writableLength > MAX_BEHIND_BYTES) end(); // resumes with Last-Event-ID
      };
      // Live events wait while what was missed is sent first.
      let waiting: EventRow[] | null = [];
      let unsubscribe: () => void;
      try {
        unsubscribe = await hub.subscribe(filter, (e) => (waiting ? waiting.push(e) : send(e)));
      } catch (err) {
        req.log.error({ err }, 'event stream could not start');
        release();
        res.end();
        return;
      }
      const ping = setInterval(() => res.write(': ping\n\n'), PING_MS);
      // A stream lasts only as long as its credential: the last line says why it ended.
      const unwatch = credentials.watch(credential, principal, (why) => end(why));
      const end = (why?: CredentialLapse) => {
        if (ended) return;
        ended = true;
        release();
        clearInterval(ping);
        unsubscribe();
        unwatch();
        open.delete(end);
        if (why) res.write(`: closed: ${why}\n\n`);
        res.end();
      };
      open.add(end);
      req.raw.once('close', () => end());
      try {
        for (let seq = afterSeq; seq !== null && !ended;) {
          const page = await listEvents(db, reader, { afterSeq: seq, types, vmId: filter.vmId, limit: CATCH_UP_PAGE });
          page.forEach(send);
          seq = page.length === CATCH_UP_PAGE ? Number(page[page.length - 1]!.seq) : null;
        }
        for (const e of waiting) send(e);
        waiting = null;
      } catch (err) {
        req.log.error({ err }, 'event stream catch-up failed');
        end();
      }
    },
  );

  // A stream never ends by itself: closing the server ends them.
  app.addHook('preClose', (done) => {
    for (const end of [...open]) end();
    done();
  });
}

const TypeFilter = Type.Optional(
  Type.Array(Type.String({ maxLength: 1000 }), {
    maxItems: 50,
    description: 'Only these types: repeat the parameter or separate types with commas',
  }),
);
const VmFilter = Type.Optional(Type.String({ format: 'uuid', description: 'Only events about this VM (its uuid)' }));
/** Events read per query while a stream catches up. */
const CATCH_UP_PAGE = 500;
/** Ids a stream remembers having sent (so the catch-up and live events never repeat one). */
const SENT_MEMORY = 5000;
/** A stream whose client reads slower than events come and falls this far behind is closed. */
const MAX_BEHIND_BYTES = 1 << 20;
const PING_MS = 15_000;
/** Streams one user may hold open at once on one instance. */
export const MAX_STREAMS_PER_USER = 20;

function readerOf(principal: Principal | undefined): EventReader {
  const p = requirePrincipal(principal);
  return { userId: p.userId, operator: p.role === 'admin' };
}

/** The types asked for (repeated or comma-separated), or null for all; an unknown one is 422. */
function parseTypes(raw: string[] | undefined): string[] | null {
  const types =
    raw
      ?.flatMap((t) => t.split(','))
      .map((t) => t.trim())
      .filter(Boolean) ?? [];
  assertKnownTypes('query.type', types);
  return types.length ? types : null;
}

/** The position of the reader's event `id`; 422 on `field` when it is not one of theirs. */
async function cursor(db: Db, reader: EventReader, id: string, field: string): Promise<number> {
  const seq = await positionOf(db, reader, id);
  if (seq === undefined) throw validation(field, 'no such event of yours');
  return Number(seq);
}
