import { test } from 'node:test';
import assert from 'node:assert/strict';
import { describeEachDb } from '../helpers/app.js';
import { advance, createNode, createUser, credit, uploadSshKey } from '../helpers/factories.js';

describeEachDb('vm journey', (t) => {
  test('search -> create -> running -> stop -> start -> destroy', async () => {
    const admin = await createUser(t(), { admin: true });
    const u = await createUser(t());
    const node = await createNode(t(), admin.token, { gpu_type: '4090', gpu_count: 8 });
    await credit(t(), admin.token, u.id, 100);
    await uploadSshKey(t(), u.token);
    const search = await t().req('GET', '/search', { query: { gpu_type: '4090' } });
    assert.equal(search.status, 200);
    assert.ok(search.body.some((o: { node: string }) => o.node === node.node));
    const c = await t().req('POST', '/vms', {
      token: u.token,
      body: { node: node.node, gpu_type: '4090', gpu_count: 2, storage_gb: 100, template_vmid: 102 },
    });
    assert.equal(c.status, 201, c.text);
    assert.equal(c.body.status, 'creating');
    assert.ok(c.body.vmid >= 1000);
    await advance(t(), admin.token, 3);
    const g = await t().req('GET', `/vms/${c.body.vmid}`, { token: u.token });
    assert.equal(g.body.status, 'running', g.text);
    assert.ok(g.body.ip_address);
    const ai = await t().req('GET', `/vms/${c.body.id}/access-info`, { token: u.token });
    assert.equal(ai.status, 200, ai.text);
    assert.ok(ai.body.web_ui.launch_token);
    const stop = await t().req('POST', `/vms/${c.body.id}/stop`, { token: u.token });
    assert.equal(stop.status, 200, stop.text);
    await advance(t(), admin.token, 1);
    assert.equal((await t().req('GET', `/vms/${c.body.id}`, { token: u.token })).body.status, 'stopped');
    const start = await t().req('POST', `/vms/${c.body.id}/start`, { token: u.token });
    assert.equal(start.status, 200, start.text);
    await advance(t(), admin.token, 1);
    assert.equal((await t().req('GET', `/vms/${c.body.id}`, { token: u.token })).body.status, 'running');
    const d = await t().req('DELETE', `/vms/${c.body.id}`, { token: u.token });
    assert.equal(d.status, 200, d.text);
    const list = await t().req('GET', '/vms', { token: u.token });
    assert.equal(list.body.length, 0);
  });
});
