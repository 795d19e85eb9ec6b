/** `gpucloud keys ...`: API keys, the credentials of scripts and CI (docs/authentication.md). */
import { call, LIMIT_OPTS, page, printJson, str, type Command } from './command.js';
import { CliUsageError, table } from './output.js';

export const API_KEY_COMMANDS: Command[] = [
  {
    path: 'keys create',
    summary: 'Create an API key (shown once)',
    example: 'gpucloud keys create --name ci --scope read_only',
    options: [
      ['--name <N>', 'A name for the key (required)'],
      ['--scope <S>', 'read_write (default), read_only or billing_only'],
      ['--expires <T>', 'Expiry time (ISO 8601)'],
    ],
    async run(ctx) {
      const name = str(ctx, 'name');
      if (!name) throw new CliUsageError('--name is required');
      const scope = str(ctx, 'scope');
      if (scope !== undefined && !['read_write', 'read_only', 'billing_only'].includes(scope))
        throw new CliUsageError('--scope must be read_write, read_only or billing_only');
      const body: { name: string; scope?: 'read_write' | 'read_only' | 'billing_only'; expires_at?: string } = { name };
      if (scope) body.scope = scope as 'read_write';
      if (str(ctx, 'expires')) body.expires_at = str(ctx, 'expires')!;
      const k = await call(ctx.client().api.POST('/api-keys', { body }));
      if (ctx.json) return printJson(ctx, k);
      ctx.out(`Created API key ${k.id} ("${k.name}", ${k.scope}). It is shown only this once:\n\n  ${k.key}\n`);
    },
  },
  {
    path: 'keys list',
    summary: 'List your API keys',
    example: 'gpucloud keys list',
    options: LIMIT_OPTS,
    async run(ctx) {
      const keys = await call(ctx.client().api.GET('/api-keys', { params: { query: page(ctx) } }));
      if (ctx.json) return printJson(ctx, keys);
      if (keys.length === 0) return ctx.out('No API keys');
      ctx.out(
        table(
          ['ID', 'NAME', 'SCOPE', 'PREFIX', 'CREATED', 'EXPIRES', 'LAST USED'],
          keys.map((k) => [k.id, k.name, k.scope, k.prefix, k.created_at, k.expires_at, k.last_used_at]),
        ),
      );
    },
  },
  {
    path: 'keys revoke',
    args: '<ID>',
    summary: 'Revoke an API key',
    example: 'gpucloud keys revoke 2b7e...',
    async run(ctx) {
      const id = ctx.positionals[0]!;
      await call(ctx.client().api.DELETE('/api-keys/{key_id}', { params: { path: { key_id: id } } }));
      if (ctx.json) return printJson(ctx, {});
      ctx.out(`Revoked API key ${id}`);
    },
  },
];
