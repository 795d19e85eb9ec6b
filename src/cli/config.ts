/**
 * Where the `gpucloud` client commands find the API and their credentials
 * (docs/configuration.md#the-command-line-client): --api-url / --api-key,
 * then GPUCLOUD_API_URL / GPUCLOUD_API_KEY, then the saved login in
 * $XDG_CONFIG_HOME/gpucloud/config.json (default ~/.config/gpucloud/config.json),
 * which is written with mode 0600 in a 0700 directory.
 */
import { chmodSync, existsSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { dirname, join } from 'node:path';

export const DEFAULT_API_URL = 'http://127.0.0.1:8080';

/** The saved login. */
export interface SavedConfig {
  api_url?: string;
  api_key?: string;
  access_token?: string;
  refresh_token?: string;
  email?: string;
}

export function configPath(env: NodeJS.ProcessEnv = process.env): string {
  const base =
    env.XDG_CONFIG_HOME && env.XDG_CONFIG_HOME.trim() !== '' ? env.XDG_CONFIG_HOME : join(homedir(), '.config');
  return join(base, 'gpucloud', 'config.json');
}

export function readConfig(path: string): SavedConfig {
  if (!existsSync(path)) return {};
  try {
    const v = JSON.parse(readFileSync(path, 'utf8')) as unknown;
    return v && typeof v === 'object' ? (v as SavedConfig) : {};
  } catch {
    return {};
  }
}

/** Writes the file atomically, readable by its owner only. */
export function writeConfig(path: string, cfg: SavedConfig): void {
  const dir = dirname(path);
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  try {
    chmodSync(dir, 0o700);
  } catch {
    // not ours to change
  }
  const tmp = `${path}.${process.pid}.tmp`;
  writeFileSync(tmp, JSON.stringify(cfg, null, 2) + '\n', { mode: 0o600 });
  chmodSync(tmp, 0o600);
  renameSync(tmp, path);
}

export function removeConfig(path: string): void {
  rmSync(path, { force: true });
}

export interface Resolved {
  apiUrl: string;
  apiKey?: string;
  accessToken?: string;
  refreshToken?: string;
  /** Where the credentials came from, for whoami. */
  source: 'flag' | 'env' | 'saved' | 'none';
}

export function resolve(
  flags: { apiUrl?: string; apiKey?: string },
  env: NodeJS.ProcessEnv,
  saved: SavedConfig,
): Resolved {
  const apiUrl = flags.apiUrl ?? nonEmpty(env.GPUCLOUD_API_URL) ?? saved.api_url ?? DEFAULT_API_URL;
  if (flags.apiKey) return { apiUrl, apiKey: flags.apiKey, source: 'flag' };
  const envKey = nonEmpty(env.GPUCLOUD_API_KEY);
  if (envKey) return { apiUrl, apiKey: envKey, source: 'env' };
  if (saved.api_key) return { apiUrl, apiKey: saved.api_key, source: 'saved' };
  if (saved.access_token || saved.refresh_token) {
    return { apiUrl, accessToken: saved.access_token, refreshToken: saved.refresh_token, source: 'saved' } as Resolved;
  }
  return { apiUrl, source: 'none' };
}

function nonEmpty(s: string | undefined): string | undefined {
  return s && s.trim() !== '' ? s.trim() : undefined;
}
