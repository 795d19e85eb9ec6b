/**
 * Identifiers: random UUIDs for everything a client names, and ordered ones
 * for the rows the meter writes in bulk (they append to their index).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { newId, newOrderedId, setRandomSourceForTests, UUID_RE } from '../src/ids.js';

test('ordered ids are version-7 UUIDs that sort in the order they were made, never twice the same', () => {
  // More than 4,096 in a row: several within one millisecond, past the counter's end.
  const ids = Array.from({ length: 20_000 }, () => newOrderedId());
  for (const id of ids) {
    assert.match(id, UUID_RE);
    assert.equal(id[14], '7', 'version 7');
    assert.ok('89ab'.includes(id[19]!), 'RFC 9562 variant');
  }
  for (let i = 1; i < ids.length; i++) assert.ok(ids[i]! > ids[i - 1]!, `${ids[i]} sorts after ${ids[i - 1]}`);
  assert.equal(new Set(ids).size, ids.length);
  const ms = parseInt(ids[0]!.slice(0, 8) + ids[0]!.slice(9, 13), 16);
  assert.ok(Math.abs(ms - Date.now()) < 60_000, 'the first 48 bits are the milliseconds it was made');
});

test('ordered ids take their random bits from the swappable source', () => {
  const restore = setRandomSourceForTests((n) => Buffer.alloc(n, 0xff));
  try {
    const id = newOrderedId();
    assert.equal(id.slice(19), 'bfff-ffffffffffff', "variant bits set over the source's bytes");
    assert.equal(newId(), 'ffffffff-ffff-4fff-bfff-ffffffffffff');
  } finally {
    restore();
  }
  assert.notEqual(newOrderedId().slice(19), 'bfff-ffffffffffff');
});
