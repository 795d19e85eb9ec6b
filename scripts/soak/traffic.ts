/**
 * The mixed traffic: one call of Traffic.run() per scheduled start picks an
 * operation by weight.
 *
 * VMs go through create -> stop -> start -> destroy cycles. The client keeps
 * what it last saw of each of its VMs (from GET /vms and GET /vms/{id}, which
 * are part of the mix, see requests.ts) and a mutation slot acts on a VM
 * whose status allows the next step, or creates one while the user has fewer
 * live VMs than the bound (and its max_vms / max_gpus allow).
 */
import { randomUUID } from 'node:crypto';
import { errorCode, httpCall } from './client.js';
import { TRANSITIONAL, TrafficRequests, type VmBody, codes, pick } from './requests.js';
import type { SoakUser, TrackedVm } from './setup.js';

/**
 * A VM in one of these for longer than this is reported as stuck (an error: the reconciler should move it in
 * seconds).
 */
export const STUCK_AFTER_MS = 60_000;

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

export class Traffic extends TrafficRequests {
  creates = 0;
  cycles = 0;
  private readonly total = MIX.reduce((s, [, w]) => s + w, 0);

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
