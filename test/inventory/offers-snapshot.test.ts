/**
 * Offers and the public price list come from a shared snapshot: a change
 * through this instance shows at once, one through another instance (or a
 * worker) within OFFERS_MAX_AGE_MS.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { FastifyInstance } from 'fastify';
import { OFFERS_MAX_AGE_MS } from '../../src/modules/inventory/service.js';
import { describeEachDb, request } from '../helpers/app.js';
import { createNode, createUser, credit, uploadSshKey } from '../helpers/factories.js';
import { within } from '../helpers/wait.js';


describeEachDb('offers snapshot across instances', (t) => {
  const on = (app: FastifyInstance, method: string, url: string, opts: { token?: string; body?: unknown } = {}) => request(app, new Set(), method, url, opts);

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
    const vm = await t().req('POST', '/vms', { token: u.token, body: { node, gpu_type: 'pro6000', gpu_count: 1, storage_gb: 50, template_vmid: 100 } });
    assert.equal(vm.status, 201, vm.text);
    assert.equal(await free(t().app), 1, 'at once on the instance that created it');
    await within(OFFERS_MAX_AGE_MS + 500, async () => (await free(b)) === 1, 'the other instance sees it');
    // Prices too.
    const put = await t().req('PUT', '/admin/pricing/pro6000', { token: admin.token, body: { gpu_price_hourly: 4.321 } });
    assert.equal(put.status, 200, put.text);
    const price = async (app: FastifyInstance) => ((await on(app, 'GET', '/pricing', {})).body as { gpu_types: { gpu_type: string; gpu_price_hourly: number }[] }).gpu_types.find((g) => g.gpu_type === 'pro6000')!.gpu_price_hourly;
    assert.equal(await price(t().app), 4.321);
    await within(OFFERS_MAX_AGE_MS + 500, async () => (await price(b)) === 4.321, 'the other instance shows the new price');
  });
});
