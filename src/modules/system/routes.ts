/** GET /healthz and GET /readyz: liveness and readiness, for load balancers and orchestrators (docs/operations.md). */
import type { FastifyInstance, FastifyReply } from 'fastify';
import { Type } from 'typebox';
import { errorResponses } from '../../http/schemas.js';

/** Public, never rate limited, and answered while the database is away (no catching up with the manual clock). */
const HEALTH = { auth: 'public', rateLimit: false, readsTime: false, cache: 'public' } as const;

/** `ping` rejects while the database does not answer. */
export function systemRoutes(app: FastifyInstance, deps: { ping: () => Promise<unknown> }): void {
  app.get(
    '/healthz',
    {
      schema: {
        tags: ['system'],
        operationId: 'getLiveness',
        summary: 'Liveness',
        description: 'The process is up.',
        security: [],
        response: { 200: Type.Object({ status: Type.Literal('ok') }) },
      },
      config: HEALTH,
    },
    async () => ({ status: 'ok' as const }),
  );
  app.get(
    '/readyz',
    {
      schema: {
        tags: ['system'],
        operationId: 'getReadiness',
        summary: 'Readiness',
        description: 'The database answers; 503 otherwise.',
        security: [],
        response: { 200: Type.Object({ status: Type.Literal('ready') }), ...errorResponses(503) },
      },
      config: HEALTH,
    },
    async (_req, reply) => {
      try {
        await deps.ping();
        return { status: 'ready' as const };
      } catch {
        return (reply as FastifyReply).code(503).send({ detail: 'Database unreachable', code: 'internal' });
      }
    },
  );
}
