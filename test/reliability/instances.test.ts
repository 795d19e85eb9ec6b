/**
 * Several instances on one PostgreSQL database and one Redis (README
 * "Deployment: PostgreSQL, Redis, several instances", `serve --role api|worker`):
 * two API processes and two worker processes, all
 * `gpucloud serve` child processes on a fresh database, the system clock and
 * a 5 s billing interval, take ~35 s of concurrent traffic spread over both
 * APIs (8 users creating, stopping, starting and destroying on-demand and
 * interruptible VMs; a quarter of the creates sent with one Idempotency-Key
 * to both APIs at once). During the traffic no node may hold more GPUs than
 * it has and open billing periods must keep closing. Afterwards (traffic
 * stopped, every VM destroyed, workers settled, processes stopped) the
 * database must show that
 *  - no billing period was charged twice and none was skipped: per VM the
 *    usage logs tile [first start, destroy] exactly, each charged by exactly
 *    one `charge` transaction; every balance is the sum of its transactions
 *    and `gpucloud admin ledger-check` exits 0;
 *  - login rate limits are one counter across instances (Redis);
 *  - no hypervisor action ran twice (see "Evidence of hypervisor calls").
 *
 * Skipped unless DATABASE_URL and GPUCLOUD_REDIS_URL are both set.
 *
 * Evidence of hypervisor calls. The simulator records its calls only in each
 * process's memory (SimulatorDriver.calls), and a fault-free run leaves no
 * trace of a call in the database: a successful action resets `attempts` and
 * `last_error`, and a duplicate successful call (a second worker running the
 * same claimed action) changes no status because completeAction() finds the
 * action done or its claim gone. The `events` table only records provision
 * failures, power-offs and low balances. The one place where each driver call
 * leaves a durable, countable trace is the shared fault table: every
 * simulated call first runs `UPDATE sim_faults SET remaining = remaining - 1`
 * for an armed fault of its action on its node, in the database. So three
 * nodes get 1000 armed faults each, one action per node, and traffic runs on
 * them too:
 *  - fp-1, provision: every provision fails, the VM ends `failed` with one
 *    `vm.status_changed` event (reason provision_failed); provisions consumed == such events == VMs
 *    failed (or destroyed: the traffic destroys fp-1 VMs only once failed);
 *  - fs-1, stop: every stop fails and is retried with backoff (the VM stays
 *    `stopping`); each failed call adds exactly one to that VM's `attempts`
 *    (only the claim holder records an outcome); stops consumed == sum of attempts;
 *  - fd-1, destroy: likewise for destroy retries of destroyed VMs.
 * The counts are compared in one snapshot taken while no VM of those nodes is
 * claimed (no call in flight). A second claimant running an action that is
 * already claimed would consume a fault without adding an attempt (its
 * outcome is dropped: the claim token is not its own) and break the equality.
 * Fault-free actions cannot be checked this way; a `hv_action_log` table
 * written by the reconciler (vm_id, action, claim_token, started/finished)
 * would make every call observable.
 *
 * Destroy and stop retries back off 5 s, 10 s, 20 s...: once the faults are
 * cleared, the test moves the due time of pending retries to now (only rows no
 * one has claimed) so that settling takes seconds, not minutes.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes, randomUUID } from 'node:crypto';
import {
  cleanEnv,
  createDatabase,
  Http,
  ledgerCheck,
  sleep,
  sshPublicKey,
  startInstance,
  type Answer,
  type FreshDatabase,
  type Instance,
} from './instances-cluster.js';
import { field, numberField, stringField } from '../helpers/json.js';

const skip = !(process.env.DATABASE_URL && process.env.GPUCLOUD_REDIS_URL)
  ? 'needs DATABASE_URL and GPUCLOUD_REDIS_URL'
  : false;

// Longer or heavier runs when hunting races: INSTANCES_TRAFFIC_S=120 INSTANCES_USERS=16.
const TRAFFIC_MS = Number(process.env.INSTANCES_TRAFFIC_S ?? 35) * 1000;
const INTERVAL_S = 5;
const USERS = Number(process.env.INSTANCES_USERS ?? 8);
const FAULTS = 1000;
const ADMIN = { email: `ops-${randomBytes(4).toString('hex')}@example.com`, password: 'a long admin password 123' };

/** Normal nodes (no faults) and the three fault nodes of the hypervisor evidence. */
const NODES = [
  { node: 'n4090-a', gpu_type: '4090', gpu_count: 8 },
  { node: 'n4090-b', gpu_type: '4090', gpu_count: 4 }, // small: on-demand creates preempt interruptible VMs here
  { node: 'n5090-a', gpu_type: '5090', gpu_count: 8 },
  { node: 'fp-1', gpu_type: '4090', gpu_count: 8, fault: 'provision' },
  { node: 'fs-1', gpu_type: '4090', gpu_count: 8, fault: 'stop' },
  { node: 'fd-1', gpu_type: '4090', gpu_count: 8, fault: 'destroy' },
] as const;
type NodeName = (typeof NODES)[number]['node'];
const FAULT_NODES = NODES.filter((n) => 'fault' in n) as {
  node: NodeName;
  gpu_type: string;
  fault: 'provision' | 'stop' | 'destroy';
}[];

/** 400 answers a racing client legitimately gets (the VM changed meanwhile, the node is full...). */
const EXPECTED_400 = new Set(['invalid_state', 'gpu_unavailable', 'limit_exceeded', 'insufficient_balance']);

interface User {
  id: number;
  email: string;
  token: string;
  keyId: string;
}

interface VmView {
  id: string;
  node: NodeName;
  status: string;
  rental_type: string;
}

interface Snapshot {
  inflight: number;
  fp_consumed: number;
  fp_events: number;
  fp_failed: number;
  fs_consumed: number;
  fs_attempts: number;
  fs_stopping: number;
  fd_consumed: number;
  fd_attempts: number;
  fd_destroyed: number;
}

const pick = <T>(xs: readonly T[]): T => xs[Math.floor(Math.random() * xs.length)]!;

describe('several instances on one PostgreSQL and Redis', { skip, timeout: TRAFFIC_MS + 200_000 }, () => {
  let db: FreshDatabase;
  let env: NodeJS.ProcessEnv;
  const instances: Instance[] = [];
  let http: Http;
  let adminToken = '';
  const users: User[] = [];
  /** Outcomes of traffic requests, e.g. "create 201", "stop 400 invalid_state". */
  const outcomes = new Map<string, number>();
  let rateLimit: { ok: true; detail: string } | { ok: false; detail: string } = { ok: false, detail: 'not run' };
  let snapshot: Snapshot | undefined;
  let settled = false;
  const stops: {
    name: string;
    code: number | null;
    signal: string | null;
    killed: boolean;
    early: boolean;
    output: string;
  }[] = [];
  const t0 = Date.now();
  const log = (msg: string) => console.log(`[instances +${((Date.now() - t0) / 1000).toFixed(1)}s] ${msg}`);

  before(async () => {
    db = await createDatabase(process.env.DATABASE_URL!);
    env = cleanEnv({
      DATABASE_URL: db.url,
      GPUCLOUD_REDIS_URL: process.env.GPUCLOUD_REDIS_URL!,
      GPUCLOUD_JWT_SECRET: randomBytes(24).toString('hex'), // 48 characters
      LOG_LEVEL: 'error', // an unexpected 500 is shown with the error it logged
      GPUCLOUD_DEMO: '0',
      GPUCLOUD_ADMIN_EMAIL: ADMIN.email,
      GPUCLOUD_ADMIN_PASSWORD: ADMIN.password,
      GPUCLOUD_SIM_PROVISION_MS: '200',
      GPUCLOUD_BILLING_INTERVAL_S: String(INTERVAL_S),
      GPUCLOUD_RATE_LIMIT_LOGIN: '5',
      // Everything comes from 127.0.0.1, and Redis keys carry no per-database prefix (shared with
      // anything else on this Redis): only the per-email login limit stays low.
      GPUCLOUD_RATE_LIMIT_LOGIN_IP: '100000',
      GPUCLOUD_RATE_LIMIT_LOGIN_GLOBAL: '1000000',
      GPUCLOUD_RATE_LIMIT_AUTH: '100000',
      GPUCLOUD_RATE_LIMIT_VM_MUTATIONS: '100000',
      GPUCLOUD_RATE_LIMIT_DEFAULT: '100000',
      PORT: '0',
    });
    // All four at once: migrations and the admin bootstrap race on the same database.
    const started = await Promise.allSettled([
      startInstance('api-1', 'api', env),
      startInstance('api-2', 'api', env),
      startInstance('worker-1', 'worker', env),
      startInstance('worker-2', 'worker', env),
    ]);
    for (const s of started) if (s.status === 'fulfilled') instances.push(s.value); // after() stops them
    const failed = started.find((s): s is PromiseRejectedResult => s.status === 'rejected');
    if (failed) throw failed.reason;
    http = new Http(instances.filter((i) => i.role === 'api'));
    log(`started ${instances.map((i) => i.url ?? i.name).join(', ')} on ${db.name}`);

    // The request shapes come from the running instance's OpenAPI document.
    const doc = (await http.must([200], 'GET', '/openapi.json')).body as {
      paths: Record<string, Record<string, unknown>>;
    };
    for (const [path, method] of [
      ['/auth/register', 'post'],
      ['/auth/login', 'post'],
      ['/admin/users/{user_id}/credits', 'post'],
      ['/ssh-keys', 'post'],
      ['/admin/nodes', 'post'],
      ['/vms', 'post'],
      ['/vms/{vm_id}/stop', 'post'],
      ['/vms/{vm_id}/start', 'post'],
      ['/vms/{vm_id}', 'delete'],
      ['/admin/simulator/faults', 'post'],
    ] as const) {
      assert.ok(doc.paths[path]?.[method], `OpenAPI has ${method.toUpperCase()} ${path}`);
    }

    adminToken = stringField((await http.must([200], 'POST', '/auth/login', { body: ADMIN })).body, 'access_token');
    for (const n of NODES) {
      await http.must([201], 'POST', '/admin/nodes', {
        token: adminToken,
        body: {
          node: n.node,
          gpu_type: n.gpu_type,
          gpu_count: n.gpu_count,
          ram_gb: 512,
          cpu_cores: 64,
          cpu_model: 'AMD EPYC 9554',
          pcie_gen: '4.0',
          max_storage_gb: 4000,
          location: 'eu-central',
          cluster_name: 'fra-1',
        },
      });
    }
    for (const n of FAULT_NODES) {
      await http.must([200], 'POST', '/admin/simulator/faults', {
        token: adminToken,
        body: { node: n.node, action: n.fault, count: FAULTS },
      });
    }
    await Promise.all(
      Array.from({ length: USERS }, async (_, i) => {
        const email = `inst-${i}-${randomBytes(4).toString('hex')}@example.com`;
        const password = `password-of-user-${i}`;
        const reg = await http.must([201], 'POST', '/auth/register', { body: { email, password, name: `User ${i}` } });
        const token = stringField(
          (await http.must([200], 'POST', '/auth/login', { body: { email, password } })).body,
          'access_token',
        );
        const id = numberField(reg.body, 'id');
        await http.must([201], 'POST', `/admin/users/${id}/credits`, {
          token: adminToken,
          body: { amount: 5000, description: 'test credit' },
        });
        const key = await http.must([201], 'POST', '/ssh-keys', {
          token,
          body: { ssh_public_key: sshPublicKey(`user${i}@test`), label: 'k' },
        });
        users.push({ id, email, token, keyId: stringField(key.body, 'id') });
      }),
    );
    log(`setup done: ${NODES.length} nodes, ${users.length} users`);

    // ---- concurrent traffic, with the shared-login-limit phase alongside ----
    const rl = loginLimitPhase();
    const deadline = Date.now() + TRAFFIC_MS;
    const sampling = sampler(deadline);
    await Promise.all(users.map((u) => actor(u, deadline)));
    rateLimit = await rl;
    await sampling;
    log(
      `traffic done: ${[...outcomes]
        .sort()
        .map(([k, v]) => `${k}: ${v}`)
        .join(', ')}`,
    );

    // ---- hypervisor evidence, then faults off ----
    snapshot = await quiescentSnapshot();
    log(`hypervisor evidence: ${JSON.stringify(snapshot)}`);
    for (const n of FAULT_NODES) {
      await http.must([200], 'POST', '/admin/simulator/faults', {
        token: adminToken,
        body: { node: n.node, action: n.fault, count: 0 },
      });
    }

    // ---- destroy every VM, wait until the workers settled ----
    const owner = new Map(users.map((u) => [u.id, u]));
    const settleBy = Date.now() + 45_000;
    while (Date.now() < settleBy) {
      await nudgeRetries();
      const left = (
        await db.pool.query<{ id: string; user_id: number; status: string }>(
          `SELECT id, user_id::int AS user_id, status FROM vms WHERE status <> 'destroyed'`,
        )
      ).rows;
      await Promise.all(left.map((v) => act('final-destroy', 'DELETE', `/vms/${v.id}`, owner.get(v.user_id)!.token)));
      const busy = await db.pool.query<{ n: number }>(
        `SELECT count(*)::int AS n FROM vms WHERE status <> 'destroyed' OR hv_action IS NOT NULL OR claim_token IS NOT NULL`,
      );
      if (busy.rows[0]!.n === 0) {
        settled = true;
        break;
      }
      await sleep(500);
    }
    // One more reconciler pass on each worker (billing intervals of nothing, auto-restarts of nothing).
    await sleep(1500);
    log(`settled: ${settled}`);

    // ---- stop every process ----
    for (const i of instances) {
      const early = i.exited !== undefined && !i.exited.expected;
      const r = await i.stop();
      stops.push({ name: i.name, ...r, early, output: i.output() });
    }
    log(`stopped: ${stops.map((s) => `${s.name}=${s.code ?? s.signal}${s.killed ? ' (killed)' : ''}`).join(', ')}`);
  });

  after(async () => {
    for (const i of instances) if (!i.exited) await i.stop(5_000);
    await db?.drop();
    log('database dropped');
  });

  // ---- traffic ----

  /** One request of the traffic; 2xx and the racing client's 400s are fine, anything else is recorded. */
  async function act(
    kind: string,
    method: string,
    path: string,
    token: string,
    body?: unknown,
    opts: { on?: number; headers?: Record<string, string> } = {},
  ): Promise<Answer> {
    const a = await http.call(method, path, { token, body, ...opts });
    if (kind.startsWith('create') && a.status === 201) createdIds.add(stringField(a.body, 'id'));
    const code = a.status === 400 ? ` ${String(field(a.body, 'code'))}` : '';
    outcomes.set(`${kind} ${a.status}${code}`, (outcomes.get(`${kind} ${a.status}${code}`) ?? 0) + 1);
    if (
      a.status !== 0 &&
      !(a.status >= 200 && a.status < 300) &&
      !(a.status === 400 && EXPECTED_400.has(String(field(a.body, 'code'))))
    ) {
      http.problems.push(
        `${a.instance} ${kind} ${method} ${path}: ${a.status} ${JSON.stringify(a.body).slice(0, 300)}`,
      );
    }
    return a;
  }

  let fsCreated = 0;
  /** Every VM id a create answered with (a replay names the same VM again). */
  const createdIds = new Set<string>();
  let idempotentPairs = 0;

  /**
   * A user's random walk: create, stop, start, destroy its VMs (on_demand and interruptible) on
   * every node, through either API. On the fault nodes it keeps to what the evidence allows: on
   * fp-1 a VM is destroyed only once it failed, on fs-1 VMs are only stopped (the stop never
   * succeeds), and only on-demand VMs go there (no preemption).
   */
  async function actor(u: User, deadline: number): Promise<void> {
    while (Date.now() < deadline) {
      const list = await act('list', 'GET', '/vms?limit=100', u.token);
      // A 200 from GET /vms: its shape is the API's (checked by the typed tests).
      const vms = (Array.isArray(list.body) ? list.body : []) as VmView[];
      if (vms.length < 5 && Math.random() < 0.45) {
        const r = Math.random();
        let node: NodeName =
          r < 0.07
            ? 'fp-1'
            : r < 0.14
              ? 'fs-1'
              : r < 0.3
                ? 'fd-1'
                : pick(['n4090-a', 'n4090-b', 'n4090-b', 'n5090-a'] as const);
        if (node === 'fs-1' && fsCreated >= 6) node = 'n4090-a';
        if (node === 'fs-1') fsCreated++;
        const spec = NODES.find((n) => n.node === node)!;
        const faulty = 'fault' in spec;
        const rental = !faulty && Math.random() < 0.45 ? 'interruptible' : 'on_demand';
        const body = {
          node,
          gpu_type: spec.gpu_type,
          gpu_count: pick([1, 1, 2]),
          storage_gb: pick([50, 100, 200]),
          template_vmid: 101,
          rental_type: rental,
          ssh_key_id: u.keyId,
        };
        if (Math.random() < 0.25) {
          // The same create with one Idempotency-Key on both APIs at once: one VM, one answer replayed.
          idempotentPairs++;
          const headers = { 'idempotency-key': randomUUID() };
          const [a, b] = await Promise.all([
            act('create', 'POST', '/vms', u.token, body, { on: 0, headers }),
            act('create-dup', 'POST', '/vms', u.token, body, { on: 1, headers }),
          ]);
          const replayed = [a, b].filter((x) => x.headers.get('idempotent-replayed') === 'true').length;
          const same = (k: string) => field(a.body, k) === field(b.body, k);
          if (a.status !== b.status || !same('id') || !same('code') || replayed !== 1) {
            http.problems.push(
              `idempotent create on both APIs: ${a.instance} ${a.status} ${JSON.stringify(a.body).slice(0, 200)} / ${b.instance} ${b.status} ${JSON.stringify(b.body).slice(0, 200)} (${replayed} replayed)`,
            );
          }
        } else {
          await act('create', 'POST', '/vms', u.token, body);
        }
      } else if (vms.length > 0) {
        const vm = pick(vms);
        const r = Math.random();
        const path = `/vms/${vm.id}`;
        if (vm.node === 'fp-1') {
          if (vm.status === 'failed') await act('destroy', 'DELETE', path, u.token);
        } else if (vm.node === 'fs-1') {
          if (vm.status === 'running') await act('stop', 'POST', `${path}/stop`, u.token);
        } else if (vm.status === 'running') {
          if (r < 0.45) await act('stop', 'POST', `${path}/stop`, u.token);
          else if (r < 0.65) await act('destroy', 'DELETE', path, u.token);
        } else if (vm.status === 'stopped' || vm.status === 'interrupted') {
          if (r < 0.55) await act('start', 'POST', `${path}/start`, u.token);
          else if (r < 0.8) await act('destroy', 'DELETE', path, u.token);
        } else if (vm.status === 'failed') {
          await act('destroy', 'DELETE', path, u.token);
        } else if (vm.status === 'creating' || vm.status === 'starting') {
          if (r < 0.1) await act('destroy', 'DELETE', path, u.token);
        }
      }
      await sleep(80 + Math.random() * 220);
    }
  }

  /**
   * Shared login limit: 5 wrong passwords for one email, alternating instances, then a 6th
   * attempt on either instance is 429. Windows are 60 s on real time: with less than 15 s
   * left in this one, wait for the next.
   */
  async function loginLimitPhase(): Promise<typeof rateLimit> {
    const email = `rl-${randomBytes(4).toString('hex')}@example.com`;
    const password = 'the-right-password-1';
    const reg = await http.call('POST', '/auth/register', { body: { email, password } });
    if (reg.status !== 201) return { ok: false, detail: `register: ${reg.status} ${JSON.stringify(reg.body)}` };
    const left = 60_000 - (Date.now() % 60_000);
    if (left < 15_000) await sleep(left + 250);
    const seen: string[] = [];
    for (let i = 1; i <= 5; i++) {
      const a = await http.call('POST', '/auth/login', { body: { email, password: 'a-wrong-password' }, on: i % 2 });
      seen.push(`#${i} ${a.instance}: ${a.status} remaining=${a.headers.get('x-ratelimit-remaining')}`);
      if (a.status !== 401 || a.headers.get('x-ratelimit-remaining') !== String(5 - i)) {
        return {
          ok: false,
          detail: `attempt ${i} should be 401 with X-RateLimit-Remaining ${5 - i}: ${seen.join('; ')} ${JSON.stringify(a.body)}`,
        };
      }
    }
    for (const [n, on, pw] of [
      [6, 1, 'a-wrong-password'],
      [7, 0, password],
    ] as const) {
      const a = await http.call('POST', '/auth/login', { body: { email, password: pw }, on });
      seen.push(`#${n} ${a.instance}: ${a.status} ${String(field(a.body, 'code'))}`);
      if (a.status !== 429 || field(a.body, 'code') !== 'rate_limited' || !a.headers.get('retry-after')) {
        return {
          ok: false,
          detail: `attempt ${n} (${pw === password ? 'right' : 'wrong'} password) on ${a.instance} should be 429 rate_limited with Retry-After: ${seen.join('; ')} ${JSON.stringify(a.body)}`,
        };
      }
    }
    return { ok: true, detail: seen.join('; ') };
  }

  /**
   * What must hold at every moment, sampled during the traffic: no node gives out more GPUs than it has; metering
   * keeps up.
   */
  const overcommits: string[] = [];
  let maxBillingLagMs = 0;
  async function sampler(deadline: number): Promise<void> {
    while (Date.now() < deadline) {
      const over = await db.pool.query<{ node: string; held: number; gpu_count: number }>(
        `SELECT v.node, sum(v.gpu_count)::int AS held, n.gpu_count FROM vms v JOIN nodes n ON n.node = v.node
          WHERE v.holds_gpus GROUP BY v.node, n.gpu_count HAVING sum(v.gpu_count) > n.gpu_count`,
      );
      for (const o of over.rows)
        overcommits.push(`${new Date().toISOString()} ${o.node}: ${o.held} GPUs held of ${o.gpu_count}`);
      const lag = await db.pool.query<{ ms: number | null }>(
        `SELECT (extract(epoch FROM now() - min(billed_until)) * 1000)::int8 AS ms FROM vm_meters`,
      );
      maxBillingLagMs = Math.max(maxBillingLagMs, Number(lag.rows[0]?.ms ?? 0));
      await sleep(500);
    }
  }

  // ---- hypervisor evidence ----

  async function quiescentSnapshot(): Promise<Snapshot> {
    // One statement: one consistent view of the fault counters and the VMs' attempts.
    const sql = `
      SELECT
        (SELECT count(*) FROM vms WHERE node IN ('fp-1', 'fs-1', 'fd-1') AND claim_token IS NOT NULL)::int AS inflight,
        (SELECT ${FAULTS} - remaining FROM sim_faults WHERE target = 'fp-1' AND action = 'provision')::int AS fp_consumed,
        (SELECT count(*) FROM events e JOIN vms v ON v.id = e.vm_id WHERE v.node = 'fp-1' AND e.type = 'vm.status_changed' AND e.data->>'reason' = 'provision_failed')::int AS fp_events,
        (SELECT count(*) FROM vms WHERE node = 'fp-1' AND status IN ('failed', 'destroyed'))::int AS fp_failed,
        (SELECT ${FAULTS} - remaining FROM sim_faults WHERE target = 'fs-1' AND action = 'stop')::int AS fs_consumed,
        (SELECT COALESCE(sum(attempts), 0) FROM vms WHERE node = 'fs-1' AND status = 'stopping')::int AS fs_attempts,
        (SELECT count(*) FROM vms WHERE node = 'fs-1' AND status = 'stopping')::int AS fs_stopping,
        (SELECT ${FAULTS} - remaining FROM sim_faults WHERE target = 'fd-1' AND action = 'destroy')::int AS fd_consumed,
        (SELECT COALESCE(sum(attempts), 0) FROM vms WHERE node = 'fd-1' AND status = 'destroyed')::int AS fd_attempts,
        (SELECT count(*) FROM vms WHERE node = 'fd-1' AND status = 'destroyed')::int AS fd_destroyed`;
    for (let i = 0; i < 100; i++) {
      const s = (await db.pool.query<Snapshot>(sql)).rows[0]!;
      if (s.inflight === 0) return s;
      await sleep(50);
    }
    throw new Error('VMs on the fault nodes stayed claimed for 5 s: no quiescent moment for the hypervisor evidence');
  }

  /** Pending stop/destroy retries back off up to minutes: make them due now (unclaimed rows only). */
  async function nudgeRetries(): Promise<void> {
    await db.pool.query(
      `UPDATE vms SET next_action_at = now() WHERE hv_action IS NOT NULL AND claim_token IS NULL AND next_action_at > now()`,
    );
  }

  // ---- the checks ----

  test('the traffic ran through both APIs with no unexpected answer, and every process lived and stopped cleanly', () => {
    const total = [...outcomes.values()].reduce((a, b) => a + b, 0);
    log(`requests per API: ${JSON.stringify(Object.fromEntries(http.sent))}, traffic requests ${total}`);
    for (const api of http.apis) assert.ok((http.sent.get(api.name) ?? 0) > 100, `${api.name} served traffic`);
    assert.ok((outcomes.get('create 201') ?? 0) >= 30, `VMs were created: ${JSON.stringify([...outcomes])}`);
    assert.ok(
      (outcomes.get('stop 200') ?? 0) >= 10 && (outcomes.get('start 200') ?? 0) >= 5,
      `VMs were stopped and started: ${JSON.stringify([...outcomes])}`,
    );
    const ids = http.problems.flatMap((p) => /request id ([0-9a-f-]{36})/.exec(p)?.[1] ?? []);
    const logged = stops.flatMap((s) =>
      s.output
        .split('\n')
        .filter((l) => ids.some((id) => l.includes(id)))
        .map((l) => `${s.name}: ${l}`),
    );
    assert.deepEqual(
      http.problems.slice(0, 30),
      [],
      `${http.problems.length} unexpected answer(s)\n${logged.join('\n').slice(0, 6000)}`,
    );
    assert.ok(idempotentPairs >= 10, `idempotent creates were raced: ${idempotentPairs}`);
    assert.ok(settled, 'every VM destroyed with no hypervisor action pending within 45 s');
    for (const s of stops) {
      assert.ok(!s.early, `${s.name} exited by itself during the test:\n${s.output.slice(-3000)}`);
      assert.ok(
        !s.killed && s.code === 0,
        `${s.name} stops on SIGTERM with 0, got ${s.code ?? s.signal}${s.killed ? ' (had to be killed)' : ''}:\n${s.output.slice(-3000)}`,
      );
    }
  });

  test('no node ever held more GPUs than it has, and the workers kept billing periods closing', () => {
    log(`largest billing lag seen: ${maxBillingLagMs} ms`);
    assert.deepEqual(overcommits.slice(0, 20), [], `${overcommits.length} overcommitted sample(s)`);
    // A period closes at every ${INTERVAL_S} s boundary; the workers run every second. Generous for busy machines.
    assert.ok(
      maxBillingLagMs < 4 * INTERVAL_S * 1000,
      `an open period was at most ${4 * INTERVAL_S} s old, saw ${maxBillingLagMs} ms`,
    );
  });

  test('login attempts for one email are one counter across both instances (Redis)', () => {
    assert.ok(rateLimit.ok, rateLimit.detail);
  });

  test("usage logs tile every VM's billed time exactly: no overlap, no gap, first start to destroy", async () => {
    const vms = (
      await db.pool.query<{
        id: string;
        vmid: number;
        status: string;
        first_started_at: Date | null;
        destroyed_at: Date | null;
        metered: boolean;
      }>(
        'SELECT id, vmid, status, first_started_at, destroyed_at, EXISTS (SELECT 1 FROM vm_meters m WHERE m.vm_id = vms.id) AS metered FROM vms ORDER BY seq',
      )
    ).rows;
    const logs = (
      await db.pool.query<{ vm_id: string; period_start: Date; period_end: Date; gpu_ms: string; storage_ms: string }>(
        'SELECT vm_id, period_start, period_end, gpu_ms, storage_ms FROM usage_logs ORDER BY vm_id, period_start, period_end',
      )
    ).rows;
    const byVm = new Map<string, typeof logs>();
    for (const l of logs) byVm.set(l.vm_id, [...(byVm.get(l.vm_id) ?? []), l]);
    const problems: string[] = [];
    const iso = (d: Date | null) => d?.toISOString() ?? 'null';
    const intervalMs = INTERVAL_S * 1000;
    let ran = 0;
    for (const vm of vms) {
      const mine = byVm.get(vm.id) ?? [];
      const name = `VM ${vm.vmid}`;
      if (vm.status !== 'destroyed') problems.push(`${name} is ${vm.status}, not destroyed`);
      if (!vm.first_started_at) {
        if (mine.length) problems.push(`${name} never ran but has ${mine.length} usage log(s)`);
        continue;
      }
      ran++;
      if (!mine.length) {
        problems.push(`${name} ran (first start ${iso(vm.first_started_at)}) but has no usage log`);
        continue;
      }
      if (mine[0]!.period_start.getTime() !== vm.first_started_at.getTime()) {
        problems.push(
          `${name}: first period starts ${iso(mine[0]!.period_start)}, first start was ${iso(vm.first_started_at)}`,
        );
      }
      const last = mine[mine.length - 1]!;
      if (last.period_end.getTime() !== vm.destroyed_at?.getTime()) {
        problems.push(`${name}: last period ends ${iso(last.period_end)}, destroyed at ${iso(vm.destroyed_at)}`);
      }
      if (vm.metered) problems.push(`${name}: destroyed, but its meter is still open`);
      for (let i = 0; i < mine.length; i++) {
        const l = mine[i]!;
        const s = l.period_start.getTime();
        const e = l.period_end.getTime();
        if (e <= s) problems.push(`${name}: empty or negative period ${iso(l.period_start)}..${iso(l.period_end)}`);
        if (Math.floor(s / intervalMs) !== Math.floor((e - 1) / intervalMs)) {
          problems.push(
            `${name}: period ${iso(l.period_start)}..${iso(l.period_end)} crosses a ${INTERVAL_S} s billing boundary`,
          );
        }
        if (Number(l.storage_ms) !== e - s || (Number(l.gpu_ms) !== 0 && Number(l.gpu_ms) !== e - s)) {
          problems.push(
            `${name}: period ${iso(l.period_start)}..${iso(l.period_end)} has gpu_ms ${l.gpu_ms}, storage_ms ${l.storage_ms}`,
          );
        }
        if (i > 0) {
          const prevEnd = mine[i - 1]!.period_end.getTime();
          if (s < prevEnd)
            problems.push(
              `${name}: period ${iso(l.period_start)}..${iso(l.period_end)} overlaps the one ending ${iso(mine[i - 1]!.period_end)}`,
            );
          if (s > prevEnd) problems.push(`${name}: gap from ${iso(mine[i - 1]!.period_end)} to ${iso(l.period_start)}`);
        }
      }
    }
    const orphans = await db.pool.query(`SELECT count(*)::int AS n FROM interruptions WHERE status = 'interrupted'`);
    if (orphans.rows[0].n)
      problems.push(`${orphans.rows[0].n} interruption(s) still open after every VM was destroyed`);
    const mismatched = await db.pool.query(
      `SELECT l.id, v.vmid FROM usage_logs l JOIN vms v ON v.id = l.vm_id
        WHERE l.user_id <> v.user_id OR l.gpu_count <> v.gpu_count OR l.storage_gb <> v.storage_gb`,
    );
    for (const m of mismatched.rows)
      problems.push(`VM ${m.vmid}: usage log ${m.id} names another user, GPU count or disk size`);
    const interruptions = await db.pool.query(
      `SELECT status, count(*)::int AS n FROM interruptions GROUP BY status ORDER BY status`,
    );
    if (vms.length !== createdIds.size)
      problems.push(`${vms.length} VMs in the database but creates answered with ${createdIds.size} distinct VMs`);
    log(
      `usage: ${vms.length} VMs, ${ran} ran, ${logs.length} usage logs; interruptions ${JSON.stringify(interruptions.rows)}`,
    );
    assert.ok(ran >= 20 && logs.length >= 100, `enough billing happened: ${ran} VMs ran, ${logs.length} periods`);
    assert.deepEqual(problems.slice(0, 30), [], `${problems.length} problem(s)`);
  });

  test('each period is charged exactly once, every balance is the sum of its transactions, ledger-check exits 0', async () => {
    const problems: string[] = [];
    // Every usage charge belongs to exactly one usage log, for its exact cost.
    const charges = await db.pool.query(
      `SELECT t.id, t.vm_id, t.amount_micros::int8 AS amount, t.description, count(l.id)::int AS logs,
              COALESCE(sum(l.total_cost_micros - l.from_reservation_micros), 0)::int8 AS cost
         FROM transactions t LEFT JOIN usage_logs l ON l.transaction_id = t.id
        WHERE t.type = 'charge' AND t.description NOT LIKE 'Minimum charge%'
        GROUP BY t.id
       HAVING count(l.id) <> 1 OR -t.amount_micros <> COALESCE(sum(l.total_cost_micros - l.from_reservation_micros), 0)`,
    );
    for (const c of charges.rows)
      problems.push(
        `charge ${c.id} (${c.description}, ${c.amount}) is referenced by ${c.logs} usage log(s) costing ${c.cost}`,
      );
    // No (VM, period) charged twice, whatever the usage logs say.
    const twice = await db.pool.query(
      `SELECT vm_id, breakdown->>'period_start' AS ps, breakdown->>'period_end' AS pe, count(*)::int AS n
         FROM transactions WHERE type = 'charge' AND breakdown ? 'period_end'
        GROUP BY 1, 2, 3 HAVING count(*) > 1`,
    );
    for (const r of twice.rows) problems.push(`VM ${r.vm_id}: period ${r.ps}..${r.pe} charged ${r.n} times`);
    const minimums = await db.pool.query(
      `SELECT vm_id, count(*)::int AS n FROM transactions WHERE description LIKE 'Minimum charge%' GROUP BY vm_id HAVING count(*) > 1`,
    );
    for (const r of minimums.rows) problems.push(`VM ${r.vm_id}: ${r.n} minimum charges`);
    // A VM that interrupted others pays at least one period of itself, topped up once at its destroy.
    const preemptors = await db.pool.query<{
      vmid: number;
      g: string;
      s: string;
      usage: string;
      minc: string;
      preempted: boolean;
    }>(
      `SELECT v.vmid, v.gpu_hourly_rate_micros AS g, v.storage_hourly_rate_micros AS s,
              (SELECT COALESCE(sum(total_cost_micros), 0) FROM usage_logs WHERE vm_id = v.id) AS usage,
              (SELECT COALESCE(-sum(amount_micros), 0) FROM transactions WHERE vm_id = v.id AND description LIKE 'Minimum charge%') AS minc,
              EXISTS (SELECT 1 FROM interruptions WHERE preempted_by_vm_id = v.id) AS preempted
         FROM vms v`,
    );
    const halfUp = (a: bigint, b: bigint, c: bigint) => (a * b * 2n + c) / (2n * c);
    for (const v of preemptors.rows) {
      const ms = BigInt(INTERVAL_S * 1000);
      const minimum = halfUp(BigInt(v.g), ms, 3_600_000n) + halfUp(BigInt(v.s), ms, 3_600_000n);
      const owed = v.preempted && minimum > BigInt(v.usage) ? minimum - BigInt(v.usage) : 0n;
      if (BigInt(v.minc) !== owed)
        problems.push(
          `VM ${v.vmid}: minimum charge ${v.minc}, expected ${owed} (preempted others: ${v.preempted}, usage ${v.usage}, minimum ${minimum})`,
        );
    }
    const unpaid = await db.pool.query(
      `SELECT id, vm_id, total_cost_micros FROM usage_logs WHERE total_cost_micros > from_reservation_micros AND transaction_id IS NULL`,
    );
    for (const r of unpaid.rows)
      problems.push(`usage log ${r.id} of VM ${r.vm_id} costs ${r.total_cost_micros} but has no charge`);
    const balances = await db.pool.query(
      `SELECT u.id, u.email, b.balance_micros::int8 AS balance, COALESCE(sum(t.amount_micros), 0)::int8 AS sum
         FROM users u JOIN balances b ON b.user_id = u.id LEFT JOIN transactions t ON t.user_id = u.id
        GROUP BY u.id, b.balance_micros
       HAVING b.balance_micros <> COALESCE(sum(t.amount_micros), 0)`,
    );
    for (const b of balances.rows)
      problems.push(`user ${b.id} <${b.email}>: balance ${b.balance} but transactions sum to ${b.sum}`);
    const spent = await db.pool.query(
      `SELECT count(*)::int AS n, COALESCE(-sum(amount_micros), 0)::int8 AS micros,
              count(*) FILTER (WHERE description LIKE 'Minimum charge%')::int AS minimums
         FROM transactions WHERE type = 'charge'`,
    );
    log(
      `charges: ${spent.rows[0].n} charge transactions (${spent.rows[0].minimums} minimum charges), ${spent.rows[0].micros} micros`,
    );
    assert.ok(spent.rows[0].n >= 100, 'enough charges happened');
    assert.deepEqual(problems.slice(0, 30), [], `${problems.length} problem(s)`);

    const r = ledgerCheck(env);
    assert.equal(r.status, 0, `ledger-check exits 0:\n${r.stdout}\n${r.stderr}`);
    assert.match(r.stdout, /Ledger OK/);
  });

  test('no hypervisor action ran twice: each failing call on the fault nodes counted once, by its claim holder', () => {
    assert.ok(snapshot, 'the evidence snapshot was taken');
    const s = snapshot;
    // Traffic reached each fault node.
    assert.ok(s.fp_consumed >= 3, `provisions were attempted on fp-1: ${JSON.stringify(s)}`);
    assert.ok(s.fs_stopping >= 2, `VMs are stuck stopping on fs-1: ${JSON.stringify(s)}`);
    assert.ok(s.fd_destroyed >= 3, `VMs were destroyed on fd-1: ${JSON.stringify(s)}`);
    assert.ok(
      s.fp_consumed < FAULTS && s.fs_consumed < FAULTS && s.fd_consumed < FAULTS,
      'the armed faults never ran out',
    );
    assert.equal(
      s.fp_consumed,
      s.fp_events,
      `one provision call per provision_failed event on fp-1: ${JSON.stringify(s)}`,
    );
    assert.equal(s.fp_consumed, s.fp_failed, `one provision call per failed VM on fp-1: ${JSON.stringify(s)}`);
    assert.equal(s.fs_consumed, s.fs_attempts, `stop calls on fs-1 == recorded failed attempts: ${JSON.stringify(s)}`);
    assert.ok(s.fs_attempts >= s.fs_stopping, `each stuck stop was tried at least once: ${JSON.stringify(s)}`);
    assert.equal(
      s.fd_consumed,
      s.fd_attempts,
      `destroy calls on fd-1 == recorded failed attempts: ${JSON.stringify(s)}`,
    );
  });
});
