/**
 * The layers a reader can trust (docs/architecture.md): the HTTP layer, the
 * hypervisor drivers, the scheduler and the disk-image checks serve the modules
 * and never reach back into them; app.ts and wiring/ compose them.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';

const SRC = join(import.meta.dirname, '..', 'src');

test('nothing in http/, hypervisor/, background/ or disk-image/ imports from modules/', () => {
  const offenders: string[] = [];
  for (const dir of ['http', 'hypervisor', 'background', 'disk-image']) {
    for (const f of readdirSync(join(SRC, dir), { recursive: true }) as string[]) {
      if (!f.endsWith('.ts')) continue;
      const text = readFileSync(join(SRC, dir, f), 'utf8');
      for (const m of text.matchAll(/from\s+'([^']+)'/g)) {
        if (/(^|\/)modules\//.test(m[1]!)) offenders.push(`src/${dir}/${f}: ${m[1]}`);
      }
    }
  }
  assert.deepEqual(offenders, []);
});

test("a module uses another module's service, never its repository (types aside)", () => {
  // The one exception: the ledger check (billing) audits reservation balances with the reservations' own query.
  const allowed = new Set(['billing/ledger-check.ts -> ../reservations/repository.js']);
  const offenders: string[] = [];
  const modules = join(SRC, 'modules');
  for (const f of readdirSync(modules, { recursive: true }) as string[]) {
    if (!f.endsWith('.ts')) continue;
    const own = f.split(/[\\/]/)[0]!;
    const text = readFileSync(join(modules, f), 'utf8');
    for (const m of text.matchAll(/^import\s+(type\s+)?[^;]*?from\s+'(\.\.\/([\w-]+)\/[\w-]*repository\.js)'/gms)) {
      if (m[1] || m[3] === own) continue;
      const edge = `${f.replace(/\\/g, '/')} -> ${m[2]}`;
      if (!allowed.has(edge)) offenders.push(edge);
    }
  }
  assert.deepEqual(offenders, []);
});
