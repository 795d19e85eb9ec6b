/**
 * Crash injection on PostgreSQL: the real server (`gpucloud serve` from
 * src/, a child process: helpers/entry.ts) on a database of its own is SIGKILLed
 * at random points CRASH_COUNT (50) times while money-moving traffic runs, and
 * started again on the same port and database each time. Every mutating
 * request carries an Idempotency-Key (a UUID per logical request), and every
 * request that got no answer is sent again, with the same key and body,
 * until it is answered.
 *
 * Two kinds of crash, at random: after a random number of requests (with the
 * last one in flight or already answered), and on a timer while three
 * clients send requests at once. Traffic: VM creates (on-demand,
 * interruptible, reserved), destroys, stops, starts, admin credits,
 * reservation cancellations and clock advances of 1800-7200 s.
 *
 * Checked:
 *  - no answer is a 5xx; a 4xx is one the request can legitimately get
 *    (e.g. a retried destroy may find the VM destroyed by its first attempt);
 *  - a request cut by a crash gets a real answer within 60 s of the last
 *    crash that cut it, and no retry is answered 400 `conflict` "still being
 *    processed": the key a request left pending when its instance died is
 *    taken over by the first retry, at once;
 *  - Idempotency-Key routes (POST /vms, POST /admin/users/{id}/credits) never apply a
 *    request twice: one VM per create label, one transaction per credit
 *    description, and a create or credit answered 4xx left nothing behind;
 *  - an answered idempotent request sent again returns the same status and the same
 *    bytes (Idempotent-Replayed: true), also after crashes;
 *  - at the end, `gpucloud admin ledger-check` exits 0; every balance is the
 *    sum of its transactions; every VM's usage periods are contiguous from its
 *    first start with no overlap or gap and end by its destruction (the
 *    "charged exactly once" check of test/billing/property.test.ts); GPUs
 *    held never exceed a node's; no idempotency key is left pending.
 *
 * POST /admin/clock/advance does not honour Idempotency-Key: a retried advance whose first
 * attempt had moved the clock moves it again. That is reported (diagnostic
 * "note:"), not failed; a cut advance is retried first thing after the
 * restart, alone and to its answer, so one advance applies at most twice, and
 * no advance is sent while it could take the service clock 20 h past an
 * unanswered idempotent request (their answers are kept 24 h of service time).
 *
 * Skipped without DATABASE_URL. Reproduce the choices of a run with
 * CRASH_SEED=<seed printed> (timing is real, so runs differ anyway);
 * CRASH_COUNT=<n> for fewer or more crashes.
 */
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import pg from 'pg';
import { holdsGpus, type RentalType, type VmStatus } from '../../src/modules/vms/lifecycle.js';
import {
  childEnv,
  createScratchDb,
  freePort,
  NoAnswer,
  runCli,
  send,
  ServerProcess,
  sleep,
  sshKeygen,
  type Answer,
  type ScratchDb,
} from './crash-harness.js';
import { usageGapsSql } from '../helpers/billing-checks.js';
import { ERROR_CODES as CODES } from '../helpers/expected.js';
import { field, isRecord, numberField, stringField } from '../helpers/json.js';

const CRASHES = Number(process.env.CRASH_COUNT ?? 50);
const SEED = Number(process.env.CRASH_SEED ?? Math.floor(Math.random() * 2 ** 31));
const JWT_SECRET = 'crash-test-jwt-secret-'.padEnd(48, 'q');
const ADMIN_EMAIL = 'crash-admin@example.com';
const ADMIN_PASSWORD = 'crash-admin-password-1234';
const CLOCK_START = '2026-01-01T00:00:00Z';
const HOUR_MS = 3_600_000;
/**
 * A retried request must get a real answer within this long (real time) after the last crash that cut
 * one of its attempts: a key left pending by a dead request must not block its retries for longer.
 */
const ANSWER_BOUND_MS = 60_000;
/**
 * Idempotency-Key answers are kept 24 h of service time, and the manual clock makes hours pass in milliseconds (a
 * retried advance may even apply again: advances do not honour Idempotency-Key). No advance (first attempt or
 * retry) is sent while it could take the clock past 20 h after an unanswered idempotent request was first sent
 * (it waits for them), and replays are checked only within 16 h of the original.
 */
const TTL_MARGIN_MS = 20 * HOUR_MS;
const REPLAY_WINDOW_MS = 16 * HOUR_MS;
const MAX_LIVE_VMS = 6;

type Kind = 'create' | 'destroy' | 'stop' | 'start' | 'credit' | 'cancel' | 'advance';

/** The answers each kind of request may get (success status, acceptable error codes). */
const EXPECTED: Record<Kind, { ok: number; codes: string[] }> = {
  create: { ok: 201, codes: ['insufficient_balance', 'gpu_unavailable', 'limit_exceeded'] },
  destroy: { ok: 200, codes: ['invalid_state'] },
  stop: { ok: 200, codes: ['invalid_state'] },
  start: { ok: 200, codes: ['invalid_state', 'gpu_unavailable', 'insufficient_balance'] },
  credit: { ok: 201, codes: [] },
  cancel: { ok: 200, codes: ['invalid_state'] },
  advance: { ok: 200, codes: [] },
};
/** Routes that honour Idempotency-Key among the ones driven here. */
const IDEMPOTENT: ReadonlySet<Kind> = new Set(['create', 'credit']);

interface Attempt {
  /** Real time the attempt was sent, relative to the op's first send. */
  atMs: number;
  ms: number;
  outcome: 'answer' | 'no-answer' | 'pending-conflict';
  status?: number;
  replayed?: boolean;
  epoch: number;
  reason?: string;
}

interface Op {
  n: number;
  kind: Kind;
  method: 'POST' | 'DELETE';
  path: string;
  body?: unknown;
  token: string;
  key: string;
  user: number;
  vmId?: string;
  resId?: string;
  label?: string;
  seconds?: number;
  description?: string;
  firstSentMs: number;
  /** The service clock known when it was first sent (a lower bound of its key's created_at). */
  sendClockMs: number;
  /**
   * Real time from which a real answer is owed within ANSWER_BOUND_MS: the end of the last attempt cut
   * by a crash (or the last time this test held a retried advance back, see clockMayMove).
   */
  owedFromMs?: number;
  attempts: Attempt[];
  answer?: Answer;
  answeredMs?: number;
  inFlight: boolean;
  /** Crash kind during which the first attempt went out, for the report. */
  origin: string;
}

interface VmModel {
  id: string;
  status: VmStatus;
  rental: RentalType;
  resId: string | null;
  resActive: boolean;
  busy: boolean;
}

interface UserModel {
  id: number;
  email: string;
  key: string;
  vms: Map<string, VmModel>;
}

/** mulberry32: the run's choices from CRASH_SEED. */
function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

let scratch: ScratchDb | undefined;
let server: ServerProcess | undefined;
let clockDb: pg.Client | undefined;
after(async () => {
  await server?.kill();
  await clockDb?.end().catch(() => {});
  await scratch?.drop();
});

test(
  `crash injection: ${CRASHES} SIGKILLs of the server under money-moving traffic (seed ${SEED})`,
  { skip: process.env.DATABASE_URL ? false : 'DATABASE_URL is not set', timeout: 15 * 60_000 },
  async (t) => {
    const t0 = Date.now();
    const random = rng(SEED);
    const int = (n: number) => Math.floor(random() * n);
    const pick = <T>(xs: readonly T[]): T | undefined => (xs.length ? xs[int(xs.length)] : undefined);
    const log = (line: string) => t.diagnostic(line);
    log(
      `seed ${SEED} (CRASH_SEED=${SEED} CRASH_COUNT=${CRASHES} node scripts/test.mjs test/reliability/crash.test.ts)`,
    );

    scratch = await createScratchDb(process.env.DATABASE_URL!);
    const port = await freePort();
    const env = childEnv({
      DATABASE_URL: scratch.url,
      GPUCLOUD_JWT_SECRET: JWT_SECRET,
      PORT: String(port),
      HOST: '127.0.0.1',
      LOG_LEVEL: 'silent',
      GPUCLOUD_CLOCK: 'manual',
      GPUCLOUD_CLOCK_START: CLOCK_START,
      GPUCLOUD_SIM_PROVISION_MS: '0',
      GPUCLOUD_DEMO: '0',
      GPUCLOUD_ADMIN_EMAIL: ADMIN_EMAIL,
      GPUCLOUD_ADMIN_PASSWORD: ADMIN_PASSWORD,
      GPUCLOUD_RATE_LIMIT_LOGIN: '1000000',
      GPUCLOUD_RATE_LIMIT_LOGIN_IP: '1000000',
      GPUCLOUD_RATE_LIMIT_LOGIN_GLOBAL: '1000000',
      GPUCLOUD_RATE_LIMIT_AUTH: '1000000',
      GPUCLOUD_RATE_LIMIT_VM_MUTATIONS: '1000000',
      GPUCLOUD_RATE_LIMIT_DEFAULT: '1000000',
    });
    const srv = new ServerProcess(port, env);
    server = srv;
    await srv.start();

    const failures: string[] = [];
    const notes: string[] = [];
    const stats = {
      ops: 0,
      inFlightAtCrash: 0,
      retried: 0,
      retriedReplayed: 0,
      retriedFresh: 0,
      pendingConflicts: 0,
      maxAnswerMs: 0,
      maxAfterCutMs: 0,
      replaysChecked: 0,
      retriedNonIdempotentRefused: new Map<string, number>(),
      doubleAdvanceS: 0,
      crashes: { count: 0, timer: 0 },
      liveNoAnswer: 0,
      answers: new Map<string, number>(),
    };
    let epoch = 0;
    let opSeq = 0;
    // The service clock, read from the database (read only): at the start of each cycle (a lower bound
    // for the rest of it), and that plus every advance attempt sent since (an upper bound).
    const cdb = new pg.Client({ connectionString: scratch.url });
    clockDb = cdb;
    await cdb.connect();
    const readClock = async () =>
      Number((await cdb.query<{ now_ms: string }>('SELECT now_ms FROM service_clock WHERE id = 1')).rows[0]!.now_ms);
    let cycleClockMs = await readClock();
    let clockUpperMs = cycleClockMs;
    let advanceSecondsIssued = 0;
    const ops: Op[] = [];
    const outstanding = new Set<Op>();

    // ---------------- plain calls (setup, reads): must be answered by a live server ----------------
    const call = async (
      method: string,
      path: string,
      opts: { token?: string; body?: unknown } = {},
    ): Promise<Answer> => {
      const key = method === 'POST' || method === 'DELETE' ? randomUUID() : undefined;
      const a = await send(port, method, path, { token: opts.token, body: opts.body, idempotencyKey: key });
      assert.ok(a.status < 500, `${method} ${path} answered ${a.status}: ${a.text}`);
      return a;
    };

    // ---------------- setup over HTTP ----------------
    const adminLogin = await call('POST', '/auth/login', { body: { email: ADMIN_EMAIL, password: ADMIN_PASSWORD } });
    assert.equal(adminLogin.status, 200, adminLogin.text);
    const adminKeyRes = await call('POST', '/api-keys', {
      token: stringField(adminLogin.body, 'access_token'),
      body: { name: 'crash-admin', scope: 'read_write' },
    });
    assert.equal(adminKeyRes.status, 201, adminKeyRes.text);
    const adminKey = stringField(adminKeyRes.body, 'key');

    const NODE_SHAPES = [
      { gpu_type: '4090', gpu_count: 2 },
      { gpu_type: '4090', gpu_count: 4 },
      { gpu_type: '5090', gpu_count: 8 },
    ];
    const nodes: { node: string; gpu_type: string; gpu_count: number }[] = [];
    for (const [i, shape] of NODE_SHAPES.entries()) {
      const body = {
        node: `crash-n${i}`,
        ...shape,
        ram_gb: 512,
        cpu_cores: 64,
        cpu_model: 'AMD EPYC 7543',
        pcie_gen: '4.0',
        max_storage_gb: 2000,
        location: 'eu-central',
        cluster_name: 'crash-1',
      };
      const r = await call('POST', '/admin/nodes', { token: adminKey, body });
      assert.equal(r.status, 201, r.text);
      nodes.push({ node: body.node, ...shape });
    }

    // Three users with credit (the last one poor: insufficient_balance and low-balance stops happen too).
    const CREDITS = [20_000, 8_000, 60];
    const users: UserModel[] = [];
    for (const [i, amount] of CREDITS.entries()) {
      const email = `crash-user-${i}-${SEED}@example.com`;
      const password = `crash-user-password-${i}-${SEED}`;
      const reg = await call('POST', '/auth/register', { body: { email, password } });
      assert.equal(reg.status, 201, reg.text);
      const login = await call('POST', '/auth/login', { body: { email, password } });
      assert.equal(login.status, 200, login.text);
      const token = stringField(login.body, 'access_token');
      const me = await call('GET', '/account', { token });
      assert.equal(me.status, 200, me.text);
      const ssh = await call('POST', '/ssh-keys', { token, body: { ssh_public_key: sshKeygen(`crash-${i}`) } });
      assert.equal(ssh.status, 201, ssh.text);
      const key = await call('POST', '/api-keys', { token, body: { name: `crash-${i}`, scope: 'read_write' } });
      assert.equal(key.status, 201, key.text);
      const userId = numberField(me.body, 'id');
      const cr = await call('POST', `/admin/users/${userId}/credits`, {
        token: adminKey,
        body: { amount, description: 'crash test: initial credit' },
      });
      assert.equal(cr.status, 201, cr.text);
      users.push({ id: userId, email, key: stringField(key.body, 'key'), vms: new Map() });
    }
    log(`setup done in ${Date.now() - t0} ms (server start ${srv.startMs[0]} ms)`);

    // ---------------- the model ----------------
    const describe = (op: Op) =>
      `#${op.n} ${op.kind} ${op.method} ${op.path}${op.body ? ` ${JSON.stringify(op.body)}` : ''} (Idempotency-Key ${op.key}, first sent during a ${op.origin}; attempts: ${op.attempts
        .map(
          (a) =>
            `[+${a.atMs} ms epoch ${a.epoch}: ${a.outcome}${a.status ? ` ${a.status}` : ''}${a.replayed ? ' replayed' : ''}${a.reason ? ` (${a.reason})` : ''}, ${a.ms} ms]`,
        )
        .join(' ')})`;
    const fail = (op: Op, msg: string): void => {
      failures.push(`${msg}: ${describe(op)}`);
    };

    const busyVms = () => {
      const s = new Set<string>();
      for (const op of outstanding) if (op.vmId) s.add(op.vmId);
      for (const op of ops) if (op.inFlight && op.vmId) s.add(op.vmId);
      return s;
    };

    async function refreshUsers(): Promise<void> {
      const busy = busyVms();
      await Promise.all(
        users.map(async (u) => {
          let a: Answer;
          try {
            a = await send(port, 'GET', '/vms?limit=100', { token: u.key });
          } catch (e) {
            if (e instanceof NoAnswer) return;
            throw e;
          }
          if (a.status !== 200) {
            failures.push(`GET /vms for user ${u.id} answered ${a.status}: ${a.text}`);
            return;
          }
          const next = new Map<string, VmModel>();
          // A 200 from GET /vms: its shape is the API's (checked by the typed tests).
          for (const v of a.body as {
            id: string;
            status: VmStatus;
            rental_type: RentalType;
            reservation_id: string | null;
          }[]) {
            const old = u.vms.get(v.id);
            next.set(v.id, {
              id: v.id,
              status: v.status,
              rental: v.rental_type,
              resId: v.reservation_id,
              resActive: v.rental_type === 'reserved' && (old?.resActive ?? true),
              busy: busy.has(v.id),
            });
          }
          u.vms = next;
        }),
      );
    }

    function newOp(kind: Kind, user: number, method: Op['method'], path: string, extra: Partial<Op> = {}): Op {
      const u = users[user];
      const op: Op = {
        n: ++opSeq,
        kind,
        method,
        path,
        token: kind === 'credit' || kind === 'advance' ? adminKey : u!.key,
        key: randomUUID(),
        user,
        firstSentMs: 0,
        sendClockMs: 0,
        attempts: [],
        inFlight: false,
        origin: '',
        ...extra,
      };
      if (op.vmId) {
        const vm = u?.vms.get(op.vmId);
        if (vm) vm.busy = true;
      }
      ops.push(op);
      return op;
    }

    const unanswered = () => [...outstanding, ...ops.filter((o) => o.inFlight)];
    const advanceOutstanding = () => unanswered().some((o) => o.kind === 'advance');
    /** Idempotency keys live 24 h of service time: keep every unanswered one well inside that. */
    const clockMayMove = (seconds: number) => {
      const oldest = Math.min(
        ...unanswered()
          .filter((o) => IDEMPOTENT.has(o.kind))
          .map((o) => o.sendClockMs),
      );
      return !Number.isFinite(oldest) || clockUpperMs + seconds * 1000 - oldest < TTL_MARGIN_MS;
    };
    const advanceAllowed = (seconds: number) => {
      if (advanceOutstanding()) return false;
      return clockMayMove(seconds);
    };

    /** A random next request given what the model knows; undefined when the pick had nothing to act on. */
    function pickOp(only?: Kind): Op | undefined {
      const ui = int(users.length);
      const u = users[ui]!;
      const live = [...u.vms.values()].filter((v) => v.status !== 'destroyed' && v.status !== 'failed');
      const free = live.filter((v) => !v.busy);
      const weights: [Kind, number][] = [
        ['create', live.length < MAX_LIVE_VMS ? 3 : 0],
        ['destroy', free.length ? (live.length >= 4 ? 3 : 1) : 0],
        ['stop', free.some((v) => v.status === 'running') ? 3 : 0],
        ['start', free.some((v) => v.status === 'stopped' || v.status === 'interrupted') ? 3 : 0],
        ['credit', 1],
        ['cancel', free.some((v) => v.resActive && v.rental === 'reserved') ? 2 : 0],
        ['advance', 4],
      ];
      let kind: Kind | undefined = only;
      if (!kind) {
        const total = weights.reduce((s, [, w]) => s + w, 0);
        let x = random() * total;
        for (const [k, w] of weights) {
          if ((x -= w) < 0) {
            kind = k;
            break;
          }
        }
      }
      switch (kind) {
        case 'create': {
          if (live.length >= MAX_LIVE_VMS) return undefined;
          const node = pick(nodes)!;
          const rental = pick<RentalType>(['on_demand', 'on_demand', 'interruptible', 'interruptible', 'reserved'])!;
          const label = `c${opSeq + 1}-${SEED % 100000}`;
          const body: Record<string, unknown> = {
            node: node.node,
            gpu_type: node.gpu_type,
            gpu_count: random() < 0.75 ? 1 : 2,
            storage_gb: pick([50, 100])!,
            template_vmid: 100,
            rental_type: rental,
            instance_label: label,
          };
          if (rental === 'reserved') body.reservation_months = 1;
          return newOp('create', ui, 'POST', '/vms', { body, label });
        }
        case 'destroy': {
          const vm = pick(free);
          return vm && newOp('destroy', ui, 'DELETE', `/vms/${vm.id}`, { vmId: vm.id });
        }
        case 'stop': {
          const vm = pick(free.filter((v) => v.status === 'running'));
          return vm && newOp('stop', ui, 'POST', `/vms/${vm.id}/stop`, { vmId: vm.id });
        }
        case 'start': {
          const vm = pick(free.filter((v) => v.status === 'stopped' || v.status === 'interrupted'));
          return vm && newOp('start', ui, 'POST', `/vms/${vm.id}/start`, { vmId: vm.id });
        }
        case 'credit': {
          const amount = (100 + int(30_000)) / 100;
          const description = `crash credit ${randomUUID()}`;
          return newOp('credit', ui, 'POST', `/admin/users/${u.id}/credits`, {
            body: { amount, description },
            description,
          });
        }
        case 'cancel': {
          const vm = pick(free.filter((v) => v.resActive && v.rental === 'reserved' && v.resId));
          return vm && newOp('cancel', ui, 'DELETE', `/reservations/${vm.resId}`, { vmId: vm.id, resId: vm.resId! });
        }
        case 'advance': {
          const seconds = 1800 + int(5401);
          if (!advanceAllowed(seconds)) return undefined;
          advanceSecondsIssued += seconds;
          return newOp('advance', ui, 'POST', '/admin/clock/advance', { body: { seconds }, seconds });
        }
      }
      return undefined;
    }

    const isPendingConflict = (a: Answer) =>
      a.status === 400 &&
      field(a.body, 'code') === 'conflict' &&
      /still being processed/i.test(String(field(a.body, 'detail')));

    /** Is this answer one the request may get? (Any 5xx, unknown code or wrong shape is a failure.) */
    function checkAnswer(op: Op, a: Answer): void {
      const exp = EXPECTED[op.kind];
      const retried = op.attempts.length > 1;
      const replayed = a.headers['idempotent-replayed'] === 'true';
      if (a.status >= 500) return fail(op, `answered ${a.status} ${a.text}`);
      if (a.status >= 400) {
        const code = field(a.body, 'code');
        if (typeof code !== 'string' || !CODES.has(code))
          return fail(op, `answered ${a.status} with a code outside the closed list: ${a.text}`);
        if (!exp.codes.includes(code))
          return fail(op, `answered ${a.status} ${code}, not an answer this request can get: ${a.text}`);
        if (op.kind === 'destroy' && !retried)
          return fail(op, `a destroy of a live VM answered ${a.text} on its first attempt`);
        if (retried && !IDEMPOTENT.has(op.kind)) {
          // Not covered by Idempotency-Key: the retry of a request whose first attempt committed finds the change made.
          const k = `${op.kind} ${code}`;
          stats.retriedNonIdempotentRefused.set(k, (stats.retriedNonIdempotentRefused.get(k) ?? 0) + 1);
        }
        return;
      }
      if (a.status !== exp.ok) return fail(op, `answered ${a.status} (expected ${exp.ok} or an error): ${a.text}`);
      if (IDEMPOTENT.has(op.kind) && retried && !replayed) stats.retriedFresh++;
      if (IDEMPOTENT.has(op.kind) && retried && replayed) stats.retriedReplayed++;
      const b = isRecord(a.body) ? a.body : {};
      const req = (op.body ?? {}) as Record<string, unknown>;
      switch (op.kind) {
        case 'create':
          if (
            typeof b.id !== 'string' ||
            b.instance_label !== op.label ||
            b.rental_type !== req.rental_type ||
            b.node !== req.node ||
            b.status !== 'creating'
          ) {
            fail(op, `create answered 201 with an unexpected VM: ${a.text}`);
          }
          if ((req.rental_type === 'reserved') !== (typeof b.reservation_id === 'string'))
            fail(op, `reservation_id does not match the rental type: ${a.text}`);
          break;
        case 'credit':
          if (
            b.type !== 'credit' ||
            b.description !== op.description ||
            typeof b.amount !== 'number' ||
            Math.round(b.amount * 100) !== Math.round(Number(req.amount) * 100)
          ) {
            fail(op, `credit answered 201 with an unexpected transaction: ${a.text}`);
          }
          break;
        case 'cancel':
          if (b.id !== op.resId || b.status !== 'cancelled')
            fail(op, `cancel answered 200 with an unexpected reservation: ${a.text}`);
          break;
        case 'advance':
          if (typeof b.now !== 'string' || !Number.isFinite(Date.parse(b.now)))
            fail(op, `advance answered 200 without a clock: ${a.text}`);
          break;
        default:
          if (typeof b.message !== 'string') fail(op, `answered ${a.status} without a message: ${a.text}`);
      }
    }

    /** What an answer teaches the model. */
    function learn(op: Op, a: Answer): void {
      const u = users[op.user]!;
      const vm = op.vmId ? u.vms.get(op.vmId) : undefined;
      if (vm) vm.busy = false;
      if (op.kind === 'create' && a.status === 201) {
        // checkAnswer has checked this 201's VM: an id, its rental type and a reservation id where it has one.
        const b = a.body as { id: string; status: VmStatus; rental_type: RentalType; reservation_id: string | null };
        u.vms.set(b.id, {
          id: b.id,
          status: b.status,
          rental: b.rental_type,
          resId: b.reservation_id,
          resActive: b.rental_type === 'reserved',
          busy: false,
        });
      } else if (op.kind === 'destroy' && vm) {
        vm.status = 'destroyed';
      } else if (op.kind === 'stop' && vm && a.status === 200) {
        vm.status = 'stopping';
      } else if (op.kind === 'start' && vm && a.status === 200) {
        vm.status = 'starting';
      } else if (op.kind === 'cancel' && vm) {
        vm.resActive = false;
      } else if (op.kind === 'advance' && a.status === 200) {
        clockUpperMs = Math.max(clockUpperMs, Date.parse(stringField(a.body, 'now')));
      }
    }

    /** One attempt of a request. */
    async function attempt(op: Op, origin: string): Promise<'answered' | 'no-answer' | 'pending'> {
      const started = Date.now();
      if (op.attempts.length === 0) {
        op.firstSentMs = started;
        op.sendClockMs = cycleClockMs;
        op.origin = origin;
        stats.ops++;
      }
      op.inFlight = true;
      if (op.kind === 'advance') clockUpperMs += op.seconds! * 1000;
      const ep = epoch;
      const wasAlive = srv.alive;
      try {
        const a = await send(port, op.method, op.path, { token: op.token, body: op.body, idempotencyKey: op.key });
        const att: Attempt = {
          atMs: started - op.firstSentMs,
          ms: Date.now() - started,
          outcome: 'answer',
          status: a.status,
          epoch: ep,
        };
        if (a.headers['idempotent-replayed'] === 'true') att.replayed = true;
        if (isPendingConflict(a)) {
          att.outcome = 'pending-conflict';
          op.attempts.push(att);
          stats.pendingConflicts++;
          outstanding.add(op);
          fail(op, `a retry was refused as still being processed, by a key its dead first attempt left: ${a.text}`);
          return 'pending';
        }
        op.attempts.push(att);
        op.answer = a;
        op.answeredMs = Date.now();
        outstanding.delete(op);
        if (op.attempts.length > 1) stats.retried++;
        stats.maxAnswerMs = Math.max(stats.maxAnswerMs, op.answeredMs - op.firstSentMs);
        if (op.owedFromMs !== undefined) {
          const took = op.answeredMs - op.owedFromMs;
          stats.maxAfterCutMs = Math.max(stats.maxAfterCutMs, took);
          if (took > ANSWER_BOUND_MS)
            fail(
              op,
              `answered for real only ${took} ms after the last crash that cut it (bound ${ANSWER_BOUND_MS} ms)`,
            );
        }
        const what = `${op.kind} ${a.status}${a.status >= 400 ? ` ${String(field(a.body, 'code'))}` : ''}`;
        stats.answers.set(what, (stats.answers.get(what) ?? 0) + 1);
        checkAnswer(op, a);
        learn(op, a);
        return 'answered';
      } catch (e) {
        if (!(e instanceof NoAnswer)) throw e;
        op.attempts.push({
          atMs: started - op.firstSentMs,
          ms: Date.now() - started,
          outcome: 'no-answer',
          epoch: ep,
          reason: e.reason,
        });
        op.owedFromMs = Date.now();
        outstanding.add(op);
        // Our kill sets alive=false before the signal: a live server that dropped a request is a finding.
        if (wasAlive && srv.alive && ep === epoch) {
          stats.liveNoAnswer++;
          fail(op, `no answer from a server we did not kill (${e.reason})`);
        }
        return 'no-answer';
      } finally {
        op.inFlight = false;
      }
    }

    /** Retries an unanswered request with the same key and body while this server lives. */
    async function retry(op: Op): Promise<void> {
      while (srv.alive && outstanding.has(op) && !op.inFlight) {
        if ((await attempt(op, 'retry')) !== 'pending') return;
      }
    }

    /** An answered idempotent request sent again: the same status and bytes, marked replayed. */
    async function replay(op: Op): Promise<void> {
      const first = op.answer!;
      let a: Answer;
      try {
        a = await send(port, op.method, op.path, { token: op.token, body: op.body, idempotencyKey: op.key });
      } catch (e) {
        if (e instanceof NoAnswer) return;
        throw e;
      }
      if (isPendingConflict(a))
        return fail(op, `a replay of an answered request was refused as still being processed: ${a.text}`);
      stats.replaysChecked++;
      if (a.status !== first.status || a.text !== first.text) {
        fail(
          op,
          `replay differs from the answer received: first ${first.status} ${first.text} / replay ${a.status} ${a.text}`,
        );
      } else if (a.headers['idempotent-replayed'] !== 'true') {
        fail(op, `replay not marked Idempotent-Replayed (status ${a.status})`);
      }
    }

    /**
     * Answered idempotent requests still well within their 24 h (advances in flight meanwhile add at most a few
     * hours).
     */
    const replayable = () =>
      ops.filter((o) => IDEMPOTENT.has(o.kind) && o.answer && clockUpperMs - o.sendClockMs < REPLAY_WINDOW_MS);

    // ---------------- crash cycles ----------------
    const timing = { refresh: 0, traffic: 0, settleBackground: 0, start: 0 };
    for (let c = 0; c < CRASHES; c++) {
      epoch++;
      cycleClockMs = await readClock();
      clockUpperMs = cycleClockMs;
      let tp = Date.now();
      await refreshUsers();
      timing.refresh += Date.now() - tp;
      tp = Date.now();
      const background: Promise<unknown>[] = [];
      for (const op of [...outstanding]) if (op.kind !== 'advance' && !op.inFlight) background.push(retry(op));
      const candidates = replayable();
      for (let i = 0; i < 2 && candidates.length; i++) background.push(replay(candidates[int(candidates.length)]!));
      // An advance cut by the last crash is retried first, alone and to its answer before this cycle's crash
      // can come: a retried advance applies again (advances ignore Idempotency-Key), so each logical advance is
      // applied at
      // most twice. It waits (and is not yet owed an answer) while that could expire an unanswered idempotency key.
      for (const op of [...outstanding].filter((o) => o.kind === 'advance')) {
        if (!clockMayMove(op.seconds!)) {
          op.owedFromMs = Date.now();
          continue;
        }
        await retry(op);
      }

      if (random() < 0.5) {
        // Crash after a random number of requests: the last one in flight (killed 0-25 ms after it went
        // out), or already answered.
        stats.crashes.count++;
        const n = 1 + int(6);
        const lastInFlight = random() < 0.7;
        for (let i = 0; i < n && srv.alive; i++) {
          const last = i === n - 1;
          const op = pickOp(last && lastInFlight && random() < 0.3 ? 'advance' : undefined) ?? pickOp();
          if (!op) continue;
          if (!last || !lastInFlight) {
            await attempt(op, 'count crash');
            continue;
          }
          const p = attempt(op, 'count crash (in flight)');
          await sleep(int(26));
          if (op.inFlight) stats.inFlightAtCrash++;
          await srv.kill();
          background.push(p);
        }
      } else {
        // Crash on a timer while three clients send requests.
        stats.crashes.timer++;
        const worker = async () => {
          while (srv.alive) {
            const op = pickOp();
            if (!op) {
              await sleep(2);
              continue;
            }
            await attempt(op, 'timer crash');
          }
        };
        const workers = [worker(), worker(), worker()];
        await sleep(40 + int(500));
        stats.inFlightAtCrash += ops.filter((o) => o.inFlight).length;
        await srv.kill();
        background.push(...workers);
      }
      await srv.kill();
      timing.traffic += Date.now() - tp;
      tp = Date.now();
      await Promise.all(background);
      timing.settleBackground += Date.now() - tp;
      tp = Date.now();
      await srv.start();
      timing.start += Date.now() - tp;
    }
    const crashesDoneMs = Date.now() - t0;

    // ---------------- drain: every unanswered request answered, within the bound ----------------
    epoch++;
    cycleClockMs = await readClock();
    clockUpperMs = cycleClockMs;
    const drainDeadline = Date.now() + 2 * ANSWER_BOUND_MS;
    while (outstanding.size && Date.now() < drainDeadline) {
      // Advances only once no idempotent request is waiting (each one may move the clock again).
      const idempotentWaiting = [...outstanding].some((o) => IDEMPOTENT.has(o.kind));
      for (const op of outstanding) if (idempotentWaiting && op.kind === 'advance') op.owedFromMs = Date.now();
      await Promise.all(
        [...outstanding]
          .filter((op) => !(idempotentWaiting && op.kind === 'advance'))
          .map(async (op) => {
            if ((await attempt(op, 'retry')) === 'no-answer') await sleep(200);
          }),
      );
    }
    for (const op of outstanding)
      fail(op, `never answered for real (gave up ${Date.now() - op.firstSentMs} ms after it was first sent)`);

    // Settle the due work a crash in the middle of an advance left (one more, uninterrupted, advance).
    const settle = await call('POST', '/admin/clock/advance', { token: adminKey, body: { seconds: 1 } });
    assert.equal(settle.status, 200, settle.text);
    cycleClockMs = clockUpperMs = await readClock();

    // Every answered idempotent request still within its 24 h: the same answer again.
    for (const op of replayable()) await replay(op);
    const clockRes = await call('GET', '/admin/clock', { token: adminKey });
    const finalClockMs = Date.parse(stringField(clockRes.body, 'now'));
    await cdb.end();
    clockDb = undefined;
    await srv.stop();
    server = undefined;

    // ---------------- the books ----------------
    const ledger = runCli(
      ['admin', 'ledger-check'],
      childEnv({ DATABASE_URL: scratch.url, GPUCLOUD_JWT_SECRET: JWT_SECRET, LOG_LEVEL: 'silent' }),
    );
    if (ledger.status !== 0)
      failures.push(`gpucloud admin ledger-check exited ${ledger.status}: ${ledger.stdout}${ledger.stderr}`);

    const db = new pg.Client({ connectionString: scratch.url });
    await db.connect();
    try {
      const q = async <R extends Record<string, unknown>>(sql: string, params: unknown[] = []) =>
        (await db.query<R>(sql, params)).rows;
      const expectNone = async (what: string, sql: string, params: unknown[] = []) => {
        const rows = await q(sql, params);
        if (rows.length)
          failures.push(
            `${what}: ${JSON.stringify(rows.slice(0, 10))}${rows.length > 10 ? ` (+${rows.length - 10} more)` : ''}`,
          );
      };
      await expectNone(
        'balance == sum(transactions) for every user',
        `SELECT b.user_id, b.balance_micros, COALESCE(SUM(t.amount_micros), 0)::int8 AS sum FROM balances b LEFT JOIN transactions t ON t.user_id = b.user_id
          GROUP BY b.user_id HAVING b.balance_micros <> COALESCE(SUM(t.amount_micros), 0)`,
      );
      // Charged exactly once (test/billing/property.test.ts): periods contiguous from the first start, none after the
      // destroy.
      await expectNone(
        'usage periods are contiguous from the first start (no gap, no overlap) and end by the destroy',
        usageGapsSql(false),
      );
      await expectNone(
        'every VM is billed up to its destruction, or (after the settling advance) up to the last period boundary',
        `SELECT v.id, v.status, m.billed_until, v.destroyed_at FROM vms v LEFT JOIN vm_meters m ON m.vm_id = v.id
          WHERE v.first_started_at IS NOT NULL AND (
           (v.status = 'destroyed' AND (m.vm_id IS NOT NULL
              OR coalesce((SELECT max(l.period_end) FROM usage_logs l WHERE l.vm_id = v.id), v.first_started_at) <> v.destroyed_at))
           OR (v.status <> 'destroyed' AND m.billed_until < to_timestamp(floor(extract(epoch FROM $1::timestamptz) / 3600) * 3600)))`,
        [new Date(finalClockMs)],
      );
      await expectNone(
        'billed_until is the end of the last usage period',
        `SELECT m.vm_id, m.billed_until, max(l.period_end) AS last FROM vm_meters m JOIN usage_logs l ON l.vm_id = m.vm_id GROUP BY m.vm_id HAVING m.billed_until <> max(l.period_end)`,
      );
      await expectNone(
        'nothing is charged for a VM that never ran (but the minimum charge of one that interrupted others)',
        `SELECT t.id, t.vm_id, t.description FROM transactions t JOIN vms v ON v.id = t.vm_id
          WHERE t.type = 'charge' AND v.first_started_at IS NULL
            AND NOT (t.description LIKE 'Minimum charge of VM %' AND EXISTS (SELECT 1 FROM interruptions i WHERE i.preempted_by_vm_id = v.id))`,
      );
      await expectNone(
        'transaction signs (credit and refund positive, charge and deposit negative)',
        `SELECT id, type, amount_micros FROM transactions WHERE NOT (
           (type = 'credit' AND amount_micros > 0) OR (type IN ('charge', 'deposit') AND amount_micros < 0) OR (type = 'refund' AND amount_micros > 0)
           OR type = 'adjustment')`,
      );
      await expectNone(
        'no node has more GPUs held than it has',
        `SELECT n.node, n.gpu_count, COALESCE(SUM(v.gpu_count) FILTER (WHERE v.holds_gpus), 0)::int8 AS held
           FROM nodes n LEFT JOIN vms v ON v.node = n.node
          GROUP BY n.node, n.gpu_count HAVING COALESCE(SUM(v.gpu_count) FILTER (WHERE v.holds_gpus), 0) > n.gpu_count`,
      );
      for (const v of await q<{
        id: string;
        status: VmStatus;
        rental_type: RentalType;
        offline_from: VmStatus | null;
        holds_gpus: boolean;
      }>('SELECT id, status, rental_type, offline_from, holds_gpus FROM vms')) {
        if (v.holds_gpus !== holdsGpus(v.status, v.rental_type, v.offline_from))
          failures.push(
            `VM ${v.id} (${v.rental_type}, ${v.status}): holds_gpus ${v.holds_gpus} (a stopped VM releases its GPUs unless it is reserved)`,
          );
      }
      await expectNone(
        'low balance: once the jobs have settled, no VM runs on credit that is used up',
        `SELECT v.id, v.status, v.rental_type, b.balance_micros FROM vms v JOIN balances b ON b.user_id = v.user_id
          WHERE b.balance_micros <= 0 AND v.status IN ('running', 'starting') AND v.rental_type <> 'reserved'`,
      );
      await expectNone(
        'no idempotency key is left pending once every request was answered',
        `SELECT user_id, created_at FROM idempotency_keys WHERE state = 'pending'`,
      );

      // Applied once: one VM per create label, one transaction per credit description, matching the answers.
      const vmsByLabel = new Map<string, { id: string; status: string }[]>();
      for (const r of await q<{ id: string; instance_label: string | null; status: string }>(
        'SELECT id, instance_label, status FROM vms',
      )) {
        if (!r.instance_label) continue;
        vmsByLabel.set(r.instance_label, [...(vmsByLabel.get(r.instance_label) ?? []), r]);
      }
      const txByDescription = new Map<string, { id: string }[]>();
      for (const r of await q<{ id: string; description: string }>(
        `SELECT id::text, description FROM transactions WHERE description LIKE 'crash credit %'`,
      )) {
        txByDescription.set(r.description, [...(txByDescription.get(r.description) ?? []), r]);
      }
      const vmStatus = new Map(
        (await q<{ id: string; status: string }>('SELECT id, status FROM vms')).map((r) => [r.id, r.status]),
      );
      const resStatus = new Map(
        (await q<{ id: string; status: string }>('SELECT id, status FROM reservations')).map((r) => [r.id, r.status]),
      );
      for (const op of ops) {
        if (!op.answer) continue;
        const a = op.answer;
        if (op.kind === 'create') {
          const rows = vmsByLabel.get(op.label!) ?? [];
          if (a.status === 201 && (rows.length !== 1 || rows[0]!.id !== field(a.body, 'id'))) {
            fail(
              op,
              `create answered 201 (VM ${String(field(a.body, 'id'))}) but the database holds ${rows.length} VM(s) with its label: ${JSON.stringify(rows)}`,
            );
          } else if (a.status !== 201 && rows.length) {
            fail(
              op,
              `create answered ${a.status} ${String(field(a.body, 'code'))} but made VM(s) ${JSON.stringify(rows)}`,
            );
          }
        } else if (op.kind === 'credit') {
          const rows = txByDescription.get(op.description!) ?? [];
          if (a.status === 201 && (rows.length !== 1 || String(rows[0]!.id) !== String(field(a.body, 'id')))) {
            fail(
              op,
              `credit answered 201 (transaction ${String(field(a.body, 'id'))}) but the database holds ${rows.length} transaction(s) for it: ${JSON.stringify(rows)}`,
            );
          } else if (a.status !== 201 && rows.length) {
            fail(op, `credit answered ${a.status} but wrote ${JSON.stringify(rows)}`);
          }
        } else if (
          op.kind === 'destroy' &&
          (a.status === 200 || field(a.body, 'code') === 'invalid_state') &&
          vmStatus.get(op.vmId!) !== 'destroyed'
        ) {
          fail(op, `destroy answered ${a.status} but the VM is ${vmStatus.get(op.vmId!)}`);
        } else if (op.kind === 'cancel' && a.status === 200 && resStatus.get(op.resId!) !== 'cancelled') {
          fail(op, `cancel answered 200 but the reservation is ${resStatus.get(op.resId!)}`);
        }
      }
      const [coverage] = await q<{
        vms: number;
        started: number;
        interrupted: number;
        reservations: number;
        cancelled: number;
        periods: number;
        charges: number;
      }>(
        `SELECT (SELECT count(*) FROM vms)::int AS vms, (SELECT count(*) FROM vms WHERE first_started_at IS NOT NULL)::int AS started,
                (SELECT count(*) FROM interruptions)::int AS interrupted, (SELECT count(*) FROM reservations)::int AS reservations,
                (SELECT count(*) FROM reservations WHERE status = 'cancelled')::int AS cancelled, (SELECT count(*) FROM usage_logs)::int AS periods,
                (SELECT count(*) FROM transactions WHERE type = 'charge')::int AS charges`,
      );
      log(`database: ${JSON.stringify(coverage)}`);
      const labels = new Set(ops.filter((o) => o.kind === 'create').map((o) => o.label));
      for (const [label, rows] of vmsByLabel)
        if (!labels.has(label))
          failures.push(`VM(s) ${JSON.stringify(rows)} with label ${label} that no request asked for`);
      const descriptions = new Set(ops.filter((o) => o.kind === 'credit').map((o) => o.description));
      for (const [d, rows] of txByDescription)
        if (!descriptions.has(d))
          failures.push(`transaction(s) ${JSON.stringify(rows)} (${d}) that no request asked for`);
    } finally {
      await db.end();
    }

    // Clock advances do not honour Idempotency-Key: a retried advance whose first attempt had moved the clock moves
    // it again.
    const expectedClock = Date.parse(CLOCK_START) + (advanceSecondsIssued + 1) * 1000;
    stats.doubleAdvanceS = (finalClockMs - expectedClock) / 1000;
    if (stats.doubleAdvanceS !== 0) {
      notes.push(
        `POST /admin/clock/advance ignores Idempotency-Key: the clock ended ${stats.doubleAdvanceS} s past the sum of the advances asked for (retried advances applied twice)`,
      );
    }

    // ---------------- report ----------------
    const pendingOps = ops.filter((o) => o.attempts.some((a) => a.outcome === 'pending-conflict'));
    const pendingSpans = pendingOps
      .map((o) =>
        o.answeredMs === undefined
          ? `unanswered after ${Date.now() - o.firstSentMs}`
          : `${o.answeredMs - o.firstSentMs}`,
      )
      .sort((a, b) => a.length - b.length || a.localeCompare(b));
    log(
      `${CRASHES} crashes (${stats.crashes.count} after a number of requests, ${stats.crashes.timer} on a timer), ${stats.ops} requests, ${stats.inFlightAtCrash} in flight at a kill, ${stats.retried} answered only on a retry`,
    );
    log(`answers: ${JSON.stringify(Object.fromEntries([...stats.answers].sort()))}`);
    log(
      `idempotent retries answered by a replay of the first attempt: ${stats.retriedReplayed}; by a fresh execution: ${stats.retriedFresh}; replays checked: ${stats.replaysChecked}`,
    );
    log(
      `retries answered 400 conflict "still being processed": ${stats.pendingConflicts} answers over ${pendingOps.length} request(s); time from the first attempt to a real answer for those: ${pendingSpans.join(', ') || '-'} ms`,
    );
    log(
      `slowest request to a real answer: ${stats.maxAnswerMs} ms after its first attempt, ${stats.maxAfterCutMs} ms after the last crash that cut it (bound ${ANSWER_BOUND_MS} ms)`,
    );
    log(
      `other retries answered 4xx (the first attempt had applied, or the state moved on): ${JSON.stringify(Object.fromEntries(stats.retriedNonIdempotentRefused))}`,
    );
    log(
      `server starts: ${srv.starts}, start times ms: min ${Math.min(...srv.startMs)} max ${Math.max(...srv.startMs)} mean ${Math.round(srv.startMs.reduce((s, x) => s + x, 0) / srv.startMs.length)}`,
    );
    log(`crash phase ${crashesDoneMs} ms (${JSON.stringify(timing)}), total ${Date.now() - t0} ms`);
    for (const n of notes) log(`note: ${n}`);
    for (const op of pendingOps.slice(0, 5)) log(`pending-key example: ${describe(op)}`);
    failures.push(...srv.unexpectedExits);
    assert.deepEqual(failures, [], `${failures.length} failure(s) (seed ${SEED})`);
  },
);
