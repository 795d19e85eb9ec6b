/**
 * The soak client's requests: each one recorded in the stats with its
 * latency, and the reads (GET /vms, GET /vms/{id}) that keep what the client
 * knows of its VMs current. A read started before the last mutation of a VM
 * answered is ignored for that VM, so stale reads never make the client send
 * a step the VM is not ready for.
 */
import { errorCode, httpCall, nextRequestId, type Reply } from './client.js';
import type { SoakUser, TokenPair, TrackedVm, World } from './setup.js';
import type { SoakStats } from './stats.js';

export const TRANSITIONAL = new Set(['creating', 'starting', 'stopping', 'unknown']);

export const pick = <T>(xs: readonly T[]): T => xs[Math.floor(Math.random() * xs.length)]!;

export interface VmBody {
  id: string;
  status: string;
  gpu_count: number;
}

export type Expect = (status: number, code: string | undefined) => boolean;
const none: Expect = () => false;
export const codes =
  (...cs: string[]): Expect =>
  (status, code) =>
    status >= 400 && status < 500 && code !== undefined && cs.includes(code);

export class TrafficRequests {
  failedVms = 0;

  constructor(
    protected readonly w: World,
    protected readonly stats: SoakStats,
    protected readonly timeoutMs: number,
  ) {}

  /** Half the reads with the user's JWT, half with its read_only API key. */
  protected readAuth(u: SoakUser): string {
    return Math.random() < 0.5 ? u.token : u.apiKey;
  }

  /**
   * One request, recorded with its latency from `startedAt` (the scheduled
   * start for the first request of an operation, so that waiting for a free
   * slot counts too). Returns the answer when it was the success status or an
   * expected business refusal, undefined when it was an error.
   */
  protected async call(
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

  protected forget(u: SoakUser, t: TrackedVm): void {
    u.vms.delete(t.id);
    u.forgotten.add(t.id);
  }

  protected async listVms(u: SoakUser, startedAt: number): Promise<void> {
    const readStart = performance.now();
    const r = await this.call('GET /vms', 'GET', '/vms?limit=100', this.readAuth(u), undefined, startedAt, 200);
    if (!r) return;
    if (!Array.isArray(r.body)) {
      this.stats.error('GET /vms bad body', r.requestId, `not an array: ${r.text.slice(0, 200)}`);
      return;
    }
    for (const v of r.body as VmBody[]) this.observe(u, v, readStart);
  }

  protected async poll(startedAt: number): Promise<void> {
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

  protected async loginRefresh(u: SoakUser, startedAt: number): Promise<void> {
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
}
