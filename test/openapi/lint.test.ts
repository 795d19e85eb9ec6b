/**
 * The served OpenAPI document passes Redocly CLI's lint with the rules in
 * redocly.yaml (recommended, plus stricter ones): no error and no warning.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { buildTestApp, type TestApp } from '../helpers/app.js';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const REDOCLY = join(ROOT, 'node_modules', '@redocly', 'cli', 'bin', 'cli.js');

function lint(file: string): { status: number | null; output: string } {
  const r = spawnSync(
    process.execPath,
    [REDOCLY, 'lint', file, '--config', join(ROOT, 'redocly.yaml'), '--format', 'stylish'],
    {
      cwd: ROOT,
      encoding: 'utf8',
      // No telemetry and no update check: the lint must not depend on the network.
      env: { ...process.env, REDOCLY_TELEMETRY: 'off', REDOCLY_SUPPRESS_UPDATE_NOTICE: 'true', NO_COLOR: '1' },
    },
  );
  return { status: r.status, output: `${r.stdout}${r.stderr}` };
}

describe('redocly lint of the served document', () => {
  let dir: string;
  before(() => {
    dir = mkdtempSync(join(tmpdir(), 'gpucloud-openapi-'));
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  for (const [name, env] of [
    ['as served by default', {}],
    [
      'with a public URL and a support address',
      { GPUCLOUD_PUBLIC_URL: 'https://api.gpucloud.test', GPUCLOUD_SUPPORT_EMAIL: 'support@gpucloud.test' },
    ],
  ] as const) {
    test(`${name}: no error, no warning`, async () => {
      let t: TestApp | undefined;
      try {
        t = await buildTestApp('pglite', { env });
        const res = await t.req('GET', '/openapi.json');
        assert.equal(res.status, 200);
        const file = join(dir, `openapi-${Object.keys(env).length}.json`);
        writeFileSync(file, res.text);
        const r = lint(file);
        assert.equal(r.status, 0, r.output);
        // (Redocly's own banner about Node.js versions says "warning" too: look at problems only.)
        assert.doesNotMatch(r.output, /^\s*\d+:\d+\s+(warning|error)\s/m, r.output);
        assert.doesNotMatch(r.output, /You have \d+ warning/, r.output);
        assert.match(r.output, /valid/i, r.output);
      } finally {
        await t?.close();
      }
    });
  }
});
