/**
 * The OpenAPI fuzzer (npm run fuzz) as a test: 3,000 requests against a
 * freshly started server on the embedded database, and on PostgreSQL too when
 * DATABASE_URL is set. No 5xx, no status the document does not list, no body
 * that does not match the documented schema.
 *
 * The seed is fixed so that a failure replays with the command in the
 * message; FUZZ_SEED picks another one.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { runFuzz } from '../../scripts/fuzz/index.js';

const SEED = process.env.FUZZ_SEED ? Number(process.env.FUZZ_SEED) : 20260101;
const DBS: ('embedded' | 'postgres')[] = process.env.DATABASE_URL ? ['embedded', 'postgres'] : ['embedded'];

for (const db of DBS) {
  test(`fuzzing 3000 requests from the OpenAPI document finds nothing (${db})`, { timeout: 240_000 }, async () => {
    const r = await runFuzz({ requests: 3000, seed: SEED, db, concurrency: 8 });
    assert.equal(r.requests, 3000, r.report);
    assert.ok(r.ok, `\n${r.report}\n`);
    assert.deepEqual(r.counts, { '5xx': 0, undocumented: 0, schema_mismatch: 0 });
  });
}
