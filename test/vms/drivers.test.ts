/**
 * Hypervisor drivers by name (docs/architecture.md#hypervisor-drivers): a node is driven by the driver
 * it names, a node that names none keeps the agent-or-simulator rule, and a node that names a driver
 * this version lacks gets its actions failed with the reason, never a crash.
 */
import { before, test } from 'node:test';
import assert from 'node:assert/strict';
import { describeEachDb } from '../helpers/app.js';
import { api, type RequestBody } from '../helpers/api.js';
import { advance, createApiKey, createNode, createUser, credit, type TestUser } from '../helpers/factories.js';
import { SimulatorDriver } from '../../src/hypervisor/simulator.js';

describeEachDb('hypervisor drivers by name', (t) => {
  let admin: TestUser;
  let key: string;
  /** A second simulator, registered as `recording`: it stands for any driver a deployment adds. */
  let recording: SimulatorDriver;

  before(async () => {
    admin = await createUser(t(), { admin: true });
    const user = await createUser(t());
    await credit(t(), admin.token, user.id, 500);
    key = await createApiKey(t(), user.token, 'read_write');
    recording = new SimulatorDriver(t().db, 'recording');
    t().services.driver.register(recording);
  });

  const vmOn = async (node: string, gpuType: '4090' | '5090' = '4090'): Promise<string> => {
    const body: RequestBody<'/vms', 'post'> = {
      node,
      gpu_type: gpuType,
      gpu_count: 1,
      storage_gb: 50,
      template_vmid: 100,
      auth_method: 'password',
      password: 'a-vm-password-1234',
    };
    const r = await api(t(), key).post('/vms', { body });
    assert.equal(r.status, 201, r.text);
    return r.body.id;
  };
  const vm = async (id: string) => {
    const r = await api(t(), admin.token).get('/admin/vms', { query: { limit: 100 } });
    assert.equal(r.status, 200, r.text);
    return r.body.find((v) => v.id === id)!;
  };
  const setDriver = (node: string, driver: string | null) =>
    t().db.query('UPDATE nodes SET driver = $2 WHERE node = $1', [node, driver]);

  test('a node that names a driver is driven by it, one that names none by the simulator', async () => {
    const named = (await createNode(t(), admin.token)).node;
    const plain = (await createNode(t(), admin.token)).node;
    await setDriver(named, 'recording');
    const [a, b] = [await vmOn(named), await vmOn(plain)];
    await advance(t(), admin.token, 10);
    assert.equal((await vm(a)).status, 'running');
    assert.equal((await vm(b)).status, 'running');
    const actions = (calls: SimulatorDriver['calls'], id: string) =>
      calls.filter((c) => c.vmId === id).map((c) => c.action);
    assert.deepEqual(actions(recording.calls, a), ['provision', 'start']);
    assert.deepEqual(actions(t().services.simulator.calls, a), []);
    assert.deepEqual(actions(t().services.simulator.calls, b), ['provision', 'start']);
    assert.deepEqual(actions(recording.calls, b), []);
  });

  test('a node that names a driver this version lacks fails its VM with the reason', async () => {
    const node = (await createNode(t(), admin.token)).node;
    await setDriver(node, 'proxmox');
    const id = await vmOn(node);
    await advance(t(), admin.token, 10);
    const v = await vm(id);
    assert.equal(v.status, 'failed');
    assert.match(
      String(v.last_error),
      new RegExp(`node ${node} names the driver proxmox, which this version does not have`),
    );
  });

  test('a VM moves only to a node of the same driver', async () => {
    const cluster = `c-${Date.now()}`;
    // The only 5090 nodes of this app: home and other.
    const only5090 = { gpu_type: '5090' as const, gpu_count: 1, cluster_name: cluster };
    const home = (await createNode(t(), admin.token, only5090)).node;
    const other = (await createNode(t(), admin.token, only5090)).node;
    await setDriver(other, 'recording');
    const x = await vmOn(home, '5090');
    await advance(t(), admin.token, 10);
    const stop = await api(t(), key).post('/vms/{vm_id}/stop', { params: { vm_id: x } });
    assert.equal(stop.status, 200, stop.text);
    await advance(t(), admin.token, 10);
    assert.equal((await vm(x)).status, 'stopped');
    await vmOn(home, '5090'); // takes home's only GPU
    await advance(t(), admin.token, 10);
    // The body is optional on this route, so the typed client has no field for it.
    const move = () => t().req('POST', `/vms/${x}/start`, { token: key, body: { move: 'if_needed' } });
    const refused = await move();
    assert.equal(refused.status, 400, refused.text);
    assert.equal((refused.body as { code: string }).code, 'gpu_unavailable');
    await setDriver(other, null); // now a simulated node like home
    const moved = await move();
    assert.equal(moved.status, 200, moved.text);
    await advance(t(), admin.token, 10);
    const after = await vm(x);
    assert.equal(after.status, 'running');
    assert.equal(after.node, other);
  });

  test('a driver name is lower-case letters, digits and dashes', async () => {
    const node = (await createNode(t(), admin.token)).node;
    for (const bad of ['', 'Agent', 'x y', '-agent', 'a'.repeat(33)]) {
      await assert.rejects(setDriver(node, bad), /driver_check|check constraint/, JSON.stringify(bad));
    }
  });

  test('a second driver under a name already registered is refused', () => {
    assert.throws(() => t().services.driver.register(new SimulatorDriver(t().db)), /already registered/);
    assert.deepEqual(t().services.driver.names(), ['simulator', 'agent', 'recording']);
  });
});
