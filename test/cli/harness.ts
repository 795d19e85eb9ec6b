/**
 * `gpucloud` run as the process users run, for the CLI tests of templates and
 * images: its exit code, stdout and stderr, and the checks made on them.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { gpucloudMain } from '../helpers/entry.js';

export interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Runs `gpucloud ARGS` with exactly `env`; killed after 90 s. */
export function gpucloud(args: string[], env: NodeJS.ProcessEnv): Promise<Run> {
  const child = spawn(process.execPath, [gpucloudMain(), ...args], { env, stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d) => (stdout += d));
  child.stderr.on('data', (d) => (stderr += d));
  const timer = setTimeout(() => child.kill('SIGKILL'), 90_000);
  return new Promise<Run>((resolve) =>
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    }),
  );
}

/** The environment of a run against `url` with `key` (null: no credentials at all), in its own config home. */
export function cliEnv(home: string, url: string, key: string | null, more: NodeJS.ProcessEnv = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    XDG_CONFIG_HOME: home,
    GPUCLOUD_API_URL: url,
    GPUCLOUD_POLL_MS: '50',
    ...more,
  };
  if (key) env.GPUCLOUD_API_KEY = key;
  else delete env.GPUCLOUD_API_KEY;
  return env;
}

export const show = (r: Run) => `exit ${r.code}\nstdout: ${r.stdout}\nstderr: ${r.stderr}`;
export const ok = (r: Run) => assert.equal(r.code, 0, show(r));
export function fails(r: Run, code: 1 | 2, stderr: RegExp): void {
  assert.equal(r.code, code, show(r));
  assert.match(r.stderr, stderr, show(r));
}
