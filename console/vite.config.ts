/**
 * The web console's build: a single-page app served by the API server at
 * /console/ (see src/http/console.ts). `npm run build` writes it to
 * dist/console, with a gzip and a brotli copy of every text asset next to it
 * so the server sends compressed files without compressing per request. The
 * build fails when the first screen's JavaScript is over budget (budget.ts).
 */
import { defineConfig, type Plugin } from 'vite';
import { readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { brotliCompressSync, constants, gzipSync } from 'node:zlib';
import { BUDGET_BYTES, firstScreenJs } from './budget.js';

const OUT = fileURLToPath(new URL('../dist/console', import.meta.url));

function files(dir: string): string[] {
  return readdirSync(dir).flatMap((f) => {
    const p = join(dir, f);
    return statSync(p).isDirectory() ? files(p) : [p];
  });
}

/** Writes FILE.gz and FILE.br next to every JS, CSS, HTML and SVG file of the build. */
function precompress(): Plugin {
  let outDir = OUT;
  return {
    name: 'gpucloud-precompress',
    apply: 'build',
    configResolved(config) {
      outDir = config.build.outDir; // --outDir may move it
    },
    closeBundle() {
      for (const f of files(outDir)) {
        if (!/\.(js|css|html|svg|json)$/.test(f)) continue;
        const body = readFileSync(f);
        writeFileSync(`${f}.gz`, gzipSync(body, { level: 9 }));
        writeFileSync(`${f}.br`, brotliCompressSync(body, { params: { [constants.BROTLI_PARAM_QUALITY]: 11 } }));
      }
      const js = firstScreenJs(outDir);
      const kb = (n: number) => `${(n / 1024).toFixed(1)} KB`;
      if (js.total > BUDGET_BYTES) {
        throw new Error(
          `console: the first screen loads ${kb(js.total)} of gzipped JavaScript, over the ${kb(BUDGET_BYTES)} budget: ${JSON.stringify(js.files)}`,
        );
      }
      console.log(`console: first screen ${kb(js.total)} of gzipped JavaScript (budget ${kb(BUDGET_BYTES)})`);
    },
  };
}

export default defineConfig({
  root: fileURLToPath(new URL('.', import.meta.url)),
  base: '/console/',
  oxc: { jsx: { runtime: 'automatic', importSource: 'preact' } },
  build: {
    outDir: OUT,
    emptyOutDir: true,
    target: 'es2022',
    sourcemap: false,
    reportCompressedSize: false,
    chunkSizeWarningLimit: 300,
  },
  server: {
    // `npm run console:dev`: the console with hot reload, calling the API on :8080.
    proxy: Object.fromEntries(
      [
        '/auth',
        '/account',
        '/api-keys',
        '/ssh-keys',
        '/search',
        '/pricing',
        '/vms',
        '/billing',
        '/reservations',
        '/admin',
        '/openapi.json',
        '/healthz',
        '/.well-known',
      ].map((p) => [p, 'http://127.0.0.1:8080']),
    ),
  },
  plugins: [precompress()],
});
