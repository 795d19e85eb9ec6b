/**
 * `npm run soak -- --minutes 10 [--rate 50] [--db embedded|postgres] [--url URL]`:
 * mixed API traffic at a fixed rate against a fresh server for the given
 * time (see scripts/soak/run.ts for the model and the RSS baseline). Prints a
 * progress line every 10 s, a per-endpoint table, every error with its
 * X-Request-Id, and last the summary line
 *   soak: minutes=1 requests=3000 errors=0 p50_ms=3 p99_ms=40 rss_start_mb=120 rss_max_mb=131 rss_growth_pct=9.2
 * Exit 0 when there was no error and the RSS grew at most 20 % over its
 * baseline, 1 otherwise, 2 on bad usage.
 */
import { parseSoakArgs, SOAK_USAGE, SoakUsageError } from './soak/options.js';
import { runSoak } from './soak/run.js';

async function main(): Promise<number> {
  let opts;
  try {
    opts = parseSoakArgs(process.argv.slice(2));
  } catch (err) {
    if (!(err instanceof SoakUsageError)) throw err;
    if (err.message) console.error(`soak: ${err.message}\n`);
    console.error(SOAK_USAGE);
    return err.message ? 2 : 0;
  }
  const ctl = new AbortController();
  const onSignal = () => {
    if (ctl.signal.aborted) process.exit(130);
    console.error('soak: interrupted, stopping (again to quit at once)');
    ctl.abort();
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
  const r = await runSoak(opts, (line) => console.log(line), ctl.signal);
  console.log(r.summary);
  return r.passed ? 0 : 1;
}

main().then(
  (code) => process.exit(code),
  (err: unknown) => {
    console.error(`soak: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}`);
    process.exit(1);
  },
);
