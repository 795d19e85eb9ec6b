/** `gpucloud reservations ...`: quote, list and cancel reservations (docs/reservations.md). */
import { call, confirmOrAbort, gpuType, int, LIMIT_OPTS, page, printJson, str, type Command } from './command.js';
import { CliUsageError, keyValues, money, table, type Cell } from './output.js';

/** A reservation's quote, for `reservations quote` and before `vm create --reserved` asks. */
export function quoteText(q: {
  reservation_months: number;
  gpu_count: number;
  gpu_type: string;
  storage_gb: number;
  discount_percent: number;
  hourly_rate_after_discount: number;
  monthly_cost: number;
  deposit_required: number;
  cancellation_fee_25_percent: number;
}): string {
  return keyValues([
    ['Reservation', `${q.reservation_months} month(s), ${q.gpu_count}x ${q.gpu_type}, ${q.storage_gb} GB disk`],
    ['Discount', `${q.discount_percent}%`],
    ['Hourly rate', money(q.hourly_rate_after_discount, 4)],
    ['Monthly cost', money(q.monthly_cost)],
    ['Deposit now', money(q.deposit_required)],
    ['Cancellation fee', money(q.cancellation_fee_25_percent)],
  ] as [string, Cell][]);
}

export const RESERVATION_COMMANDS: Command[] = [
  {
    path: 'reservations quote',
    summary: 'Price a reservation',
    example: 'gpucloud reservations quote --gpu 5090 --count 2 --disk 100 --months 3',
    options: [
      ['--gpu <TYPE>', '5090, 4090 or pro6000 (required)'],
      ['--count <N>', 'GPUs: 1, 2, 4 or 8 (default 1)'],
      ['--disk <GB>', 'Disk size (default 50)'],
      ['--months <M>', '1, 3 or 6 (default 1)'],
    ],
    async run(ctx) {
      const gpu = gpuType(str(ctx, 'gpu'));
      if (!gpu) throw new CliUsageError('--gpu is required');
      const count = int(ctx, 'count', { def: 1 })!;
      if (![1, 2, 4, 8].includes(count)) throw new CliUsageError('--count must be 1, 2, 4 or 8');
      const months = int(ctx, 'months', { def: 1 })!;
      if (![1, 3, 6].includes(months)) throw new CliUsageError('--months must be 1, 3 or 6');
      const q = await call(
        ctx.client().api.POST('/reservations/calculate', {
          body: {
            gpu_type: gpu,
            gpu_count: count as 1,
            storage_gb: int(ctx, 'disk', { def: 50, min: 1 })!,
            reservation_months: months as 1,
          },
        }),
      );
      if (ctx.json) return printJson(ctx, q);
      ctx.out(quoteText(q));
    },
  },
  {
    path: 'reservations list',
    summary: 'Your reservations',
    example: 'gpucloud reservations list',
    options: LIMIT_OPTS,
    async run(ctx) {
      const rows = await call(ctx.client().api.GET('/reservations', { params: { query: page(ctx) } }));
      if (ctx.json) return printJson(ctx, rows);
      if (rows.length === 0) return ctx.out('No reservations');
      ctx.out(
        table(
          ['ID', 'VM', 'GPU', 'MONTHS', 'DISCOUNT', 'DEPOSIT', 'REMAINING', 'STATUS', 'ENDS'],
          rows.map((r) => [
            r.id,
            r.vm_id,
            `${r.gpu_count}x ${r.gpu_type}`,
            r.reservation_months,
            `${r.discount_percent}%`,
            money(r.deposit_amount),
            money(r.remaining_balance),
            r.status,
            r.end_at,
          ]),
        ),
      );
    },
  },
  {
    path: 'reservations cancel',
    args: '<ID>',
    summary: 'Cancel a reservation (a 25% fee applies; asks unless --yes)',
    example: 'gpucloud reservations cancel 9a2d... --yes',
    options: [['-y, --yes', 'Do not ask']],
    async run(ctx) {
      const id = ctx.positionals[0]!;
      await confirmOrAbort(ctx, `Cancel reservation ${id}? A cancellation fee applies.`);
      const r = await call(
        ctx.client().api.DELETE('/reservations/{reservation_id}', { params: { path: { reservation_id: id } } }),
      );
      if (ctx.json) return printJson(ctx, r);
      ctx.out(`Reservation ${r.id} is ${r.status}: fee ${money(r.cancellation_fee)}, refund ${money(r.refund_amount)}`);
    },
  },
];
