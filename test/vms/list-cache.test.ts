/**
 * GET /vms reads its page as ids and row versions and keeps, per process, the records of the rows it has read
 * (vms/record-cache.ts). Whatever it kept, every list must show exactly what the database holds now: each
 * answer here is compared with the page read whole from the database, after changes made through this
 * instance, through another instance on the same database, and by a bare UPDATE that no instance knows of.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { FastifyInstance } from 'fastify';
import { describeEachDb, request, type TestApp } from '../helpers/app.js';
import { api } from '../helpers/api.js';
import { createVm, world } from '../helpers/world.js';
import { listVms, type VmFilter } from '../../src/modules/vms/listed-repository.js';
import { toVmRecord } from '../../src/modules/vms/records.js';
import { VmRecordCache } from '../../src/modules/vms/record-cache.js';
import type { VmRecord } from '../../src/modules/vms/service.js';

describeEachDb('VM lists read through the record cache', (t) => {
  /** The test app with its requests sent to `app`, another instance on the same database. */
  const via = (app: FastifyInstance): TestApp => ({
    ...t(),
    app,
    req: (method, url, opts) => request(app, new Set(), method, url, opts),
  });

  /** The page as the database holds it now, read whole (no cache), as GET /vms would show it. */
  const truth = async (f: VmFilter) => {
    const r = await listVms(t().db, f);
    return { items: JSON.parse(JSON.stringify(r.rows.map(toVmRecord))) as VmRecord[], total: r.total };
  };

  test('every list shows what the database holds, after changes through any instance or none', async () => {
    const w = await world(t(), { nodes: 1, vm: { instance_label: 'first' }, credit: 500 });
    const b = await t().another();
    const onA = w.user.api;
    const onB = api(via(b), w.user.token);
    const made = [w.vm.id];
    for (let i = 0; i < 3; i++) made.push((await createVm(onA, w.node)).id);
    await t().services.clock.advance(1);
    const base = { userId: w.user.id, includeDestroyed: false, limit: 50, offset: 0 } satisfies VmFilter;

    let checks = 0;
    /** Both instances list the page (each twice: once to fill its cache, once from it) and agree with the database. */
    const same = async (why: string, f: VmFilter = base, query: Record<string, string | number | boolean> = {}) => {
      const want = await truth(f);
      for (const [name, client] of [
        ['A', onA],
        ['B', onB],
      ] as const) {
        for (const pass of [1, 2]) {
          const r = await client.get('/vms', { query });
          assert.equal(r.status, 200, r.text);
          assert.deepEqual(r.body, want.items, `${why}: instance ${name}, pass ${pass}`);
          assert.equal(r.headers['x-total-count'], String(want.total), `${why}: total on ${name}`);
          checks++;
        }
      }
      return want;
    };

    const first = await same('four running VMs');
    assert.equal(first.items.length, 4);
    assert.ok(first.items.every((v) => v.status === 'running'));

    /** The list's bytes are each VM's as GET /vms/{vm_id} writes it, in the list's order, as JSON. */
    const sameBytes = async () => {
      const list = await onA.get('/vms', { query: { include_destroyed: true } });
      assert.equal(list.status, 200, list.text);
      assert.equal(list.headers['content-type'], 'application/json; charset=utf-8');
      const one = await Promise.all(list.body.map((v) => onA.get('/vms/{vm_id}', { params: { vm_id: v.id } })));
      assert.equal(list.text, `[${one.map((r) => r.text).join(',')}]`);
    };
    await sameBytes();

    // A stop through B reads as stopped through A on the next request, and the other way round.
    assert.equal((await onB.post('/vms/{vm_id}/stop', { params: { vm_id: made[1]! } })).status, 200);
    await t().services.clock.advance(1);
    const stopped = await same('one stopped through B');
    assert.equal(stopped.items.find((v) => v.id === made[1])!.status, 'stopped');
    assert.equal(
      (await onA.post('/vms/{vm_id}/set-label', { params: { vm_id: made[2]! }, body: { instance_label: 'renamed' } }))
        .status,
      200,
    );
    assert.equal((await same('a label set through A')).items.find((v) => v.id === made[2])!.instance_label, 'renamed');

    // A write no instance made: a bare UPDATE of a listed column, then one that writes the value it had.
    await t().db.query(`UPDATE vms SET cpu_percent = 42 WHERE id = $1`, [made[3]]);
    assert.equal((await same('a bare UPDATE')).items.find((v) => v.id === made[3])!.cpu_percent, 42);
    await t().db.query(`UPDATE vms SET cpu_percent = cpu_percent WHERE id = $1`, [made[3]]);
    await same('an UPDATE that changed nothing');
    await sameBytes();

    // A destroyed VM leaves the default list and stays in the one that includes it; filters and pages agree too.
    assert.equal((await onB.delete('/vms/{vm_id}', { params: { vm_id: made[0]! } })).status, 200);
    await t().services.clock.advance(1);
    assert.equal((await same('one destroyed through B')).items.length, 3);
    await same('with the destroyed', { ...base, includeDestroyed: true }, { include_destroyed: true });
    await same('only stopped', { ...base, status: 'stopped' }, { status: 'stopped' });
    await same('a middle page', { ...base, limit: 2, offset: 1 }, { limit: 2, offset: 1 });
    await same('past the last page', { ...base, offset: 10 }, { offset: 10 });

    // Another user's list never shows these VMs, cached or not.
    const other = await w.newUser();
    const theirs = await other.api.get('/vms');
    assert.equal(theirs.status, 200);
    assert.deepEqual(theirs.body, []);
    assert.equal(theirs.headers['x-total-count'], '0');
    assert.equal(checks, 4 * 10);
  });

  test('a row that changes between the page and the read of its record: the page is read again, as one snapshot', async () => {
    const w = await world(t(), { nodes: 1, vm: true });
    const db = t().db;
    const query = db.query.bind(db);
    let raced = 0;
    // The write lands between the two reads of a list: just before the records of the page's rows are read.
    db.query = (async (sql: string, params?: unknown[]) => {
      if (raced === 0 && sql.includes('id = ANY($1::uuid[])')) {
        raced++;
        await query(`UPDATE vms SET status = 'stopped', instance_label = 'raced' WHERE id = $1`, [w.vm.id]);
      }
      return query(sql, params);
    }) as typeof db.query;
    try {
      // The running VMs: the page held it, but by the time its record was read it had stopped.
      const r = await w.user.api.get('/vms', { query: { status: 'running' } });
      assert.equal(r.status, 200, r.text);
      assert.equal(raced, 1, 'the write landed between the reads');
      assert.deepEqual(r.body, [], 'a stopped VM is not in the list of running ones');
      assert.equal(r.headers['x-total-count'], '0');
    } finally {
      db.query = query;
    }
    const again = await w.user.api.get('/vms');
    assert.equal(again.status, 200, again.text);
    assert.equal(again.body.length, 1);
    assert.equal(again.body[0]!.status, 'stopped');
    assert.equal(again.body[0]!.instance_label, 'raced');
  });
});

test('the record cache gives a record only at its version, and drops the least recently used past its size', () => {
  const cache = new VmRecordCache(2);
  const rec = (id: string) => ({ id }) as VmRecord;
  cache.set('a', '1', rec('a'));
  cache.set('b', '1', rec('b'));
  assert.equal(cache.get('a', '1')?.id, 'a');
  assert.equal(cache.get('a', '2'), undefined, 'another version is not this record');
  assert.equal(cache.get('c', '1'), undefined);
  // 'a' was used last: 'b' goes when 'c' comes.
  cache.set('c', '1', rec('c'));
  assert.equal(cache.size, 2);
  assert.equal(cache.get('b', '1'), undefined);
  assert.equal(cache.get('a', '1')?.id, 'a');
  assert.equal(cache.get('c', '1')?.id, 'c');
  // A new version replaces the old one.
  cache.set('a', '2', rec('a2'));
  assert.equal(cache.get('a', '1'), undefined);
  assert.equal(cache.get('a', '2')?.id, 'a2');
  assert.equal(cache.size, 2);
  assert.ok(Object.isFrozen(cache.get('a', '2')), 'a kept record cannot be changed by a caller');
});
