/**
 * A page of VMs is read as one JSON object per row on the embedded database and as columns on PostgreSQL
 * (vms/listed-repository.ts), and a page's ids and row versions as one text value on the embedded database and as
 * columns on PostgreSQL. Both shapes must give the same rows: each is run here against the same database, over
 * VMs in every kind of state (timestamps set and null, labels, a destroyed VM), for a page and for one VM.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { describeEachDb } from '../helpers/app.js';
import { createVm, world } from '../helpers/world.js';
import { findVm } from '../../src/modules/vms/repository.js';
import {
  findListedVm,
  LISTED_COLUMNS,
  listVms,
  listVmVersions,
  type VmFilter,
} from '../../src/modules/vms/listed-repository.js';

describeEachDb('VM lists: the JSON rows and the column rows agree', (t) => {
  test('for a user and for the fleet, with every filter and past the last page', async () => {
    const w = await world(t(), { nodes: 1, vm: { instance_label: 'first' } });
    const { api } = w.user;
    const made: string[] = [w.vm.id];
    for (let i = 0; i < 3; i++) made.push((await createVm(api, w.node)).id);
    await t().services.clock.advance(1);
    assert.equal((await api.post('/vms/{vm_id}/stop', { params: { vm_id: made[1]! } })).status, 200);
    assert.equal((await api.delete('/vms/{vm_id}', { params: { vm_id: made[2]! } })).status, 200);
    await t().services.clock.advance(1);
    const other = await w.newUser();

    const db = t().db;
    const as = (kind: 'pglite' | 'postgres') => ({ kind, query: db.query.bind(db) });
    const base = { includeDestroyed: false, limit: 50, offset: 0 } satisfies VmFilter;
    const filters: VmFilter[] = [
      { ...base, userId: w.user.id },
      { ...base, userId: w.user.id, includeDestroyed: true },
      { ...base, userId: w.user.id, status: 'stopped' },
      { ...base, userId: w.user.id, limit: 2, offset: 1 },
      { ...base, userId: w.user.id, offset: 10 },
      { ...base, userId: other.id },
      { ...base },
      { ...base, includeDestroyed: true, node: w.node.node },
      { ...base, status: 'destroyed' },
      { ...base, limit: 1, offset: 20 },
    ];
    let compared = 0;
    let versioned = 0;
    for (const f of filters) {
      const json = await listVms(as('pglite'), f);
      const columns = await listVms(as('postgres'), f);
      assert.deepEqual(json, columns, JSON.stringify(f));
      for (const row of json.rows) {
        assert.ok(row.created_at instanceof Date, 'created_at is a Date');
        for (const k of ['started_at', 'stopped_at', 'destroyed_at'] as const) {
          assert.ok(row[k] === null || row[k] instanceof Date, `${k} is a Date or null`);
        }
      }
      compared += json.rows.length;
      if (f.userId !== undefined) {
        // The page as ids and row versions: one text value on the embedded database, columns on PostgreSQL.
        const uf = { ...f, userId: f.userId };
        const text = await listVmVersions(as('pglite'), uf);
        assert.deepEqual(text, await listVmVersions(as('postgres'), uf), `versions ${JSON.stringify(f)}`);
        assert.deepEqual(
          text.refs.map((r) => r.id),
          columns.rows.map((v) => v.id),
          `the versions' page is the rows' page: ${JSON.stringify(f)}`,
        );
        assert.equal(text.total, columns.total);
        assert.ok(
          text.refs.every((r) => /^\d+$/.test(r.version)),
          'a version is a transaction id',
        );
        versioned += text.refs.length;
      }
    }
    assert.ok(versioned >= 8, `compared ${versioned} versions`);
    // The comparisons saw every kind of value: a destroyed VM, a stopped one, a label, timestamps set.
    const all = (await listVms(as('pglite'), { ...base, userId: w.user.id, includeDestroyed: true })).rows;
    assert.equal(all.length, 4);
    assert.ok(all.some((v) => v.destroyed_at !== null && v.status === 'destroyed'));
    assert.ok(all.some((v) => v.stopped_at !== null && v.status === 'stopped'));
    assert.ok(all.some((v) => v.instance_label === 'first' && v.started_at !== null));
    assert.ok(all.some((v) => v.instance_label === null));
    assert.ok(compared >= 15, `compared ${compared} rows`);

    // One VM by uuid or vmid (GET /vms/{vm_id}): both shapes give the listed columns of the whole row.
    for (const v of all) {
      const full = await findVm(db, { id: v.id }, null);
      assert.ok(full);
      const listed = Object.fromEntries(LISTED_COLUMNS.map((c) => [c, full[c]]));
      for (const ref of [{ id: v.id }, { vmid: v.vmid }]) {
        for (const kind of ['pglite', 'postgres'] as const) {
          assert.deepEqual(await findListedVm(as(kind), ref, w.user.id), listed, `${kind} ${JSON.stringify(ref)}`);
          assert.deepEqual(await findListedVm(as(kind), ref, null), listed, `${kind}, anyone's`);
          assert.equal(await findListedVm(as(kind), ref, other.id), undefined, `${kind}: not another user's`);
        }
      }
    }
  });
});
