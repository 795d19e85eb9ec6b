/** Balance, transactions and admin credits (docs/billing.md#the-balance). */
import type { Db } from '../../db/db.js';
import type { Clock } from '../../clock.js';
import { AppError, notFound, validation } from '../../errors.js';
import { formatAmount, toAmount, toMicros } from '../../money.js';
import { CURRENCY } from '../inventory/pricing.js';
import * as ledger from './ledger.js';
import * as repo from './repository.js';
import { recordEvent } from '../events/service.js';
import type { TransactionRow } from './ledger.js';
import type { TransactionRecord } from './schemas.js';

export const toTransactionRecord = (t: TransactionRow): TransactionRecord => ({
  id: t.id,
  type: t.type,
  amount: toAmount(t.amount_micros),
  balance_after: toAmount(t.balance_after_micros),
  description: t.description,
  breakdown: t.breakdown,
  created_at: t.created_at.toISOString(),
});

/** Largest single admin credit: 10 million in the major unit. */
export const MAX_CREDIT_MICROS = 10_000_000 * 1_000_000;
/**
 * Largest balance an admin credit may leave: 1 billion in the major unit,
 * the largest magnitude at which every micro-unit still reads back exactly
 * as a 6-decimal JSON number (15 significant digits; see money.toAmount).
 */
export const MAX_BALANCE_MICROS = 1_000_000_000 * 1_000_000;

export class BillingService {
  constructor(
    private readonly db: Db,
    private readonly clock: Clock,
  ) {}

  /**
   * A credit the user gets once: none is posted when one with this description exists.
   * Returns whether this call posted it.
   */
  async creditOnce(userId: number, micros: number, description: string): Promise<boolean> {
    return this.db.transaction(async (tx) => {
      await ledger.lockBalance(tx, userId);
      if (await repo.hasCredit(tx, userId, description)) return false;
      await ledger.post(tx, { userId, type: 'credit', amountMicros: micros, description, now: this.clock.now() });
      return true;
    });
  }

  async balance(userId: number): Promise<{ balance: number; currency: string }> {
    return { balance: toAmount(await ledger.balance(this.db, userId)), currency: CURRENCY };
  }

  async transactions(
    userId: number,
    limit: number,
    offset: number,
  ): Promise<{ items: TransactionRecord[]; total: number }> {
    const r = await repo.listTransactions(this.db, userId, limit, offset);
    return { items: r.rows.map(toTransactionRecord), total: r.total };
  }

  /**
   * A `credit` (or `adjustment` when negative) transaction written by an admin
   * (docs/billing.md#admin-credits-and-adjustments).
   */
  async adminCredit(actorId: number, userId: number, amount: number, description?: string): Promise<TransactionRecord> {
    if (Math.abs(amount) > MAX_CREDIT_MICROS / 1_000_000)
      throw validation('body.amount', 'must be at most 10000000 in absolute value');
    const micros = toMicros(amount);
    if (micros === null) throw validation('body.amount', 'must be an amount with at most 6 decimals');
    if (micros === 0) throw validation('body.amount', 'must not be zero');
    return this.db.transaction(async (tx) => {
      const exists = await repo.lockBalanceRow(tx, userId);
      if (!exists) throw notFound('User');
      if (exists.balance_micros + micros > MAX_BALANCE_MICROS) {
        throw new AppError('limit_exceeded', `A balance may not exceed ${formatAmount(MAX_BALANCE_MICROS)}`);
      }
      const row = await ledger.post(tx, {
        userId,
        type: micros > 0 ? 'credit' : 'adjustment',
        amountMicros: micros,
        description:
          description?.trim() || (micros > 0 ? 'Credit added by an administrator' : 'Adjustment by an administrator'),
        breakdown: { by_admin: actorId },
        now: this.clock.now(),
      });
      if (micros > 0) {
        await recordEvent(tx, {
          type: 'billing.credit_added',
          userId,
          data: { amount: toAmount(micros), balance: toAmount(row.balance_after_micros), transaction_id: row.id },
          at: row.created_at,
        });
      }
      return toTransactionRecord(row);
    });
  }

  async ledgerProblems() {
    return repo.unbalancedAccounts(this.db);
  }
}
