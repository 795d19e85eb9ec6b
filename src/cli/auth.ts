/** `gpucloud login`, `logout` and `whoami`: the credentials the other commands use (docs/authentication.md). */
import { GpuCloudClient, GpuCloudError } from '../sdk/index.js';
import { call, printJson, str, type Command, type Ctx } from './command.js';
import { readConfig, removeConfig, writeConfig, type SavedConfig } from './config.js';
import { CliUsageError, keyValues } from './output.js';
import { ask, interactive } from './prompt.js';

/** Saves a (rotated) pair of session tokens in the config file, in place of a saved API key. */
export function saveTokens(
  ctx: Ctx,
  tokens: { accessToken: string; refreshToken: string },
  extra: SavedConfig = {},
): void {
  const saved = readConfig(ctx.configFile);
  delete saved.api_key;
  writeConfig(ctx.configFile, {
    ...saved,
    ...extra,
    access_token: tokens.accessToken,
    refresh_token: tokens.refreshToken,
  });
}

export const AUTH_COMMANDS: Command[] = [
  {
    path: 'login',
    summary: 'Log in and save the session (or an API key) in the config file',
    example: ['gpucloud login --email me@example.com', 'gpucloud login --api-key gpc_...'],
    options: [
      ['--email <E>', 'Account email (asked for on a terminal)'],
      ['--password <P>', 'Password (asked for, hidden, on a terminal)'],
      ['--code <C>', 'TOTP or recovery code when 2FA is on (else asked for, or read from stdin)'],
      ['--api-key <K>', 'Save this API key instead of logging in with a password'],
    ],
    async run(ctx) {
      const apiUrl = ctx.resolved().apiUrl;
      const key = str(ctx, 'api-key');
      if (key) {
        const client = new GpuCloudClient({ baseUrl: apiUrl, apiKey: key });
        const account = await call(client.api.GET('/account'));
        writeConfig(ctx.configFile, { api_url: apiUrl, api_key: key, email: account.email });
        if (ctx.json) printJson(ctx, account);
        else ctx.out(`Saved the API key for ${account.email} in ${ctx.configFile}`);
        return;
      }
      let email = str(ctx, 'email');
      let password = str(ctx, 'password');
      if (!email) {
        if (!interactive()) throw new CliUsageError('--email is required without a terminal');
        email = await ask('Email: ');
      }
      if (!password) {
        if (!interactive()) throw new CliUsageError('--password is required without a terminal');
        password = await ask('Password: ', { hidden: true });
      }
      if (!email || !password) throw new CliUsageError('an email and a password are required');
      let first = true;
      const client = new GpuCloudClient({
        baseUrl: apiUrl,
        onTokens: (t) => {
          // The first pair replaces whatever was saved; later ones are rotations.
          if (first)
            writeConfig(ctx.configFile, {
              api_url: apiUrl,
              email,
              access_token: t.accessToken,
              refresh_token: t.refreshToken,
            });
          else saveTokens(ctx, t);
          first = false;
        },
      });
      const res = await client.login(email, password);
      if ('two_factor_required' in res) {
        let code = str(ctx, 'code');
        if (!code) code = await ask('Two-factor code: ');
        if (!code) throw new CliUsageError('two-factor authentication is on: give the code with --code (or on stdin)');
        await client.verify2fa(res.challenge_token, code);
      }
      const account = await call(client.api.GET('/account'));
      if (ctx.json) printJson(ctx, account);
      else ctx.out(`Logged in as ${account.email}${account.role === 'admin' ? ' (admin)' : ''}`);
    },
  },
  {
    path: 'logout',
    summary: 'Revoke the saved session and forget the saved credentials',
    example: 'gpucloud logout',
    async run(ctx) {
      const saved = readConfig(ctx.configFile);
      if (saved.refresh_token) {
        const client = new GpuCloudClient({
          baseUrl: ctx.resolved().apiUrl,
          accessToken: saved.access_token,
          refreshToken: saved.refresh_token,
        });
        try {
          await client.logout();
        } catch (err) {
          // An already dead session: forgetting it locally is all that is left.
          if (!(err instanceof GpuCloudError && err.status === 401)) throw err;
        }
      }
      removeConfig(ctx.configFile);
      if (ctx.json) printJson(ctx, {});
      else ctx.out('Logged out');
    },
  },
  {
    path: 'whoami',
    summary: 'Show the account the credentials belong to',
    example: 'gpucloud whoami',
    async run(ctx) {
      const a = await call(ctx.client().api.GET('/account'));
      if (ctx.json) return printJson(ctx, a);
      const r = ctx.resolved();
      ctx.out(
        keyValues([
          ['Email', a.email],
          ['Name', a.name],
          ['ID', a.id],
          ['Role', a.role],
          ['2FA', a.two_factor_enabled ? 'on' : 'off'],
          ['API', r.apiUrl],
          ['Credentials', r.apiKey ? `API key (${r.source})` : `login session (${r.source})`],
        ]),
      );
    },
  },
];
