/**
 * The HTTP cases of `npm run bench` on one database: the service as a child
 * process (bench/service.ts), set up over its API (bench/setup.ts), each
 * endpoint loaded with autocannon (bench/load.ts); then, with the service
 * stopped, the baselines (bench/baseline-server.ts) measured the same way,
 * and each endpoint reported against the closest one:
 *   search    GET /search                 vs the 3 queries it runs, and vs its body served from memory
 *   pricing   GET /pricing                vs the same 3 queries
 *   vm        GET /vms/{id}, API key      vs one select by id
 *   vms       GET /vms, JWT, 50 VMs       vs the 50-row select
 *   balance   GET /billing/balance, JWT   vs the balance select
 *   login     POST /auth/login            vs {"hello":"world"} (argon2id per call: CPU-bound)
 *   vm-cycle  POST /vms, DELETE /vms/{id} vs {"hello":"world"}; each of the 50
 *             connections creates a one-GPU VM on a node with a free GPU and
 *             destroys it (req/s counts both calls), leftovers of a run are
 *             destroyed before the next; all 50 for one customer, whose
 *             creates the database serializes (the limits and the balance
 *             check), so this is one customer's ceiling
 *   vm-cycle-customers
 *             the same cycle with the 50 connections shared out among 10
 *             customers: the service's ceiling for a fleet's creates
 * Run: npm run bench -- [search pricing vm vms balance login vm-cycle vm-cycle-customers] [--db embedded|postgres|both]
 * [--duration S] [--repo DIR]
 */
import type autocannon from 'autocannon';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { must } from '../scripts/soak/client.js';
import { REPO_ROOT, startChildServer } from '../scripts/soak/server.js';
import { withScope, type Scope } from './cleanup.js';
import { CONNECTIONS, measure, WARMUP_S, type Load, type Measurement } from './load.js';
import type { BenchOptions, BenchResult } from './types.js';
import { BENCH_RATE_LIMIT, benchAdmin, freshDatabase, startService, type ServiceDb } from './service.js';
import { CYCLE_CUSTOMERS, liveVms, login, setupWorld, vmRequest, type World } from './setup.js';

type BaselineKey = 'hello' | 'static-search' | 'db-search' | 'db-vm' | 'db-vms' | 'db-balance';

interface ServiceCase {
  name: string;
  title: string;
  /** Compared with these, one row each. */
  baselines: BaselineKey[];
  load(w: World): Promise<Load>;
}

interface Baseline {
  title: string;
  mode: 'hello' | 'static' | 'db';
  path(w: World): string;
}

/** What the baselines need from the service's run. */
interface BaselineInputs {
  world: World;
  db: ServiceDb;
  searchBody: string;
  tmpDir: string;
}

const BASELINE_SERVER = join(REPO_ROOT, 'bench', 'baseline-server.ts');
const bearer = (token: string) => ({ authorization: `Bearer ${token}` });
const JSON_TYPE = { 'content-type': 'application/json' };

const BASELINES: Record<BaselineKey, Baseline> = {
  hello: { title: 'fastify {"hello":"world"}', mode: 'hello', path: () => '/hello' },
  'static-search': { title: 'fastify /search body from memory', mode: 'static', path: () => '/search' },
  'db-search': { title: 'fastify + db: the 3 /search queries', mode: 'db', path: () => '/search' },
  'db-vm': { title: 'fastify + db: select vm by id', mode: 'db', path: (w) => `/vms/${w.vmIds[0]}` },
  'db-vms': { title: 'fastify + db: select 50 vms', mode: 'db', path: () => '/vms' },
  'db-balance': { title: 'fastify + db: select balance', mode: 'db', path: () => '/billing/balance' },
};

export const SERVICE_CASES: ServiceCase[] = [
  {
    name: 'search',
    title: 'GET /search',
    baselines: ['db-search', 'static-search'],
    load: async (w) => ({ url: `${w.base}/search` }),
  },
  {
    name: 'pricing',
    title: 'GET /pricing',
    baselines: ['db-search'],
    load: async (w) => ({ url: `${w.base}/pricing` }),
  },
  {
    name: 'vm',
    title: 'GET /vms/{id} (API key)',
    baselines: ['db-vm'],
    load: async (w) => ({ url: `${w.base}/vms/${w.vmIds[0]}`, headers: bearer(w.apiKey) }),
  },
  {
    name: 'vms',
    title: 'GET /vms (JWT, 50 VMs)',
    baselines: ['db-vms'],
    load: async (w) => ({ url: `${w.base}/vms`, headers: bearer(await login(w.base, w.customer)) }),
  },
  {
    name: 'balance',
    title: 'GET /billing/balance (JWT)',
    baselines: ['db-balance'],
    load: async (w) => ({ url: `${w.base}/billing/balance`, headers: bearer(await login(w.base, w.customer)) }),
  },
  {
    name: 'login',
    title: 'POST /auth/login (argon2id)',
    baselines: ['hello'],
    load: async (w) => ({
      url: `${w.base}/auth/login`,
      method: 'POST',
      headers: JSON_TYPE,
      body: JSON.stringify({ email: w.customer.email, password: w.customer.password }),
    }),
  },
  {
    name: 'vm-cycle',
    title: 'POST /vms + DELETE /vms/{id} (1 customer)',
    baselines: ['hello'],
    load: async (w) => cycleLoad(w, [w.apiKey]),
  },
  {
    name: 'vm-cycle-customers',
    title: `POST /vms + DELETE /vms/{id} (${CYCLE_CUSTOMERS} customers)`,
    baselines: ['hello'],
    load: async (w) => cycleLoad(w, w.cycleKeys),
  },
];

/** The `code` of an error answer ("-" when it has none). */
function errorCode(body: string): string {
  try {
    return String((JSON.parse(body) as { code?: unknown }).code ?? '-');
  } catch {
    return '-';
  }
}

/**
 * One slot per GPU free now, named by its node (from GET /search: one offer per node with its free GPUs), the
 * nodes taken in turn, so that creates in flight at once spread over the nodes as a fleet's customers do.
 */
async function freeSlots(w: World): Promise<string[]> {
  const offers = await must<{ node: string; gpu_count: number }[]>(w.base, 'GET', '/search?limit=100', {
    timeoutMs: 30_000,
  });
  const slots: string[] = [];
  const rounds = Math.max(0, ...offers.map((o) => o.gpu_count));
  for (let round = 0; round < rounds; round++) {
    for (const o of offers) if (round < o.gpu_count) slots.push(o.node);
  }
  return slots;
}

/**
 * Destroys the VMs the cycle runs left, of every customer (a create answered after the run ended, one whose answer
 * was cut off, or one not yet destroyed when the run ended).
 */
async function destroyLeftovers(w: World): Promise<void> {
  const keep = new Set(w.vmIds);
  for (const key of [w.apiKey, ...w.cycleKeys]) {
    for (const vm of await liveVms(w.base, key)) {
      if (!keep.has(vm.id)) await must(w.base, 'DELETE', `/vms/${vm.id}`, { token: key, timeoutMs: 30_000 });
    }
  }
}

/**
 * POST /vms then DELETE /vms/{id}, on every connection, each connection for one customer (the API keys given,
 * in turn). A create takes a free GPU (a slot; freed slots queue behind the others) and its successful destroy
 * gives it back, so creates do not fail for want of GPUs while the cycle keeps up; a connection with no free slot
 * still sends its create (answered 400 gpu_unavailable: an error). The slots are counted before each run, after
 * the last run's leftovers are destroyed.
 */
function cycleLoad(w: World, keys: string[]): Load {
  let slots: string[] = [];
  let connections = 0;
  const errorCodes = new Map<string, number>();
  const failed = (method: string, status: number, code: string) => {
    const key = `${method} ${status} ${code}`;
    errorCodes.set(key, (errorCodes.get(key) ?? 0) + 1);
  };
  const withKey = (req: autocannon.Request, ctx: Record<string, unknown>) => {
    if (typeof ctx.key !== 'string') ctx.key = keys[connections++ % keys.length]!;
    return { ...req, headers: { ...req.headers, ...bearer(ctx.key as string) } };
  };
  return {
    url: w.base,
    headers: JSON_TYPE,
    errorCodes,
    prepare: async () => {
      await new Promise((r) => setTimeout(r, 1000)); // creates still in flight when the last run ended
      await destroyLeftovers(w);
      // /search may answer from a snapshot up to a second old: let it see the destroys.
      await new Promise((r) => setTimeout(r, 1100));
      slots = await freeSlots(w);
      errorCodes.clear();
    },
    requests: [
      {
        method: 'POST',
        path: '/vms',
        setupRequest: (req, ctx) => {
          const slot = slots.shift();
          ctx.slot = slot;
          return { ...withKey(req, ctx), body: JSON.stringify(vmRequest(slot ?? w.nodes[0]!)) };
        },
        onResponse: (status, body, ctx) => {
          if (status === 201) {
            ctx.vmId = (JSON.parse(body) as { id: string }).id;
            return;
          }
          const code = errorCode(body);
          failed('POST', status, code);
          // No free GPU where the slot said (a create of the last run answered late): the slot was not real.
          if (typeof ctx.slot === 'string' && code !== 'gpu_unavailable') slots.push(ctx.slot);
        },
      },
      {
        method: 'DELETE',
        setupRequest: (req, ctx) =>
          typeof ctx.vmId === 'string' ? { ...withKey(req, ctx), path: `/vms/${ctx.vmId}` } : null,
        onResponse: (status, body, ctx) => {
          if (status < 200 || status >= 300) failed('DELETE', status, errorCode(body));
          else if (typeof ctx.slot === 'string') slots.push(ctx.slot);
        },
      },
    ],
  };
}

function describe(title: string, m: Measurement): string {
  const errors = m.errors ? `, ${m.errors} errors ${JSON.stringify(m.error_codes ?? m.statuses)}` : '';
  return `  ${title}: ${m.rps.toFixed(0)} req/s, p50 ${m.p50_ms ?? '-'} ms, p99 ${m.p99_ms ?? '-'} ms${errors}`;
}

async function measureService(
  scope: Scope,
  o: BenchOptions,
  cases: ServiceCase[],
): Promise<{ measured: Map<ServiceCase, Measurement>; inputs: BaselineInputs }> {
  const db = await freshDatabase(scope, o.db);
  const admin = benchAdmin();
  const service = await startService(scope, o.repo, db, admin);
  console.log(`  service: ${o.repo} (npm start), pid ${service.pid}, ${service.url}`);
  const tmpDir = scope.tempDir();
  const world = await setupWorld(service.url, admin, tmpDir, CONNECTIONS);
  const searchBody = await (await fetch(`${service.url}/search`)).text();
  const measured = new Map<ServiceCase, Measurement>();
  let lastRequests = 0;
  for (const c of cases) {
    await afterRateLimitWindow(lastRequests);
    const m = await measure(await c.load(world), o.durationS);
    console.log(describe(c.title, m));
    measured.set(c, m);
    // The warm-up's requests count too: 2 s at the measured rate.
    lastRequests = m.requests * (1 + WARMUP_S / o.durationS);
  }
  await service.stop();
  return { measured, inputs: { world, db, searchBody, tmpDir } };
}

const RATE_WINDOW_MS = 60_000;

/**
 * The bench's anonymous requests all come from one address, and its rate limits count per fixed minute of the
 * wall clock: on a quick machine two cases in one minute (`/search` then `/pricing`, 50,000 req/s each) pass the
 * most the configuration allows. After a case that sent more than 40 % of the limit (with its warm-up), the next
 * one starts at the next minute, where nothing of it counts.
 */
async function afterRateLimitWindow(lastRequests: number): Promise<void> {
  if (lastRequests <= 0.4 * BENCH_RATE_LIMIT) return;
  const now = Date.now();
  await new Promise((r) => setTimeout(r, Math.floor(now / RATE_WINDOW_MS + 1) * RATE_WINDOW_MS - now + 100));
}

function baselineEnv(mode: Baseline['mode'], inputs: BaselineInputs): Record<string, string> {
  if (mode === 'hello') return {};
  if (mode === 'static') {
    const file = join(inputs.tmpDir, 'search.json');
    writeFileSync(file, inputs.searchBody);
    return { BENCH_STATIC_FILE: file };
  }
  const where: Record<string, string> = inputs.db.databaseUrl
    ? { BENCH_DATABASE_URL: inputs.db.databaseUrl }
    : { BENCH_PGLITE_DIR: inputs.db.pgliteDir! };
  return { ...where, BENCH_USER_ID: String(inputs.world.customer.id) };
}

/** Each baseline server mode needed is started once, its baselines measured, and stopped. */
async function measureBaselines(
  scope: Scope,
  keys: BaselineKey[],
  inputs: BaselineInputs,
  durationS: number,
): Promise<Map<BaselineKey, Measurement>> {
  const measured = new Map<BaselineKey, Measurement>();
  for (const mode of ['hello', 'static', 'db'] as const) {
    const mine = keys.filter((k) => BASELINES[k].mode === mode);
    if (mine.length === 0) continue;
    const server = await startChildServer(
      baselineEnv(mode, inputs),
      60_000,
      (line) => process.stderr.write(`  [baseline] ${line}\n`),
      {
        args: ['--import', 'tsx', BASELINE_SERVER, mode],
        cwd: REPO_ROOT,
      },
    );
    const stop = scope.defer(() => server.stop());
    for (const k of mine) {
      const m = await measure({ url: `${server.url}${BASELINES[k].path(inputs.world)}` }, durationS);
      console.log(describe(`baseline ${BASELINES[k].title}`, m));
      measured.set(k, m);
    }
    await stop();
  }
  return measured;
}

function row(name: string, db: string, m: Measurement, baseline?: { title: string; m: Measurement }): BenchResult {
  return {
    kind: 'http',
    name,
    db,
    rps: m.rps,
    p50_ms: m.p50_ms,
    p99_ms: m.p99_ms,
    baseline: baseline?.title ?? null,
    baseline_rps: baseline?.m.rps ?? null,
    ratio: baseline && baseline.m.rps > 0 ? Math.round((m.rps / baseline.m.rps) * 1000) / 1000 : null,
    errors: m.errors,
    requests: m.requests,
    seconds: m.seconds,
    statuses: m.statuses,
    ...(m.error_codes ? { error_codes: m.error_codes } : {}),
  };
}

/** The named HTTP cases on the database o.db. */
export function httpBench(o: BenchOptions, names: string[]): Promise<BenchResult[]> {
  const cases = SERVICE_CASES.filter((c) => names.includes(c.name));
  return withScope(async (scope) => {
    const { measured, inputs } = await measureService(scope, o, cases);
    const keys = [...new Set<BaselineKey>(['hello', ...cases.flatMap((c) => c.baselines)])];
    const base = await measureBaselines(scope, keys, inputs, o.durationS);
    const rows = cases.flatMap((c) =>
      c.baselines.map((k) => row(c.title, o.db, measured.get(c)!, { title: BASELINES[k].title, m: base.get(k)! })),
    );
    // The baselines themselves, against the bare framework.
    const hello = { title: BASELINES.hello.title, m: base.get('hello')! };
    for (const k of keys)
      rows.push(row(`baseline: ${BASELINES[k].title}`, o.db, base.get(k)!, k === 'hello' ? undefined : hello));
    return rows;
  });
}
