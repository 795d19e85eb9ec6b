/** `gpucloud billing ...`: your balance, usage, current spend and ledger (docs/billing.md). */
import { call, LIMIT_OPTS, page, printJson, str, type Command } from './command.js';
import { money, table } from './output.js';

export const BILLING_COMMANDS: Command[] = [
  {
    path: 'billing balance',
    summary: 'Your credit balance',
    example: 'gpucloud billing balance',
    async run(ctx) {
      const b = await call(ctx.client().api.GET('/billing/balance'));
      if (ctx.json) return printJson(ctx, b);
      ctx.out(`Balance: ${money(b.balance)} ${b.currency}`);
    },
  },
  {
    path: 'billing usage',
    summary: 'Usage and cost over a period, per VM',
    example: 'gpucloud billing usage --from 2026-01-01 --to 2026-01-31',
    options: [
      ['--from <DATE>', 'Start of the period'],
      ['--to <DATE>', 'End of the period'],
    ],
    async run(ctx) {
      const query: { start_date?: string; end_date?: string } = {};
      if (str(ctx, 'from')) query.start_date = str(ctx, 'from')!;
      if (str(ctx, 'to')) query.end_date = str(ctx, 'to')!;
      const u = await call(ctx.client().api.GET('/billing/usage', { params: { query } }));
      if (ctx.json) return printJson(ctx, u);
      const lines = [
        `Period: ${u.period_start} .. ${u.period_end}`,
        `Total:  ${money(u.total_cost)} for ${u.total_hours.toFixed(2)} h`,
      ];
      if (u.vm_breakdown.length)
        lines.push(
          '',
          table(
            ['VM', 'VMID', 'GPU', 'HOURS', 'COST'],
            u.vm_breakdown.map((v) => [v.vm_id, v.vmid, v.gpu_model, v.hours.toFixed(2), money(v.cost)]),
          ),
        );
      ctx.out(lines.join('\n'));
    },
  },
  {
    path: 'billing spend',
    summary: 'What your running VMs cost now',
    example: 'gpucloud billing spend',
    async run(ctx) {
      const s = await call(ctx.client().api.GET('/billing/current-spend'));
      if (ctx.json) return printJson(ctx, s);
      const lines = [
        `${s.running_vms} running VM(s): ${money(s.total_per_hour, 3)}/h, ${money(s.total_per_day)}/day, ${money(s.total_per_month)}/month`,
      ];
      if (s.vms.length)
        lines.push(
          '',
          table(
            ['VMID', 'GPU', 'DISK', 'GPU $/H', 'DISK $/H', 'TOTAL $/H'],
            s.vms.map((v) => [
              v.vmid,
              `${v.gpu_count}x ${v.gpu_type}`,
              `${v.storage_gb} GB`,
              money(v.gpu_cost_per_hour, 3),
              money(v.storage_cost_per_hour, 4),
              money(v.total_cost_per_hour, 3),
            ]),
          ),
        );
      ctx.out(lines.join('\n'));
    },
  },
  {
    path: 'billing transactions',
    summary: 'Your ledger, newest first',
    example: 'gpucloud billing transactions --limit 20',
    options: LIMIT_OPTS,
    async run(ctx) {
      const rows = await call(ctx.client().api.GET('/billing/transactions', { params: { query: page(ctx) } }));
      if (ctx.json) return printJson(ctx, rows);
      if (rows.length === 0) return ctx.out('No transactions');
      ctx.out(
        table(
          ['TIME', 'TYPE', 'AMOUNT', 'BALANCE', 'DESCRIPTION'],
          rows.map((r) => [r.created_at, r.type, money(r.amount, 4), money(r.balance_after, 4), r.description]),
        ),
      );
    },
  },
];
