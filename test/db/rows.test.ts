import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { ROWS_FILE, generateRowTypes } from '../../scripts/generate-db-types.js';

test('src/db/rows.ts is what the migrations make (else: node --import tsx scripts/generate-db-types.ts)', async () => {
  const fresh = await generateRowTypes();
  assert.equal(readFileSync(ROWS_FILE, 'utf8'), fresh);
  // Every table the migrations make has its row type.
  assert.match(fresh, /export interface VmsRow \{/);
  assert.match(fresh, /^ {2}vms: VmsRow;$/m);
});
