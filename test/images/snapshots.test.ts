/**
 * Customer images (docs/images.md) on simulated nodes, on both databases: a snapshot of a stopped
 * VM becomes a ready image; GET/DELETE /images; a VM from an image on another node; every refusal
 * (a running VM, bad names, another user's image or VM, the limits, a VM that is being snapshotted);
 * a failed snapshot; and storage billing exact to the micro-unit over several periods with the
 * manual clock, with a clean ledger. A low balance deletes nothing.
 */
import { before, beforeEach, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { describeEachDb, type TestApp } from '../helpers/app.js';
import { api, expectError, type BodyFor, type RequestBody } from '../helpers/api.js';
import {
  advance,
  alignToHour,
  createApiKey,
  createNode,
  createUser,
  credit,
  uploadSshKey,
  type TestUser,
} from '../helpers/factories.js';

type Vm = BodyFor<'/vms', 'post', 201>;
type Image = BodyFor<'/images/{image_id}', 'get', 200>;

/** The price per GB-hour these tests run with, in micro-units (0.000137 per GB-hour): odd, so rounding shows. */
const PRICE_MICROS = 137;
const GIB = 2 ** 30;

/** What the documentation says a period costs: size in GB x price x hours, rounded half-up to the micro-unit. */
function expectedCost(sizeBytes: number, ms: number): number {
  const num = BigInt(sizeBytes) * BigInt(PRICE_MICROS) * BigInt(ms);
  const den = 1_000_000_000n * 3_600_000n;
  return Number((num * 2n + den) / (2n * den));
}

describeEachDb(
  'Customer images: snapshots, images and their billing (simulated nodes)',
  (t) => {
    let admin: TestUser;
    let owner: TestUser;
    let other: TestUser;
    let node: string;
    let node2: string;
    const as = (u: TestUser) => api(t(), u.token);
    const settle = () => advance(t(), admin.token, 1);

    const createVm = async (u: TestUser, over: Partial<RequestBody<'/vms', 'post'>> = {}): Promise<Vm> => {
      const r = await as(u).post('/vms', {
        body: { node, gpu_type: '4090', gpu_count: 1, storage_gb: 73, template_vmid: 101, ...over },
      });
      assert.equal(r.status, 201, r.text);
      return r.body;
    };
    const vmStatus = async (u: TestUser, id: string) => {
      const r = await as(u).get('/vms/{vm_id}', { params: { vm_id: id } });
      assert.equal(r.status, 200, r.text);
      return r.body;
    };
    const stoppedVm = async (u: TestUser, over: Partial<RequestBody<'/vms', 'post'>> = {}) => {
      const vm = await createVm(u, over);
      await settle();
      assert.equal((await as(u).post('/vms/{vm_id}/stop', { params: { vm_id: vm.id } })).status, 200);
      await settle();
      assert.equal((await vmStatus(u, vm.id)).status, 'stopped');
      return vm;
    };
    const snapshot = (u: TestUser, vm: string, name: unknown) =>
      t().req('POST', `/vms/${vm}/snapshots`, { token: u.token, body: { name } as Record<string, unknown> });
    const image = async (u: TestUser, id: string): Promise<Image> => {
      const r = await as(u).get('/images/{image_id}', { params: { image_id: id } });
      assert.equal(r.status, 200, r.text);
      return r.body;
    };
    /** A ready image of a fresh stopped VM of `u`. */
    const readyImage = async (u: TestUser, name = 'img', over: Partial<RequestBody<'/vms', 'post'>> = {}) => {
      const vm = await stoppedVm(u, over);
      const r = await snapshot(u, vm.id, name);
      assert.equal(r.status, 202, r.text);
      await settle();
      const img = await image(u, (r.body as Image).id);
      assert.equal(img.state, 'ready', JSON.stringify(img));
      return { vm, img };
    };
    const balanceOf = async (u: TestUser): Promise<number> => {
      const r = await as(u).get('/billing/balance');
      assert.equal(r.status, 200, r.text);
      return (r.body as { balance: number }).balance;
    };
    const imageCharges = async (u: TestUser, imageId: string) => {
      const r = await as(u).get('/billing/transactions', { query: { limit: 100 } });
      assert.equal(r.status, 200, r.text);
      return r.body.filter((x) => (x.breakdown as { image_id?: string }).image_id === imageId);
    };

    /** API keys instead of session tokens: the clock moves by hours here, past any access token's life. */
    const withKey = async (u: TestUser): Promise<TestUser> => ({
      ...u,
      token: await createApiKey(t(), u.token, 'read_write', 'tests'),
    });

    before(async () => {
      admin = await withKey(await createUser(t(), { admin: true }));
      node = (await createNode(t(), admin.token, { gpu_type: '4090', gpu_count: 16 })).node;
      node2 = (await createNode(t(), admin.token, { gpu_type: '5090', gpu_count: 16 })).node;
    });
    beforeEach(async () => {
      owner = await withKey(await createUser(t()));
      other = await withKey(await createUser(t()));
      for (const u of [owner, other]) {
        await credit(t(), admin.token, u.id, 1000);
        await uploadSshKey(t(), u.token);
      }
    });

    test('a stopped VM becomes a ready image; listed with its size and cost; the VM cannot start meanwhile', async () => {
      const vm = await stoppedVm(owner);
      const r = await snapshot(owner, vm.id, 'trained-model v2');
      assert.equal(r.status, 202, r.text);
      const made = r.body as Image;
      assert.equal(made.state, 'creating');
      assert.equal(made.size_bytes, null);
      assert.equal(made.source_vm_id, vm.id);
      assert.equal(made.source_vmid, vm.vmid);
      assert.equal(made.disk_gb, 73);
      assert.equal(made.template_vmid, 101);
      // While it is copied the VM stays off, and a second snapshot of it waits.
      expectError(await as(owner).post('/vms/{vm_id}/start', { params: { vm_id: vm.id } }), 400, 'invalid_state');
      expectError(await snapshot(owner, vm.id, 'again'), 400, 'invalid_state');
      expectError(
        await as(owner).delete('/images/{image_id}', { params: { image_id: made.id } }),
        400,
        'invalid_state',
      );
      await settle();
      const img = await image(owner, made.id);
      assert.equal(img.state, 'ready');
      assert.equal(img.size_bytes, 73 * GIB);
      assert.equal(img.size_gb, Math.round((73 * GIB) / 1e6) / 1000);
      assert.equal(img.hourly_cost, expectedCost(73 * GIB, 3_600_000) / 1e6);
      assert.ok(img.ready_at);
      const list = await as(owner).get('/images');
      assert.equal(list.status, 200, list.text);
      assert.deepEqual(
        list.body.map((i) => i.id),
        [made.id],
      );
      assert.equal(list.headers['x-total-count'], '1');
      assert.match(String(list.headers['cache-control']), /no-store/);
      // The VM starts again once the copy is done.
      assert.equal((await as(owner).post('/vms/{vm_id}/start', { params: { vm_id: vm.id } })).status, 200);
      const pricing = await api(t()).get('/pricing');
      assert.equal(pricing.status, 200, pricing.text);
      assert.equal(pricing.body.image_storage_gb_hourly, PRICE_MICROS / 1e6);
    });

    test('snapshot of the VM destroyed, a new VM from the image on another node: it starts, and says where it came from', async () => {
      const { vm, img } = await readyImage(owner, 'keep');
      assert.equal((await as(owner).delete('/vms/{vm_id}', { params: { vm_id: vm.id } })).status, 200);
      await settle();
      assert.equal((await image(owner, img.id)).state, 'ready', 'the image outlives its VM');
      const r = await as(owner).post('/vms', {
        body: { node: node2, gpu_type: '5090', gpu_count: 1, storage_gb: 80, image_id: img.id },
      });
      assert.equal(r.status, 201, r.text);
      assert.equal(r.body.image_id, img.id);
      assert.equal(r.body.template_vmid, 101, "the image's template");
      await settle();
      assert.equal((await vmStatus(owner, r.body.id)).status, 'running');
    });

    describe('refusals', () => {
      test('a running VM: 400 invalid_state; a VM never built: 400 invalid_state', async () => {
        const vm = await createVm(owner);
        await settle();
        expectError(await snapshot(owner, vm.id, 'live'), 400, 'invalid_state', /running: stop it first/);
      });

      test('names: too long, control characters, empty, missing or not a string are 422 on body.name', async () => {
        const vm = await stoppedVm(owner);
        for (const name of ['x'.repeat(65), 'bell\u0007', 'new\nline', 'tab\there', '', 42, null]) {
          const r = await snapshot(owner, vm.id, name);
          expectError(r, 422, 'validation_error', undefined, JSON.stringify(name));
          assert.equal((r.body as { errors?: { field: string }[] }).errors?.[0]?.field, 'body.name');
        }
        const none = await t().req('POST', `/vms/${vm.id}/snapshots`, { token: owner.token, body: {} });
        expectError(none, 422, 'validation_error');
        const extra = await t().req('POST', `/vms/${vm.id}/snapshots`, {
          token: owner.token,
          body: { name: 'ok', more: 1 },
        });
        expectError(extra, 422, 'validation_error');
        // 64 characters, with spaces and non-ASCII letters, is fine.
        const ok = await snapshot(owner, vm.id, 'é'.repeat(60) + ' abc');
        assert.equal(ok.status, 202, ok.text);
      });

      test("another user's image and VM: 404 everywhere, nothing changes", async () => {
        const { vm, img } = await readyImage(owner, 'mine');
        expectError(await as(other).get('/images/{image_id}', { params: { image_id: img.id } }), 404, 'not_found');
        expectError(await as(other).delete('/images/{image_id}', { params: { image_id: img.id } }), 404, 'not_found');
        expectError(
          await as(other).post('/vms', {
            body: { node, gpu_type: '4090', gpu_count: 1, storage_gb: 80, image_id: img.id },
          }),
          404,
          'not_found',
        );
        expectError(await snapshot(other, vm.id, 'theirs'), 404, 'not_found');
        const list = await as(other).get('/images');
        assert.deepEqual(list.body, []);
        for (const bad of ['nope', '00000000-0000-4000-8000-000000000000'])
          expectError(await as(owner).get('/images/{image_id}', { params: { image_id: bad } }), 404, 'not_found');
        assert.equal((await image(owner, img.id)).state, 'ready');
      });

      test('POST /vms: image_id with template_vmid, neither, a disk smaller than the image: 422', async () => {
        const { img } = await readyImage(owner, 'sized');
        const body = { node, gpu_type: '4090' as const, gpu_count: 1 as const };
        const both = await as(owner).post('/vms', {
          body: { ...body, storage_gb: 80, image_id: img.id, template_vmid: 101 },
        });
        expectError(both, 422, 'validation_error');
        const neither = await as(owner).post('/vms', { body: { ...body, storage_gb: 80 } });
        expectError(neither, 422, 'validation_error');
        assert.equal((neither.body as { errors?: { field: string }[] }).errors?.[0]?.field, 'body.template_vmid');
        const small = await as(owner).post('/vms', { body: { ...body, storage_gb: 72, image_id: img.id } });
        expectError(small, 422, 'validation_error', /73 GB disk/);
      });

      test('a deleted image: 404, and a VM cannot start from it', async () => {
        const { img } = await readyImage(owner, 'gone');
        const d = await as(owner).delete('/images/{image_id}', { params: { image_id: img.id } });
        assert.equal(d.status, 204, d.text);
        expectError(await as(owner).get('/images/{image_id}', { params: { image_id: img.id } }), 404, 'not_found');
        expectError(await as(owner).delete('/images/{image_id}', { params: { image_id: img.id } }), 404, 'not_found');
        expectError(
          await as(owner).post('/vms', {
            body: { node, gpu_type: '4090', gpu_count: 1, storage_gb: 80, image_id: img.id },
          }),
          404,
          'not_found',
        );
      });

      test('a read-only API key lists images but cannot take or delete one', async () => {
        const { vm, img } = await readyImage(owner, 'ro');
        const key = await createApiKey(t(), owner.token, 'read_only', 'ro');
        assert.equal((await api(t(), key).get('/images')).status, 200);
        assert.equal((await api(t(), key).get('/images/{image_id}', { params: { image_id: img.id } })).status, 200);
        expectError(await snapshot({ ...owner, token: key }, vm.id, 'x'), 403, 'forbidden');
        expectError(
          await api(t(), key).delete('/images/{image_id}', { params: { image_id: img.id } }),
          403,
          'forbidden',
        );
      });
    });

    test('a template cannot be deleted while images were taken of its VMs: they need its user and web ports', async () => {
      const c = await as(admin).post('/admin/templates', {
        body: { template_vmid: 140, name: 'imaged', description: 'x', os: 'Debian 12', default_user: 'debian' },
      });
      assert.equal(c.status, 201, c.text);
      const { vm, img } = await readyImage(owner, 'of-140', { template_vmid: 140 });
      assert.equal(img.template_vmid, 140);
      assert.equal((await as(owner).delete('/vms/{vm_id}', { params: { vm_id: vm.id } })).status, 200);
      await settle();
      const refused = await as(admin).delete('/admin/templates/{template_vmid}', { params: { template_vmid: 140 } });
      expectError(refused, 400, 'conflict', /1 customer image/);
      assert.equal((await as(owner).delete('/images/{image_id}', { params: { image_id: img.id } })).status, 204);
      const d = await as(admin).delete('/admin/templates/{template_vmid}', { params: { template_vmid: 140 } });
      assert.equal(d.status, 204, d.text);
    });

    test('a snapshot that fails: failed with the reason, never billed, not counted; the VM can start', async () => {
      const vm = await stoppedVm(owner);
      const f = await as(admin).post('/admin/simulator/faults', { body: { node, action: 'snapshot', vm_id: vm.id } });
      assert.equal(f.status, 200, f.text);
      const r = await snapshot(owner, vm.id, 'doomed');
      assert.equal(r.status, 202, r.text);
      await settle();
      const img = await image(owner, (r.body as Image).id);
      assert.equal(img.state, 'failed');
      assert.match(img.error ?? '', /simulated snapshot failure/);
      await advance(t(), admin.token, 7200);
      assert.deepEqual(await imageCharges(owner, img.id), []);
      assert.equal((await as(owner).post('/vms/{vm_id}/start', { params: { vm_id: vm.id } })).status, 200);
      // A failed image can be deleted.
      assert.equal((await as(owner).delete('/images/{image_id}', { params: { image_id: img.id } })).status, 204);
    });

    test('storage is billed per GB-hour, exact to the micro-unit, over several periods and up to the delete', async () => {
      const tt: TestApp = t();
      await alignToHour(tt);
      // Ready 20 minutes 7 seconds into an hour: the first period is partial.
      await advance(tt, admin.token, 20 * 60);
      const vm = await stoppedVm(owner);
      const r = await snapshot(owner, vm.id, 'billed');
      assert.equal(r.status, 202, r.text);
      await advance(tt, admin.token, 5);
      const img = await image(owner, (r.body as Image).id);
      assert.equal(img.state, 'ready');
      const readyMs = Date.parse(img.ready_at!);
      const size = img.size_bytes!;
      // The VM goes (its last period is charged now): from here on only the image is billed.
      assert.equal((await as(owner).delete('/vms/{vm_id}', { params: { vm_id: vm.id } })).status, 200);
      await advance(tt, admin.token, 1);
      const balanceBefore = await balanceOf(owner);
      // Three hours and a bit, then the delete in the middle of an hour.
      await advance(tt, admin.token, 3 * 3600 + 1234);
      const deleteMs = tt.clock.nowMs();
      assert.equal((await as(owner).delete('/images/{image_id}', { params: { image_id: img.id } })).status, 204);
      await advance(tt, admin.token, 7200);

      const hour = 3_600_000;
      const ends: number[] = [];
      for (let b = Math.floor(readyMs / hour) * hour + hour; b < deleteMs; b += hour) ends.push(b);
      ends.push(deleteMs);
      let start = readyMs;
      const expected = ends.map((end) => {
        const c = { start, end, cost: expectedCost(size, end - start) };
        start = end;
        return c;
      });
      const charges = (await imageCharges(owner, img.id)).reverse(); // oldest first
      assert.equal(charges.length, expected.length, JSON.stringify(charges));
      for (const [i, c] of charges.entries()) {
        const e = expected[i]!;
        assert.equal(c.type, 'charge');
        assert.equal(Math.round(-c.amount * 1e6), e.cost, `period ${i}`);
        const b = c.breakdown as { period_start: string; period_end: string; size_bytes: number };
        assert.equal(Date.parse(b.period_start), e.start);
        assert.equal(Date.parse(b.period_end), e.end);
        assert.equal(b.size_bytes, size);
      }
      const total = expected.reduce((s, e) => s + e.cost, 0);
      const balanceAfter = await balanceOf(owner);
      assert.equal(Math.round((balanceBefore - balanceAfter) * 1e6), total, 'the balance moved by the charges only');
      // The usage report has the same lines.
      const day = (ms: number) => new Date(ms).toISOString().slice(0, 10);
      const usage = await as(owner).get('/billing/usage', {
        query: { start_date: day(readyMs), end_date: day(tt.clock.nowMs()) },
      });
      assert.equal(usage.status, 200, usage.text);
      const lines = usage.body.image_logs.filter((l) => l.image_id === img.id);
      assert.equal(lines.length, expected.length);
      assert.equal(Math.round(lines.reduce((s, l) => s + l.cost, 0) * 1e6), total);
      const check = await as(admin).get('/admin/ledger-check');
      assert.equal(check.status, 200, check.text);
      assert.equal(check.body.ok, true, check.text);
    });

    test('current spend counts ready images at their storage rate', async () => {
      const { img } = await readyImage(owner, 'spend');
      const r = await as(owner).get('/billing/current-spend');
      assert.equal(r.status, 200, r.text);
      const line = r.body.images.find((i) => i.image_id === img.id);
      assert.ok(line);
      assert.equal(line.cost_per_hour, expectedCost(img.size_bytes!, 3_600_000) / 1e6);
    });

    test('image storage that takes the balance to zero stops running VMs at that very boundary, in one long advance', async () => {
      const poor = await withKey(await createUser(t()));
      await credit(t(), admin.token, poor.id, 3);
      await uploadSshKey(t(), poor.token);
      const { vm: big } = await readyImage(poor, 'large', { storage_gb: 900 });
      assert.equal((await as(poor).delete('/vms/{vm_id}', { params: { vm_id: big.id } })).status, 200);
      const running = await createVm(poor, { storage_gb: 50 });
      await settle();
      assert.equal((await vmStatus(poor, running.id)).status, 'running');
      await advance(t(), admin.token, 12 * 3600);
      const txs = await as(poor).get('/billing/transactions', { query: { limit: 100 } });
      assert.equal(txs.status, 200, txs.text);
      const firstAtZero = [...txs.body].reverse().find((x) => x.balance_after <= 0);
      assert.ok(firstAtZero, 'the balance reached zero');
      const vm = await vmStatus(poor, running.id);
      assert.equal(vm.status, 'stopped');
      assert.equal(vm.stopped_at, firstAtZero.created_at, 'stopped at the boundary whose charges reached zero');
    });

    test('a balance below zero stops VMs but deletes no image', async () => {
      const poor = await withKey(await createUser(t()));
      await credit(t(), admin.token, poor.id, 1);
      await uploadSshKey(t(), poor.token);
      const { img } = await readyImage(poor, 'kept', { storage_gb: 500 });
      // 500 GiB at 0.000137/GB-hour is about 0.0736 an hour, plus the VM's own storage: days take the dollar.
      await advance(t(), admin.token, 24 * 3600);
      await advance(t(), admin.token, 24 * 3600);
      const bal = await balanceOf(poor);
      assert.ok(bal < 0, `balance ${bal}`);
      assert.equal((await image(poor, img.id)).state, 'ready', 'still there');
    });
  },
  { env: { GPUCLOUD_IMAGE_PRICE_GB_HOUR: '0.000137' } },
);

describeEachDb(
  'Customer images: the per-account limits',
  (t) => {
    let admin: TestUser;
    let user: TestUser;
    let node: string;
    const as = (u: TestUser) => api(t(), u.token);
    const settle = () => advance(t(), admin.token, 1);
    const stopped = async (storage_gb: number) => {
      const r = await as(user).post('/vms', {
        body: { node, gpu_type: '4090', gpu_count: 1, storage_gb, template_vmid: 101 },
      });
      assert.equal(r.status, 201, r.text);
      await settle();
      assert.equal((await as(user).post('/vms/{vm_id}/stop', { params: { vm_id: r.body.id } })).status, 200);
      await settle();
      return r.body.id;
    };
    const snap = (vm: string, name: string) =>
      t().req('POST', `/vms/${vm}/snapshots`, { token: user.token, body: { name } });

    before(async () => {
      admin = await createUser(t(), { admin: true });
      user = await createUser(t());
      await credit(t(), admin.token, user.id, 1000);
      await uploadSshKey(t(), user.token);
      node = (await createNode(t(), admin.token, { gpu_type: '4090', gpu_count: 16 })).node;
    });

    test('count and GB: 400 limit_exceeded; a deleted image frees its place', async () => {
      const a = await stopped(100);
      const b = await stopped(100);
      const c = await stopped(80);
      const first = await snap(a, 'one');
      assert.equal(first.status, 202, first.text);
      // An image being made counts at its disk's size: 100 + 100 GB would pass 170.
      expectError(await snap(b, 'two'), 400, 'limit_exceeded', /storage limit/);
      assert.equal((await snap(c, 'two')).status, 400, 'still over the GB limit: 100 + 80 > 170');
      // Ready: it counts at its size now, 100 GiB (107.4 GB), which leaves room for 50 GB.
      await settle();
      const small = await stopped(50);
      const second = await snap(small, 'small');
      assert.equal(second.status, 202, second.text);
      await settle();
      // Two images: the count limit.
      const d = await stopped(50);
      expectError(await snap(d, 'three'), 400, 'limit_exceeded', /at most 2 images/);
      const del = await as(user).delete('/images/{image_id}', { params: { image_id: (second.body as Image).id } });
      assert.equal(del.status, 204, del.text);
      assert.equal((await snap(d, 'three')).status, 202);
    });
  },
  { env: { GPUCLOUD_MAX_IMAGES: '2', GPUCLOUD_MAX_IMAGE_GB: '170' } },
);
