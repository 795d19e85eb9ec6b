/**
 * `gpucloud admin ...` through the API (an admin's credentials): nodes, pricing,
 * users, credit and everyone's VMs, and `gpucloud backup` (backup.ts).
 * `admin create-user` and `admin ledger-check` work on the database instead
 * and live in src/main.ts.
 */
import { BACKUP_COMMAND } from './backup.js';
import { call, flag, int, LIMIT_OPTS, page, printJson, str, type Command } from './command.js';
import { CliUsageError, money, table } from './output.js';

export const ADMIN_COMMANDS: Command[] = [
  {
    path: 'admin nodes',
    summary: 'List the nodes (admin)',
    example: 'gpucloud admin nodes',
    options: LIMIT_OPTS,
    async run(ctx) {
      const rows = await call(ctx.client().api.GET('/admin/nodes', { params: { query: page(ctx) } }));
      if (ctx.json) return printJson(ctx, rows);
      ctx.out(
        table(
          ['NODE', 'GPU', 'GPUS', 'FREE', 'STATUS', 'CPU', 'RAM', 'LOCATION', 'CLUSTER'],
          rows.map((n) => [
            n.node,
            n.gpu_type,
            n.gpu_count,
            n.gpus_free,
            n.status,
            n.cpu_cores,
            `${n.ram_gb} GB`,
            n.location,
            n.cluster_name,
          ]),
        ),
      );
    },
  },
  {
    path: 'admin pricing',
    summary: 'The pricing table (admin)',
    example: 'gpucloud admin pricing',
    async run(ctx) {
      const rows = await call(ctx.client().api.GET('/admin/pricing'));
      if (ctx.json) return printJson(ctx, rows);
      ctx.out(
        table(
          ['GPU', '$/GPU/H', 'INTERRUPTIBLE', '$/GB/H', 'RES 1MO', 'RES 3MO', 'RES 6MO', 'UPDATED'],
          rows.map((p) => [
            p.gpu_type,
            money(p.gpu_price_hourly, 3),
            p.interruptible_rate,
            money(p.storage_price_gb_hourly, 5),
            `${p.reserved_discount_1mo}%`,
            `${p.reserved_discount_3mo}%`,
            `${p.reserved_discount_6mo}%`,
            p.updated_at,
          ]),
        ),
      );
    },
  },
  {
    path: 'admin users',
    summary: 'List users (admin)',
    example: 'gpucloud admin users --email alice@example.com',
    options: [['--email <E>', 'Only this email'], ...LIMIT_OPTS],
    async run(ctx) {
      const query: { email?: string; limit?: number; offset?: number } = { ...page(ctx) };
      if (str(ctx, 'email')) query.email = str(ctx, 'email')!;
      const rows = await call(ctx.client().api.GET('/admin/users', { params: { query } }));
      if (ctx.json) return printJson(ctx, rows);
      ctx.out(
        table(
          ['ID', 'EMAIL', 'NAME', 'ROLE', '2FA', 'SUSPENDED', 'MAX VMS', 'MAX GPUS'],
          rows.map((u) => [u.id, u.email, u.name, u.role, u.two_factor_enabled, u.suspended, u.max_vms, u.max_gpus]),
        ),
      );
    },
  },
  {
    path: 'admin credit',
    args: '<USER_ID> <AMOUNT>',
    summary: "Add credit to a user's balance (admin)",
    example: 'gpucloud admin credit 42 25.00 --description "welcome credit"',
    options: [['--description <D>', 'Shown in the ledger']],
    async run(ctx) {
      const [userRaw, amountRaw] = ctx.positionals;
      if (!/^\d+$/.test(userRaw!)) throw new CliUsageError(`USER_ID must be a number, got "${userRaw}"`);
      const amount = Number(amountRaw);
      if (!Number.isFinite(amount)) throw new CliUsageError(`AMOUNT must be a number, got "${amountRaw}"`);
      const body: { amount: number; description?: string } = { amount };
      if (str(ctx, 'description')) body.description = str(ctx, 'description')!;
      const tx = await call(
        ctx
          .client()
          .api.POST('/admin/users/{user_id}/credits', { params: { path: { user_id: Number(userRaw) } }, body }),
      );
      if (ctx.json) return printJson(ctx, tx);
      ctx.out(`Credited ${money(tx.amount)} to user ${userRaw}; balance now ${money(tx.balance_after)}`);
    },
  },
  {
    path: 'admin vms',
    summary: "Everyone's VMs (admin)",
    example: 'gpucloud admin vms --node vm01 --status running',
    options: [
      ['--user <ID>', 'Only this user'],
      ['--node <N>', 'Only on this node'],
      ['--status <S>', 'Only in this status'],
      ['--all', 'Include destroyed VMs'],
      ...LIMIT_OPTS,
    ],
    async run(ctx) {
      const query: Record<string, unknown> = { ...page(ctx) };
      const user = int(ctx, 'user', { min: 1 });
      if (user !== undefined) query.user_id = user;
      if (str(ctx, 'node')) query.node = str(ctx, 'node');
      if (str(ctx, 'status')) query.status = str(ctx, 'status');
      if (flag(ctx, 'all')) query.include_destroyed = true;
      const rows = await call(ctx.client().api.GET('/admin/vms', { params: { query: query as never } }));
      if (ctx.json) return printJson(ctx, rows);
      if (rows.length === 0) return ctx.out('No VMs');
      ctx.out(
        table(
          ['ID', 'VMID', 'USER', 'STATUS', 'GPU', 'NODE', 'RENTAL', '$/H'],
          rows.map((v) => [
            v.id,
            v.vmid,
            v.user_id,
            v.status,
            `${v.gpu_count}x ${v.gpu_type}`,
            v.node,
            v.rental_type,
            money(v.hourly_rate, 3),
          ]),
        ),
      );
    },
  },
  BACKUP_COMMAND,
];
