/**
 * What the reservation tests share: an administrator with a 4090 node, callers
 * with credit, an SSH key and an API key (which do not expire with service
 * time), the manual clock, and reads of balances, transactions, reservations
 * and VMs through the typed client.
 */
import assert from 'node:assert/strict';
import type { TestApp } from '../helpers/app.js';
import { api, ok, type Api } from '../helpers/api.js';
import { createApiKey, createNode, createUser, credit, uploadSshKey } from '../helpers/factories.js';
import type { VmSpec } from '../helpers/world.js';

export const HOUR_MS = 3_600_000;
/** An amount in the major unit as micro-units. */
export const micros = (x: number) => Math.round(x * 1e6);

export interface Caller {
  id: number;
  key: string;
  /** A typed client sending `key`. */
  api: Api;
}

export interface KitOptions {
  /** The name of the callers' API keys. */
  keyName: string;
  /** The storage of a reserved VM unless told (the tests' sums are worked out for it). */
  storageGb: number;
}

export function reservationKit(t: () => TestApp, o: KitOptions) {
  let adminKey: string | undefined;
  let adminApi: Api | undefined;
  let node: string | undefined;
  const must = <T>(v: T | undefined, what: string): T => {
    assert.ok(v !== undefined, `${what}: call setUp() in before()`);
    return v;
  };

  const kit = {
    /** Makes the administrator and a 4090 x 8 node (call in before()). */
    async setUp(): Promise<void> {
      const adminUser = await createUser(t(), { admin: true });
      adminKey = await createApiKey(t(), adminUser.token, 'read_write', 'admin-tests');
      adminApi = api(t(), adminKey);
      node = (await createNode(t(), adminKey, { gpu_type: '4090', gpu_count: 8 })).node;
    },
    /** The administrator's read_write key and a client sending it. */
    adminKey: () => must(adminKey, 'adminKey'),
    admin: () => must(adminApi, 'admin'),
    /** The 4090 x 8 node. */
    node: () => must(node, 'node'),
    advance: async (seconds: number) => ok(await kit.admin().post('/admin/clock/advance', { body: { seconds } })),
    nowMs: async () => Date.parse(ok(await kit.admin().get('/admin/clock')).now),
    /** Moves the clock to the next top of the hour (billing periods close there). */
    toNextHour: async () => {
      const s = Math.round((HOUR_MS - ((await kit.nowMs()) % HOUR_MS)) / 1000) % 3600;
      if (s > 0) await kit.advance(s);
    },
    /** A user with `amount` of credit (major unit), an SSH key and a read_write API key. */
    newCaller: async (amount: number): Promise<Caller> => {
      const u = await createUser(t());
      if (amount > 0) await credit(t(), kit.adminKey(), u.id, amount);
      await uploadSshKey(t(), u.token);
      const key = await createApiKey(t(), u.token, 'read_write', o.keyName);
      return { id: u.id, key, api: api(t(), key) };
    },
    /** POST /vms of a reserved 4090 x 1 for a month on the node, with `over` changed; the answer as it comes. */
    reserve: (c: Caller, over: VmSpec = {}) =>
      c.api.post('/vms', {
        body: {
          node: kit.node(),
          gpu_type: '4090',
          gpu_count: 1,
          storage_gb: o.storageGb,
          template_vmid: 100,
          rental_type: 'reserved',
          reservation_months: 1,
          ...over,
        },
      }),
    /** A reserved VM that was made (asserting the 201); a reserved VM has its reservation's id. */
    reservedVm: async (c: Caller, over: VmSpec = {}) => {
      const r = await kit.reserve(c, over);
      const v = ok(r, 201);
      const reservationId = v.reservation_id;
      assert.ok(reservationId, `a reserved VM has a reservation: ${r.text}`);
      return { ...v, reservation_id: reservationId };
    },
    balance: async (c: Caller) => micros(ok(await c.api.get('/billing/balance')).balance),
    txs: async (c: Caller) => ok(await c.api.get('/billing/transactions', { query: { limit: 100 } })),
    reservations: async (c: Caller) => ok(await c.api.get('/reservations')),
    /** The caller's reservation `id`, asserting it is listed. */
    reservation: async (c: Caller, id: string) => {
      const r = (await kit.reservations(c)).find((x) => x.id === id);
      assert.ok(r, `reservation ${id} is listed`);
      return r;
    },
    vm: async (c: Caller, id: string) => ok(await c.api.get('/vms/{vm_id}', { params: { vm_id: id } })),
  };
  return kit;
}
