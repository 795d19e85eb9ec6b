/**
 * `npm run bench [-- CASE ...] [--runs N]`: the benchmarks, printed as a
 * table and written to bench/results.json. Speed targets live here, never in
 * timed tests. Cases so far:
 *   real-vm   POST /vms -> running -> SSH login on the test image, the agent
 *             alone, and bare QEMU as the baseline (needs QEMU)
 */
import { writeFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { realVmBench } from './real-vm.js';

export interface BenchResult {
  name: string;
  db: string;
  seconds?: number;
  min_s?: number;
  max_s?: number;
  runs?: number;
  baseline?: number;
  target_s?: number;
  ok?: boolean;
}

const CASES: Record<string, (runs: number) => Promise<BenchResult[]>> = {
  'real-vm': realVmBench,
};

async function main(): Promise<void> {
  const { values, positionals } = parseArgs({ options: { runs: { type: 'string', default: '3' } }, allowPositionals: true, strict: true });
  const runs = Number(values.runs);
  if (!Number.isInteger(runs) || runs < 1 || runs > 50) throw new Error('--runs must be 1 to 50');
  const chosen = positionals.length ? positionals : Object.keys(CASES);
  for (const c of chosen) if (!CASES[c]) throw new Error(`unknown case "${c}"; cases: ${Object.keys(CASES).join(', ')}`);
  const results: BenchResult[] = [];
  for (const c of chosen) {
    console.log(`== ${c}`);
    results.push(...(await CASES[c]!(runs)));
  }
  const fmt = (n: number | undefined) => (n === undefined ? '' : n.toFixed(2));
  console.log(['case'.padEnd(46), 'db'.padEnd(9), 'median s'.padStart(9), 'min s'.padStart(7), 'max s'.padStart(7), '  target'].join(' '));
  for (const r of results) {
    const target = r.target_s === undefined ? '' : `  < ${r.target_s} s ${r.ok ? 'ok' : 'MISSED'}`;
    console.log([r.name.padEnd(46), r.db.padEnd(9), fmt(r.seconds).padStart(9), fmt(r.min_s).padStart(7), fmt(r.max_s).padStart(7), target].join(' '));
  }
  writeFileSync(new URL('./results.json', import.meta.url), JSON.stringify(results, null, 2) + '\n');
  console.log('written: bench/results.json');
}

main().catch((err: unknown) => {
  console.error(err instanceof Error ? err.message : err);
  process.exit(1);
});
