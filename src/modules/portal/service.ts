/**
 * The access portal (docs/portal.md): a customer's browser reaches a web
 * service of their VM (WebUI, Jupyter, a port they opened) on a host name of
 * its own, signed in by a one-time launch token, and the portal passes the
 * traffic through the VM's host agent to the guest port.
 *
 * Rules:
 * - Every request names its VM and service in its Host (links.ts); paths
 *   under `/.gpucloud/` are the portal's own (the launch page and the token
 *   exchange), never the guest's.
 * - A launch token opens the portal once (its jti is recorded, across
 *   instances) and becomes a cookie for that one host, bound to the user, the
 *   VM's current run and at most 12 hours (cookie.ts). The guest never sees
 *   the cookie.
 * - Each request is checked against the VM as the database has it, read at
 *   most once a second per VM: a cookie stops working within a second of the
 *   VM stopping, being interrupted or destroyed.
 * - Only ports the VM declares are reached: its template's web services and
 *   its own HTTP ports; the agent checks the same list again.
 * - Requests and responses stream both ways (uploads, downloads, server-sent
 *   events); connection upgrades (WebSocket) are passed through whole.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Dispatcher } from 'undici';
import type { Duplex } from 'node:stream';
import type { FastifyBaseLogger } from 'fastify';
import type { Db } from '../../db/db.js';
import type { Clock } from '../../clock.js';
import type { AgentEndpoint } from '../../hypervisor/host-agent-client.js';
import { openTunnel, TunnelError, TunnelPool } from '../../hypervisor/tunnel.js';
import type { TokenService } from '../auth/tokens.js';
import { guestPortOf, serviceLabel } from '../vms/templates.js';
import type { TemplateWeb } from '../templates/service.js';
import { COOKIE_MAX_S, COOKIE_NAME, CookieSigner, readCookie, stripCookie, type PortalSession } from './cookie.js';
import type { PortalLinks, PortalTarget } from './links.js';
import {
  answer,
  asset,
  LAUNCH_JS,
  launchPage,
  OWN_PREFIX,
  PORTAL_CSS,
  refuseUpgrade,
  wantsHtml,
  page,
} from './pages.js';
import * as repo from './repository.js';
import { splice } from '../../net/streams.js';
import type { PortalVm } from './repository.js';

export interface PortalDeps {
  /** The web services of a template (its WebUI and Jupyter ports). */
  templateWeb: (vmid: number) => Promise<TemplateWeb>;
  db: Db;
  clock: Clock;
  tokens: TokenService;
  links: PortalLinks;
  /** The host agent of a node, or null for a simulated node. */
  agentEndpoint: (node: string) => Promise<AgentEndpoint | null>;
  cookieKey: Buffer;
  /** The client's address, behind trusted proxies the one they forwarded. */
  clientAddress?: (req: IncomingMessage) => string;
  log?: FastifyBaseLogger;
}

/** How long a VM's row, and a node's agent, are taken as read (real time). */
const VM_TTL_MS = 1000;
const ENDPOINT_TTL_MS = 10_000;
const MAX_EXCHANGE_BODY = 8 * 1024;

/** Headers that belong to one connection, never passed on (RFC 9110 7.6.1), and the portal's own. */
const HOP = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'proxy-authorization',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
  'x-forwarded-for',
  'x-forwarded-proto',
  'x-forwarded-host',
  'forwarded',
  // The portal answered any 100-continue itself, as it reads the body.
  'expect',
]);

type Resolved =
  | { kind: 'agent'; vm: PortalVm; endpoint: AgentEndpoint; port: number; runMs: number }
  | { kind: 'simulated'; vm: PortalVm; port: number }
  | { kind: 'refused'; status: number; code: string; title: string; detail: string };

export class Portal {
  private readonly vms = new Map<number, { vm: PortalVm | undefined; at: number }>();
  private readonly endpoints = new Map<string, { endpoint: AgentEndpoint | null; at: number }>();
  private readonly pool = new TunnelPool();
  private readonly cookies: CookieSigner;

  constructor(private readonly deps: PortalDeps) {
    this.cookies = new CookieSigner(deps.cookieKey);
  }

  private client(req: IncomingMessage): string {
    return this.deps.clientAddress?.(req) ?? req.socket.remoteAddress ?? '';
  }

  get links(): PortalLinks {
    return this.deps.links;
  }

  /** The VM and service a request's Host names, or null when it is not for the portal. */
  target(req: IncomingMessage): PortalTarget | null {
    return this.deps.links.parse(req.headers.host);
  }

  /** Serves one request to a portal host. Never throws: every failure becomes an answer. */
  async handle(req: IncomingMessage, res: ServerResponse, target: PortalTarget): Promise<void> {
    try {
      const path = req.url ?? '/';
      if (path.startsWith(OWN_PREFIX) || path === OWN_PREFIX.slice(0, -1)) return await this.own(req, res, target);
      const session = this.session(req, target);
      if (!session) return this.signInFirst(req, res, target);
      const r = await this.resolve(target, session);
      if (r.kind === 'refused') return answer(req, res, r.status, r.code, r.title, r.detail);
      if (r.kind === 'simulated') return this.simulated(req, res, target, r.port);
      this.proxy(req, res, target, r);
    } catch (err) {
      this.deps.log?.error({ err, host: req.headers.host }, 'portal request failed');
      answer(req, res, 500, 'internal', 'Something went wrong', 'The portal could not serve this request.');
    }
  }

  /** A connection upgrade (WebSocket) on a portal host: checked like a request, then passed through whole. */
  async upgrade(req: IncomingMessage, socket: Duplex, head: Buffer, target: PortalTarget): Promise<void> {
    socket.on('error', () => socket.destroy());
    try {
      const session = this.session(req, target);
      if (!session) return refuseUpgrade(socket, 401, 'unauthorized', 'sign in through a launch link first');
      const r = await this.resolve(target, session);
      if (r.kind === 'refused') return refuseUpgrade(socket, r.status, r.code, r.detail);
      if (r.kind === 'simulated')
        return refuseUpgrade(socket, 409, 'invalid_state', `VM ${target.vmid} is simulated: nothing runs behind it`);
      let tunnel: Duplex;
      try {
        tunnel = await openTunnel(r.endpoint, r.vm.id, r.port);
      } catch (err) {
        const e = this.tunnelFailure(err, target, r.port);
        return refuseUpgrade(socket, e.status, e.code, e.detail);
      }
      const lines = [`${req.method} ${req.url} HTTP/1.1`];
      const headers = this.forwardHeaders(req, true);
      for (let i = 0; i < headers.length; i += 2) lines.push(`${headers[i]}: ${headers[i + 1]}`);
      tunnel.write(`${lines.join('\r\n')}\r\n\r\n`);
      if (head.length) tunnel.write(head);
      splice(socket, tunnel);
    } catch (err) {
      this.deps.log?.error({ err, host: req.headers.host }, 'portal upgrade failed');
      refuseUpgrade(socket, 502, 'internal', 'the portal could not open this connection');
    }
  }

  close(): void {
    this.pool.close();
  }

  // ---- the portal's own paths ----

  private async own(req: IncomingMessage, res: ServerResponse, target: PortalTarget): Promise<void> {
    const path = (req.url ?? '').split('?')[0];
    const get = req.method === 'GET' || req.method === 'HEAD';
    if (get && path === `${OWN_PREFIX}launch`) return launchPage(res);
    if (get && path === `${OWN_PREFIX}launch.js`) return asset(res, 'text/javascript; charset=utf-8', LAUNCH_JS);
    if (get && path === `${OWN_PREFIX}portal.css`) return asset(res, 'text/css; charset=utf-8', PORTAL_CSS);
    if (path === `${OWN_PREFIX}session`) {
      if (req.method !== 'POST')
        return answer(req, res, 405, 'validation_error', 'Not allowed', 'Use POST to sign in with a launch token.');
      return this.exchange(req, res, target);
    }
    return answer(req, res, 404, 'not_found', 'Not found', `${path} is not a page of the portal.`);
  }

  /** POST /.gpucloud/session {launch_token}: the one use of a launch token, answered with the cookie. */
  private async exchange(req: IncomingMessage, res: ServerResponse, target: PortalTarget): Promise<void> {
    const refuse = (status: number, code: string, detail: string) => {
      req.resume();
      answer(req, res, status, code, 'Cannot sign in', detail);
    };
    if (!/^application\/json\b/i.test(req.headers['content-type'] ?? ''))
      return refuse(415, 'unsupported_media_type', 'Send {"launch_token": "..."} as application/json.');
    const origin = req.headers.origin;
    const own = this.deps.links.url(target.vmid, target.service).slice(0, -1);
    if (origin !== undefined && origin !== own && origin !== `${own.split('//')[0]}//${req.headers.host}`)
      return refuse(403, 'forbidden', 'A launch token is exchanged only on the host it opens.');
    let raw = '';
    for await (const chunk of req as AsyncIterable<Buffer>) {
      raw += chunk.toString('utf8');
      if (raw.length > MAX_EXCHANGE_BODY) return refuse(413, 'payload_too_large', 'The body is too large.');
    }
    let token: unknown;
    try {
      token = (JSON.parse(raw) as { launch_token?: unknown }).launch_token;
    } catch {
      return refuse(400, 'malformed_json', 'The body is not valid JSON.');
    }
    if (typeof token !== 'string' || token.length > 4096)
      return refuse(422, 'validation_error', 'launch_token must be the token of a launch link.');
    const claims = await this.deps.tokens.verifyPurpose('launch', token);
    if (!claims)
      return refuse(
        401,
        'unauthorized',
        'This launch link is not valid or has expired (links last 5 minutes). Open the service again from the console.',
      );
    const vm = await repo.vmByVmid(this.deps.db, target.vmid);
    if (!vm || vm.id !== claims.vm_id || claims.service !== target.service)
      return refuse(403, 'forbidden', 'This launch link opens another VM or service, not this one.');
    if (vm.user_id !== claims.user_id)
      return refuse(403, 'forbidden', 'This launch link opens another VM or service, not this one.');
    if (vm.status !== 'running' || !vm.started_at)
      return refuse(409, 'invalid_state', `VM ${vm.vmid} is ${vm.status}: start it, then open the service again.`);
    if (typeof claims.jti !== 'string' || typeof claims.exp !== 'number')
      return refuse(401, 'unauthorized', 'This launch link is not valid.');
    if (!(await repo.useLaunchToken(this.deps.db, claims.jti, new Date(claims.exp * 1000))))
      return refuse(
        401,
        'unauthorized',
        'This launch link was used already: each link opens the service once. Open it again from the console for a new one.',
      );
    const now = this.deps.clock.nowMs();
    const value = this.cookies.sign({
      vmid: vm.vmid,
      service: target.service,
      userId: vm.user_id,
      runMs: vm.started_at.getTime(),
      expMs: now + COOKIE_MAX_S * 1000,
    });
    this.deps.log?.info(
      { user: vm.user_id, vm: vm.id, vmid: vm.vmid, service: target.service, client: this.client(req) },
      'portal launch',
    );
    const attrs = ['Path=/', 'HttpOnly', 'SameSite=Lax', `Max-Age=${COOKIE_MAX_S}`];
    if (this.deps.links.secure) attrs.push('Secure');
    res.writeHead(204, {
      'set-cookie': `${COOKIE_NAME}=${value}; ${attrs.join('; ')}`,
      'cache-control': 'no-store',
      'x-content-type-options': 'nosniff',
    });
    res.end();
  }

  // ---- who is asking, and for what ----

  private session(req: IncomingMessage, target: PortalTarget): PortalSession | null {
    const value = readCookie(req.headers.cookie);
    if (!value) return null;
    const s = this.cookies.verify(value, this.deps.clock.nowMs());
    // A cookie is the host's alone: browsers keep it so, and a copied one opens nothing elsewhere.
    return s && s.vmid === target.vmid && s.service === target.service ? s : null;
  }

  private signInFirst(req: IncomingMessage, res: ServerResponse, target: PortalTarget): void {
    answer(
      req,
      res,
      401,
      'unauthorized',
      'Open this from gpucloud',
      `This is ${serviceLabel(target.service)} of VM ${target.vmid}. Open it from the console (or with gpucloud vm open ${target.vmid}): its link signs you in once.`,
    );
  }

  private async resolve(target: PortalTarget, session: PortalSession): Promise<Resolved> {
    const vm = await this.vm(target.vmid);
    const refused = (status: number, code: string, title: string, detail: string): Resolved => ({
      kind: 'refused',
      status,
      code,
      title,
      detail,
    });
    if (!vm || vm.user_id !== session.userId || vm.status === 'destroyed')
      return refused(404, 'not_found', 'No such VM', `VM ${target.vmid} does not exist (any more).`);
    if (vm.status !== 'running')
      return refused(
        409,
        'invalid_state',
        `VM ${vm.vmid} is ${vm.status}`,
        `VM ${vm.vmid} is ${vm.status}. Start it, then open ${serviceLabel(target.service)} again from the console.`,
      );
    if (vm.started_at?.getTime() !== session.runMs)
      return refused(
        401,
        'unauthorized',
        'Signed out',
        `VM ${vm.vmid} has stopped since you signed in, which ended that sign-in. Open ${serviceLabel(target.service)} again from the console.`,
      );
    const port = guestPortOf(await this.deps.templateWeb(vm.template_vmid), vm, target.service);
    if (port === null)
      return refused(404, 'not_found', 'No such service', `VM ${vm.vmid} has no ${serviceLabel(target.service)}.`);
    const endpoint = await this.endpoint(vm.node);
    if (!endpoint) return { kind: 'simulated', vm, port };
    return { kind: 'agent', vm, endpoint, port, runMs: session.runMs };
  }

  private async vm(vmid: number): Promise<PortalVm | undefined> {
    const now = Date.now();
    const hit = this.vms.get(vmid);
    if (hit && now - hit.at < VM_TTL_MS) return hit.vm;
    const vm = await repo.vmByVmid(this.deps.db, vmid);
    if (this.vms.size >= 10_000) this.vms.delete(this.vms.keys().next().value!);
    this.vms.set(vmid, { vm, at: now });
    return vm;
  }

  private async endpoint(node: string): Promise<AgentEndpoint | null> {
    const now = Date.now();
    const hit = this.endpoints.get(node);
    if (hit && now - hit.at < ENDPOINT_TTL_MS) return hit.endpoint;
    const endpoint = await this.deps.agentEndpoint(node);
    if (this.endpoints.size >= 10_000) this.endpoints.delete(this.endpoints.keys().next().value!);
    this.endpoints.set(node, { endpoint, at: now });
    return endpoint;
  }

  private simulated(req: IncomingMessage, res: ServerResponse, target: PortalTarget, port: number): void {
    const detail = `VM ${target.vmid} runs on a simulated node: there is no machine behind it, so nothing answers here. On a real host this would be ${serviceLabel(target.service)}, port ${port} of the VM.`;
    if (!wantsHtml(req)) return answer(req, res, 409, 'invalid_state', 'Simulated VM', detail);
    const body = page(`VM ${target.vmid} is simulated`, [
      detail,
      'To run real VMs, see "Run real VMs" in the README: a host agent runs them under QEMU.',
    ]);
    res.writeHead(200, { 'content-type': 'text/html; charset=utf-8', 'cache-control': 'no-store' });
    res.end(req.method === 'HEAD' ? undefined : body);
  }

  // ---- passing traffic on ----

  /** The request's headers as the guest gets them: no hop-by-hop header, no portal cookie, X-Forwarded-*. */
  private forwardHeaders(req: IncomingMessage, upgrade: boolean): string[] {
    const out: string[] = [];
    const raw = req.rawHeaders;
    for (let i = 0; i < raw.length; i += 2) {
      const name = raw[i]!;
      const lower = name.toLowerCase();
      if (lower === 'cookie') continue;
      if (HOP.has(lower) && !(upgrade && (lower === 'connection' || lower === 'upgrade'))) continue;
      out.push(name, raw[i + 1]!);
    }
    const cookie = stripCookie(req.headers.cookie);
    if (cookie) out.push('Cookie', cookie);
    out.push('X-Forwarded-For', this.client(req));
    out.push('X-Forwarded-Proto', this.deps.links.secure ? 'https' : 'http');
    out.push('X-Forwarded-Host', req.headers.host ?? '');
    return out;
  }

  private proxy(
    req: IncomingMessage,
    res: ServerResponse,
    target: PortalTarget,
    r: Extract<Resolved, { kind: 'agent' }>,
  ): void {
    const abort = new AbortController();
    res.on('close', () => {
      if (!res.writableFinished) abort.abort();
    });
    const hasBody = req.headers['content-length'] !== undefined || req.headers['transfer-encoding'] !== undefined;
    this.pool
      .get(r.endpoint, r.vm.id, r.runMs, r.port)
      .stream(
        {
          method: req.method as Dispatcher.HttpMethod,
          path: req.url ?? '/',
          headers: this.forwardHeaders(req, false),
          body: hasBody ? req : null,
          signal: abort.signal,
        },
        ({ statusCode, headers }) => {
          const out: Record<string, string | string[]> = {};
          for (const [name, value] of Object.entries(headers)) {
            if (value === undefined || name === 'connection' || name === 'keep-alive' || name === 'transfer-encoding')
              continue;
            out[name] = value;
          }
          res.writeHead(statusCode, out);
          return res;
        },
      )
      .catch((err: unknown) => {
        if (abort.signal.aborted) return;
        const e = this.tunnelFailure(err, target, r.port);
        answer(req, res, e.status, e.code, e.title, e.detail);
      });
  }

  /** What a failed tunnel means to the customer. */
  private tunnelFailure(
    err: unknown,
    target: PortalTarget,
    port: number,
  ): { status: number; code: string; title: string; detail: string } {
    const what = `${serviceLabel(target.service)} of VM ${target.vmid} (port ${port})`;
    if (err instanceof TunnelError && err.code === 'guest_unreachable')
      return {
        status: 502,
        code: 'invalid_state',
        title: 'Not answering yet',
        detail: `Nothing answers on ${what} yet: the app may still be starting. Try again in a moment.`,
      };
    if (err instanceof TunnelError && err.status === 409)
      return { status: 409, code: 'invalid_state', title: 'Not running', detail: `VM ${target.vmid} is not running.` };
    // The tunnel opened, but the connection ended before an answer: under user networking QEMU
    // accepts for the guest and drops the connection when nothing listens on the port.
    if (!(err instanceof TunnelError))
      return {
        status: 502,
        code: 'invalid_state',
        title: 'Not answering yet',
        detail: `Nothing answers on ${what} yet: the app may still be starting. Try again in a moment.`,
      };
    this.deps.log?.warn({ err: err instanceof Error ? err.message : String(err), vmid: target.vmid }, 'portal tunnel');
    return {
      status: 502,
      code: 'internal',
      title: 'The VM cannot be reached',
      detail: `The host of VM ${target.vmid} does not answer, so ${what} cannot be reached. Try again in a moment.`,
    };
  }

  /** Forgets the uses of expired launch tokens (housekeeping). */
  purge(now: Date): Promise<number> {
    return repo.purgeLaunchTokenUses(this.deps.db, now);
  }
}
