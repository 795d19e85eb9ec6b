/**
 * The JSON of the ledger: the TypeBox schema is the one definition of a transaction's shape, the
 * OpenAPI document's and BillingService's type alike (docs/billing.md).
 */
import { Type, type Static } from 'typebox';
import { DateTime, Enum } from '../../http/schemas.js';
import { TRANSACTION_TYPES } from './ledger.js';

export const TransactionSchema = Type.Object(
  {
    id: Type.String(),
    type: Enum(TRANSACTION_TYPES),
    amount: Type.Number({ description: 'Signed: positive adds to the balance' }),
    balance_after: Type.Number(),
    description: Type.String(),
    breakdown: Type.Record(Type.String(), Type.Unknown(), {
      description: 'Free-form details (usage figures, fee and refund, ...)',
    }),
    created_at: DateTime(),
  },
  {
    description: 'A ledger entry: credit, charge, deposit, refund or adjustment',
    examples: [
      {
        id: '0f1e2d3c-4b5a-4968-8776-655443322110',
        type: 'credit',
        amount: 50,
        balance_after: 50,
        description: 'Top-up',
        breakdown: {},
        created_at: '2026-11-22T10:00:00.000Z',
      },
    ],
  },
);
export type TransactionRecord = Static<typeof TransactionSchema>;
