/** `gpucloud search` and `pricing`: the GPU offers and the price list (docs/offers.md). */
import { call, flag, gpuType, int, LIMIT_OPTS, num, page, printJson, str, type Command } from './command.js';
import { money, table } from './output.js';
import { catalogue, resolveTemplate } from './templates.js';

/** The smallest disk, which an offer's total price per hour includes. */
const MIN_DISK_GB = 50;

export const OFFER_COMMANDS: Command[] = [
  {
    path: 'search',
    summary: "Find GPU offers in the API's order: cheapest on-demand $/GPU/H first, then by node",
    example: [
      'gpucloud search --gpu 4090 --min-gpus 2 --max-price 1.5',
      'gpucloud search --interruptible --limit 5',
      'gpucloud search --template stable-diffusion',
    ],
    options: [
      ['--gpu <TYPE>', '5090, 4090 or pro6000'],
      ['--min-gpus <N>', 'At least N free GPUs'],
      ['--max-price <P>', 'At most P dollars per GPU-hour (the interruptible price with --interruptible)'],
      ['--interruptible', 'Offers for interruptible rentals (priced at the interruptible rate)'],
      ['--location <L>', 'Only in this location'],
      ['--template <T>', 'Only nodes whose host holds this template ready (number or name; see gpucloud templates)'],
      ...LIMIT_OPTS,
    ],
    async run(ctx) {
      // The rows keep the API's order (docs/offers.md), the one the console shows and --limit/--offset page: the
      // on-demand price per GPU-hour, then the node. Re-sorting one page here would disagree with the next page.
      const query: Record<string, string | number> = { ...page(ctx) };
      const g = gpuType(str(ctx, 'gpu'));
      if (g) query.gpu_type = g;
      const minGpus = int(ctx, 'min-gpus', { min: 1 });
      if (minGpus !== undefined) query.min_gpus = minGpus;
      const maxPrice = num(ctx, 'max-price');
      if (maxPrice !== undefined) query.max_price = maxPrice;
      const interruptible = flag(ctx, 'interruptible');
      if (interruptible) query.rental_type = 'interruptible';
      if (str(ctx, 'location')) query.location = str(ctx, 'location')!;
      const t = str(ctx, 'template');
      if (t !== undefined)
        query.template_vmid = resolveTemplate(t, /^\d+$/.test(t.trim()) ? undefined : await catalogue(ctx));
      const offers = await call(ctx.client().api.GET('/search', { params: { query: query as never } }));
      if (ctx.json) return printJson(ctx, offers);
      // interruptible_rate is a price per GPU-hour; the interruptible total mirrors total_price_hourly
      // (gpu_count x the GPU price + the smallest disk), in millionths so that no float noise shows.
      const micros = (v: number) => Math.round(v * 1e6);
      const price = (o: (typeof offers)[number]) =>
        interruptible
          ? (o.gpu_count * micros(o.interruptible_rate) + MIN_DISK_GB * micros(o.storage_price_hourly)) / 1e6
          : o.total_price_hourly;
      if (offers.length === 0) return ctx.out('No offers match');
      ctx.out(
        table(
          [
            'NODE',
            'GPU',
            'GPUS',
            'VRAM',
            'CPU',
            'RAM',
            'DISK',
            '$/GPU/H',
            interruptible ? '$/H (INT)' : '$/H',
            'LOCATION',
          ],
          offers.map((o) => [
            o.node,
            o.gpu_type,
            o.gpu_count,
            `${Math.round(o.gpu_ram_mb / 1024)} GB`,
            o.cpu_cores,
            `${o.ram_gb} GB`,
            `${o.max_storage_gb} GB`,
            money(interruptible ? o.interruptible_rate : o.gpu_price_hourly, 3),
            money(price(o), 3),
            o.location,
          ]),
        ),
      );
    },
  },
  {
    path: 'pricing',
    summary: 'Show the price list',
    example: 'gpucloud pricing',
    async run(ctx) {
      const p = await call(ctx.client().api.GET('/pricing'));
      if (ctx.json) return printJson(ctx, p);
      ctx.out(
        table(
          ['GPU', 'VRAM', '$/GPU/H', 'INT $/GPU/H', '$/GB/H DISK', 'RESERVED 1/3/6 MO', 'FREE'],
          p.gpu_types.map((g) => [
            g.gpu_type,
            `${Math.round(g.gpu_ram_mb / 1024)} GB`,
            money(g.gpu_price_hourly, 3),
            money(g.interruptible_rate, 3),
            money(g.storage_price_gb_hourly, 5),
            `${g.reserved_discount_1mo}% / ${g.reserved_discount_3mo}% / ${g.reserved_discount_6mo}%`,
            `${g.available_gpus}/${g.total_gpus}`,
          ]),
        ) + `\n\nPrices in ${p.currency}, updated ${p.updated_at}`,
      );
    },
  },
];
