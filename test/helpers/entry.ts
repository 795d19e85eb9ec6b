/**
 * The suite's TypeScript compiled ahead of time, for the test runner and for
 * tests that run the `gpucloud` command as a child process (the CLI, a server
 * to SIGKILL, several instances): `node <gpucloudMain()> ARGS`, bundled as
 * `npm run build` bundles it (scripts/bundle.ts).
 *
 * tsx compiles as it loads, through loader hooks on another thread: about
 * 1.8 s of CPU to load one test file's app on two cores, 0.4 s per CLI run
 * and 1.4 s per server start, and the suite does that a few hundred times.
 * The compiled tree is what tsx would run (esbuild, file by file) with one
 * difference that keeps it a drop-in: `import.meta.url`, `dirname` and
 * `filename` are the source file's own, so every path a module
 * makes from them (migrations/, dist/, package.json, fixtures) is the one it
 * would make under tsx, wherever the compiled file lies. The tree is written
 * once per content of those files to `.test-build-<hash>/` at the
 * repository root (src/, test/, ... below it, with source maps); processes
 * building at once build under names of their own and rename into place, and
 * the first rename wins. From that tree, the command and each test file are
 * then bundled (bin/, bundled/), as `npm run build` bundles dist/.
 */
import { createHash, randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, readdirSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { basename, dirname, join, relative } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { buildSync, transformSync } from 'esbuild';
import { EXTERNAL, bundleOptions } from '../../scripts/bundle.js';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const PREFIX = '.test-build-';
/** Builds of other contents older than this are removed. */
const STALE_MS = 3_600_000;

/** The TypeScript sources below `dir` (no declaration files, nothing in hidden folders), sorted. */
export function sources(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true })
    .flatMap((e) => {
      const p = join(dir, e.name);
      if (e.isDirectory()) return e.name.startsWith('.') ? [] : sources(p);
      return e.name.endsWith('.ts') && !e.name.endsWith('.d.ts') ? [p] : [];
    })
    .sort();
}

const MAIN = join(ROOT, 'src', 'main.ts');
/**
 * The compiled src/main.ts turns off V8's optimising compiler for WebAssembly, as the runner does for the test files
 * (`--liftoff-only`, test/README.md). It is added at the end, so the source map's lines hold, and it still runs
 * before the embedded database compiles anything: main() awaits before it opens one.
 */
const LIFTOFF_ONLY = "import { setFlagsFromString } from 'node:v8'; setFlagsFromString('--liftoff-only');";

let tree: string | undefined;

/** The folders compiled: the service and the tests, and what tests import from the scripts and the console. */
const COMPILED = ['src', 'test', 'scripts', 'console'];

/** The directory holding the compiled tree (`<dir>/test/x.test.js`), built now if a source changed. */
export function compiledTree(): string {
  if (tree) return tree;
  const files = COMPILED.flatMap((d) => sources(join(ROOT, d)));
  const hash = createHash('sha256').update(ROOT).update('\0');
  for (const f of files) hash.update(relative(ROOT, f)).update('\0').update(readFileSync(f)).update('\0');
  const name = `${PREFIX}${hash.digest('hex').slice(0, 16)}`;
  const dir = join(ROOT, name);
  if (!existsSync(join(dir, 'complete'))) {
    const tmp = join(ROOT, `${PREFIX}tmp-${process.pid}-${randomBytes(4).toString('hex')}`);
    const tsconfigRaw = readFileSync(join(ROOT, 'tsconfig.json'), 'utf8');
    for (const f of files) {
      const out = compiledPath(tmp, f);
      const { code, map } = transformSync(readFileSync(f, 'utf8'), {
        loader: 'ts',
        format: 'esm',
        target: 'node20',
        tsconfigRaw,
        sourcefile: f,
        sourcemap: 'external',
        sourcesContent: false,
        define: {
          'import.meta.url': JSON.stringify(pathToFileURL(f).href),
          'import.meta.dirname': JSON.stringify(dirname(f)),
          'import.meta.filename': JSON.stringify(f),
        },
      });
      mkdirSync(dirname(out), { recursive: true });
      const last = f === MAIN ? LIFTOFF_ONLY : '';
      writeFileSync(out, `${code}${last}\n//# sourceMappingURL=${basename(out)}.map\n`);
      writeFileSync(`${out}.map`, map);
    }
    // The command as users run it: bundled (scripts/bundle.ts). Its modules' `import.meta` values are literals
    // already, so the bundle needs nothing more.
    buildSync(bundleOptions({ gpucloud: join(tmp, 'src', 'main.js') }, join(tmp, 'bin')));
    // And each test file with what it imports, the service's dependencies included, into bundled/ (the same paths
    // below it, shared code in bundled/chunks/): a test process loads a few files instead of a thousand. The test
    // tools (devDependencies) stay packages.
    const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { devDependencies?: object };
    const tests = files.filter((f) => f.endsWith('.test.ts')).map((f) => compiledPath(tmp, f));
    buildSync({
      ...bundleOptions(tests, join(tmp, BUNDLED)),
      outbase: tmp,
      chunkNames: 'chunks/[name]-[hash]',
      external: [...EXTERNAL, ...Object.keys(pkg.devDependencies ?? {})],
    });
    writeFileSync(join(tmp, 'complete'), '');
    try {
      renameSync(tmp, dir);
    } catch {
      rmSync(tmp, { recursive: true, force: true }); // another process renamed the same build first
    }
    removeStale(name);
  }
  tree = dir;
  return dir;
}

/** Where the compiled tree in `dir` holds the source file `file`. */
function compiledPath(dir: string, file: string): string {
  return join(dir, relative(ROOT, file)).replace(/\.ts$/, '.js');
}

/** The folder of the compiled tree holding the bundled test files. */
const BUNDLED = 'bundled';

/** What the runner runs for a test file: the file bundled with what it imports. */
export function compiledTest(file: string): string {
  return compiledPath(join(compiledTree(), BUNDLED), file);
}

/** The `gpucloud` command: the compiled src/main.ts, bundled as `npm run build` bundles dist/main.js. */
export function gpucloudMain(): string {
  return join(compiledTree(), 'bin', 'gpucloud.js');
}

function removeStale(current: string): void {
  for (const e of readdirSync(ROOT)) {
    if (!e.startsWith(PREFIX) || e === current) continue;
    const p = join(ROOT, e);
    try {
      if (Date.now() - statSync(p).mtimeMs > STALE_MS) rmSync(p, { recursive: true, force: true });
    } catch {
      // removed meanwhile by another process
    }
  }
}
