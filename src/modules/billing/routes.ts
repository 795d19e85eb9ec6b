/** Balance and transactions, and admin credits (docs/billing.md). */
import type { FastifyInstance } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { Type } from 'typebox';
import { errorResponses, page, pageArgs, PaginationQuery } from '../../http/schemas.js';
import { requirePrincipal } from '../../http/principal.js';
import type { BillingService } from './service.js';
import { TransactionSchema } from './schemas.js';

const UserId = Type.Object({
  user_id: Type.Integer({ minimum: 1, maximum: Number.MAX_SAFE_INTEGER, description: "The user's id" }),
});

export function billingRoutes(app: FastifyInstance, billing: BillingService): void {
  const r = app.withTypeProvider<TypeBoxTypeProvider>();

  r.get(
    '/billing/balance',
    {
      schema: {
        tags: ['billing'],
        operationId: 'getBalance',
        summary: 'Your credit balance',
        description:
          "Your prepaid credit balance in the currency's major unit (at most 6 decimals). Running VMs are charged from it every hour.",
        response: {
          200: Type.Object(
            { balance: Type.Number(), currency: Type.String() },
            { examples: [{ balance: 42.5, currency: 'USD' }] },
          ),
          ...errorResponses(401, 403, 429),
        },
      },
      config: { auth: 'user', scopes: ['read_only', 'billing_only'], cache: 'no-store' },
    },
    async (req) => billing.balance(requirePrincipal(req.principal).userId),
  );

  r.get(
    '/billing/transactions',
    {
      schema: {
        tags: ['billing'],
        operationId: 'listTransactions',
        summary: 'Your transactions',
        description: 'Newest first; limit at most 100 (default 50). X-Total-Count holds the total.',
        querystring: Type.Object(PaginationQuery, { additionalProperties: false }),
        response: { 200: Type.Array(TransactionSchema), ...errorResponses(401, 403, 422, 429) },
      },
      config: { auth: 'user', scopes: ['read_only', 'billing_only'], cache: 'no-store' },
    },
    async (req, reply) =>
      page(reply, await billing.transactions(requirePrincipal(req.principal).userId, ...pageArgs(req.query))),
  );

  r.post(
    '/admin/users/:user_id/credits',
    {
      schema: {
        tags: ['admin'],
        operationId: 'addCredits',
        summary: 'Credit (or debit) a user',
        description:
          'A positive amount writes a `credit` transaction, a negative one an `adjustment`. Non-zero, at most 6 decimals, at most 10 000 000 in absolute value (422); a credit that would take the balance over 1 000 000 000 is 400 limit_exceeded. Honours Idempotency-Key.',
        params: UserId,
        body: Type.Object(
          {
            amount: Type.Number({ description: "In the currency's major unit" }),
            description: Type.Optional(Type.String({ maxLength: 500 })),
          },
          { additionalProperties: false, examples: [{ amount: 100, description: 'Welcome credit' }] },
        ),
        response: { 201: TransactionSchema, ...errorResponses(400, 401, 403, 404, 415, 422, 429) },
      },
      config: { auth: 'admin', scopes: [], cache: 'no-store', idempotent: true },
    },
    async (req, reply) => {
      reply.code(201);
      return billing.adminCredit(
        requirePrincipal(req.principal).userId,
        req.params.user_id,
        req.body.amount,
        req.body.description,
      );
    },
  );
}
