/**
 * Public offers (GET /search) and prices (GET /pricing).
 * Every test registers its nodes in a location of its own and searches that
 * location, so the other tests' nodes never get in the way.
 */
import { afterEach, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { describeEachDb } from '../helpers/app.js';
import { api, type Api, type BodyFor, type Op, type RequestBody } from '../helpers/api.js';
import { createNode, createUser, credit, uploadSshKey, type TestUser } from '../helpers/factories.js';
import { SHIPPED_PRICES as DEFAULTS } from '../helpers/expected.js';
import type { NodeRecord, NodeSpec } from '../helpers/world.js';

const OFFER_KEYS = [
  'available_interruptible',
  'available_ondemand',
  'available_reserved',
  'cluster_name',
  'cpu_cores',
  'cpu_model',
  'gpu_count',
  'gpu_price_hourly',
  'gpu_ram_mb',
  'gpu_type',
  'interruptible_rate',
  'location',
  'max_storage_gb',
  'node',
  'pcie_gen',
  'ram_gb',
  'reserved_discount_1mo',
  'reserved_discount_3mo',
  'reserved_discount_6mo',
  'storage_price_hourly',
  'total_gpu_ram_mb',
  'total_price_hourly',
];
const PRICING_TYPE_KEYS = [
  'available_gpus',
  'gpu_price_hourly',
  'gpu_ram_mb',
  'gpu_type',
  'interruptible_rate',
  'reserved_discount_1mo',
  'reserved_discount_3mo',
  'reserved_discount_6mo',
  'storage_price_gb_hourly',
  'total_gpus',
];

type Offer = BodyFor<'/search', 'get', 200>[number];
type SearchQuery = NonNullable<Op<'/search', 'get'>['parameters']['query']>;
type PricingType = BodyFor<'/pricing', 'get', 200>['gpu_types'][number];
type VmBody = RequestBody<'/vms', 'post'>;

const newLocation = () => `loc-${randomBytes(4).toString('hex')}`;

describeEachDb('offers and public prices', (t) => {
  let admin: TestUser;
  let renter: TestUser;
  /** Typed clients for the administrator and the renter (made in before()), and an anonymous one. */
  let asAdmin: Api;
  let asRenter: Api;
  const anon = () => api(t());

  const search = async (query: SearchQuery = {}): Promise<Offer[]> => {
    const r = await anon().get('/search', { query });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.headers['x-total-count'] !== undefined, true, 'X-Total-Count');
    return r.body;
  };
  /** The one offer of a node (or undefined), searching its location. */
  const offerOf = async (
    node: { node: string; location: string },
    query: SearchQuery = {},
  ): Promise<Offer | undefined> => {
    const offers = await search({ location: String(node.location), ...query });
    const mine = offers.filter((o) => o.node === node.node);
    assert.ok(mine.length <= 1, 'one offer per node');
    return mine[0];
  };
  const node = (location: string, over: NodeSpec = {}) => createNode(t(), admin.token, { location, ...over });
  const vm = async (
    n: { node: string; gpu_type?: VmBody['gpu_type'] },
    gpuCount: VmBody['gpu_count'],
    rental: 'on_demand' | 'interruptible' = 'on_demand',
  ) => {
    const r = await asRenter.post('/vms', {
      body: {
        node: n.node,
        gpu_type: n.gpu_type ?? '4090',
        gpu_count: gpuCount,
        storage_gb: 50,
        template_vmid: 100,
        rental_type: rental,
      },
    });
    assert.equal(r.status, 201, r.text);
    return r.body;
  };
  const destroy = async (id: string) =>
    assert.equal((await asRenter.delete('/vms/{vm_id}', { params: { vm_id: id } })).status, 200);
  const patchNode = async (name: string, body: RequestBody<'/admin/nodes/{node}', 'patch'>) => {
    const r = await asAdmin.patch('/admin/nodes/{node}', { params: { node: name }, body });
    assert.equal(r.status, 200, r.text);
  };
  const pricingOf = async (gpuType: string): Promise<PricingType> => {
    const r = await anon().get('/pricing');
    assert.equal(r.status, 200, r.text);
    const g = r.body.gpu_types.find((x) => x.gpu_type === gpuType);
    assert.ok(g, `${gpuType} is listed`);
    return g;
  };
  /** PUT /admin/pricing/{gpu_type} (its answer is checked only where the test did). */
  const setPrices = (gpuType: string, body: RequestBody<'/admin/pricing/{gpu_type}', 'put'>) =>
    asAdmin.put('/admin/pricing/{gpu_type}', { params: { gpu_type: gpuType }, body });

  // VMs are created (and may be metered) here too: the ledger stays balanced (every balance is the sum of its
  // transactions).
  afterEach(async () => {
    const { rows } = await t().db.query(
      `SELECT b.user_id FROM balances b LEFT JOIN transactions t ON t.user_id = b.user_id
        GROUP BY b.user_id HAVING b.balance_micros <> COALESCE(SUM(t.amount_micros), 0)`,
    );
    assert.deepEqual(rows, [], 'balance == sum(transactions)');
  });

  before(async () => {
    admin = await createUser(t(), { admin: true });
    renter = await createUser(t());
    asAdmin = api(t(), admin.token);
    asRenter = api(t(), renter.token);
    await credit(t(), admin.token, renter.id, 100_000);
    await uploadSshKey(t(), renter.token);
    const p = await asAdmin.patch('/admin/users/{user_id}', {
      params: { user_id: renter.id },
      body: { max_vms: 1000, max_gpus: 10_000 },
    });
    assert.equal(p.status, 200, p.text);
  });

  describe('GET /search: one offer per active node with GPUs rentable now', () => {
    test('no authentication; one offer per active node with every field, prices exact', async () => {
      const loc = newLocation();
      const a = await node(loc, {
        gpu_type: '4090',
        gpu_count: 8,
        ram_gb: 512,
        cpu_cores: 64,
        cpu_model: 'AMD EPYC 7543',
        pcie_gen: '4.0',
        max_storage_gb: 2000,
        cluster_name: 'fra-1',
      });
      const b = await node(loc, {
        gpu_type: '5090',
        gpu_count: 3,
        ram_gb: 192,
        cpu_cores: 24,
        cpu_model: 'Intel Xeon w7-3465X',
        pcie_gen: '5.0',
        max_storage_gb: 4000,
        cluster_name: 'sfo-1',
      });
      const c = await node(loc, {
        gpu_type: 'pro6000',
        gpu_count: 7,
        gpu_ram_mb: 96_000,
        ram_gb: 1536,
        cpu_cores: 128,
        cpu_model: 'AMD EPYC 9654',
        pcie_gen: '5.0',
        max_storage_gb: 16000,
        cluster_name: 'nyc-1',
      });
      const r = await anon().get('/search', { query: { location: loc } });
      assert.equal(r.status, 200, r.text);
      assert.equal(r.headers['x-total-count'], '3');
      // A bad credential on a public route is ignored, not refused
      assert.equal((await api(t(), 'not-a-token').get('/search', { query: { location: loc } })).status, 200);
      assert.deepEqual(
        r.body.map((o) => o.node),
        [a.node, b.node, c.node],
        'by price: 4090, 5090, pro6000',
      );
      for (const o of r.body) assert.deepEqual(Object.keys(o).sort(), OFFER_KEYS);
      const base = (n: NodeRecord) => ({
        node: n.node,
        gpu_type: n.gpu_type,
        gpu_count: n.gpu_count,
        gpu_ram_mb: n.gpu_ram_mb,
        ram_gb: n.ram_gb,
        cpu_cores: n.cpu_cores,
        cpu_model: n.cpu_model,
        pcie_gen: n.pcie_gen,
        max_storage_gb: n.max_storage_gb,
        location: loc,
        cluster_name: n.cluster_name,
        storage_price_hourly: 0.0002,
        reserved_discount_1mo: 10,
        reserved_discount_3mo: 20,
        reserved_discount_6mo: 30,
        available_ondemand: true,
        available_interruptible: true,
        available_reserved: true,
      });
      assert.deepEqual(r.body[0], {
        ...base(a),
        total_gpu_ram_mb: 8 * 24_576,
        gpu_price_hourly: 0.44,
        interruptible_rate: 0.22,
        total_price_hourly: 3.53,
      });
      assert.deepEqual(r.body[1], {
        ...base(b),
        total_gpu_ram_mb: 3 * 32_768,
        gpu_price_hourly: 0.69,
        interruptible_rate: 0.35,
        total_price_hourly: 2.08,
      });
      assert.deepEqual(r.body[2], {
        ...base(c),
        total_gpu_ram_mb: 7 * 96_000,
        gpu_price_hourly: 1.69,
        interruptible_rate: 0.85,
        total_price_hourly: 11.84,
      });
    });

    test('total_price_hourly = gpu_count x gpu_price_hourly + 50 x storage_price_hourly, exact in decimal', async () => {
      const loc = newLocation();
      const n = await node(loc, { gpu_type: '5090', gpu_count: 7 });
      try {
        // 0.1 and 0.2 style prices whose float sums are inexact
        const p = await setPrices('5090', { gpu_price_hourly: 0.1, storage_price_gb_hourly: 0.000007 });
        assert.equal(p.status, 200, p.text);
        let o = (await offerOf(n))!;
        assert.equal(o.storage_price_hourly, 0.000007);
        assert.equal(o.total_price_hourly, 0.70035); // 7 x 0.1 + 50 x 0.000007; in floats 0.7000000000000001 + 0.00035
        await setPrices('5090', { gpu_price_hourly: 0.333333, storage_price_gb_hourly: 0.000001 });
        o = (await offerOf(n))!;
        assert.equal(o.total_price_hourly, 2.333381); // 7 x 0.333333 = 2.333331, + 0.00005
        const v = await vm(n, 4);
        o = (await offerOf(n))!;
        assert.equal(o.gpu_count, 3);
        assert.equal(o.total_price_hourly, 1.000049); // 0.999999 + 0.00005
        await destroy(v.id);
      } finally {
        await setPrices('5090', DEFAULTS['5090']);
      }
    });

    test('draining and offline nodes are absent; back to active they return', async () => {
      const loc = newLocation();
      const a = await node(loc);
      const d = await node(loc, { status: 'draining' });
      const o = await node(loc, { status: 'offline' });
      assert.deepEqual(
        (await search({ location: loc })).map((x) => x.node),
        [a.node],
      );
      for (const rental of ['on_demand', 'reserved', 'interruptible'] as const) {
        assert.deepEqual(
          (await search({ location: loc, rental_type: rental })).map((x) => x.node),
          [a.node],
          rental,
        );
      }
      await patchNode(a.node, { status: 'draining' });
      assert.deepEqual(await search({ location: loc }), []);
      await patchNode(a.node, { status: 'offline' });
      await patchNode(d.node, { status: 'active' });
      await patchNode(o.node, { status: 'active' });
      assert.deepEqual((await search({ location: loc })).map((x) => x.node).sort(), [d.node, o.node].sort());
    });

    test('gpu_count is the GPUs free now; a fully used node is absent', async () => {
      const loc = newLocation();
      const n = await node(loc, { gpu_count: 8 });
      const v1 = await vm(n, 2);
      let o = (await offerOf(n))!;
      assert.equal(o.gpu_count, 6);
      assert.equal(o.total_gpu_ram_mb, 6 * 24_576);
      assert.equal(o.total_price_hourly, 2.65); // 6 x 0.44 + 0.01
      const v2 = await vm(n, 4);
      o = (await offerOf(n))!;
      assert.equal(o.gpu_count, 2);
      const v3 = await vm(n, 2);
      for (const rental of ['on_demand', 'reserved', 'interruptible'] as const) {
        assert.equal(await offerOf(n, { rental_type: rental }), undefined, `${rental}: full`);
      }
      await destroy(v2.id);
      o = (await offerOf(n))!;
      assert.equal(o.gpu_count, 4);
      await destroy(v1.id);
      await destroy(v3.id);
      assert.equal((await offerOf(n))!.gpu_count, 8);
    });

    test('GPUs held by interruptible VMs are rentable on-demand and reserved, not interruptible', async () => {
      const loc = newLocation();
      const n = await node(loc, { gpu_count: 8 });
      const spot = await vm(n, 2, 'interruptible');
      const od = await vm(n, 4);
      // free 2, interruptible 2
      const onDemand = (await offerOf(n))!;
      assert.equal(onDemand.gpu_count, 4);
      assert.equal(onDemand.total_gpu_ram_mb, 4 * 24_576);
      assert.equal(onDemand.total_price_hourly, 1.77); // 4 x 0.44 + 0.01
      assert.deepEqual(
        [onDemand.available_ondemand, onDemand.available_reserved, onDemand.available_interruptible],
        [true, true, true],
      );
      assert.deepEqual(await offerOf(n, { rental_type: 'on_demand' }), onDemand, 'on_demand is the default');
      assert.deepEqual(await offerOf(n, { rental_type: 'reserved' }), onDemand);
      const spotOffer = (await offerOf(n, { rental_type: 'interruptible' }))!;
      assert.equal(spotOffer.gpu_count, 2);
      assert.equal(spotOffer.total_gpu_ram_mb, 2 * 24_576);
      assert.equal(spotOffer.total_price_hourly, 0.89, 'the on-demand price of the offer (2 x 0.44 + 0.01)');

      // Fill the free GPUs with interruptible VMs: nothing free, 4 held by interruptible VMs
      const spot2 = await vm(n, 2, 'interruptible');
      const full = (await offerOf(n))!;
      assert.equal(full.gpu_count, 4);
      assert.deepEqual(
        [full.available_ondemand, full.available_reserved, full.available_interruptible],
        [true, true, false],
      );
      assert.equal(await offerOf(n, { rental_type: 'interruptible' }), undefined);
      assert.deepEqual((await offerOf(n, { min_gpus: 4 }))?.node, n.node);
      assert.equal(await offerOf(n, { min_gpus: 5 }), undefined);

      // An on-demand VM takes the interruptible VMs' GPUs; they are interrupted and hold none
      const od2 = await vm(n, 4);
      const spotNow = await asRenter.get('/vms/{vm_id}', { params: { vm_id: spot.id } });
      assert.equal(spotNow.status, 200, spotNow.text);
      assert.equal(spotNow.body.status, 'interrupted');
      assert.equal(await offerOf(n), undefined, 'all 8 GPUs on-demand now');
      for (const v of [od, od2]) await destroy(v.id);
      for (const v of [spot, spot2]) await destroy(v.id);
      assert.equal((await offerOf(n, { rental_type: 'interruptible' }))!.gpu_count, 8);
    });

    test('filters: gpu_type, min_gpus, location (case-insensitive) and their combination', async () => {
      const loc = newLocation();
      const a = await node(loc, { gpu_type: '4090', gpu_count: 2 });
      const b = await node(loc, { gpu_type: '4090', gpu_count: 8 });
      const c = await node(loc, { gpu_type: '5090', gpu_count: 4 });
      const d = await node(loc, { gpu_type: 'pro6000', gpu_count: 1 });
      const names = (offers: Offer[]) => offers.map((o) => o.node);
      assert.deepEqual(names(await search({ location: loc, gpu_type: '4090' })), [a.node, b.node].sort());
      assert.deepEqual(names(await search({ location: loc, gpu_type: '5090' })), [c.node]);
      assert.deepEqual(names(await search({ location: loc, gpu_type: 'pro6000' })), [d.node]);
      assert.deepEqual(names(await search({ location: loc, min_gpus: 1 })).length, 4);
      assert.deepEqual(names(await search({ location: loc, min_gpus: 2 })).sort(), [a.node, b.node, c.node].sort());
      assert.deepEqual(names(await search({ location: loc, min_gpus: 4 })).sort(), [b.node, c.node].sort());
      assert.deepEqual(names(await search({ location: loc, min_gpus: 8 })), [b.node]);
      assert.deepEqual(names(await search({ location: loc, min_gpus: 9 })), []);
      assert.deepEqual(names(await search({ location: loc, min_gpus: 4, gpu_type: '4090' })), [b.node]);
      // min_gpus counts the GPUs rentable now
      const v = await vm(b, 8);
      assert.deepEqual(names(await search({ location: loc, min_gpus: 4 })), [c.node]);
      await destroy(v.id);
      // location: exact match, any case; another location is not this one
      assert.equal((await search({ location: loc.toUpperCase() })).length, 4);
      assert.equal((await search({ location: `${loc.slice(0, 1).toUpperCase()}${loc.slice(1)}` })).length, 4);
      assert.deepEqual(await search({ location: loc.slice(0, -1) }), []);
      assert.deepEqual(await search({ location: `${loc}x` }), []);
      // Without location every location's offers come back
      const everywhere = names(await search({ gpu_type: 'pro6000', limit: 100 }));
      assert.ok(everywhere.includes(d.node));
      const withCase = await node(loc.toUpperCase(), { gpu_type: '5090', gpu_count: 1 });
      assert.deepEqual(names(await search({ location: loc, gpu_type: '5090' })).sort(), [c.node, withCase.node].sort());
    });

    test('max_price is per GPU-hour: gpu_price_hourly, or interruptible_rate for rental_type=interruptible; the bound is inclusive', async () => {
      const loc = newLocation();
      const a = await node(loc, { gpu_type: '4090', gpu_count: 2 }); // 0.44 / 0.22
      const b = await node(loc, { gpu_type: '5090', gpu_count: 2 }); // 0.69 / 0.35
      const c = await node(loc, { gpu_type: 'pro6000', gpu_count: 2 }); // 1.69 / 0.85
      // (a number in the query is sent as its decimal text, e.g. 0.439999 as '0.439999')
      const names = async (q: SearchQuery) => (await search({ location: loc, ...q })).map((o) => o.node);
      assert.deepEqual(await names({ max_price: 0.44 }), [a.node]);
      assert.deepEqual(await names({ max_price: 0.439999 }), []);
      assert.deepEqual(await names({ max_price: 0.69 }), [a.node, b.node]);
      assert.deepEqual(await names({ max_price: 1.69 }), [a.node, b.node, c.node]);
      assert.deepEqual(await names({ max_price: 100 }), [a.node, b.node, c.node]);
      assert.deepEqual(await names({ max_price: 0 }), []);
      assert.deepEqual(await names({ max_price: 1 }), [a.node, b.node]);
      assert.deepEqual(
        await names({ max_price: 0.35, rental_type: 'reserved' }),
        [],
        'reserved compares gpu_price_hourly',
      );
      assert.deepEqual(await names({ max_price: 0.35, rental_type: 'interruptible' }), [a.node, b.node]);
      assert.deepEqual(await names({ max_price: 0.349999, rental_type: 'interruptible' }), [a.node]);
      assert.deepEqual(await names({ max_price: 0.22, rental_type: 'interruptible' }), [a.node]);
      assert.deepEqual(await names({ max_price: 0.85, rental_type: 'interruptible' }), [a.node, b.node, c.node]);
      assert.deepEqual(await names({ max_price: 0.85, rental_type: 'on_demand' }), [a.node, b.node]);
      assert.deepEqual(await names({ max_price: 1, gpu_type: '5090' }), [b.node]);
    });

    test('query validation: 422 naming the parameter', async () => {
      const cases: Array<[Record<string, string | number>, string]> = [
        [{ min_gpus: 0 }, 'query.min_gpus'],
        [{ min_gpus: -1 }, 'query.min_gpus'],
        [{ min_gpus: '1.5' }, 'query.min_gpus'],
        [{ min_gpus: 'two' }, 'query.min_gpus'],
        [{ min_gpus: 65 }, 'query.min_gpus'],
        [{ max_price: -1 }, 'query.max_price'],
        [{ max_price: '-0.01' }, 'query.max_price'],
        [{ max_price: 'cheap' }, 'query.max_price'],
        [{ max_price: '1e3' }, 'query.max_price'],
        [{ gpu_type: 'a100' }, 'query.gpu_type'],
        [{ gpu_type: '' }, 'query.gpu_type'],
        [{ rental_type: 'spot' }, 'query.rental_type'],
        [{ limit: 0 }, 'query.limit'],
        [{ limit: 101 }, 'query.limit'],
        [{ offset: -1 }, 'query.offset'],
        [{ sort: 'price' }, 'query.sort'],
        [{ gpu: '4090' }, 'query.gpu'],
      ];
      for (const [query, field] of cases) {
        const r = await anon().get('/search', { rawQuery: query });
        assert.equal(r.status, 422, `${JSON.stringify(query)}: ${r.text}`);
        assert.equal(r.body.code, 'validation_error');
        assert.ok(
          r.body.errors?.some((e) => e.field === field),
          `${JSON.stringify(query)}: ${r.text}`,
        );
      }
      // The edges that are allowed
      const edges: SearchQuery[] = [
        { min_gpus: 1 },
        { min_gpus: 64 },
        { max_price: 0 },
        { max_price: 0.5 }, // sent as '0.5'
        { limit: 1 },
        { limit: 100 },
        { offset: 0 },
      ];
      for (const query of edges) {
        assert.equal((await anon().get('/search', { query })).status, 200, JSON.stringify(query));
      }
    });

    test('sorted by gpu_price_hourly, then node; follows price changes', async () => {
      const loc = newLocation();
      const tag = randomBytes(2).toString('hex');
      // Names chosen so that by name alone the order would be different
      const z4 = await node(loc, { node: `z${tag}-4090`, gpu_type: '4090', gpu_count: 1 });
      const a5 = await node(loc, { node: `a${tag}-5090`, gpu_type: '5090', gpu_count: 1 });
      const m4 = await node(loc, { node: `m${tag}-4090`, gpu_type: '4090', gpu_count: 1 });
      const b6 = await node(loc, { node: `b${tag}-pro`, gpu_type: 'pro6000', gpu_count: 1 });
      const a4 = await node(loc, { node: `a${tag}-4090`, gpu_type: '4090', gpu_count: 1 });
      const order = async (q: SearchQuery = {}) => (await search({ location: loc, ...q })).map((o) => o.node);
      assert.deepEqual(await order(), [a4.node, m4.node, z4.node, a5.node, b6.node]);
      // Sorted by the on-demand price whatever the rental type
      assert.deepEqual(await order({ rental_type: 'interruptible' }), [a4.node, m4.node, z4.node, a5.node, b6.node]);
      try {
        const p = await setPrices('4090', { gpu_price_hourly: 2 });
        assert.equal(p.status, 200, p.text);
        assert.deepEqual(await order(), [a5.node, b6.node, a4.node, m4.node, z4.node]);
        await setPrices('pro6000', { gpu_price_hourly: 0.69 });
        assert.deepEqual(await order(), [a5.node, b6.node, a4.node, m4.node, z4.node], 'equal price: by node');
        await setPrices('pro6000', { gpu_price_hourly: 0.689999 });
        assert.deepEqual(await order(), [b6.node, a5.node, a4.node, m4.node, z4.node]);
      } finally {
        await setPrices('4090', DEFAULTS['4090']);
        await setPrices('pro6000', DEFAULTS.pro6000);
      }
    });

    test('limit and offset page the sorted offers; X-Total-Count is the number of matching offers', async () => {
      const loc = newLocation();
      const made: NodeRecord[] = [];
      for (let i = 0; i < 5; i++)
        made.push(await node(loc, { node: `p${i}-${randomBytes(3).toString('hex')}`, gpu_count: 1 }));
      const all = made.map((n) => n.node).sort();
      const pageOf = async (q: SearchQuery) => {
        const r = await anon().get('/search', { query: { location: loc, ...q } });
        assert.equal(r.status, 200, r.text);
        assert.equal(r.headers['x-total-count'], '5', JSON.stringify(q));
        return r.body.map((o) => o.node);
      };
      assert.deepEqual(await pageOf({}), all);
      assert.deepEqual(await pageOf({ limit: 2 }), all.slice(0, 2));
      assert.deepEqual(await pageOf({ limit: 2, offset: 2 }), all.slice(2, 4));
      assert.deepEqual(await pageOf({ limit: 2, offset: 4 }), all.slice(4));
      assert.deepEqual(await pageOf({ offset: 5 }), []);
      assert.deepEqual(await pageOf({ offset: 1000 }), []);
      const filtered = await anon().get('/search', { query: { location: loc, min_gpus: 2 } });
      assert.equal(filtered.headers['x-total-count'], '0');
      // Without filters the total counts every offer, beyond the first page
      const everything = await anon().get('/search', { query: { limit: 1 } });
      assert.equal(everything.status, 200, everything.text);
      assert.equal(everything.body.length, 1);
      assert.ok(Number(everything.headers['x-total-count']) >= 5);
    });
  });

  describe('GET /pricing: the public price list with GPU totals', () => {
    test('no authentication; currency, updated_at and the three GPU types with their prices', async () => {
      const r = await anon().get('/pricing');
      assert.equal(r.status, 200, r.text);
      assert.deepEqual(Object.keys(r.body).sort(), ['currency', 'gpu_types', 'image_storage_gb_hourly', 'updated_at']);
      assert.equal(r.body.image_storage_gb_hourly, 0.0001, 'the default price of image storage per GB-hour');
      assert.equal(r.body.currency, 'USD');
      assert.match(r.body.updated_at, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
      assert.deepEqual(
        r.body.gpu_types.map((g) => g.gpu_type),
        ['5090', '4090', 'pro6000'],
      );
      for (const g of r.body.gpu_types) {
        assert.deepEqual(Object.keys(g).sort(), PRICING_TYPE_KEYS);
        const { gpu_type, total_gpus, available_gpus, ...prices } = g;
        assert.deepEqual(prices, DEFAULTS[gpu_type]);
        assert.ok(Number.isInteger(total_gpus) && Number.isInteger(available_gpus));
        assert.ok(available_gpus >= 0 && available_gpus <= total_gpus);
      }
      assert.equal((await api(t(), 'garbage').get('/pricing')).status, 200);
    });

    test('totals follow nodes and VMs: GPUs on active nodes, and the free ones among them', async () => {
      const loc = newLocation();
      const before = await pricingOf('pro6000');
      const other = await pricingOf('5090');
      const n = await node(loc, { gpu_type: 'pro6000', gpu_count: 8 });
      let p = await pricingOf('pro6000');
      assert.deepEqual([p.total_gpus - before.total_gpus, p.available_gpus - before.available_gpus], [8, 8]);
      const v = await vm(n, 2);
      p = await pricingOf('pro6000');
      assert.deepEqual([p.total_gpus - before.total_gpus, p.available_gpus - before.available_gpus], [8, 6]);
      const s = await vm(n, 4, 'interruptible');
      p = await pricingOf('pro6000');
      assert.deepEqual(
        [p.total_gpus - before.total_gpus, p.available_gpus - before.available_gpus],
        [8, 2],
        'interruptible VMs use GPUs too',
      );
      await patchNode(n.node, { status: 'draining' });
      p = await pricingOf('pro6000');
      assert.deepEqual(
        [p.total_gpus, p.available_gpus],
        [before.total_gpus, before.available_gpus],
        'a draining node does not count',
      );
      await patchNode(n.node, { status: 'offline' });
      p = await pricingOf('pro6000');
      assert.deepEqual(
        [p.total_gpus, p.available_gpus],
        [before.total_gpus, before.available_gpus],
        'an offline node does not count',
      );
      await patchNode(n.node, { status: 'active' });
      p = await pricingOf('pro6000');
      assert.deepEqual(
        [p.total_gpus - before.total_gpus, p.available_gpus - before.available_gpus],
        [8, 2],
        'back as before',
      );
      await destroy(v.id);
      await destroy(s.id);
      p = await pricingOf('pro6000');
      assert.deepEqual([p.total_gpus - before.total_gpus, p.available_gpus - before.available_gpus], [8, 8]);
      await patchNode(n.node, { gpu_count: 4 });
      p = await pricingOf('pro6000');
      assert.deepEqual([p.total_gpus - before.total_gpus, p.available_gpus - before.available_gpus], [4, 4]);
      const del = await asAdmin.delete('/admin/nodes/{node}', { params: { node: n.node } });
      assert.equal(del.status, 204, del.text);
      p = await pricingOf('pro6000');
      assert.deepEqual([p.total_gpus, p.available_gpus], [before.total_gpus, before.available_gpus]);
      assert.deepEqual(await pricingOf('5090'), other, 'other types unaffected');
    });

    test('prices and updated_at follow an admin PUT', async () => {
      const first = await anon().get('/pricing');
      assert.equal(first.status, 200, first.text);
      const t0 = first.body.updated_at;
      await asAdmin.post('/admin/clock/advance', { body: { seconds: 7 } });
      try {
        const put = await setPrices('4090', { gpu_price_hourly: 0.123456, reserved_discount_6mo: 33.33 });
        assert.equal(put.status, 200, put.text);
        const r = await anon().get('/pricing');
        assert.equal(r.status, 200, r.text);
        assert.equal(r.body.updated_at, t().clock.now().toISOString());
        assert.ok(Date.parse(r.body.updated_at) > Date.parse(t0));
        const g = r.body.gpu_types.find((x) => x.gpu_type === '4090');
        assert.ok(g, '4090 is listed');
        assert.equal(g.gpu_price_hourly, 0.123456);
        assert.equal(g.reserved_discount_6mo, 33.33);
        assert.equal(g.interruptible_rate, 0.22);
        // Offers carry the same prices
        const loc = newLocation();
        const n = await node(loc, { gpu_type: '4090', gpu_count: 2 });
        const o = (await offerOf(n))!;
        assert.deepEqual(
          [o.gpu_price_hourly, o.reserved_discount_6mo, o.total_price_hourly],
          [0.123456, 33.33, 0.256912],
        );
      } finally {
        await setPrices('4090', DEFAULTS['4090']);
      }
    });
  });
});
