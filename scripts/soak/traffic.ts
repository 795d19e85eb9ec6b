/**
 * Setup over HTTP (admin login, nodes, users with credits, SSH keys, tokens
 * and API keys) and the mixed traffic: one call of Traffic.run() per
 * scheduled start picks an operation by weight.
 *
 * VMs go through create -> stop -> start -> destroy cycles. The client keeps
 * what it last saw of each of its VMs (from GET /vms and GET /vms/{id}, which
 * are part of the mix) and a mutation slot acts on a VM whose status allows
 * the next step, or creates one while the user has fewer live VMs than the
 * bound (and its max_vms / max_gpus allow). A read started before the last
 * mutation of a VM answered is ignored for that VM, so stale reads never make
 * the client send a step the VM is not ready for.
 */
import { execFileSync } from 'node:child_process';
import { randomBytes, randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { errorCode, httpCall, must, nextRequestId, type Reply } from './client.js';
import type { SoakStats } from './stats.js';

/**
 * A VM in one of these for longer than this is reported as stuck (an error: the reconciler should move it in
 * seconds).
 */
export const STUCK_AFTER_MS = 60_000;
const TRANSITIONAL = new Set(['creating', 'starting', 'stopping', 'unknown']);

export interface TrackedVm {
  id: string;
  status: string;
  /** 0: created (stop next), 1: stopped once (start next), 2: restarted (destroy next). */
  step: 0 | 1 | 2;
  busy: boolean;
  gpus: number;
  /**
   * performance.now() of the last status change, of the last mutation's answer, of the start of the last read
   * applied.
   */
  statusSince: number;
  mutatedAt: number;
  observedAt: number;
  /** A start was refused (no free GPUs, balance): destroy it instead. */
  startRefused: boolean;
  stuckReported: boolean;
}

export interface SoakUser {
  idx: number;
  id: number;
  email: string;
  password: string;
  token: string;
  apiKey: string;
  sshKeyId: string;
  maxLive: number;
  maxGpus: number;
  vms: Map<string, TrackedVm>;
  /** VMs destroyed or failed: never tracked again when a list still shows them. */
  forgotten: Set<string>;
  creating: number;
  creatingGpus: number;
}

export interface SoakNode {
  node: string;
  gpu_type: '4090' | '5090' | 'pro6000';
  gpu_count: number;
  max_storage_gb: number;
}

export interface World {
  base: string;
  runId: string;
  adminToken: string;
  users: SoakUser[];
  nodes: SoakNode[];
}

export interface SetupOptions {
  adminEmail: string;
  adminPassword: string;
  users: number;
  vmsPerUser: number;
  timeoutMs: number;
  tmpDir: string;
}

interface TokenPair {
  access_token?: string;
  refresh_token?: string;
}

export async function setup(base: string, o: SetupOptions, log: (s: string) => void): Promise<World> {
  const t = o.timeoutMs;
  const runId = randomBytes(3).toString('hex');
  const login = async (email: string, password: string): Promise<TokenPair> => {
    const p = await must<TokenPair>(base, 'POST', '/auth/login', { body: { email, password }, timeoutMs: t });
    if (!p.access_token || !p.refresh_token)
      throw new Error(`POST /auth/login for ${email}: no token pair (two-factor on?)`);
    return p;
  };
  const adminToken = (await login(o.adminEmail, o.adminPassword)).access_token!;
  const nodes: SoakNode[] = [
    { node: `soak-${runId}-a`, gpu_type: '4090', gpu_count: 8, max_storage_gb: 2000 },
    { node: `soak-${runId}-b`, gpu_type: '4090', gpu_count: 4, max_storage_gb: 2000 },
    { node: `soak-${runId}-c`, gpu_type: '5090', gpu_count: 8, max_storage_gb: 2000 },
    { node: `soak-${runId}-d`, gpu_type: 'pro6000', gpu_count: 4, max_storage_gb: 4000 },
  ];
  for (const n of nodes) {
    await must(base, 'POST', '/admin/nodes', {
      token: adminToken,
      timeoutMs: t,
      body: {
        ...n,
        ram_gb: 512,
        cpu_cores: 128,
        cpu_model: 'Soak EPYC',
        pcie_gen: '4.0',
        location: 'soak',
        cluster_name: `soak-${runId}`,
      },
    });
  }
  const users: SoakUser[] = [];
  for (let i = 0; i < o.users; i++) {
    const email = `soak-${runId}-${i}@example.com`;
    const password = `soak-pw-${randomBytes(9).toString('hex')}`;
    const acct = await must<{ id: number }>(base, 'POST', '/auth/register', {
      body: { email, password, name: `Soak ${i}` },
      timeoutMs: t,
    });
    await must(base, 'POST', `/admin/users/${acct.id}/credits`, {
      token: adminToken,
      body: { amount: 10_000, description: 'soak test credit' },
      timeoutMs: t,
    });
    const admView = await must<{ max_vms: number | null; max_gpus: number | null }>(
      base,
      'GET',
      `/admin/users/${acct.id}`,
      { token: adminToken, timeoutMs: t },
    );
    const keyFile = join(o.tmpDir, `id_ed25519_${i}`);
    execFileSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-C', `soak-${i}`, '-f', keyFile]);
    const pair = await login(email, password);
    const sshKey = await must<{ id: string }>(base, 'POST', '/ssh-keys', {
      token: pair.access_token,
      body: { ssh_public_key: readFileSync(`${keyFile}.pub`, 'utf8').trim(), label: `soak-${i}` },
      timeoutMs: t,
    });
    const apiKey = await must<{ key: string }>(base, 'POST', '/api-keys', {
      token: pair.access_token,
      body: { name: `soak-${i}`, scope: 'read_only' },
      timeoutMs: t,
    });
    // The server's defaults when null: 10 VMs, 16 GPUs (D-limits, GET /admin/users/{id}).
    const maxVms = admView.max_vms ?? 10;
    const maxGpus = admView.max_gpus ?? 16;
    users.push({
      idx: i,
      id: acct.id,
      email,
      password,
      token: pair.access_token!,
      apiKey: apiKey.key,
      sshKeyId: sshKey.id,
      maxLive: Math.min(o.vmsPerUser, maxVms, 10),
      maxGpus,
      vms: new Map(),
      forgotten: new Set(),
      creating: 0,
      creatingGpus: 0,
    });
  }
  log(
    `setup: run ${runId}: ${nodes.length} nodes (${nodes.reduce((s, n) => s + n.gpu_count, 0)} GPUs), ${users.length} users with 10000 credit, an SSH key and a read_only API key each`,
  );
  return { base, runId, adminToken, users, nodes };
}

export type OpKind =
  | 'search'
  | 'pricing'
  | 'list_vms'
  | 'get_vm'
  | 'balance'
  | 'transactions'
  | 'current_spend'
  | 'login_refresh'
  | 'vm_mutation';

/** The mix, in percent of scheduled starts. A mutation slot with nothing to do polls a VM instead. */
export const MIX: [OpKind, number][] = [
  ['search', 12],
  ['pricing', 8],
  ['list_vms', 12],
  ['get_vm', 14],
  ['balance', 10],
  ['transactions', 8],
  ['current_spend', 8],
  ['login_refresh', 4],
  ['vm_mutation', 24],
];

const pick = <T>(xs: readonly T[]): T => xs[Math.floor(Math.random() * xs.length)]!;

interface VmBody {
  id: string;
  status: string;
  gpu_count: number;
}

type Expect = (status: number, code: string | undefined) => boolean;
const none: Expect = () => false;
const codes =
  (...cs: string[]): Expect =>
  (status, code) =>
    status >= 400 && status < 500 && code !== undefined && cs.includes(code);

export class Traffic {
  creates = 0;
  cycles = 0;
  failedVms = 0;
  private readonly total = MIX.reduce((s, [, w]) => s + w, 0);

  constructor(
    private readonly w: World,
    private readonly stats: SoakStats,
    private readonly timeoutMs: number,
  ) {}

  pickOp(): OpKind {
    let r = Math.random() * this.total;
    for (const [k, wt] of MIX) {
      if ((r -= wt) < 0) return k;
    }
    return 'get_vm';
  }

  async run(kind: OpKind, scheduledAt: number): Promise<void> {
    switch (kind) {
      case 'search': {
        const q = pick([
          '',
          '?gpu_type=4090',
          '?gpu_type=5090&min_gpus=2',
          '?rental_type=interruptible',
          '?max_price=1&limit=10',
          '?gpu_type=pro6000&rental_type=reserved',
        ]);
        await this.call('GET /search', 'GET', `/search${q}`, undefined, undefined, scheduledAt, 200);
        return;
      }
      case 'pricing':
        await this.call('GET /pricing', 'GET', '/pricing', undefined, undefined, scheduledAt, 200);
        return;
      case 'list_vms':
        return this.listVms(pick(this.w.users), scheduledAt);
      case 'get_vm':
        return this.poll(scheduledAt);
      case 'balance':
        await this.call(
          'GET /billing/balance',
          'GET',
          '/billing/balance',
          this.readAuth(pick(this.w.users)),
          undefined,
          scheduledAt,
          200,
        );
        return;
      case 'transactions':
        await this.call(
          'GET /billing/transactions',
          'GET',
          `/billing/transactions?limit=${pick([10, 50, 100])}`,
          this.readAuth(pick(this.w.users)),
          undefined,
          scheduledAt,
          200,
        );
        return;
      case 'current_spend':
        await this.call(
          'GET /billing/current-spend',
          'GET',
          '/billing/current-spend',
          this.readAuth(pick(this.w.users)),
          undefined,
          scheduledAt,
          200,
        );
        return;
      case 'login_refresh':
        return this.loginRefresh(pick(this.w.users), scheduledAt);
      case 'vm_mutation':
        return this.mutate(scheduledAt);
    }
  }

  /** Half the reads with the user's JWT, half with its read_only API key. */
  private readAuth(u: SoakUser): string {
    return Math.random() < 0.5 ? u.token : u.apiKey;
  }

  /**
   * One request, recorded with its latency from `startedAt` (the scheduled
   * start for the first request of an operation, so that waiting for a free
   * slot counts too). Returns the answer when it was the success status or an
   * expected business refusal, undefined when it was an error.
   */
  private async call(
    endpoint: string,
    method: string,
    path: string,
    token: string | undefined,
    body: unknown,
    startedAt: number,
    ok: number,
    expected: Expect = none,
    headers?: Record<string, string>,
  ): Promise<Reply | undefined> {
    const requestId = nextRequestId();
    let r: Reply;
    try {
      r = await httpCall(this.w.base, method, path, { token, body, headers, timeoutMs: this.timeoutMs, requestId });
    } catch (err) {
      const e = err as Error & { cause?: { code?: string; message?: string } };
      const what =
        e.name === 'TimeoutError'
          ? `timeout after ${this.timeoutMs} ms`
          : `${e.message}${e.cause ? ` (${e.cause.code ?? e.cause.message})` : ''}`;
      this.stats.record(endpoint, performance.now() - startedAt, 'error');
      this.stats.error(
        `${endpoint} network: ${e.name === 'TimeoutError' ? 'timeout' : (e.cause?.code ?? e.message)}`,
        requestId,
        `${method} ${path}: ${what}`,
      );
      return undefined;
    }
    const ms = performance.now() - startedAt;
    const code = errorCode(r);
    if (r.status === ok) {
      this.stats.record(endpoint, ms, 'ok');
      return r;
    }
    if (expected(r.status, code)) {
      this.stats.record(endpoint, ms, 'expected', code);
      return r;
    }
    this.stats.record(endpoint, ms, 'error');
    this.stats.error(
      `${endpoint} ${r.status} ${code ?? ''}`.trim(),
      requestId,
      `${method} ${path} -> ${r.status} ${r.text.slice(0, 400)}`,
    );
    return undefined;
  }

  // ---- what the client knows of its VMs ----

  private observe(u: SoakUser, v: VmBody, readStart: number): void {
    let t = u.vms.get(v.id);
    if (!t) {
      // A VM we do not track: one whose create timed out but happened. Track it so limits stay right.
      if (u.forgotten.has(v.id) || v.status === 'destroyed' || v.status === 'failed') return;
      t = {
        id: v.id,
        status: v.status,
        step: v.status === 'stopped' ? 1 : 0,
        busy: false,
        gpus: v.gpu_count,
        statusSince: readStart,
        mutatedAt: 0,
        observedAt: 0,
        startRefused: false,
        stuckReported: false,
      };
      u.vms.set(v.id, t);
    }
    if (readStart <= t.mutatedAt || readStart <= t.observedAt) return; // stale
    t.observedAt = readStart;
    if (v.status !== t.status) {
      t.status = v.status;
      t.statusSince = performance.now();
    }
    if (v.status === 'destroyed') this.forget(u, t);
    else if (v.status === 'failed') {
      this.failedVms++;
      this.forget(u, t);
      this.stats.error('VM failed', '', `VM ${v.id} of user ${u.id} ended "failed" (no simulator fault was armed)`);
    }
  }

  private forget(u: SoakUser, t: TrackedVm): void {
    u.vms.delete(t.id);
    u.forgotten.add(t.id);
  }

  private async listVms(u: SoakUser, startedAt: number): Promise<void> {
    const readStart = performance.now();
    const r = await this.call('GET /vms', 'GET', '/vms?limit=100', this.readAuth(u), undefined, startedAt, 200);
    if (!r) return;
    if (!Array.isArray(r.body)) {
      this.stats.error('GET /vms bad body', r.requestId, `not an array: ${r.text.slice(0, 200)}`);
      return;
    }
    for (const v of r.body as VmBody[]) this.observe(u, v, readStart);
  }

  private async poll(startedAt: number): Promise<void> {
    const all = this.w.users.flatMap((u) => [...u.vms.values()].map((vm) => ({ u, vm })));
    const moving = all.filter((x) => TRANSITIONAL.has(x.vm.status));
    const chosen = moving.length && Math.random() < 0.8 ? pick(moving) : all.length ? pick(all) : undefined;
    if (!chosen) return this.listVms(pick(this.w.users), startedAt);
    const readStart = performance.now();
    const r = await this.call(
      'GET /vms/{id}',
      'GET',
      `/vms/${chosen.vm.id}`,
      this.readAuth(chosen.u),
      undefined,
      startedAt,
      200,
    );
    if (r) this.observe(chosen.u, r.body as VmBody, readStart);
  }

  private async loginRefresh(u: SoakUser, startedAt: number): Promise<void> {
    const r = await this.call(
      'POST /auth/login',
      'POST',
      '/auth/login',
      undefined,
      { email: u.email, password: u.password },
      startedAt,
      200,
    );
    if (!r) return;
    const pair = r.body as TokenPair;
    if (!pair.refresh_token) {
      this.stats.error('POST /auth/login no refresh_token', r.requestId, r.text.slice(0, 200));
      return;
    }
    const r2 = await this.call(
      'POST /auth/refresh',
      'POST',
      '/auth/refresh',
      undefined,
      { refresh_token: pair.refresh_token },
      performance.now(),
      200,
    );
    const fresh = (r2?.body as TokenPair | undefined)?.access_token;
    if (fresh) u.token = fresh;
  }

  // ---- VM cycles ----

  private live(u: SoakUser): { vms: number; gpus: number } {
    let gpus = u.creatingGpus;
    for (const v of u.vms.values()) gpus += v.gpus;
    return { vms: u.vms.size + u.creating, gpus };
  }

  private async mutate(startedAt: number): Promise<void> {
    const actions: { u: SoakUser; vm: TrackedVm; what: 'stop' | 'start' | 'destroy' }[] = [];
    for (const u of this.w.users) {
      for (const vm of u.vms.values()) {
        if (vm.busy) continue;
        if (vm.status === 'running') actions.push({ u, vm, what: vm.step === 0 ? 'stop' : 'destroy' });
        else if (vm.status === 'stopped')
          actions.push({ u, vm, what: vm.step === 1 && !vm.startRefused ? 'start' : 'destroy' });
        else if (vm.status === 'interrupted' || vm.status === 'offline') actions.push({ u, vm, what: 'destroy' });
      }
    }
    const creators = this.w.users.filter((u) => {
      const l = this.live(u);
      return l.vms < u.maxLive && l.gpus + 1 <= u.maxGpus;
    });
    if (actions.length && (!creators.length || Math.random() < 0.75)) {
      const a = pick(actions);
      return this.step(a.u, a.vm, a.what, startedAt);
    }
    if (creators.length) return this.create(pick(creators), startedAt);
    return this.poll(startedAt);
  }

  private async create(u: SoakUser, startedAt: number): Promise<void> {
    const l = this.live(u);
    const gpus = l.gpus + 2 <= u.maxGpus && Math.random() < 0.25 ? 2 : 1;
    const n = pick(this.w.nodes);
    const body = {
      node: n.node,
      gpu_type: n.gpu_type,
      gpu_count: gpus,
      storage_gb: pick([50, 100, 200]),
      template_vmid: pick([100, 101]),
      ssh_key_id: u.sshKeyId,
      instance_label: `soak-${this.creates % 1000}`,
    };
    u.creating++;
    u.creatingGpus += gpus;
    try {
      const r = await this.call(
        'POST /vms',
        'POST',
        '/vms',
        u.token,
        body,
        startedAt,
        201,
        codes('gpu_unavailable', 'insufficient_balance', 'limit_exceeded'),
        {
          'idempotency-key': randomUUID(),
        },
      );
      if (r?.status === 201) {
        this.creates++;
        const v = r.body as VmBody;
        const now = performance.now();
        u.vms.set(v.id, {
          id: v.id,
          status: v.status,
          step: 0,
          busy: false,
          gpus: v.gpu_count,
          statusSince: now,
          mutatedAt: now,
          observedAt: 0,
          startRefused: false,
          stuckReported: false,
        });
      }
    } finally {
      u.creating--;
      u.creatingGpus -= gpus;
    }
  }

  private async step(u: SoakUser, vm: TrackedVm, what: 'stop' | 'start' | 'destroy', startedAt: number): Promise<void> {
    vm.busy = true;
    try {
      if (what === 'destroy') {
        const r = await this.call(
          'DELETE /vms/{id}',
          'DELETE',
          `/vms/${vm.id}`,
          u.token,
          undefined,
          startedAt,
          200,
          codes('invalid_state'),
        );
        if (r) {
          if (r.status === 200 && vm.step === 2) this.cycles++;
          this.forget(u, vm);
        } else this.unknown(vm);
        return;
      }
      const expected =
        what === 'stop' ? codes('invalid_state') : codes('invalid_state', 'gpu_unavailable', 'insufficient_balance');
      const r = await this.call(
        `POST /vms/{id}/${what}`,
        'POST',
        `/vms/${vm.id}/${what}`,
        u.token,
        undefined,
        startedAt,
        200,
        expected,
      );
      if (r?.status === 200) {
        vm.status = what === 'stop' ? 'stopping' : 'starting';
        vm.statusSince = performance.now();
        vm.step = what === 'stop' ? 1 : 2;
        vm.mutatedAt = performance.now();
      } else if (r && what === 'start' && errorCode(r) !== 'invalid_state') {
        vm.startRefused = true;
      } else this.unknown(vm);
    } finally {
      vm.busy = false;
    }
  }

  /** After a failed or refused step the client no longer knows the status: the next read tells. */
  private unknown(vm: TrackedVm): void {
    vm.status = 'unknown';
    vm.statusSince = performance.now();
    vm.mutatedAt = performance.now();
  }

  /** VMs that stayed creating/starting/stopping (or unknown) too long: each reported once, as an error. */
  checkStuck(): void {
    const now = performance.now();
    for (const u of this.w.users) {
      for (const vm of u.vms.values()) {
        if (!vm.stuckReported && TRANSITIONAL.has(vm.status) && now - vm.statusSince > STUCK_AFTER_MS) {
          vm.stuckReported = true;
          this.stats.error(
            `VM stuck in ${vm.status}`,
            '',
            `VM ${vm.id} of user ${u.id} has been ${vm.status} for ${Math.round((now - vm.statusSince) / 1000)} s`,
          );
        }
      }
    }
  }

  liveSummary(): string {
    const by = new Map<string, number>();
    for (const u of this.w.users) for (const vm of u.vms.values()) by.set(vm.status, (by.get(vm.status) ?? 0) + 1);
    return [...by].map(([s, n]) => `${s}:${n}`).join(',') || 'none';
  }

  liveCount(): number {
    return this.w.users.reduce((s, u) => s + u.vms.size, 0);
  }

  /** For a server that keeps running (--url): destroy what the soak left. */
  async destroyAll(): Promise<void> {
    for (const u of this.w.users) {
      for (const vm of [...u.vms.values()]) {
        await httpCall(this.w.base, 'DELETE', `/vms/${vm.id}`, { token: u.token, timeoutMs: this.timeoutMs }).catch(
          () => undefined,
        );
      }
    }
  }
}
