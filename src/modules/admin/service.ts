/** The operator's view of accounts: list, look up, change role, suspension and limits. */
import type { Db, Queryable } from '../../db/db.js';
import type { Clock } from '../../clock.js';
import { invalidState, notFound } from '../../errors.js';
import { toAmount } from '../../money.js';
import * as ledger from '../billing/ledger.js';
import type { UserRow } from '../auth/repository.js';
import { toUserRecord, type AccountPatch, type AuthService } from '../auth/service.js';
import type { AdminUserRecord } from './schemas.js';

export type UserPatch = AccountPatch;

/** Called inside the suspension's transaction (the VM module stops the user's VMs here). */
export type SuspensionHook = (tx: Queryable, userId: number, now: Date) => Promise<void>;

const toAdminRecord = (u: UserRow, balanceMicros: number): AdminUserRecord => ({
  ...toUserRecord(u),
  balance: toAmount(balanceMicros),
  suspended: u.suspended,
  max_vms: u.max_vms,
  max_gpus: u.max_gpus,
  updated_at: u.updated_at.toISOString(),
});

export class AdminUserService {
  private readonly suspensionHooks: SuspensionHook[] = [];
  private readonly changeHooks: ((userId: number) => void)[] = [];

  constructor(
    private readonly db: Db,
    private readonly clock: Clock,
    private readonly accounts: AuthService,
  ) {}

  onSuspend(hook: SuspensionHook): void {
    this.suspensionHooks.push(hook);
  }

  /** Called after a change of role, suspension or limits has committed (remembered credentials are forgotten). */
  onChange(hook: (userId: number) => void): void {
    this.changeHooks.push(hook);
  }

  async list(f: {
    email?: string;
    limit: number;
    offset: number;
  }): Promise<{ items: AdminUserRecord[]; total: number }> {
    const r = await this.accounts.listAccounts(f);
    const balances = await ledger.balancesOf(
      this.db,
      r.rows.map((u) => u.id),
    );
    return { items: r.rows.map((u) => toAdminRecord(u, balances.get(u.id) ?? 0)), total: r.total };
  }

  async get(id: number): Promise<AdminUserRecord> {
    const u = await this.accounts.accountRow(this.db, id);
    if (!u) throw notFound('User');
    return toAdminRecord(u, await ledger.balance(this.db, id));
  }

  async patch(actorId: number, id: number, patch: UserPatch): Promise<AdminUserRecord> {
    const record = await this.db.transaction(async (tx) => {
      if (id === actorId && (patch.suspended === true || patch.role === 'user')) {
        throw invalidState('Administrators cannot suspend or demote themselves; ask another administrator');
      }
      const now = this.clock.now();
      // A suspension stops the user's running VMs before it locks the user's row: stopping a VM locks
      // it, its meter and reservation, then its owner's balance (docs/billing.md#lock-order), and
      // nothing locks a VM while holding the user's row.
      if (patch.suspended === true) {
        const current = await this.accounts.accountRow(tx, id);
        if (current && !current.suspended) {
          for (const hook of this.suspensionHooks) await hook(tx, id, now);
        }
      }
      if (!(await this.accounts.accountRow(tx, id, true))) throw notFound('User');
      const after = (await this.accounts.changeAccount(tx, id, patch, now))!;
      return toAdminRecord(after, await ledger.balance(tx, id));
    });
    for (const hook of this.changeHooks) hook(id);
    return record;
  }
}
