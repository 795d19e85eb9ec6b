/** What a command of `gpucloud` is, and the small helpers every command group uses to read its options and print. */
import type { ParseArgsConfig } from 'node:util';
import { GpuCloudError, type GpuCloudClient } from '../sdk/index.js';
import type { Resolved } from './config.js';
import { CliUsageError } from './output.js';

export type Options = NonNullable<ParseArgsConfig['options']>;
export type Values = Record<string, string | boolean | undefined>;

export interface Ctx {
  values: Values;
  positionals: string[];
  json: boolean;
  env: NodeJS.ProcessEnv;
  /** The SDK client, credentials resolved from the options, the environment and the config file; rotated tokens are saved back. */
  client(): GpuCloudClient;
  resolved(): Resolved;
  configFile: string;
  out(text: string): void;
  err(text: string): void;
}

export interface Command {
  path: string;
  args?: string;
  summary: string;
  example: string | string[];
  options?: Options;
  /** Option descriptions for the help text. */
  optionHelp?: [string, string][];
  /** Exact number of positionals, or [min, max]. */
  positionals?: number | [number, number];
  run(ctx: Ctx): Promise<void>;
}

/** The data of a 2xx answer, or the API's refusal as a GpuCloudError. */
export async function call<D>(p: Promise<{ data?: D; error?: unknown; response: Response }>): Promise<D> {
  const { data, error, response } = await p;
  if (!response.ok) throw GpuCloudError.from(response, error);
  return data as D;
}

export function str(ctx: Ctx, name: string): string | undefined {
  const v = ctx.values[name];
  return typeof v === 'string' ? v : undefined;
}

export function flag(ctx: Ctx, name: string): boolean {
  return ctx.values[name] === true;
}

export function int(ctx: Ctx, name: string, opts: { min?: number; max?: number; def?: number } = {}): number | undefined {
  const raw = str(ctx, name);
  if (raw === undefined) return opts.def;
  if (!/^-?\d+$/.test(raw.trim())) throw new CliUsageError(`--${name} must be a whole number, got "${raw}"`);
  const n = Number(raw);
  if (opts.min !== undefined && n < opts.min) throw new CliUsageError(`--${name} must be at least ${opts.min}`);
  if (opts.max !== undefined && n > opts.max) throw new CliUsageError(`--${name} must be at most ${opts.max}`);
  return n;
}

export function num(ctx: Ctx, name: string): number | undefined {
  const raw = str(ctx, name);
  if (raw === undefined) return undefined;
  const n = Number(raw);
  if (raw.trim() === '' || !Number.isFinite(n)) throw new CliUsageError(`--${name} must be a number, got "${raw}"`);
  return n;
}

export function printJson(ctx: Ctx, data: unknown): void {
  ctx.out(JSON.stringify(data ?? null, null, 2));
}

export const LIMIT_OPTS: Options = { limit: { type: 'string' }, offset: { type: 'string' } };
export const LIMIT_HELP: [string, string][] = [
  ['--limit N', 'At most N rows (server default)'],
  ['--offset N', 'Skip N rows'],
];
export function page(ctx: Ctx): { limit?: number; offset?: number } {
  const q: { limit?: number; offset?: number } = {};
  const limit = int(ctx, 'limit', { min: 1 });
  const offset = int(ctx, 'offset', { min: 0 });
  if (limit !== undefined) q.limit = limit;
  if (offset !== undefined) q.offset = offset;
  return q;
}
