/**
 * The fuzzer's own requests: setup (identities, credit, nodes, API keys, VMs)
 * and the repairs between batches that put back what fuzzed admin calls
 * changed. Each is checked against the document like a planned request.
 */
import { randomBytes } from 'node:crypto';
import { Checker } from './checker.js';
import type { HttpClient, RawRequest, RawResponse } from './http.js';
import type { Operation } from './openapi.js';
import { ed25519Line } from './overrides.js';
import type { IdentityName } from './plan.js';
import { encodeText } from './encode.js';
import { World } from './world.js';

export class Harness {
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
    protected readonly log: (l: string) => void,
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

  private async must(opId: string, opts: Parameters<Harness['call']>[1], what: string): Promise<any> {
    const r = await this.call(opId, opts);
    if (r.status < 200 || r.status >= 300) {
      throw new Error(
        `fuzz setup: ${what} (${opId}) answered ${r.status}: ${r.res.error ?? r.res.body.toString('utf8').slice(0, 300)}`,
      );
    }
    return r.json;
  }

  protected async login(email: string, password: string): Promise<{ access: string; refresh: string }> {
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

  protected learnVm(vm: any): void {
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
}
