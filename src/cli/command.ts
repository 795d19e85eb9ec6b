/** What a command of `gpucloud` is, and the small helpers every command group uses to read its options and print. */
import { GpuCloudError, type GpuCloudClient } from '../sdk/index.js';
import type { Resolved } from './config.js';
import { CliFailure, CliUsageError } from './output.js';
import { ask, interactive } from './prompt.js';

/**
 * An option: its flags as commander reads them ("--count <N>" takes a value,
 * "-y, --yes" is a flag with a short alias), its description for the help, and
 * whether it may be repeated (its value is then every value given, in order).
 */
export type OptionSpec = [flags: string, description: string, more?: { repeatable: true }];

/** The options given, by long name without the dashes ("min-gpus"); a repeatable option's value is a list. */
export type Values = Record<string, string | boolean | string[] | undefined>;

export interface Ctx {
  values: Values;
  positionals: string[];
  json: boolean;
  env: NodeJS.ProcessEnv;
  /**
   * The SDK client, credentials resolved from the options, the environment and the config file; rotated tokens are
   * saved back.
   */
  client(): GpuCloudClient;
  resolved(): Resolved;
  configFile: string;
  out(text: string): void;
  err(text: string): void;
}

export interface Command {
  /** The words that name it: "vm create". */
  path: string;
  /** Its positional arguments as commander reads them: "<VM> [LABEL]"; a last "[NAME...]" takes the rest. */
  args?: string;
  summary: string;
  example: string | string[];
  /** Its own options; every command also takes --json, --api-url, --api-key and --help. */
  options?: OptionSpec[];
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

export function int(
  ctx: Ctx,
  name: string,
  opts: { min?: number; max?: number; def?: number } = {},
): number | undefined {
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

export const LIMIT_OPTS: OptionSpec[] = [
  ['--limit <N>', 'At most N rows (server default)'],
  ['--offset <N>', 'Skip N rows'],
];
export function page(ctx: Ctx): { limit?: number; offset?: number } {
  const q: { limit?: number; offset?: number } = {};
  const limit = int(ctx, 'limit', { min: 1 });
  const offset = int(ctx, 'offset', { min: 0 });
  if (limit !== undefined) q.limit = limit;
  if (offset !== undefined) q.offset = offset;
  return q;
}

export const GPU_TYPES = ['5090', '4090', 'pro6000'] as const;
export type GpuType = (typeof GPU_TYPES)[number];

/** The --gpu option (or another named one) as a GPU type, checked. */
export function gpuType(raw: string | undefined, name = 'gpu'): GpuType | undefined {
  if (raw === undefined) return undefined;
  if (!(GPU_TYPES as readonly string[]).includes(raw))
    throw new CliUsageError(`--${name} must be one of ${GPU_TYPES.join(', ')}, got "${raw}"`);
  return raw as GpuType;
}

/**
 * Asks y/N unless --yes; aborts (exit 1) on anything but yes, and is bad usage (exit 2) with no answer and no
 * terminal.
 */
export async function confirmOrAbort(ctx: Ctx, question: string): Promise<void> {
  if (flag(ctx, 'yes')) return;
  const answer = await ask(`${question} [y/N] `);
  if (answer === undefined && !interactive())
    throw new CliUsageError('no answer on stdin: pass --yes to confirm without a terminal');
  if (answer === undefined || !/^y(es)?$/i.test(answer)) throw new CliFailure('Aborted');
}
