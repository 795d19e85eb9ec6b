/**
 * `gpucloud search` lists offers in the API's order, the one the console
 * shows and `limit`/`offset` page (docs/offers.md): the on-demand price per
 * GPU-hour, then the node; not by the whole offer's price per hour, which
 * puts a big node of cheap GPUs last. Run as a child process against a real
 * server on both databases.
 */
import { before, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { AddressInfo } from 'node:net';
import { describeEachDb } from '../helpers/app.js';
import { createNode, createUser } from '../helpers/factories.js';
import { gpucloudMain } from '../helpers/entry.js';

interface Offer {
  node: string;
  gpu_price_hourly: number;
  total_price_hourly: number;
}

describeEachDb('gpucloud search: the order of the API', (t) => {
  let base: string;

  before(async () => {
    await t().app.listen({ port: 0, host: '127.0.0.1' });
    base = `http://127.0.0.1:${(t().app.server.address() as AddressInfo).port}`;
    const admin = await createUser(t(), { admin: true });
    // Per GPU-hour 4090 < 5090 < pro6000; per offer-hour the eight 4090s cost the most.
    for (const [node, gpu_type, gpu_count] of [
      ['a-8x4090', '4090', 8],
      ['b-1x5090', '5090', 1],
      ['c-1xpro6000', 'pro6000', 1],
      ['d-1x4090', '4090', 1],
    ] as const)
      await createNode(t(), admin.token, { node, gpu_type, gpu_count });
  });

  /** The offers the API answers for the query string, and the NODE column of `gpucloud search ARGS`. */
  async function both(query: string, args: string[]): Promise<{ api: Offer[]; cli: string[] }> {
    const r = await fetch(`${base}/search${query}`);
    assert.equal(r.status, 200);
    const home = mkdtempSync(join(tmpdir(), 'gpucloud-cli-search-'));
    try {
      const env: NodeJS.ProcessEnv = { ...process.env, XDG_CONFIG_HOME: home, GPUCLOUD_API_URL: base };
      delete env.GPUCLOUD_API_KEY; // offers need no account
      // Not spawnSync: the server answers from this process.
      const child = spawn(process.execPath, [gpucloudMain(), 'search', ...args], { env });
      let stdout = '';
      let stderr = '';
      child.stdout.on('data', (d) => (stdout += d));
      child.stderr.on('data', (d) => (stderr += d));
      const code = await new Promise<number | null>((resolve) => child.on('close', resolve));
      const run = { status: code, stdout, stderr };
      assert.equal(run.status, 0, run.stderr);
      const [header, ...rows] = run.stdout.trim().split('\n');
      assert.match(header!, /^NODE\s+GPU\s/);
      return { api: (await r.json()) as Offer[], cli: rows.map((l) => l.split(/\s+/)[0]!) };
    } finally {
      rmSync(home, { recursive: true, force: true });
    }
  }

  test('the table lists the offers in the order the API gives them, page by page', async () => {
    const all = await both('', []);
    assert.deepEqual(all.cli, ['a-8x4090', 'd-1x4090', 'b-1x5090', 'c-1xpro6000']);
    assert.deepEqual(
      all.cli,
      all.api.map((o) => o.node),
    );
    // The order of the whole offer's price would differ: the test tells them apart.
    const byTotal = [...all.api].sort((a, b) => a.total_price_hourly - b.total_price_hourly).map((o) => o.node);
    assert.notDeepEqual(all.cli, byTotal);

    const interruptible = await both('?rental_type=interruptible', ['--interruptible']);
    assert.deepEqual(
      interruptible.cli,
      interruptible.api.map((o) => o.node),
    );
    const page = await both('?limit=2&offset=1', ['--limit', '2', '--offset', '1']);
    assert.deepEqual(page.cli, ['d-1x4090', 'b-1x5090']);
    assert.deepEqual(
      page.cli,
      page.api.map((o) => o.node),
    );
  });

  test('the help says which order', () => {
    const help = spawnSync(process.execPath, [gpucloudMain(), 'search', '--help'], { encoding: 'utf8' });
    assert.equal(help.status, 0, help.stderr);
    assert.match(
      help.stdout.replace(/\s+/g, ' '),
      /in the API's order: cheapest on-demand \$\/GPU\/H first, then by node/,
    );
  });
});
