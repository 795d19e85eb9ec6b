/**
 * The `gpucloud` command for tests that run it as a child process (the CLI,
 * a server to SIGKILL, several instances): `node <gpucloudMain()> ARGS`.
 *
 * It runs src/ compiled ahead of time rather than through tsx: tsx compiles
 * as it loads, through loader hooks on another thread, which cost about
 * 0.4 s per CLI run and 1.4 s per server start on two cores, and the suite
 * starts a few hundred of them. The compiled copy is what tsx would run
 * (esbuild, file by file, no bundling), written once per content of src/ to
 * `.test-build-<hash>/` at the repository root: one level down, like dist/,
 * so the sources' paths to migrations/, dist/ and package.json hold. Test
 * files running at once build under names of their own and rename into
 * place; the first rename wins and the others use it.
 */
import { createHash, randomBytes } from 'node:crypto';
import { existsSync, readdirSync, readFileSync, renameSync, rmSync, statSync } from 'node:fs';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { buildSync } from 'esbuild';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const SRC = join(ROOT, 'src');
const PREFIX = '.test-build-';
/** Builds of other contents of src/ older than this are removed. */
const STALE_MS = 3_600_000;

/** The TypeScript sources below `dir` (no declaration files), sorted. */
export function sources(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true })
    .flatMap((e) => {
      const p = join(dir, e.name);
      if (e.isDirectory()) return sources(p);
      return e.name.endsWith('.ts') && !e.name.endsWith('.d.ts') ? [p] : [];
    })
    .sort();
}

let main: string | undefined;

/** The compiled src/main.ts, built now if src/ changed since the last build. */
export function gpucloudMain(): string {
  if (main) return main;
  const files = sources(SRC);
  const hash = createHash('sha256');
  for (const f of files) hash.update(relative(SRC, f)).update('\0').update(readFileSync(f)).update('\0');
  const name = `${PREFIX}${hash.digest('hex').slice(0, 16)}`;
  const dir = join(ROOT, name);
  if (!existsSync(join(dir, 'main.js'))) {
    const tmp = join(ROOT, `${PREFIX}tmp-${process.pid}-${randomBytes(4).toString('hex')}`);
    buildSync({
      entryPoints: files,
      outdir: tmp,
      outbase: SRC,
      format: 'esm',
      platform: 'node',
      target: 'node20',
      sourcemap: 'linked',
      logLevel: 'error',
    });
    try {
      renameSync(tmp, dir);
    } catch {
      rmSync(tmp, { recursive: true, force: true }); // another test file renamed the same build first
    }
    removeStale(name);
  }
  main = join(dir, 'main.js');
  return main;
}

function removeStale(current: string): void {
  for (const e of readdirSync(ROOT)) {
    if (!e.startsWith(PREFIX) || e === current) continue;
    const p = join(ROOT, e);
    try {
      if (Date.now() - statSync(p).mtimeMs > STALE_MS) rmSync(p, { recursive: true, force: true });
    } catch {
      // removed meanwhile by another test file
    }
  }
}
