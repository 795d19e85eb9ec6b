/**
 * Offers and the public price list come from a shared snapshot: a change
 * through this instance shows at once, one through another instance (or a
 * worker) within OFFERS_MAX_AGE_MS.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { FastifyInstance } from 'fastify';
import { OFFERS_MAX_AGE_MS } from '../../src/modules/inventory/offers.js';
import { describeEachDb, request } from '../helpers/app.js';
import { createNode, createUser, credit, uploadSshKey } from '../helpers/factories.js';
import { within } from '../helpers/wait.js';

describeEachDb('offers snapshot across instances', (t) => {
  const on = (app: FastifyInstance, method: string, url: string, opts: { token?: string; body?: unknown } = {}) =>
    request(app, new Set(), method, url, opts);

  test('offers follow a new VM at once on this instance and within a second on another', async () => {
    const admin = await createUser(t(), { admin: true });
    const { node } = await createNode(t(), admin.token, { gpu_type: 'pro6000', gpu_count: 2 });
    const u = await createUser(t());
    await credit(t(), admin.token, u.id, 1000);
    await uploadSshKey(t(), u.token);
    const b = await t().another();
    const free = async (app: FastifyInstance) => {
      const r = await on(app, 'GET', '/search', {});
      return (r.body as { node: string; gpu_count: number }[]).find((o) => o.node === node)?.gpu_count ?? 0;
    };
    assert.equal(await free(t().app), 2);
    assert.equal(await free(b), 2);
    const vm = await t().req('POST', '/vms', {
      token: u.token,
      body: { node, gpu_type: 'pro6000', gpu_count: 1, storage_gb: 50, template_vmid: 100 },
    });
    assert.equal(vm.status, 201, vm.text);
    assert.equal(await free(t().app), 1, 'at once on the instance that created it');
    await within(OFFERS_MAX_AGE_MS + 500, async () => (await free(b)) === 1, 'the other instance sees it');
    // Prices too.
    const put = await t().req('PUT', '/admin/pricing/pro6000', {
      token: admin.token,
      body: { gpu_price_hourly: 4.321 },
    });
    assert.equal(put.status, 200, put.text);
    const price = async (app: FastifyInstance) =>
      (
        (await on(app, 'GET', '/pricing', {})).body as { gpu_types: { gpu_type: string; gpu_price_hourly: number }[] }
      ).gpu_types.find((g) => g.gpu_type === 'pro6000')!.gpu_price_hourly;
    assert.equal(await price(t().app), 4.321);
    await within(
      OFFERS_MAX_AGE_MS + 500,
      async () => (await price(b)) === 4.321,
      'the other instance shows the new price',
    );
  });

  test('answers kept per snapshot differ by query, keep X-Total-Count and follow a change', async () => {
    const admin = await createUser(t(), { admin: true });
    const nodes: string[] = [];
    for (let i = 0; i < 3; i++)
      nodes.push((await createNode(t(), admin.token, { gpu_type: '5090', gpu_count: 2 + i })).node);
    const get = async (url: string) => {
      const r = await t().req('GET', url);
      assert.equal(r.status, 200, r.text);
      assert.match(String(r.headers['content-type']), /^application\/json; charset=utf-8/);
      return {
        offers: (r.body as { node: string; gpu_count: number }[]).filter((o) => nodes.includes(o.node)),
        total: Number(r.headers['x-total-count']),
        text: r.text,
      };
    };
    const all = await get('/search?gpu_type=5090&limit=100');
    assert.equal(all.offers.length, 3);
    for (let round = 0; round < 2; round++) {
      // The second round is answered from kept bodies: the same bytes, the same totals.
      assert.equal((await get('/search?gpu_type=5090&limit=100')).text, all.text);
      const second = await get('/search?gpu_type=5090&limit=1&offset=1');
      assert.equal(second.total, all.total);
      assert.equal(JSON.parse(second.text).length, 1);
      const big = await get('/search?gpu_type=5090&min_gpus=4&limit=100');
      assert.deepEqual(
        big.offers.map((o) => o.gpu_count),
        [4],
      );
      assert.ok(big.total < all.total);
    }
    // Turning a node off replaces the snapshot: the same query no longer lists it.
    const off = await t().req('PATCH', `/admin/nodes/${nodes[2]}`, { token: admin.token, body: { status: 'offline' } });
    assert.equal(off.status, 200, off.text);
    const after = await get('/search?gpu_type=5090&min_gpus=4&limit=100');
    assert.deepEqual(after.offers, []);
    const allAfter = await get('/search?gpu_type=5090&limit=100');
    assert.equal(allAfter.total, all.total - 1);
    assert.deepEqual(allAfter.offers.map((o) => o.node).sort(), nodes.slice(0, 2).sort());
  });
});
