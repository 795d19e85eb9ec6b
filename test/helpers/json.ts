/**
 * Reading JSON answers that have no schema type: those of processes a test
 * started and calls by path strings (test/reliability), where the typed
 * client of api.ts does not reach. A missing field reads as undefined; a
 * field the test relies on is asserted.
 */
import assert from 'node:assert/strict';

export function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** `body[name]` when the body is an object, else undefined. */
export function field(body: unknown, name: string): unknown {
  return isRecord(body) ? body[name] : undefined;
}

/** `body[name]`, which must be a string. */
export function stringField(body: unknown, name: string): string {
  const v = field(body, name);
  if (typeof v !== 'string') assert.fail(`no string "${name}" in ${JSON.stringify(body)?.slice(0, 300)}`);
  return v;
}

/** `body[name]`, which must be a number. */
export function numberField(body: unknown, name: string): number {
  const v = field(body, name);
  if (typeof v !== 'number') assert.fail(`no number "${name}" in ${JSON.stringify(body)?.slice(0, 300)}`);
  return v;
}
