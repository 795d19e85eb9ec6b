/**
 * The `gpucloud` command as a few files: `npm run build` bundles tsc's output
 * (dist/main.js and everything it imports, the dependencies included) into
 * dist/bin/, and the test suite bundles its compiled tree the same way
 * (test/helpers/entry.ts), so the tests run the server as users do, and
 * bundles its test files too.
 *
 * Loading ~1,100 small modules (typebox, fastify, ajv, ioredis...) was most
 * of a start: Node resolves, reads, compiles and links each one. A bundle is
 * the same code in a handful of files (docs/configuration.md#start-up).
 * The server and the agent stay behind dynamic imports, split into chunks of
 * their own, so a client command still loads only the client.
 *
 * Left as packages, loaded from node_modules as before: the ones that find
 * files next to their own code (PGlite's WebAssembly, the static files of
 * the API reference and the console, swagger's package.json, pino's worker
 * threads) and argon2's native addon.
 */
import { readFile } from 'node:fs/promises';
import { dirname, relative } from 'node:path';
import type { BuildOptions, Plugin } from 'esbuild';

export const EXTERNAL = [
  '@electric-sql/pglite',
  '@fastify/static',
  '@fastify/swagger',
  '@fastify/swagger-ui',
  '@node-rs/argon2',
  'pino',
];

/**
 * The options both bundles use. CommonJS dependencies call `require` for Node's
 * own modules, which an ES module does not have: each output file makes one.
 */
export function bundleOptions(entryPoints: BuildOptions['entryPoints'], outdir: string): BuildOptions {
  return {
    entryPoints,
    outdir,
    bundle: true,
    splitting: true,
    format: 'esm',
    platform: 'node',
    target: 'node20',
    external: EXTERNAL,
    sourcemap: 'linked',
    sourcesContent: false,
    logLevel: 'warning',
    banner: {
      js: "import { createRequire as __gpucloudRequire } from 'node:module';\nconst require = __gpucloudRequire(import.meta.url);",
    },
  };
}

/**
 * Keeps `import.meta.url` meaning the file a module was compiled to, not the bundle: paths made from it
 * (migrations/, package.json, dist/console, the embedded database's template) come out as before. The bundle's
 * files all lie in `outdir`, so each module's own URL is its path relative to that folder, resolved against the
 * bundle file's URL at run time: the installation can move.
 */
export function ownImportMeta(outdir: string): Plugin {
  return {
    name: 'own-import-meta',
    setup(build) {
      build.onLoad({ filter: /\.js$/ }, async ({ path }) => {
        if (path.includes('/node_modules/')) return undefined;
        const code = await readFile(path, 'utf8');
        if (!code.includes('import.meta.url')) return undefined;
        const rel = relative(outdir, path).split('\\').join('/');
        const own = `new URL(${JSON.stringify(rel)}, import.meta.url).href`;
        return { contents: code.replaceAll('import.meta.url', own), loader: 'js', resolveDir: dirname(path) };
      });
    },
  };
}
