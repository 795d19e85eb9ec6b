/** GET /events: what happened to the caller's VMs, money, keys and account (docs/events.md). */
import type { FastifyInstance } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { Type } from 'typebox';
import { DateTime, errorResponses, Nullable } from '../../http/schemas.js';
import { requirePrincipal } from '../../http/principal.js';
import { validation } from '../../errors.js';
import type { Db } from '../../db/db.js';
import { EVENT_TYPES, listEvents, positionOf } from './repository.js';

const Event = Type.Object(
  {
    id: Type.String({ format: 'uuid', description: 'The event id; pass it as `after` to read on from here' }),
    type: Type.String({ description: `One of: ${EVENT_TYPES.join(', ')}` }),
    created_at: DateTime('When it happened, in service time'),
    vm_id: Nullable(Type.String({ format: 'uuid', description: 'The VM it concerns, if any' })),
    data: Type.Record(Type.String(), Type.Unknown(), { description: 'What happened: the fields depend on the type (docs/events.md)' }),
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

export function eventRoutes(app: FastifyInstance, db: Db): void {
  const r = app.withTypeProvider<TypeBoxTypeProvider>();
  r.get(
    '/events',
    {
      schema: {
        tags: ['events'],
        operationId: 'listEvents',
        summary: 'List events',
        description:
          'Your events, oldest first, after the one named by `after` (from the first without it). Administrators also see the nodes\' (`node.offline`, `node.online`). To follow along, pass the last id you read as `after`. Readable with a read_only key.',
        querystring: Type.Object(
          {
            after: Type.Optional(Type.String({ format: 'uuid', description: 'An event id: only events written after it' })),
            type: Type.Optional(Type.Array(Type.String({ maxLength: 1000 }), { maxItems: 50, description: 'Only these types: repeat the parameter or separate types with commas' })),
            vm_id: Type.Optional(Type.String({ format: 'uuid', description: 'Only events about this VM (its uuid)' })),
            limit: Type.Optional(Type.Integer({ minimum: 1, maximum: MAX_LIMIT, default: 50, description: `At most this many (1..${MAX_LIMIT}, default 50)` })),
          },
          { additionalProperties: false },
        ),
        response: { 200: Type.Array(Event), ...errorResponses(401, 403, 422, 429) },
      },
    },
    async (req, reply) => {
      const p = requirePrincipal(req.principal);
      const reader = { userId: p.userId, operator: p.role === 'admin' };
      const types = req.query.type?.flatMap((t) => t.split(',')).map((t) => t.trim()).filter(Boolean) ?? null;
      const unknown = types?.find((t) => !(EVENT_TYPES as readonly string[]).includes(t));
      if (unknown !== undefined) throw validation('query.type', `unknown event type ${JSON.stringify(unknown.slice(0, 64))}; the types are ${EVENT_TYPES.join(', ')}`);
      let afterSeq = 0;
      if (req.query.after) {
        const seq = await positionOf(db, reader, req.query.after);
        if (seq === undefined) throw validation('query.after', 'no such event of yours');
        afterSeq = seq;
      }
      const rows = await listEvents(db, reader, { afterSeq, types: types?.length ? types : null, vmId: req.query.vm_id ?? null, limit: req.query.limit ?? 50 });
      reply.header('cache-control', 'no-store');
      return rows.map((e) => ({ id: e.id, type: e.type, created_at: e.created_at.toISOString(), vm_id: e.vm_id, data: e.data }));
    },
  );
}
