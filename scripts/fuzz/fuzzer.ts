/**
 * The fuzzer: builds each planned request (real ids looked up, protected
 * fixtures swapped for victims), sends the plan a few at a time, checks every
 * response and learns what successful calls created.
 */
import { FAILURE_KINDS, type SentRequest } from './checker.js';
import type { RawRequest, RawResponse } from './http.js';
import type { Operation } from './openapi.js';
import type { AuthSpec, IdentityName, Planned } from './plan.js';
import { authLabel, encodeText, paramText, withBytes } from './encode.js';
import { Harness } from './harness.js';
import type { StartedServer } from './server.js';
import { type Ref, isPlainObject, resolveRefs, toJsonText } from './values.js';
import { PROTECTED_SWAP_UUID } from './world.js';

interface Built {
  raw: RawRequest;
  sent: SentRequest;
  resolvedBody: unknown;
}

export class Fuzzer extends Harness {
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
