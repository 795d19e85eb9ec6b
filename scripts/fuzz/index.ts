/**
 * `runFuzz(options)`: fuzzes the API from its served OpenAPI document.
 *
 * Starts a server (unless given a URL), reads /openapi.json, sets up
 * identities and real objects, sends a seeded plan of valid and broken
 * requests (a few in flight at once), and checks every response against the
 * document: no 5xx, only documented statuses, bodies matching the documented
 * schemas.
 */
import { randomBytes } from 'node:crypto';
import { appendFileSync, writeFileSync } from 'node:fs';
import { Checker, FAILURE_KINDS, type Failure, type FailureKind, type SentRequest } from './checker.js';
import { HttpClient, type RawRequest, type RawResponse } from './http.js';
import { type OpenApiDoc, type Operation, parseOperations } from './openapi.js';
import { type AuthSpec, type IdentityName, type Planned, docFingerprint, ed25519Line, makePlan } from './plan.js';
import { FUZZ_ADMIN_EMAIL, type StartedServer, startServer } from './server.js';
import { type PoolKind, RawText, Ref, isPlainObject, resolveRefs, toJsonText } from './values.js';

export interface FuzzOptions {
  /** Planned requests to send (default 3000). */
  requests?: number;
  /** fast-check seed (default: random; printed for replay). */
  seed?: number;
  /** Which database the started server uses (default embedded). Ignored with `url`. */
  db?: 'embedded' | 'postgres';
  /** Fuzz a running server instead of starting one (needs its admin login). */
  url?: string;
  adminEmail?: string;
  adminPassword?: string;
  /** Requests in flight at most (default 8). */
  concurrency?: number;
  /** Only operations whose id ("POST /vms") contains this text. */
  only?: string;
  /** LOG_LEVEL of the started server (default silent); its output is kept for the report. */
  serverLogLevel?: string;
  databaseUrl?: string;
  timeoutMs?: number;
  /** Write every planned request and its response (shortened) to this file, one JSON object per line. */
  trace?: string;
  /** Progress lines (default: none). */
  log?: (line: string) => void;
}

export interface FuzzResult {
  requests: number;
  /** Every request sent, harness ones (setup, repairs) included. */
  checked: number;
  seed: number;
  db: string;
  counts: Record<FailureKind, number>;
  failures: Failure[];
  durationMs: number;
  /** The one-line summary: fuzz: requests=... 5xx=... undocumented=... schema_mismatch=... seed=... db=... */
  summary: string;
  /** Summary, examples per failure kind, the distinct causes and a replay hint. */
  report: string;
  ok: boolean;
  /** Status counts per operation. */
  statuses: Record<string, Record<string, number>>;
  /** The server's last output lines (started servers only). */
  serverOutput: string;
}

const PROTECTED_SWAP_UUID = '00000000-0000-4000-8000-00000000f00d';

interface PoolEntry {
  [field: string]: unknown;
}

class World {
  readonly pools: Record<PoolKind, PoolEntry[]> = {
    vm: [],
    sshkey: [],
    apikey: [],
    user: [],
    credential: [],
    node: [],
    reservation: [],
    refresh: [],
  };
  readonly protectedIds = {
    apikey: new Set<string>(),
    sshkey: new Set<string>(),
    user: new Set<string>(),
    node: new Set<string>(),
  };
  readonly tokens = new Map<IdentityName, string>();
  victimUser = 0;
  victimNode = '';

  add(kind: PoolKind, entry: PoolEntry): void {
    const pool = this.pools[kind];
    if (pool.length < 400) pool.push(entry);
  }

  lookup(r: Ref): unknown {
    const pool = this.pools[r.kind];
    if (!pool.length) return r.field === 'vmid' ? 999_999 : r.kind === 'user' ? 999_999 : PROTECTED_SWAP_UUID;
    return pool[r.index % pool.length]![r.field];
  }
}

function encodeText(s: string): string {
  try {
    return encodeURIComponent(s);
  } catch {
    // Lone surrogates: send what UTF-8 makes of them.
    return [...Buffer.from(s, 'utf8')]
      .map((b) =>
        /[A-Za-z0-9\-_.~]/.test(String.fromCharCode(b))
          ? String.fromCharCode(b)
          : `%${b.toString(16).toUpperCase().padStart(2, '0')}`,
      )
      .join('');
  }
}

/** The body's bytes; with `bytes`, those go at the start of its first string value (invalid UTF-8). */
function withBytes(text: string, bytes: number[] | undefined): Buffer {
  if (!bytes) return Buffer.from(text, 'utf8');
  const m = /:\s*"/.exec(text);
  if (!m) return Buffer.concat([Buffer.from('{"a":"'), Buffer.from(bytes), Buffer.from('"}')]);
  const at = m.index + m[0].length;
  return Buffer.concat([
    Buffer.from(text.slice(0, at), 'utf8'),
    Buffer.from(bytes),
    Buffer.from(text.slice(at), 'utf8'),
  ]);
}

/** A number as plain decimal digits (query values like 1e-7 are refused by the API's own rule). */
function plainNumber(n: number): string {
  if (!Number.isFinite(n)) return String(n);
  if (Number.isInteger(n)) return Math.abs(n) < 1e21 ? n.toFixed(0) : BigInt(n).toString();
  const s = String(n);
  return /e/i.test(s) ? n.toFixed(20).replace(/0+$/, '').replace(/\.$/, '') || '0' : s;
}

function paramText(v: unknown): string {
  if (v instanceof RawText) return v.text;
  if (typeof v === 'number') return encodeText(plainNumber(v));
  const s =
    typeof v === 'string'
      ? v
      : v === null || v === undefined
        ? ''
        : typeof v === 'object'
          ? JSON.stringify(v)
          : String(v);
  return encodeText(s);
}

function authLabel(a: AuthSpec): string {
  switch (a.kind) {
    case 'none':
      return 'anonymous';
    case 'as':
      return a.who;
    case 'tamper':
      return `${a.who}'s token, ${a.how}`;
    case 'raw':
      return `bogus credentials (${a.note})`;
  }
}

interface Built {
  raw: RawRequest;
  sent: SentRequest;
  resolvedBody: unknown;
}

class Fuzzer {
  readonly checker = new Checker();
  readonly world = new World();
  private readonly opsById = new Map<string, Operation>();
  private loginAt = 0;
  private clockNow = 0;
  readonly users: Record<'user' | 'other' | 'victim', { id: number; email: string; password: string }> = {
    user: { id: 0, email: '', password: '' },
    other: { id: 0, email: '', password: '' },
    victim: { id: 0, email: '', password: '' },
  };
  private setupNodes: Record<string, unknown>[] = [];
  private pricing: Record<string, unknown>[] = [];
  private harnessSeq = -1;

  constructor(
    readonly http: HttpClient,
    allOps: Operation[],
    /** The operations the plan's `op` indexes point into. */
    readonly ops: Operation[],
    readonly admin: { email: string; password: string },
    private readonly seed: number,
    private readonly log: (l: string) => void,
  ) {
    for (const op of allOps) this.opsById.set(op.id, op);
  }

  // ------------------------------------------------------------ harness calls

  /** A request of the harness itself (setup, repairs): checked like the others. */
  async call(
    opId: string,
    opts: {
      as?: IdentityName | 'none';
      params?: Record<string, string | number>;
      body?: unknown;
      query?: Record<string, string | number>;
    } = {},
  ): Promise<{ status: number; json: any; res: RawResponse }> {
    const op = this.opsById.get(opId);
    if (!op) throw new Error(`the document has no operation ${opId}`);
    const path = op.path.replace(/\{([^}]+)\}/g, (_, n: string) => encodeText(String(opts.params?.[n] ?? '')));
    const qs = opts.query
      ? '?' +
        Object.entries(opts.query)
          .map(([k, v]) => `${encodeText(k)}=${encodeText(String(v))}`)
          .join('&')
      : '';
    const headers: [string, string][] = [];
    const who = opts.as ?? 'none';
    if (who !== 'none') headers.push(['Authorization', `Bearer ${this.world.tokens.get(who) ?? ''}`]);
    let body: Buffer | undefined;
    if (opts.body !== undefined) {
      body = Buffer.from(JSON.stringify(opts.body));
      headers.push(['Content-Type', 'application/json']);
    }
    const raw: RawRequest = { method: op.method, path: path + qs, headers, body };
    const res = await this.http.send(raw);
    this.checker.check(
      {
        seq: this.harnessSeq--,
        op,
        method: op.method,
        url: raw.path,
        identity: who,
        input: 'harness (setup/repair)',
        bodyText: body?.toString() ?? '',
      },
      res,
    );
    let json: any;
    try {
      json = JSON.parse(res.body.toString('utf8'));
    } catch {
      json = undefined;
    }
    return { status: res.status, json, res };
  }

  private async must(opId: string, opts: Parameters<Fuzzer['call']>[1], what: string): Promise<any> {
    const r = await this.call(opId, opts);
    if (r.status < 200 || r.status >= 300) {
      throw new Error(
        `fuzz setup: ${what} (${opId}) answered ${r.status}: ${r.res.error ?? r.res.body.toString('utf8').slice(0, 300)}`,
      );
    }
    return r.json;
  }

  private async login(email: string, password: string): Promise<{ access: string; refresh: string }> {
    const j = await this.must('POST /auth/login', { body: { email, password } }, `login as ${email}`);
    if (typeof j?.access_token !== 'string')
      throw new Error(`fuzz setup: login as ${email} gave no access token (2FA?)`);
    return { access: j.access_token, refresh: j.refresh_token };
  }

  private async loginAll(): Promise<void> {
    this.world.tokens.set('admin', (await this.login(this.admin.email, this.admin.password)).access);
    this.world.tokens.set('user', (await this.login(this.users.user.email, this.users.user.password)).access);
    this.world.tokens.set('other', (await this.login(this.users.other.email, this.users.other.password)).access);
    this.loginAt = this.clockNow;
  }

  private async readClock(): Promise<void> {
    const r = await this.call('GET /admin/clock', { as: 'admin' });
    if (r.status === 200 && typeof r.json?.now === 'string') this.clockNow = Date.parse(r.json.now);
  }

  async setup(): Promise<void> {
    const w = this.world;
    const tag = randomBytes(4).toString('hex');
    this.world.tokens.set('admin', (await this.login(this.admin.email, this.admin.password)).access);
    await this.readClock();
    const account = await this.must('GET /account', { as: 'admin' }, 'read the admin account');
    w.protectedIds.user.add(String(account.id));
    w.add('user', { id: account.id, email: account.email });

    for (const who of ['user', 'other', 'victim'] as const) {
      const email = `fuzz-${who}-${tag}@example.com`;
      const password = `fuzz-${who}-password-${tag}`;
      const u = await this.must(
        'POST /auth/register',
        { body: { email, password, name: `Fuzz ${who}` } },
        `register the ${who}`,
      );
      this.users[who] = { id: u.id, email, password };
      w.add('user', { id: u.id, email });
      w.add('credential', { email, password });
      if (who !== 'victim') w.protectedIds.user.add(String(u.id));
    }
    w.victimUser = this.users.victim.id;
    await this.loginAll();

    await this.must(
      'POST /admin/users/{user_id}/credits',
      { as: 'admin', params: { user_id: this.users.user.id }, body: { amount: 100000 } },
      'credit the user',
    );
    await this.must(
      'POST /admin/users/{user_id}/credits',
      { as: 'admin', params: { user_id: this.users.other.id }, body: { amount: 5000 } },
      'credit the other user',
    );
    await this.must(
      'PATCH /admin/users/{user_id}',
      { as: 'admin', params: { user_id: this.users.user.id }, body: { max_vms: 40, max_gpus: 200 } },
      'raise the user limits',
    );

    for (const who of ['user', 'other'] as const) {
      const key = await this.must(
        'POST /ssh-keys',
        { as: who, body: { ssh_public_key: ed25519Line(randomBytes(32), `fuzz-${who}`), label: `fuzz ${who}` } },
        `add the ${who}'s SSH key`,
      );
      w.add('sshkey', { id: key.id });
      w.protectedIds.sshkey.add(key.id);
    }

    const nodes = [
      { node: `fz-4090-${tag}`, gpu_type: '4090', gpu_count: 8 },
      { node: `fz-5090-${tag}`, gpu_type: '5090', gpu_count: 8 },
      { node: `fz-pro-${tag}`, gpu_type: 'pro6000', gpu_count: 4 },
      { node: `fz-victim-${tag}`, gpu_type: '4090', gpu_count: 2 },
    ];
    for (const n of nodes) {
      const spec = {
        ...n,
        ram_gb: 256,
        cpu_cores: 64,
        cpu_model: 'AMD EPYC 7B13',
        pcie_gen: '4.0',
        max_storage_gb: 4000,
        location: 'Fuzzland',
        cluster_name: 'fuzz',
        status: 'active',
      };
      await this.must('POST /admin/nodes', { as: 'admin', body: spec }, `add node ${n.node}`);
      w.add('node', { node: n.node, gpu_type: n.gpu_type });
      if (!n.node.startsWith('fz-victim')) {
        w.protectedIds.node.add(n.node);
        const { node: _n, ...rest } = spec;
        this.setupNodes.push({ node: n.node, ...rest });
      } else {
        w.victimNode = n.node;
      }
    }

    for (const scope of ['read_write', 'read_only', 'billing_only'] as const) {
      const k = await this.must(
        'POST /api-keys',
        { as: 'user', body: { name: `fuzz ${scope}`, scope } },
        `create a ${scope} API key`,
      );
      w.tokens.set(scope === 'read_write' ? 'key_rw' : scope === 'read_only' ? 'key_ro' : 'key_billing', k.key);
      w.add('apikey', { id: k.id });
      w.protectedIds.apikey.add(k.id);
    }

    const vms: [IdentityName, Record<string, unknown>][] = [
      [
        'user',
        {
          node: nodes[0]!.node,
          gpu_type: '4090',
          gpu_count: 1,
          storage_gb: 100,
          template_vmid: 101,
          instance_label: 'fuzz-a',
        },
      ],
      [
        'user',
        {
          node: nodes[1]!.node,
          gpu_type: '5090',
          gpu_count: 2,
          storage_gb: 200,
          template_vmid: 100,
          rental_type: 'interruptible',
        },
      ],
      [
        'user',
        {
          node: nodes[2]!.node,
          gpu_type: 'pro6000',
          gpu_count: 1,
          storage_gb: 100,
          template_vmid: 102,
          rental_type: 'reserved',
          reservation_months: 1,
        },
      ],
      [
        'user',
        {
          node: nodes[0]!.node,
          gpu_type: '4090',
          gpu_count: 1,
          storage_gb: 50,
          template_vmid: 104,
          auth_method: 'password',
          password: 'fuzz-vm-password-1',
        },
      ],
      ['other', { node: nodes[0]!.node, gpu_type: '4090', gpu_count: 1, storage_gb: 50, template_vmid: 101 }],
    ];
    for (const [who, body] of vms) {
      const vm = await this.must('POST /vms', { as: who, body }, `create a VM for the ${who}`);
      this.learnVm(vm);
    }
    const prices = await this.must('GET /admin/pricing', { as: 'admin' }, 'read the prices');
    if (Array.isArray(prices)) this.pricing = prices;
    await this.call('POST /admin/clock/advance', { as: 'admin', body: { seconds: 30 } });
    await this.readClock();
    // Stop one VM so that start has something to start.
    await this.call('POST /vms/{vm_id}/stop', { as: 'user', params: { vm_id: String(w.pools.vm[0]!.id) } });
    await this.call('POST /admin/clock/advance', { as: 'admin', body: { seconds: 5 } });
  }

  private learnVm(vm: any): void {
    if (!vm || typeof vm.id !== 'string') return;
    this.world.add('vm', { id: vm.id, vmid: vm.vmid });
    if (typeof vm.reservation_id === 'string') this.world.add('reservation', { id: vm.reservation_id });
  }

  /** Puts back what fuzzed admin calls may have changed, and moves the clock a little. */
  async repair(cycle: number): Promise<void> {
    const u = this.users;
    await this.readClock();
    if (this.clockNow - this.loginAt > 1800_000) await this.loginAll();
    for (const who of ['user', 'other'] as const) {
      await this.call('PATCH /admin/users/{user_id}', {
        as: 'admin',
        params: { user_id: u[who].id },
        body: {
          role: 'user',
          suspended: false,
          max_vms: who === 'user' ? 40 : null,
          max_gpus: who === 'user' ? 200 : null,
        },
      });
    }
    for (const n of this.setupNodes) {
      const { node, ...spec } = n;
      await this.call('PATCH /admin/nodes/{node}', { as: 'admin', params: { node: String(node) }, body: spec });
      const now = await this.call('GET /admin/nodes/{node}', { as: 'admin', params: { node: String(node) } });
      if (now.status === 200 && now.json?.agent_url != null) {
        await this.call('PATCH /admin/nodes/{node}', {
          as: 'admin',
          params: { node: String(node) },
          body: { agent_url: null },
        });
      }
      for (const action of ['provision', 'start', 'stop', 'destroy']) {
        await this.call('POST /admin/simulator/faults', { as: 'admin', body: { node, action, count: 0 } });
      }
    }
    for (const p of this.pricing) {
      const { gpu_type, updated_at: _u, ...rest } = p;
      const body: Record<string, unknown> = {};
      for (const k of [
        'gpu_ram_mb',
        'gpu_price_hourly',
        'interruptible_rate',
        'storage_price_gb_hourly',
        'reserved_discount_1mo',
        'reserved_discount_3mo',
        'reserved_discount_6mo',
      ]) {
        if (k in rest) body[k] = rest[k];
      }
      await this.call('PUT /admin/pricing/{gpu_type}', { as: 'admin', params: { gpu_type: String(gpu_type) }, body });
    }
    const bal = await this.call('GET /billing/balance', { as: 'user' });
    if (bal.status === 200 && typeof bal.json?.balance === 'number' && bal.json.balance < 20000) {
      await this.call('POST /admin/users/{user_id}/credits', {
        as: 'admin',
        params: { user_id: u.user.id },
        body: { amount: 100000 },
      });
    }
    // Keep a couple of live VMs around to act on.
    const live = await this.call('GET /vms', { as: 'user', query: { limit: 100 } });
    if (live.status === 200 && Array.isArray(live.json) && live.json.length < 3) {
      const node = this.setupNodes[cycle % this.setupNodes.length]!;
      const r = await this.call('POST /vms', {
        as: 'user',
        body: { node: node.node, gpu_type: node.gpu_type, gpu_count: 1, storage_gb: 60, template_vmid: 100 },
      });
      if (r.status === 201) this.learnVm(r.json);
    }
    // A small, seed-determined step of the clock.
    const seconds = 1 + (((this.seed ^ (cycle * 2654435761)) >>> 0) % 300);
    await this.call('POST /admin/clock/advance', { as: 'admin', body: { seconds } });
  }

  // ------------------------------------------------------------ planned requests

  build(p: Planned): Built {
    const op = this.ops[p.op]!;
    const lookup = (r: Ref) => this.world.lookup(r);
    const notes: string[] = [];
    const pathValues: Record<string, unknown> = {};
    for (const prm of op.pathParams) {
      let v = resolveRefs(p.path[prm.name], lookup);
      v = this.protect(op, prm.name, v, notes);
      pathValues[prm.name] = v;
    }
    const path = op.path.replace(/\{([^}]+)\}/g, (_, n: string) => {
      const t = paramText(pathValues[n]);
      return t === '' ? 'empty' : t;
    });
    let qs = '';
    if (p.query.kind === 'raw') qs = p.query.text;
    else qs = p.query.entries.map(([k, v]) => `${encodeText(k)}=${paramText(resolveRefs(v, lookup))}`).join('&');
    const url = qs ? `${path}?${qs}` : path;

    const headers: [string, string][] = [];
    const auth = this.authHeader(p.auth);
    if (auth !== undefined) headers.push(['Authorization', auth]);
    headers.push(...p.headers);
    let body: Buffer | undefined;
    let bodyText = '';
    let resolvedBody: unknown;
    if (p.body.kind === 'json') {
      resolvedBody = resolveRefs(p.body.value, lookup);
      bodyText = toJsonText(resolvedBody);
      if (p.body.duplicateKey !== undefined)
        bodyText = bodyText.replace(/^\{/, `{${JSON.stringify(p.body.duplicateKey)}:[[["dup"]]],`);
      body = withBytes(bodyText, p.body.injectBytes);
      if (p.body.contentType !== null) headers.push(['Content-Type', p.body.contentType]);
    } else if (p.body.kind === 'raw') {
      bodyText = p.body.text;
      body = withBytes(bodyText, p.body.bytes);
      if (p.body.contentType !== null) headers.push(['Content-Type', p.body.contentType]);
    }
    if (body && body.length !== Buffer.byteLength(bodyText)) bodyText = body.toString('latin1');
    const input =
      (p.mode === 'valid' ? 'valid' : `invalid: ${p.note}`) + (notes.length ? ` (${notes.join('; ')})` : '');
    return {
      raw: { method: op.method, path: url, headers, body },
      sent: { seq: p.seq, op, method: op.method, url, identity: authLabel(p.auth), input, bodyText },
      resolvedBody,
    };
  }

  /** Keeps the run's own identities and fixtures alive: destructive calls on them go to victims. */
  private protect(op: Operation, name: string, v: unknown, notes: string[]): unknown {
    const w = this.world;
    const s = String(v);
    if (op.id === 'DELETE /api-keys/{key_id}' && w.protectedIds.apikey.has(s)) {
      notes.push('a protected API key id was swapped for an unknown one');
      return PROTECTED_SWAP_UUID;
    }
    if (op.id === 'DELETE /ssh-keys/{key_id}' && w.protectedIds.sshkey.has(s)) {
      notes.push('a protected SSH key id was swapped for an unknown one');
      return PROTECTED_SWAP_UUID;
    }
    if (op.id === 'PATCH /admin/users/{user_id}' && name === 'user_id' && w.protectedIds.user.has(s)) {
      notes.push('a protected user id was swapped for the victim user');
      return w.victimUser;
    }
    if (op.id === 'DELETE /admin/nodes/{node}' && w.protectedIds.node.has(s)) {
      notes.push('a protected node was swapped for the victim node');
      return w.victimNode;
    }
    return v;
  }

  private authHeader(a: AuthSpec): string | undefined {
    switch (a.kind) {
      case 'none':
        return undefined;
      case 'raw':
        return a.header;
      case 'as':
        return `Bearer ${this.world.tokens.get(a.who) ?? ''}`;
      case 'tamper': {
        const t = this.world.tokens.get(a.who) ?? '';
        switch (a.how) {
          case 'lowercase-scheme':
            return `bearer ${t}`;
          case 'append':
            return `Bearer ${t}x`;
          case 'truncate':
            return `Bearer ${t.slice(0, -3)}`;
          case 'double-space':
            return `Bearer  ${t}`;
          case 'no-scheme':
            return t;
          case 'basic':
            return `Basic ${t}`;
          case 'two-tokens':
            return `Bearer ${t} ${t}`;
        }
      }
    }
    return undefined;
  }

  /** Remembers what a successful call created, for later requests to use. */
  learn(op: Operation, res: RawResponse, resolvedBody: unknown): void {
    if (res.status < 200 || res.status >= 300) return;
    let j: any;
    try {
      j = JSON.parse(res.body.toString('utf8'));
    } catch {
      return;
    }
    const w = this.world;
    switch (op.id) {
      case 'POST /vms':
        this.learnVm(j);
        break;
      case 'POST /ssh-keys':
        if (typeof j?.id === 'string') w.add('sshkey', { id: j.id });
        break;
      case 'POST /api-keys':
        if (typeof j?.id === 'string') w.add('apikey', { id: j.id });
        break;
      case 'POST /auth/register':
        if (typeof j?.id === 'number') {
          w.add('user', { id: j.id, email: j.email });
          if (isPlainObject(resolvedBody) && typeof resolvedBody.password === 'string')
            w.add('credential', { email: resolvedBody.email, password: resolvedBody.password });
        }
        break;
      case 'POST /auth/login':
      case 'POST /auth/refresh':
      case 'POST /auth/2fa/verify':
        if (typeof j?.refresh_token === 'string') w.add('refresh', { token: j.refresh_token });
        break;
      case 'POST /admin/nodes':
        if (typeof j?.node === 'string') w.add('node', { node: j.node, gpu_type: j.gpu_type });
        break;
    }
  }

  async runPlanned(plan: Planned[], concurrency: number, repairEvery: number, server?: StartedServer): Promise<void> {
    let next = 0;
    let cycle = 0;
    const started = performance.now();
    for (let start = 0; start < plan.length; start += repairEvery) {
      const end = Math.min(plan.length, start + repairEvery);
      next = start;
      const worker = async () => {
        for (;;) {
          const i = next++;
          if (i >= end) return;
          const p = plan[i]!;
          const b = this.build(p);
          const res = await this.http.send(b.raw);
          if (res.status === -1) {
            this.skipped++;
            continue;
          }
          this.sent++;
          const failed = this.checker.check(b.sent, res);
          this.learn(b.sent.op, res, b.resolvedBody);
          if (res.status === 401 && p.auth.kind === 'as' && SESSION_IDENTITIES.has(p.auth.who))
            await this.relogin(p.auth.who);
          this.trace?.({
            seq: p.seq,
            op: b.sent.op.id,
            identity: b.sent.identity,
            input: b.sent.input,
            url: b.sent.url.slice(0, 300),
            status: res.status,
            request: b.sent.bodyText.slice(0, 300),
            response: res.error ?? res.body.toString('utf8').slice(0, 300),
            failed: failed.map((f) => f.kind),
          });
        }
      };
      await Promise.all(Array.from({ length: concurrency }, worker));
      if (server?.exited()) {
        this.log(`fuzz: the server ${server.exited()} after ${end} requests`);
        break;
      }
      if (end < plan.length) await this.repair(cycle++);
      this.log(
        `fuzz: ${end}/${plan.length} requests, ${((performance.now() - started) / 1000).toFixed(1)} s, failures ${FAILURE_KINDS.map((k) => `${k}=${this.checker.counts[k]}`).join(' ')}`,
      );
    }
  }

  sent = 0;
  skipped = 0;
  trace: ((entry: Record<string, unknown>) => void) | undefined;
  private relogins = new Map<IdentityName, Promise<void>>();

  /**
   * A session identity got 401: something (logout-all, a password change, a
   * role change) ended its sessions. Log in again, once for all the requests
   * that noticed.
   */
  private relogin(who: IdentityName): Promise<void> {
    const pending = this.relogins.get(who);
    if (pending) return pending;
    const creds = who === 'admin' ? this.admin : who === 'user' ? this.users.user : this.users.other;
    const p = this.login(creds.email, creds.password)
      .then(({ access }) => {
        this.world.tokens.set(who, access);
      })
      .catch((e: Error) => this.log(`fuzz: could not log in again as ${who}: ${e.message}`))
      .finally(() => setTimeout(() => this.relogins.delete(who), 0));
    this.relogins.set(who, p);
    return p;
  }
}

const SESSION_IDENTITIES = new Set<IdentityName>(['admin', 'user', 'other']);

// ---------------------------------------------------------------- report

function pickExamples(failures: Failure[], kind: FailureKind, max: number): Failure[] {
  const of = failures.filter((f) => f.kind === kind);
  const byGroup = new Map<string, Failure[]>();
  for (const f of of) byGroup.set(f.group, [...(byGroup.get(f.group) ?? []), f]);
  const out: Failure[] = [];
  // One per distinct cause first, then more of the same.
  for (let round = 0; out.length < max && round < max; round++) {
    for (const fs of byGroup.values()) {
      if (out.length >= max) break;
      if (fs[round]) out.push(fs[round]!);
    }
  }
  return out;
}

function causes(failures: Failure[], kind: FailureKind): string[] {
  const byGroup = new Map<string, { n: number; f: Failure }>();
  for (const f of failures.filter((x) => x.kind === kind)) {
    const g = byGroup.get(f.group);
    if (g) g.n++;
    else byGroup.set(f.group, { n: 1, f });
  }
  return [...byGroup.values()]
    .sort((a, b) => b.n - a.n)
    .map(
      ({ n, f }) =>
        `    ${String(n).padStart(4)} x ${f.op} -> ${f.status}${f.group.split('|')[3] ? ` [${f.group.split('|')[3]}]` : ''}`,
    );
}

export function formatReport(
  r: Omit<FuzzResult, 'report' | 'summary' | 'ok'> & { summary: string },
  replay: string,
): string {
  const lines = [r.summary];
  for (const kind of FAILURE_KINDS) {
    if (!r.counts[kind]) continue;
    lines.push('', `${kind}: ${r.counts[kind]} (distinct causes: kind, operation, status, code or first schema error)`);
    lines.push(...causes(r.failures, kind));
    lines.push(`  examples:`);
    pickExamples(r.failures, kind, 10).forEach((f, i) => {
      lines.push(
        `  ${i + 1}. ${f.method} ${f.url} -> ${f.status}   as ${f.identity}   #${f.seq < 0 ? 'harness' : f.seq}`,
      );
      lines.push(`     input:    ${f.input}`);
      if (f.requestBody) lines.push(`     request:  ${f.requestBody}`);
      lines.push(`     response: ${f.response}`);
      if (f.detail)
        lines.push(...f.detail.split('\n').map((d) => `     ${kind === 'undocumented' ? '' : 'problem:  '}${d}`));
    });
  }
  if (!FAILURE_KINDS.every((k) => r.counts[k] === 0)) lines.push('', `replay: ${replay}`);
  return lines.join('\n');
}

// ---------------------------------------------------------------- entry

export async function runFuzz(options: FuzzOptions = {}): Promise<FuzzResult> {
  const requests = options.requests ?? 3000;
  const seed = options.seed ?? randomBytes(4).readUInt32BE(0) >>> 1;
  const concurrency = options.concurrency ?? 8;
  const log = options.log ?? (() => {});
  const dbLabel = options.url ? 'external' : (options.db ?? 'embedded');
  const t0 = performance.now();

  let server: StartedServer | undefined;
  let baseUrl = options.url;
  let admin = {
    email: options.adminEmail ?? process.env.GPUCLOUD_ADMIN_EMAIL ?? FUZZ_ADMIN_EMAIL,
    password: options.adminPassword ?? process.env.GPUCLOUD_ADMIN_PASSWORD ?? '',
  };
  if (!baseUrl) {
    log(`fuzz: starting a server (${dbLabel})`);
    server = await startServer({
      db: options.db ?? 'embedded',
      databaseUrl: options.databaseUrl,
      logLevel: options.serverLogLevel,
    });
    baseUrl = server.url;
    admin = { email: server.adminEmail, password: server.adminPassword };
    log(`fuzz: server at ${baseUrl} after ${((performance.now() - t0) / 1000).toFixed(1)} s`);
  }
  const http = new HttpClient(baseUrl, concurrency, options.timeoutMs ?? 30_000);
  try {
    const docRes = await http.send({ method: 'GET', path: '/openapi.json', headers: [], body: undefined });
    if (docRes.status !== 200)
      throw new Error(
        `GET /openapi.json answered ${docRes.status}: ${docRes.error ?? docRes.body.toString('utf8').slice(0, 200)}`,
      );
    const doc = JSON.parse(docRes.body.toString('utf8')) as OpenApiDoc;
    const allOps = parseOperations(doc);
    const ops = options.only ? allOps.filter((o) => o.id.includes(options.only!)) : allOps;
    if (!ops.length) throw new Error(`no operation matches --only ${options.only}`);
    const plan = makePlan(ops, seed, requests);
    log(
      `fuzz: ${ops.length} operations (document ${docFingerprint(ops)}), ${plan.filter((p) => p.mode === 'invalid').length} of ${plan.length} requests invalid, seed ${seed}`,
    );

    const fz = new Fuzzer(http, allOps, ops, admin, seed, log);
    if (options.trace) {
      const file = options.trace;
      writeFileSync(file, '');
      fz.trace = (e) => appendFileSync(file, JSON.stringify(e) + '\n');
    }
    await fz.setup();
    log(`fuzz: setup done after ${((performance.now() - t0) / 1000).toFixed(1)} s`);
    await fz.runPlanned(plan, concurrency, 250, server);
    if (server?.exited()) {
      fz.checker.counts['5xx']++;
      fz.checker.failures.push({
        kind: '5xx',
        op: '(server)',
        method: '-',
        url: '-',
        status: 0,
        identity: '-',
        input: '-',
        requestBody: '',
        seq: -1,
        response: server.output().slice(-1500),
        detail: `the server ${server.exited()} during the run`,
        group: '5xx|(server)|0|exit',
      });
    }

    const counts = fz.checker.counts;
    const durationMs = performance.now() - t0;
    const summary = `fuzz: requests=${fz.sent} 5xx=${counts['5xx']} undocumented=${counts.undocumented} schema_mismatch=${counts.schema_mismatch} seed=${seed} db=${dbLabel}`;
    const statuses: Record<string, Record<string, number>> = {};
    for (const [op, m] of fz.checker.seen)
      statuses[op] = Object.fromEntries([...m.entries()].map(([s, n]) => [String(s), n]));
    const replayArgs = [
      `--requests ${requests}`,
      `--seed ${seed}`,
      options.url ? `--url ${options.url}` : `--db ${dbLabel}`,
      options.only ? `--only '${options.only}'` : '',
      concurrency !== 8 ? `--concurrency ${concurrency}` : '',
    ]
      .filter(Boolean)
      .join(' ');
    const base = {
      requests: fz.sent,
      checked: fz.checker.checked,
      seed,
      db: dbLabel,
      counts: { ...counts },
      failures: fz.checker.failures,
      durationMs,
      statuses,
      serverOutput: server?.output() ?? '',
      summary,
    };
    const report = formatReport(
      base,
      `npm run fuzz -- ${replayArgs}   (the same requests in the same order; --concurrency 1 also fixes the order in which they land)`,
    );
    log(
      `fuzz: ${fz.sent} requests (+${fz.checker.checked - fz.sent} of setup/repair${fz.skipped ? `, ${fz.skipped} the client could not send` : ''}) in ${(durationMs / 1000).toFixed(1)} s` +
        (http.retries ? `; ${http.retries} sent again after the server closed a keep-alive connection under them` : ''),
    );
    return { ...base, report, ok: FAILURE_KINDS.every((k) => counts[k] === 0) };
  } finally {
    http.close();
    await server?.stop();
  }
}

export { FAILURE_KINDS };
export type { Failure, FailureKind };
