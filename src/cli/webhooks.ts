/** `gpucloud webhooks ...`: endpoints that receive your events (docs/webhooks.md). */
import type { Webhook, WebhookDelivery } from '../sdk/index.js';
import {
  call,
  int,
  LIMIT_OPTS,
  page,
  printJson,
  str,
  flag,
  type Command,
  type Ctx,
  type OptionSpec,
} from './command.js';
import { CliFailure, CliUsageError, keyValues, table } from './output.js';

const hookPath = (id: string) => ({ params: { path: { webhook_id: id } } });

/** `--events a,b` (repeatable) as a list; `all` means every type (null). */
function eventTypes(ctx: Ctx): string[] | null | undefined {
  const raw = ctx.values.events;
  const list = (Array.isArray(raw) ? raw : raw === undefined ? [] : [raw])
    .filter((v): v is string => typeof v === 'string')
    .flatMap((v) => v.split(','))
    .map((v) => v.trim())
    .filter(Boolean);
  if (list.length === 0) return undefined;
  if (list.includes('all')) {
    if (list.length > 1) throw new CliUsageError('--events all cannot be combined with other types');
    return null;
  }
  return list;
}

const typesOf = (w: Webhook) => (w.event_types ? w.event_types.join(',') : 'all');
const stateOf = (w: Webhook) =>
  w.enabled
    ? w.failing_since
      ? `failing since ${w.failing_since}`
      : 'on'
    : w.disabled_reason === 'failing'
      ? 'off (failing)'
      : 'off';

function showHook(w: Webhook): string {
  return keyValues([
    ['ID', w.id],
    ['URL', w.url],
    ['Events', typesOf(w)],
    ['Description', w.description],
    ['State', stateOf(w)],
    ['Created', w.created_at],
    ['Updated', w.updated_at],
  ]);
}

function attemptLine(a: WebhookDelivery): string {
  const what = a.status_code !== null ? `HTTP ${a.status_code}` : (a.error ?? 'no answer');
  const next = a.outcome === 'retrying' && a.next_attempt_at ? `, next attempt ${a.next_attempt_at}` : '';
  return `${a.outcome} (${what}, ${a.duration_ms} ms${next})`;
}

const EVENTS_OPT: OptionSpec = [
  '--events <T>',
  'The event types to send, comma-separated or repeated; "all" for every type (see gpucloud events)',
  { repeatable: true },
];

export const WEBHOOK_COMMANDS: Command[] = [
  {
    path: 'webhooks create',
    args: '<URL>',
    summary: 'Add an endpoint that receives your events (its secret is shown once)',
    example: [
      'gpucloud webhooks create https://hooks.example.com/gpucloud --events vm.interrupted,billing.low_balance',
      'gpucloud webhooks create https://hooks.example.com/all --description "audit log"',
    ],
    options: [EVENTS_OPT, ['--description <D>', 'A note for you']],
    async run(ctx) {
      const body: { url: string; event_types?: string[] | null; description?: string } = { url: ctx.positionals[0]! };
      const types = eventTypes(ctx);
      if (types !== undefined) body.event_types = types;
      if (str(ctx, 'description') !== undefined) body.description = str(ctx, 'description')!;
      const w = await call(ctx.client().api.POST('/webhooks', { body }));
      if (ctx.json) return printJson(ctx, w);
      ctx.out(
        `Added webhook ${w.id} -> ${w.url} (${typesOf(w)}).\nIts signing secret is shown only this once; your receiver verifies each request with it:\n\n  ${w.secret}\n\nTry it: gpucloud webhooks test ${w.id}`,
      );
    },
  },
  {
    path: 'webhooks list',
    summary: 'List your webhook endpoints',
    example: 'gpucloud webhooks list',
    options: LIMIT_OPTS,
    async run(ctx) {
      const hooks = await call(ctx.client().api.GET('/webhooks', { params: { query: page(ctx) } }));
      if (ctx.json) return printJson(ctx, hooks);
      if (hooks.length === 0) return ctx.out('No webhooks; add one with: gpucloud webhooks create https://...');
      ctx.out(
        table(
          ['ID', 'URL', 'EVENTS', 'STATE', 'DESCRIPTION'],
          hooks.map((w) => [w.id, w.url, typesOf(w), stateOf(w), w.description]),
        ),
      );
    },
  },
  {
    path: 'webhooks show',
    args: '<ID>',
    summary: 'Show a webhook endpoint',
    example: 'gpucloud webhooks show 4a7c...',
    async run(ctx) {
      const w = await call(ctx.client().api.GET('/webhooks/{webhook_id}', hookPath(ctx.positionals[0]!)));
      if (ctx.json) return printJson(ctx, w);
      ctx.out(showHook(w));
    },
  },
  {
    path: 'webhooks update',
    args: '<ID>',
    summary: 'Change an endpoint: its URL, events, description, or turn it on or off',
    example: ['gpucloud webhooks update 4a7c... --events all', 'gpucloud webhooks update 4a7c... --enable'],
    options: [
      ['--url <U>', 'A new URL'],
      EVENTS_OPT,
      ['--description <D>', 'A new note'],
      ['--enable', 'Turn it on (also after the service turned it off for failing)'],
      ['--disable', 'Turn it off (what waits for it is dropped)'],
    ],
    async run(ctx) {
      if (flag(ctx, 'enable') && flag(ctx, 'disable'))
        throw new CliUsageError('--enable and --disable exclude each other');
      const body: { url?: string; event_types?: string[] | null; description?: string; enabled?: boolean } = {};
      if (str(ctx, 'url') !== undefined) body.url = str(ctx, 'url')!;
      const types = eventTypes(ctx);
      if (types !== undefined) body.event_types = types;
      if (str(ctx, 'description') !== undefined) body.description = str(ctx, 'description')!;
      if (flag(ctx, 'enable')) body.enabled = true;
      if (flag(ctx, 'disable')) body.enabled = false;
      if (Object.keys(body).length === 0)
        throw new CliUsageError('nothing to change: give --url, --events, --description, --enable or --disable');
      const w = await call(
        ctx.client().api.PATCH('/webhooks/{webhook_id}', { ...hookPath(ctx.positionals[0]!), body }),
      );
      if (ctx.json) return printJson(ctx, w);
      ctx.out(showHook(w));
    },
  },
  {
    path: 'webhooks rm',
    args: '<ID>',
    summary: 'Delete a webhook endpoint',
    example: 'gpucloud webhooks rm 4a7c...',
    async run(ctx) {
      const id = ctx.positionals[0]!;
      await call(ctx.client().api.DELETE('/webhooks/{webhook_id}', hookPath(id)));
      if (ctx.json) return printJson(ctx, {});
      ctx.out(`Deleted webhook ${id}`);
    },
  },
  {
    path: 'webhooks rotate-secret',
    args: '<ID>',
    summary: 'A new signing secret (shown once); the old one still signs for 24 hours',
    example: 'gpucloud webhooks rotate-secret 4a7c...',
    async run(ctx) {
      const w = await call(
        ctx.client().api.POST('/webhooks/{webhook_id}/rotate-secret', hookPath(ctx.positionals[0]!)),
      );
      if (ctx.json) return printJson(ctx, w);
      ctx.out(
        `New signing secret for webhook ${w.id}, shown only this once (the old one still signs for 24 hours):\n\n  ${w.secret}\n`,
      );
    },
  },
  {
    path: 'webhooks test',
    args: '<ID>',
    summary: "Send a webhook.test event and wait for the first attempt's outcome",
    example: 'gpucloud webhooks test 4a7c...',
    options: [['--timeout <S>', 'Seconds to wait for the attempt (default 30)']],
    async run(ctx) {
      const id = ctx.positionals[0]!;
      const timeoutS = int(ctx, 'timeout', { min: 1, max: 3600, def: 30 })!;
      const client = ctx.client();
      const { event_id } = await call(client.api.POST('/webhooks/{webhook_id}/test', hookPath(id)));
      if (!ctx.json) ctx.err(`Sent test event ${event_id}; waiting for the attempt...`);
      const deadline = Date.now() + timeoutS * 1000;
      for (;;) {
        const attempts = await call(
          client.api.GET('/webhooks/{webhook_id}/deliveries', {
            params: { path: { webhook_id: id }, query: { limit: 20 } },
          }),
        );
        const a = attempts.find((x) => x.event_id === event_id);
        if (a) {
          if (ctx.json) printJson(ctx, a);
          else ctx.out(`Test event ${event_id}: ${attemptLine(a)}`);
          if (a.outcome !== 'succeeded') throw new CliFailure('The endpoint did not answer 2xx', 1);
          return;
        }
        if (Date.now() > deadline)
          throw new CliFailure(
            `No attempt within ${timeoutS} s: is a worker running? (gpucloud serve --role worker)`,
            1,
          );
        await new Promise((r) => setTimeout(r, 500));
      }
    },
  },
  {
    path: 'webhooks deliveries',
    args: '<ID>',
    summary: 'Delivery attempts to an endpoint, newest first',
    example: 'gpucloud webhooks deliveries 4a7c... --limit 20',
    options: LIMIT_OPTS,
    async run(ctx) {
      const id = ctx.positionals[0]!;
      const attempts = await call(
        ctx
          .client()
          .api.GET('/webhooks/{webhook_id}/deliveries', { params: { path: { webhook_id: id }, query: page(ctx) } }),
      );
      if (ctx.json) return printJson(ctx, attempts);
      if (attempts.length === 0) return ctx.out('No delivery attempts yet');
      ctx.out(
        table(
          ['TIME', 'EVENT', 'TYPE', 'TRY', 'RESULT', 'MS', 'OUTCOME'],
          attempts.map((a) => [
            a.attempted_at,
            a.event_id,
            a.event_type,
            a.attempt,
            a.status_code ?? a.error,
            a.duration_ms,
            a.outcome === 'retrying' && a.next_attempt_at ? `retrying at ${a.next_attempt_at}` : a.outcome,
          ]),
        ),
      );
    },
  },
];
