/**
 * The console's bundle budget: the JavaScript the first screen loads (the
 * entry script and the modules it preloads, as index.html names them), in
 * gzip-compressed bytes, stays under 200 KB. The build fails past it.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { gzipSync } from 'node:zlib';

export const BUDGET_BYTES = 200 * 1024;

/** Gzip bytes of every script index.html loads on the first screen, per file and in all. */
export function firstScreenJs(outDir: string): { files: Record<string, number>; total: number } {
  const html = readFileSync(join(outDir, 'index.html'), 'utf8');
  const urls = [...html.matchAll(/<(?:script[^>]*\ssrc|link[^>]*rel="modulepreload"[^>]*\shref)="([^"]+\.js)"/g)].map(
    (m) => m[1]!,
  );
  const files: Record<string, number> = {};
  for (const url of urls) {
    const rel = url.replace(/^\/console\//, '');
    files[rel] = gzipSync(readFileSync(join(outDir, rel)), { level: 9 }).length;
  }
  return { files, total: Object.values(files).reduce((a, b) => a + b, 0) };
}
