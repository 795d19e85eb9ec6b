// Runs the test suite (or the files given) with the machine's clock moved to
// the moments where date arithmetic breaks: late on the last day of a month
// and just after midnight on the first. No test may depend on the date or hour
// it runs at; this is the proof. Needs libfaketime (Debian: apt-get install faketime).
//
//   npm run test:timeshift                      # the whole suite at each moment
//   npm run test:timeshift -- test/billing      # only these files or folders
//   TIMESHIFT_AT="2027-02-28 23:59:00" npm run test:timeshift
//
// Each test process sees the clock start at the moment given and tick from
// there (faketime's "@" form). Monotonic time is left real so timers behave.
import { spawnSync } from 'node:child_process';
import { readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';

const DEFAULT_AT = ['2026-12-31 23:40:00', '2027-01-01 00:00:30'];
const at = process.env.TIMESHIFT_AT
  ? process.env.TIMESHIFT_AT.split(',')
      .map((s) => s.trim())
      .filter(Boolean)
  : DEFAULT_AT;

for (const moment of at) {
  if (!/^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}$/.test(moment)) {
    console.error(`TIMESHIFT_AT: "${moment}" is not a moment like 2026-12-31 23:40:00 (UTC)`);
    process.exit(2);
  }
}
if (spawnSync('faketime', ['--version'], { stdio: 'ignore' }).error) {
  console.error('test:timeshift needs libfaketime: apt-get install faketime');
  process.exit(2);
}

function find(p) {
  if (!statSync(p).isDirectory()) return [p];
  return readdirSync(p)
    .flatMap((f) => {
      const q = join(p, f);
      return statSync(q).isDirectory() ? find(q) : q.endsWith('.test.ts') ? [q] : [];
    })
    .sort();
}
const files = process.argv.slice(2).flatMap(find);

let failed = 0;
for (const moment of at) {
  console.log(`\n== tests with the machine's clock at ${moment} UTC${files.length ? ` (${files.length} files)` : ''}`);
  const r = spawnSync('faketime', ['-f', `@${moment}`, process.execPath, 'scripts/test.mjs', ...files], {
    stdio: 'inherit',
    env: { ...process.env, TZ: 'UTC', FAKETIME_DONT_FAKE_MONOTONIC: '1' },
  });
  if (r.status !== 0) {
    failed++;
    console.error(`== FAILED with the clock at ${moment} UTC`);
  }
}
process.exit(failed ? 1 : 0);
