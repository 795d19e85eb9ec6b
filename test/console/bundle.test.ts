/**
 * The console's bundle budget: the first screen loads under 200 KB of
 * gzip-compressed JavaScript (the build itself refuses to go over it), and
 * the server sends the build's precompressed files with long caching for the
 * hashed assets and none for the page.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { buildConsole } from '../helpers/browser.js';
import { buildTestApp, type TestApp } from '../helpers/app.js';
import { BUDGET_BYTES, firstScreenJs } from '../../console/budget.js';

describe('console bundle', () => {
  let built: { dir: string; cleanup: () => void };
  let t: TestApp;
  before(async () => {
    built = buildConsole();
    t = await buildTestApp('pglite', { consoleDir: built.dir });
  });
  after(async () => {
    await t?.close();
    built?.cleanup();
  });

  test('the first screen loads under 200 KB of gzipped JavaScript', () => {
    const js = firstScreenJs(built.dir);
    assert.ok(Object.keys(js.files).length >= 1, 'index.html names its scripts');
    assert.ok(js.total > 1000, `a real bundle (${js.total} bytes)`);
    assert.ok(js.total < BUDGET_BYTES, `${js.total} bytes of gzipped JavaScript: ${JSON.stringify(js.files)}`);
  });

  test('served compressed, hashed assets cached for a year, the page never cached', async () => {
    const page = await t.app.inject({ method: 'GET', url: '/console/' });
    assert.equal(page.statusCode, 200);
    assert.equal(page.headers['cache-control'], 'no-cache');
    assert.match(String(page.headers['content-security-policy']), /default-src 'self'/);
    const src = page.body.match(/<script[^>]*src="([^"]+)"/)![1]!;
    for (const [encoding, expected] of [
      ['br', 'br'],
      ['gzip', 'gzip'],
      ['identity', undefined],
    ] as const) {
      const js = await t.app.inject({ method: 'GET', url: src, headers: { 'accept-encoding': encoding } });
      assert.equal(js.statusCode, 200);
      assert.equal(js.headers['content-encoding'], expected, encoding);
      assert.match(String(js.headers['content-type']), /javascript/);
      assert.equal(js.headers['cache-control'], 'public, max-age=31536000, immutable');
    }
    const deep = await t.app.inject({ method: 'GET', url: '/console/vms/1234' });
    assert.equal(deep.statusCode, 200, 'a deep link answers the app');
    assert.equal(deep.body, page.body);
    const missing = await t.app.inject({ method: 'GET', url: '/console/assets/gone-123.js' });
    assert.equal(missing.statusCode, 404);
    assert.equal(missing.json().code, 'not_found');
    const root = await t.app.inject({ method: 'GET', url: '/' });
    assert.equal(root.statusCode, 302);
    assert.equal(root.headers.location, '/console/');
  });

  test('without a build, /console/ says how to make one', async () => {
    const bare = await buildTestApp('pglite', { consoleDir: '/nonexistent-console-build' });
    try {
      const r = await bare.app.inject({ method: 'GET', url: '/console/' });
      assert.equal(r.statusCode, 404);
      assert.match(r.body, /npm run build/);
    } finally {
      await bare.close();
    }
  });
});
