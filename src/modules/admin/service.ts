/** The operator's view of accounts: list, look up, change role, suspension and limits. */
import type { Db } from '../../db/db.js';
import type { Clock } from '../../clock.js';
import { invalidState, notFound } from '../../errors.js';
import { toAmount } from '../../money.js';
import type { UserRow } from '../auth/repository.js';
import { toUserRecord, type AccountPatch, type AuthService, type UserRecord } from '../auth/service.js';

export interface AdminUserRecord extends UserRecord {
  /** Credit balance in the major unit. */
  balance: number;
  suspended: boolean;
  max_vms: number | null;
  max_gpus: number | null;
  updated_at: string;
}

export type UserPatch = AccountPatch;

/** Called inside the suspension's transaction (the VM module stops the user's VMs here). */
export type SuspensionHook = (tx: import('../../db/db.js').Queryable, userId: number, now: Date) => Promise<void>;

const toAdminRecord = (u: UserRow): AdminUserRecord => ({
  ...toUserRecord(u),
  balance: toAmount(u.balance_micros),
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
    return { items: r.rows.map(toAdminRecord), total: r.total };
  }

  async get(id: number): Promise<AdminUserRecord> {
    const u = await this.accounts.accountRow(this.db, id);
    if (!u) throw notFound('User');
    return toAdminRecord(u);
  }

  async patch(actorId: number, id: number, patch: UserPatch): Promise<AdminUserRecord> {
    const record = await this.db.transaction(async (tx) => {
      if (id === actorId && (patch.suspended === true || patch.role === 'user')) {
        throw invalidState('Administrators cannot suspend or demote themselves; ask another administrator');
      }
      const now = this.clock.now();
      // A suspension stops the user's running VMs before it locks the user's row: the lock order of
      // everything that touches VMs and money (docs/billing.md#lock-order) has the VMs, their meters and
      // reservations before the balance, which lives on that row.
      if (patch.suspended === true) {
        const current = await this.accounts.accountRow(tx, id);
        if (current && !current.suspended) {
          for (const hook of this.suspensionHooks) await hook(tx, id, now);
        }
      }
      if (!(await this.accounts.accountRow(tx, id, true))) throw notFound('User');
      const after = (await this.accounts.changeAccount(tx, id, patch, now))!;
      return toAdminRecord(after);
    });
    for (const hook of this.changeHooks) hook(id);
    return record;
  }
}
