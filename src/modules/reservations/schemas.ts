/**
 * The JSON of reservations: the TypeBox schema is the one definition of a reservation's shape, the
 * OpenAPI document's and ReservationService's type alike (docs/reservations.md).
 */
import { Type, type Static } from 'typebox';
import { DateTime, Enum, Nullable } from '../../http/schemas.js';
import { RESERVATION_STATUSES } from './repository.js';

export const ReservationSchema = Type.Object(
  {
    id: Type.String({ format: 'uuid' }),
    user_id: Type.Integer(),
    vm_id: Type.String(),
    reservation_months: Type.Integer(),
    discount_percent: Type.Number(),
    deposit_amount: Type.Number({ description: 'The whole commitment, prepaid at creation' }),
    remaining_balance: Type.Number({ description: 'What usage has not drawn yet' }),
    status: Enum(RESERVATION_STATUSES),
    created_at: DateTime(),
    end_at: DateTime('created_at + months x 730 h'),
    cancelled_at: Nullable(DateTime()),
    cancellation_fee: Type.Number(),
    refund_amount: Type.Number(),
    gpu_type: Type.String(),
    gpu_count: Type.Integer(),
    storage_gb: Type.Integer(),
  },
  { description: 'A reserved-instance commitment' },
);
export type ReservationRecord = Static<typeof ReservationSchema>;
