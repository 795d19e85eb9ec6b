/** /reservations: price, list and cancel reservations (docs/reservations.md). */
import type { FastifyInstance } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { Type } from 'typebox';
import { errorResponses, page, pageArgs, PaginationQuery } from '../../http/schemas.js';
import { requirePrincipal } from '../../http/principal.js';
import type { ReservationService } from './service.js';
import { ReservationSchema } from './schemas.js';

const Months = Type.Unsafe<1 | 3 | 6>({ type: 'integer', enum: [1, 3, 6], description: '1, 3 or 6 months' });

const Calculation = Type.Object(
  {
    discount_percent: Type.Number(),
    deposit_required: Type.Number({ description: 'monthly_cost x months: the whole commitment is prepaid' }),
    monthly_cost: Type.Number({ description: 'hourly_rate_after_discount x 730' }),
    hourly_rate_after_discount: Type.Number({
      description: 'gpu_count x gpu_price_hourly x (1 - discount) + storage_gb x storage_price_gb_hourly',
    }),
    cancellation_fee_25_percent: Type.Number({ description: '25 % of the deposit' }),
    reservation_months: Type.Integer(),
    gpu_type: Type.String(),
    gpu_count: Type.Integer(),
    storage_gb: Type.Integer(),
  },
  {
    examples: [
      {
        discount_percent: 10,
        deposit_required: 319.74,
        monthly_cost: 319.74,
        hourly_rate_after_discount: 0.438,
        cancellation_fee_25_percent: 79.935,
        reservation_months: 1,
        gpu_type: '4090',
        gpu_count: 1,
        storage_gb: 100,
      },
    ],
  },
);

export function reservationRoutes(app: FastifyInstance, reservations: ReservationService): void {
  const r = app.withTypeProvider<TypeBoxTypeProvider>();

  r.post(
    '/reservations/calculate',
    {
      schema: {
        tags: ['reservations'],
        operationId: 'calculateReservation',
        summary: 'Price a reservation',
        description: 'What a reserved VM of this shape would cost. Commit by creating a VM with rental_type reserved.',
        body: Type.Object(
          {
            gpu_type: Type.Unsafe<'5090' | '4090' | 'pro6000'>({ type: 'string', enum: ['5090', '4090', 'pro6000'] }),
            gpu_count: Type.Unsafe<1 | 2 | 4 | 8>({ type: 'integer', enum: [1, 2, 4, 8] }),
            storage_gb: Type.Integer({ minimum: 50, maximum: 1_000_000 }),
            reservation_months: Type.Optional(Months),
          },
          {
            additionalProperties: false,
            examples: [{ gpu_type: '4090', gpu_count: 1, storage_gb: 100, reservation_months: 3 }],
          },
        ),
        response: { 200: Calculation, ...errorResponses(400, 401, 403, 415, 422, 429) },
      },
      config: { auth: 'user', scopes: ['billing_only'], cache: 'no-store' },
    },
    async (req) => reservations.calculate(req.body),
  );

  r.get(
    '/reservations',
    {
      schema: {
        tags: ['reservations'],
        operationId: 'listReservations',
        summary: 'Your reservations',
        description:
          'Your reservations, newest first: term, GPU type and count, storage, deposit, what usage has not drawn yet (remaining_balance), and status.',
        querystring: Type.Object(PaginationQuery, { additionalProperties: false }),
        response: { 200: Type.Array(ReservationSchema), ...errorResponses(401, 403, 422, 429) },
      },
      config: { auth: 'user', scopes: ['read_only'], cache: 'no-store' },
    },
    async (req, reply) =>
      page(reply, await reservations.list(requirePrincipal(req.principal).userId, ...pageArgs(req.query))),
  );

  r.delete(
    '/reservations/:reservation_id',
    {
      schema: {
        tags: ['reservations'],
        operationId: 'cancelReservation',
        summary: 'Cancel a reservation',
        description:
          'Active reservations only (else 400 invalid_state). 25 % of the remaining balance is kept as a fee, 75 % is refunded to your credit balance; the VM, if it still exists, goes on as on-demand at on-demand prices.',
        params: Type.Object({ reservation_id: Type.String({ description: "The reservation's id (uuid)" }) }),
        response: { 200: ReservationSchema, ...errorResponses(400, 401, 403, 404, 429) },
      },
      config: { auth: 'user', scopes: [], cache: 'no-store' },
    },
    async (req) => reservations.cancel(requirePrincipal(req.principal).userId, req.params.reservation_id),
  );
}
