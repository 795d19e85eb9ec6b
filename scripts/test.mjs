// Runs test/**/*.test.ts (or the files and directories given) with node's test runner, three files at a time. The
// files run compiled ahead of time and bundled (test/helpers/entry.ts: the tree tsx would run, without its loader
// hooks, which cost more CPU than most test files' own work, and each file bundled with what it imports), with
// source maps, so stack traces name the TypeScript lines, and with V8's baseline WebAssembly compiler only
// (test/README.md#compiled-ahead-of-time).
import { existsSync, readdirSync, statSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { spawnSync } from 'node:child_process';
import { tsImport } from 'tsx/esm/api';

function find(dir) {
  return readdirSync(dir).flatMap((f) => {
    const p = join(dir, f);
    return statSync(p).isDirectory() ? find(p) : p.endsWith('.test.ts') ? [p] : [];
  });
}

// Arguments are test files or directories (searched for *.test.ts); none means all of test/.
const only = process.argv.slice(2);
for (const p of only) {
  if (!existsSync(p)) {
    console.error(`no such test file or directory: ${p}`);
    process.exit(1);
  }
}
const files = (only.length ? only : ['test']).flatMap((p) => (statSync(p).isDirectory() ? find(p).sort() : [p]));
if (files.length === 0) {
  console.error(`no test files in ${only.join(' ')}`);
  process.exit(1);
}
const { compiledTest } = await tsImport('../test/helpers/entry.ts', import.meta.url);
const compiled = files.map((f) => compiledTest(resolve(f)));
// --test-force-exit: a file whose tests have all finished ends even if a stray handle (a socket
// a closed app left half-open) would keep it alive; its results are already in.
// --test-timeout also bounds each file as a whole: 15 minutes, the budget the longest test (the
// crash injection, about 250 s on two cores) declares for itself, so a slow machine does not cut
// it at 5 minutes while a hung file still fails well inside CI's limit.
// Three files at a time: on two cores, a file often waits (on a QEMU guest, Chromium, a server starting, PostgreSQL)
// and two at a time left the machine idle 13-18 % of the suite; three leave it about 5 % idle.
const r = spawnSync(
  process.execPath,
  [
    '--enable-source-maps',
    '--liftoff-only',
    '--test',
    '--test-concurrency=3',
    '--test-timeout=900000',
    '--test-force-exit',
    ...compiled,
  ],
  { stdio: 'inherit' },
);
process.exit(r.status ?? 1);
