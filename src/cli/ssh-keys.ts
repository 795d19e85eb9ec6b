/** `gpucloud ssh-keys ...`: the SSH public keys a VM can be created with. */
import { readFileSync } from 'node:fs';
import { call, LIMIT_OPTS, page, printJson, str, type Command } from './command.js';
import { CliUsageError, table } from './output.js';

export const SSH_KEY_COMMANDS: Command[] = [
  {
    path: 'ssh-keys add',
    args: '<FILE>',
    summary: 'Upload an SSH public key (e.g. ~/.ssh/id_ed25519.pub)',
    example: 'gpucloud ssh-keys add ~/.ssh/id_ed25519.pub --label laptop',
    options: [['--label <L>', 'A name for the key (default: the key comment)']],
    async run(ctx) {
      const file = ctx.positionals[0]!;
      let text: string;
      try {
        text = readFileSync(file, 'utf8');
      } catch (err) {
        throw new CliUsageError(`cannot read ${file}: ${(err as Error).message}`);
      }
      const body: { ssh_public_key: string; label?: string } = { ssh_public_key: text.trim() };
      if (str(ctx, 'label')) body.label = str(ctx, 'label')!;
      const k = await call(ctx.client().api.POST('/ssh-keys', { body }));
      if (ctx.json) return printJson(ctx, k);
      ctx.out(`Added SSH key ${k.id} (${k.key_type} ${k.fingerprint}, "${k.label}")`);
    },
  },
  {
    path: 'ssh-keys list',
    summary: 'List your SSH keys',
    example: 'gpucloud ssh-keys list',
    options: LIMIT_OPTS,
    async run(ctx) {
      const keys = await call(ctx.client().api.GET('/ssh-keys', { params: { query: page(ctx) } }));
      if (ctx.json) return printJson(ctx, keys);
      if (keys.length === 0) return ctx.out('No SSH keys; add one with: gpucloud ssh-keys add ~/.ssh/id_ed25519.pub');
      ctx.out(
        table(
          ['ID', 'LABEL', 'TYPE', 'FINGERPRINT', 'CREATED'],
          keys.map((k) => [k.id, k.label, k.key_type, k.fingerprint, k.created_at]),
        ),
      );
    },
  },
  {
    path: 'ssh-keys rm',
    args: '<ID>',
    summary: 'Delete an SSH key',
    example: 'gpucloud ssh-keys rm 6f1c...',
    async run(ctx) {
      const id = ctx.positionals[0]!;
      await call(ctx.client().api.DELETE('/ssh-keys/{key_id}', { params: { path: { key_id: id } } }));
      if (ctx.json) return printJson(ctx, {});
      ctx.out(`Deleted SSH key ${id}`);
    },
  },
];
