/** Waiting on real time, for what other instances see "within a second". */
import assert from 'node:assert/strict';

/** Polls `check` every 50 ms until it holds; fails after `ms`. Returns the milliseconds it took. */
export async function within(ms: number, check: () => Promise<boolean>, what: string): Promise<number> {
  const started = Date.now();
  for (;;) {
    if (await check()) return Date.now() - started;
    if (Date.now() - started > ms) assert.fail(`${what}: not within ${ms} ms`);
    await new Promise((r) => setTimeout(r, 50));
  }
}
