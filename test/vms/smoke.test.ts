import { test } from 'node:test';
import assert from 'node:assert/strict';
import { describeEachDb } from '../helpers/app.js';
import { api } from '../helpers/api.js';
import { advance, createNode, createUser, credit, uploadSshKey } from '../helpers/factories.js';

describeEachDb('vm journey', (t) => {
  test('search -> create -> running -> stop -> start -> destroy', async () => {
    const admin = await createUser(t(), { admin: true });
    const u = await createUser(t());
    const node = await createNode(t(), admin.token, { gpu_type: '4090', gpu_count: 8 });
    await credit(t(), admin.token, u.id, 100);
    await uploadSshKey(t(), u.token);
    const uc = api(t(), u.token);
    const search = await api(t()).get('/search', { query: { gpu_type: '4090' } });
    assert.equal(search.status, 200);
    assert.ok(search.body.some((o) => o.node === node.node));
    const c = await uc.post('/vms', {
      body: { node: node.node, gpu_type: '4090', gpu_count: 2, storage_gb: 100, template_vmid: 102 },
    });
    assert.equal(c.status, 201, c.text);
    assert.equal(c.body.status, 'creating');
    assert.ok(c.body.vmid >= 1000);
    const vm = { params: { vm_id: c.body.id } };
    await advance(t(), admin.token, 3);
    const g = await uc.get('/vms/{vm_id}', { params: { vm_id: String(c.body.vmid) } });
    assert.equal(g.status, 200, g.text);
    assert.equal(g.body.status, 'running', g.text);
    assert.ok(g.body.ip_address);
    const ai = await uc.get('/vms/{vm_id}/access-info', vm);
    assert.equal(ai.status, 200, ai.text);
    assert.ok(ai.body.web_ui?.launch_token);
    const stop = await uc.post('/vms/{vm_id}/stop', vm);
    assert.equal(stop.status, 200, stop.text);
    await advance(t(), admin.token, 1);
    const stopped = await uc.get('/vms/{vm_id}', vm);
    assert.equal(stopped.status, 200, stopped.text);
    assert.equal(stopped.body.status, 'stopped');
    const start = await uc.post('/vms/{vm_id}/start', vm);
    assert.equal(start.status, 200, start.text);
    await advance(t(), admin.token, 1);
    const started = await uc.get('/vms/{vm_id}', vm);
    assert.equal(started.status, 200, started.text);
    assert.equal(started.body.status, 'running');
    const d = await uc.delete('/vms/{vm_id}', vm);
    assert.equal(d.status, 200, d.text);
    const list = await uc.get('/vms');
    assert.equal(list.status, 200, list.text);
    assert.equal(list.body.length, 0);
  });
});
