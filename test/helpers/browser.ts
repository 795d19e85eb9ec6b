/**
 * Headless Chromium for the console's browser tests: Debian's `chromium`
 * package driven by playwright-core (Playwright's own browser download is
 * not reachable from every machine). The console is built once per test run
 * into a temporary directory, never into dist/, so other test files that
 * serve dist/console are not disturbed.
 */
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium, type Browser } from 'playwright-core';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));

/** The Chromium to drive: GPUCLOUD_CHROMIUM, or Debian's package. */
export function chromiumPath(): string | undefined {
  const candidates = [
    process.env.GPUCLOUD_CHROMIUM,
    '/usr/bin/chromium',
    '/usr/bin/chromium-browser',
    '/usr/bin/google-chrome',
  ];
  return candidates.find((p): p is string => !!p && existsSync(p));
}

/**
 * Why browser tests cannot run here, or undefined when they can. With
 * GPUCLOUD_REQUIRE_BROWSER=1 (CI) a missing browser is a failure, not a skip.
 */
export function browserSkipReason(): string | undefined {
  if (chromiumPath()) return undefined;
  const reason = 'no Chromium: apt-get install chromium (or set GPUCLOUD_CHROMIUM)';
  if (process.env.GPUCLOUD_REQUIRE_BROWSER === '1') throw new Error(`GPUCLOUD_REQUIRE_BROWSER=1 but ${reason}`);
  return reason;
}

/** Builds the console with Vite into a fresh temporary directory; returns it and a cleanup. */
export function buildConsole(): { dir: string; cleanup: () => void } {
  const dir = mkdtempSync(join(tmpdir(), 'gpucloud-console-'));
  const r = spawnSync(
    process.execPath,
    [
      join(ROOT, 'node_modules', 'vite', 'bin', 'vite.js'),
      'build',
      '--config',
      'console/vite.config.ts',
      '--outDir',
      dir,
      '--emptyOutDir',
      '--logLevel',
      'warn',
    ],
    {
      cwd: ROOT,
      encoding: 'utf8',
    },
  );
  if (r.status !== 0) throw new Error(`console build failed:\n${r.stdout}${r.stderr}`);
  return { dir, cleanup: () => rmSync(dir, { recursive: true, force: true }) };
}

export async function launchChromium(): Promise<Browser> {
  return chromium.launch({
    executablePath: chromiumPath()!,
    headless: true,
    // No sandbox: CI runs as root in a container; no GPU: nothing to draw with.
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--no-first-run', '--no-default-browser-check'],
  });
}
