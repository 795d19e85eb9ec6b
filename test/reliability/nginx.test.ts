/**
 * Behind a real nginx with TLS (docs/operations.md#proxies): the Debian
 * package's nginx, started as a child process with a configuration of its own
 * in a temporary directory (nginx-proxy.ts), terminates TLS with a certificate
 * from a throwaway CA and balances two `gpucloud serve --role api` processes,
 * with a worker, on a fresh PostgreSQL database (and Redis when
 * GPUCLOUD_REDIS_URL is set; else the limits are counted in PostgreSQL: shared
 * by both instances either way). The APIs run with GPUCLOUD_TRUST_PROXY=127.0.0.1.
 *
 *  - clients on 127.0.0.2 and 127.0.0.3 have separate login limits, and a
 *    forged X-Forwarded-For sent through nginx does not escape one (nginx
 *    appends the real address; the service reads from the right);
 *  - /metrics through nginx needs the token, from loopback without a
 *    forwarding header it does not;
 *  - an event stream passes through unbuffered; a WebSocket upgrade reaches
 *    the access portal (a simulated VM's refusal, 409, comes back);
 *  - a rolling restart (SIGTERM each API in turn, start it again on its port)
 *    under mixed load fails no request, makes no duplicate VM, and leaves the
 *    ledger clean. nginx retries refused connections and 503s of idempotent
 *    methods on the other instance; a POST that got a 503 (it reached an
 *    instance that was closing, which did nothing with it) is retried once by
 *    the client with the same Idempotency-Key, as the SDK does. One failure is
 *    known and kept as a todo test: a POST that nginx sends on a kept-alive
 *    connection just as the stopping instance closes it as idle gets 502.
 *
 * Skipped without DATABASE_URL, and without nginx unless GPUCLOUD_REQUIRE_NGINX=1.
 * NGINX_ROLL_S sets the length of the rolling-restart load (60 s by default).
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes, randomUUID } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import https from 'node:https';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  cleanEnv,
  createDatabase,
  ledgerCheck,
  sleep,
  sshPublicKey,
  startInstance,
  type FreshDatabase,
  type Instance,
} from './instances-cluster.js';
import {
  findNginx,
  freePort,
  httpsRequest,
  makeCertificates,
  startNginx,
  type Nginx,
  type Reply,
  type RequestOptions,
} from './nginx-proxy.js';
import { field, numberField, stringField } from '../helpers/json.js';

const nginxBin = findNginx();
const skip = !process.env.DATABASE_URL
  ? 'needs DATABASE_URL'
  : !nginxBin && process.env.GPUCLOUD_REQUIRE_NGINX !== '1'
    ? 'needs nginx (apt-get install nginx; GPUCLOUD_REQUIRE_NGINX=1 fails instead of skipping)'
    : false;

const ROLL_MS = Number(process.env.NGINX_ROLL_S ?? 60) * 1000;
// More rounds of restarts in the same time when hunting races: NGINX_ROLL_S=120 NGINX_RESTART_ROUNDS=10.
const ROUNDS = Number(process.env.NGINX_RESTART_ROUNDS ?? 1);
const LOOPS = 4;
const ADMIN = { email: `ops-${randomBytes(4).toString('hex')}@example.com`, password: 'a long admin password 123' };
const PORTAL_DOMAIN = 'portal.localhost';

interface User {
  id: number;
  email: string;
  password: string;
  token: string;
  keyId: string;
}

interface StreamEvent {
  id: string;
  type: string;
  data: unknown;
}

/** An open `GET /events/stream`: its events as they arrive, and how it ended. */
interface Stream {
  status: number;
  events: StreamEvent[];
  ended: Promise<string>;
  close(): void;
}

describe(
  'behind a real nginx with TLS: client addresses, streams, a rolling restart',
  { skip, timeout: ROLL_MS + 150_000 },
  () => {
    let dir = '';
    let db: FreshDatabase;
    let baseEnv: NodeJS.ProcessEnv;
    const apiPorts: number[] = [];
    const apis: Instance[] = [];
    let worker: Instance | undefined;
    let nginx: Nginx | undefined;
    let nginxPort = 0;
    let ca = '';
    let adminToken = '';
    let wsVmId = '';
    /** POSTs of the rolling restart answered 502 because the stopping instance reset their connection. */
    const idleResets: string[] = [];
    const users: User[] = [];
    const t0 = Date.now();
    const log = (msg: string) => console.log(`[nginx +${((Date.now() - t0) / 1000).toFixed(1)}s] ${msg}`);

    const req = (method: string, path: string, o: RequestOptions = {}) => httpsRequest(nginxPort, ca, method, path, o);
    async function must(status: number[], method: string, path: string, o: RequestOptions = {}): Promise<Reply> {
      const r = await req(method, path, o);
      if (!status.includes(r.status)) assert.fail(`${method} ${path}: ${r.status} ${r.error ?? r.text.slice(0, 500)}`);
      return r;
    }
    const apiEnv = (i: number) => ({ ...baseEnv, PORT: String(apiPorts[i]) });

    before(async () => {
      if (!nginxBin) throw new Error('GPUCLOUD_REQUIRE_NGINX=1 but there is no nginx (apt-get install nginx)');
      dir = mkdtempSync(join(tmpdir(), 'gpucloud-nginx-'));
      const certs = makeCertificates(dir, PORTAL_DOMAIN);
      ca = certs.ca;
      nginxPort = await freePort();
      apiPorts.push(await freePort(), await freePort());
      db = await createDatabase(process.env.DATABASE_URL!);
      baseEnv = cleanEnv({
        DATABASE_URL: db.url,
        ...(process.env.GPUCLOUD_REDIS_URL
          ? {
              GPUCLOUD_REDIS_URL: process.env.GPUCLOUD_REDIS_URL,
              // Limits of this run only: 127.0.0.2's counters are not shared with another run on this Redis.
              GPUCLOUD_REDIS_PREFIX: `nginx-${randomBytes(4).toString('hex')}:`,
            }
          : {}),
        GPUCLOUD_JWT_SECRET: randomBytes(24).toString('hex'),
        LOG_LEVEL: 'error',
        GPUCLOUD_DEMO: '0',
        GPUCLOUD_ADMIN_EMAIL: ADMIN.email,
        GPUCLOUD_ADMIN_PASSWORD: ADMIN.password,
        GPUCLOUD_SIM_PROVISION_MS: '200',
        GPUCLOUD_TRUST_PROXY: '127.0.0.1',
        GPUCLOUD_PORTAL_URL: `https://${PORTAL_DOMAIN}:${nginxPort}`,
        GPUCLOUD_SHUTDOWN_TIMEOUT_S: '10',
        GPUCLOUD_RATE_LIMIT_LOGIN: '5',
        GPUCLOUD_RATE_LIMIT_LOGIN_IP: '1000',
        GPUCLOUD_RATE_LIMIT_LOGIN_GLOBAL: '100000',
        GPUCLOUD_RATE_LIMIT_AUTH: '100000',
        GPUCLOUD_RATE_LIMIT_VM_MUTATIONS: '100000',
        GPUCLOUD_RATE_LIMIT_DEFAULT: '100000',
      });
      // The first API migrates the database; the others start on it.
      apis.push(await startInstance('api-1', 'api', apiEnv(0)));
      const [a2, w] = await Promise.all([
        startInstance('api-2', 'api', apiEnv(1)),
        startInstance('worker', 'worker', { ...baseEnv, PORT: '0' }),
      ]);
      apis.push(a2);
      worker = w;
      nginx = await startNginx(nginxBin, {
        dir,
        port: nginxPort,
        upstreams: apiPorts,
        cert: certs.cert,
        key: certs.key,
      });
      log(
        `nginx on https://localhost:${nginxPort} in front of ${apis.map((a) => a.url).join(', ')}; database ${db.name}`,
      );

      adminToken = stringField((await must([200], 'POST', '/auth/login', { body: ADMIN })).body, 'access_token');
      for (const node of ['ngx-a', 'ngx-b']) {
        await must([201], 'POST', '/admin/nodes', {
          token: adminToken,
          body: {
            node,
            gpu_type: '4090',
            gpu_count: 8,
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
      for (let i = 0; i <= LOOPS; i++) {
        const email = `ngx-${i}-${randomBytes(4).toString('hex')}@example.com`;
        const password = `password-of-user-${i}`;
        const reg = await must([201], 'POST', '/auth/register', { body: { email, password, name: `User ${i}` } });
        const token = stringField(
          (await must([200], 'POST', '/auth/login', { body: { email, password } })).body,
          'access_token',
        );
        const id = numberField(reg.body, 'id');
        await must([201], 'POST', `/admin/users/${id}/credits`, {
          token: adminToken,
          body: { amount: 1000, description: 'test credit' },
        });
        const key = await must([201], 'POST', '/ssh-keys', {
          token,
          body: { ssh_public_key: sshPublicKey(`ngx${i}@test`), label: 'k' },
        });
        users.push({ id, email, password, token, keyId: stringField(key.body, 'id') });
      }
      log(`setup done: ${users.length} users`);
    });

    after(async () => {
      await nginx?.stop();
      for (const i of [...apis, ...(worker ? [worker] : [])]) if (!i.exited) await i.stop(5_000);
      await db?.drop();
      if (dir) rmSync(dir, { recursive: true, force: true });
    });

    const login = (email: string, password: string, localAddress: string, headers: Record<string, string> = {}) =>
      req('POST', '/auth/login', { body: { email, password }, localAddress, headers });

    /** Opens the event stream through nginx; resolves once the answer's head arrived. */
    function openStream(token: string, lastEventId?: string): Promise<Stream> {
      return new Promise((resolve) => {
        const events: StreamEvent[] = [];
        let endedWith: (why: string) => void = () => undefined;
        const ended = new Promise<string>((r) => (endedWith = r));
        const headers: Record<string, string> = {
          host: `localhost:${nginxPort}`,
          authorization: `Bearer ${token}`,
          accept: 'text/event-stream',
        };
        if (lastEventId) headers['last-event-id'] = lastEventId;
        const r = https.request(
          {
            host: '127.0.0.1',
            port: nginxPort,
            path: '/events/stream',
            headers,
            ca,
            servername: 'localhost',
            agent: false,
          },
          (res) => {
            let buf = '';
            res.setEncoding('utf8');
            res.on('data', (d: string) => {
              buf += d;
              for (let i = buf.indexOf('\n\n'); i >= 0; i = buf.indexOf('\n\n')) {
                const block = buf.slice(0, i);
                buf = buf.slice(i + 2);
                let id = '';
                let type = '';
                let data = '';
                for (const line of block.split('\n')) {
                  if (line.startsWith('id:')) id = line.slice(3).trim();
                  else if (line.startsWith('event:')) type = line.slice(6).trim();
                  else if (line.startsWith('data:')) data += line.slice(5).trim();
                }
                if (id && type) events.push({ id, type, data: data ? (JSON.parse(data) as unknown) : undefined });
              }
            });
            res.on('end', () => endedWith('end'));
            res.on('error', (e) => endedWith(`error ${e.message}`));
            resolve({ status: res.statusCode ?? 0, events, ended, close: () => r.destroy() });
          },
        );
        r.on('error', (e: NodeJS.ErrnoException) => {
          endedWith(`error ${e.code ?? ''} ${e.message}`);
          resolve({ status: 0, events, ended, close: () => undefined });
        });
        r.end();
      });
    }

    async function waitFor<T>(what: string, ms: number, fn: () => T | undefined | Promise<T | undefined>): Promise<T> {
      const deadline = Date.now() + ms;
      for (;;) {
        const v = await fn();
        if (v !== undefined) return v;
        if (Date.now() > deadline) assert.fail(`${what}: not within ${ms} ms`);
        await sleep(100);
      }
    }

    test('clients on 127.0.0.2 and 127.0.0.3 have their own login limits through nginx (GPUCLOUD_TRUST_PROXY)', async () => {
      // Limits count per minute of the clock: this test and the next must fall in one, so start early in one.
      const intoMinute = Date.now() % 60_000;
      if (intoMinute > 30_000) await sleep(60_000 - intoMinute + 200);
      const u = users[LOOPS]!;
      for (let i = 0; i < 5; i++) {
        const r = await login(u.email, 'wrong password!!', '127.0.0.2');
        assert.equal(r.status, 401, `failed login ${i + 1} from 127.0.0.2: ${r.status} ${r.text}`);
      }
      const sixth = await login(u.email, 'wrong password!!', '127.0.0.2');
      assert.equal(sixth.status, 429, `the 6th from 127.0.0.2 is limited: ${sixth.text}`);
      const owner = await login(u.email, u.password, '127.0.0.3');
      assert.equal(owner.status, 200, `the right password from 127.0.0.3 signs in: ${owner.text}`);
    });

    test('a forged X-Forwarded-For sent through nginx does not escape the limit', async () => {
      const u = users[LOOPS]!;
      // 127.0.0.3 is an address that may sign in; 198.51.100.9 one the service never saw.
      for (const forged of ['127.0.0.3', '198.51.100.9', '127.0.0.1']) {
        const r = await login(u.email, u.password, '127.0.0.2', { 'x-forwarded-for': forged });
        assert.equal(r.status, 429, `from 127.0.0.2 claiming ${forged}: ${r.status} ${r.text}`);
      }
      const xRealIp = await login(u.email, u.password, '127.0.0.2', {
        'x-real-ip': '127.0.0.3',
        forwarded: 'for=127.0.0.3',
      });
      assert.equal(xRealIp.status, 429, `X-Real-IP and Forwarded change nothing either: ${xRealIp.text}`);
      // nginx appended the real address after the forged one.
      assert.match(nginx!.accessLog(), /^127\.0\.0\.2 "POST \/auth\/login HTTP\/1\.1" 429 .*xff="127\.0\.0\.3"$/m);
    });

    test('/metrics through nginx needs the token; straight from loopback without a forwarding header it does not', async () => {
      const via = await req('GET', '/metrics');
      assert.equal(via.status, 401, `through nginx: ${via.text.slice(0, 200)}`);
      assert.equal(field(via.body, 'code'), 'unauthorized');
      for (const api of apis) {
        const direct = await fetch(`${api.url}/metrics`);
        const text = await direct.text();
        assert.equal(direct.status, 200, `${api.name} from loopback: ${text.slice(0, 200)}`);
        assert.match(text, /^# (HELP|TYPE) /m);
      }
    });

    test('the event stream passes through nginx unbuffered: an event made after opening arrives', async () => {
      const u = users[0]!;
      const s = await openStream(u.token);
      try {
        assert.equal(s.status, 200);
        await sleep(300); // the stream is open on the service: from now on nothing is missed
        const made = Date.now();
        const key = await must([201], 'POST', '/ssh-keys', {
          token: u.token,
          body: { ssh_public_key: sshPublicKey('stream@test'), label: 'stream' },
        });
        const keyId = stringField(key.body, 'id');
        const ev = await waitFor('ssh_key.created on the stream', 5000, () =>
          s.events.find((e) => e.type === 'ssh_key.created' && field(field(e.data, 'data'), 'ssh_key_id') === keyId),
        );
        log(`ssh_key.created arrived on the stream ${Date.now() - made} ms after the create was sent`);
        assert.equal(field(ev.data, 'id'), ev.id);
      } finally {
        s.close();
      }
    });

    test('a WebSocket upgrade passes through nginx to the access portal (a simulated VM refuses it with 409)', async () => {
      const u = users[0]!;
      const vm = await must([201], 'POST', '/vms', {
        token: u.token,
        headers: { 'idempotency-key': randomUUID() },
        body: {
          node: 'ngx-a',
          gpu_type: '4090',
          gpu_count: 1,
          storage_gb: 50,
          template_vmid: 102,
          rental_type: 'on_demand',
          ssh_key_id: u.keyId,
        },
      });
      const vmId = stringField(vm.body, 'id');
      wsVmId = vmId;
      await waitFor('the VM running', 15_000, async () => {
        const r = await req('GET', `/vms/${vmId}`, { token: u.token });
        return field(r.body, 'status') === 'running' ? true : undefined;
      });
      const access = await must([200], 'GET', `/vms/${vmId}/access-info`, { token: u.token });
      const webUi = field(access.body, 'web_ui');
      const host = new URL(stringField(webUi, 'url')).hostname;
      assert.ok(host.endsWith(`.${PORTAL_DOMAIN}`), host);
      const session = await req('POST', '/.gpucloud/session', {
        host,
        body: { launch_token: stringField(webUi, 'launch_token') },
      });
      assert.equal(session.status, 204, `the launch token signs in through nginx: ${session.text}`);
      const setCookie = session.headers['set-cookie'];
      const cookie = (Array.isArray(setCookie) ? setCookie[0]! : String(setCookie)).split(';')[0]!;
      // A plain request: the portal's page for a simulated VM.
      const page = await req('GET', '/', { host, headers: { cookie, accept: 'application/json' } });
      assert.equal(page.status, 409, page.text);
      assert.match(stringField(page.body, 'detail'), /runs on a simulated node/);
      // The upgrade: it reaches the portal's upgrade handler (its own refusal), not the plain request path.
      const upgrade = await req('GET', '/ws', {
        host,
        headers: {
          cookie,
          connection: 'Upgrade',
          upgrade: 'websocket',
          'sec-websocket-version': '13',
          'sec-websocket-key': randomBytes(16).toString('base64'),
        },
      });
      assert.equal(upgrade.status, 409, upgrade.text);
      assert.equal(field(upgrade.body, 'code'), 'invalid_state');
      assert.match(stringField(upgrade.body, 'detail'), /is simulated: nothing runs behind it/);
      await must([200, 202, 204], 'DELETE', `/vms/${vmId}`, { token: u.token });
    });

    test(`rolling restart under ${ROLL_MS / 1000} s of mixed load through nginx: no failed request (but the todo below), no duplicate VM, ledger clean`, async () => {
      const failures: { method: string; path: string; status: number; line: string }[] = [];
      const outcomes = new Map<string, number>();
      let requests = 0;
      let clientRetries = 0;
      let maxMs = 0;
      const createdIds = new Set<string>();
      let stop = false;
      const count = (k: string) => outcomes.set(k, (outcomes.get(k) ?? 0) + 1);

      /**
       * One request as a careful client sends it: a 503 (the instance was closing and did nothing with it) is
       * retried once, with the same headers and so the same Idempotency-Key. Anything else unexpected is a failure.
       */
      async function call(kind: string, ok: number[], method: string, path: string, o: RequestOptions): Promise<Reply> {
        for (let attempt = 0; ; attempt++) {
          const started = Date.now();
          requests++;
          const r = await req(method, path, o);
          maxMs = Math.max(maxMs, Date.now() - started);
          count(`${kind} ${r.status}`);
          if (ok.includes(r.status)) return r;
          if (r.status === 503 && attempt === 0) {
            clientRetries++;
            log(`client retry after 503: ${method} ${path} ${r.text.slice(0, 200)}`);
            await sleep(100);
            continue;
          }
          failures.push({
            method,
            path,
            status: r.status,
            line: `+${((Date.now() - t0) / 1000).toFixed(1)}s ${kind} ${method} ${path} (attempt ${attempt + 1}): ${r.status} ${r.error ?? r.text.slice(0, 300)}`,
          });
          return r;
        }
      }

      async function vmLoop(u: User, i: number): Promise<void> {
        const agent = new https.Agent({ keepAlive: true, maxSockets: 2 });
        const o = { token: u.token, agent };
        try {
          while (!stop) {
            const create = await call('create', [201], 'POST', '/vms', {
              ...o,
              headers: { 'idempotency-key': randomUUID() },
              body: {
                node: i % 2 ? 'ngx-b' : 'ngx-a',
                gpu_type: '4090',
                gpu_count: 1,
                storage_gb: 50,
                template_vmid: 101,
                rental_type: 'on_demand',
                ssh_key_id: u.keyId,
              },
            });
            if (create.status !== 201) {
              await sleep(500);
              continue;
            }
            const id = stringField(create.body, 'id');
            createdIds.add(id);
            for (let n = 0; n < 30 && !stop; n++) {
              const r = await call('get', [200], 'GET', `/vms/${id}`, o);
              if (field(r.body, 'status') === 'running') break;
              await sleep(100);
            }
            await call('list', [200], 'GET', '/vms?limit=20', o);
            await call('destroy', [200], 'DELETE', `/vms/${id}`, o);
          }
        } finally {
          agent.destroy();
        }
      }

      async function pricingLoop(): Promise<void> {
        const agent = new https.Agent({ keepAlive: true, maxSockets: 1 });
        try {
          while (!stop) {
            await call('pricing', [200], 'GET', '/pricing', { agent });
            await sleep(250);
          }
        } finally {
          agent.destroy();
        }
      }

      // One event stream, reconnecting with Last-Event-ID whenever its instance ends it.
      const stream = { opens: 0, ends: [] as string[], failures: [] as string[], events: [] as StreamEvent[] };
      let current: Stream | undefined;
      async function streamLoop(u: User): Promise<void> {
        while (!stop) {
          const last = stream.events.at(-1)?.id;
          const s = await openStream(u.token, last);
          current = s;
          if (s.status !== 200) {
            stream.failures.push(`+${((Date.now() - t0) / 1000).toFixed(1)}s open ${s.status} ${await s.ended}`);
            await sleep(500);
            continue;
          }
          stream.opens++;
          const before = stream.events.length;
          const copy = setInterval(() => stream.events.push(...s.events.splice(0)), 50);
          const why = await s.ended;
          clearInterval(copy);
          stream.events.push(...s.events.splice(0));
          if (!stop)
            stream.ends.push(
              `+${((Date.now() - t0) / 1000).toFixed(1)}s ${why} after ${stream.events.length - before} events`,
            );
          if (!stop) await sleep(200); // the retry: hint the service sends is 1-3 s; sooner is fine here
        }
      }

      const restarts: string[] = [];
      const restartProblems: string[] = [];
      async function restarter(deadline: number): Promise<void> {
        await sleep(Math.min(8000, ROLL_MS / 6));
        for (let round = 0; round < ROUNDS && Date.now() < deadline - 8000; round++) {
          for (let i = 0; i < apis.length; i++) {
            const old = apis[i]!;
            const t = Date.now();
            const r = await old.stop(20_000);
            const stoppedMs = Date.now() - t;
            if (r.killed || r.code !== 0)
              restartProblems.push(
                `${old.name} stopped with ${r.code ?? r.signal}${r.killed ? ' (killed)' : ''}:\n${old.output().slice(-3000)}`,
              );
            apis[i] = await startInstance(old.name, 'api', apiEnv(i));
            restarts.push(
              `${old.name}: exited ${r.code ?? r.signal}${r.killed ? ' (killed)' : ''} ${stoppedMs} ms after SIGTERM, back after ${Date.now() - t} ms`,
            );
            log(restarts.at(-1)!);
            // As an operator waits for /readyz before the next one; longer than nginx's fail_timeout (2 s).
            await sleep(3000);
          }
        }
        while (Date.now() < deadline) await sleep(200);
      }

      const started = Date.now();
      const deadline = started + ROLL_MS;
      const streamDone = streamLoop(users[0]!);
      await sleep(300);
      const ending = (async () => {
        await sleep(ROLL_MS);
        stop = true;
      })();
      await Promise.all([
        ...users.slice(0, LOOPS).map((u, i) => vmLoop(u, i)),
        pricingLoop(),
        pricingLoop(),
        restarter(deadline),
        ending,
      ]);
      await sleep(1500); // the last events reach the stream
      current?.close();
      await streamDone;
      const nginxRetried = nginx!
        .accessLog()
        .split('\n')
        .filter((l) => /upstatus=\S+, /.test(l));
      log(
        `load: ${requests} requests in ${((Date.now() - started) / 1000).toFixed(1)} s, slowest ${maxMs} ms, ` +
          `${failures.length} failures, ${clientRetries} client retries after 503, ${nginxRetried.length} retried by nginx; ` +
          `${[...outcomes]
            .sort()
            .map(([k, v]) => `${k}: ${v}`)
            .join(', ')}`,
      );
      for (const l of nginxRetried.slice(0, 20)) log(`nginx retried: ${l}`);
      log(`stream: ${stream.opens} opens, ${stream.events.length} events, ends ${JSON.stringify(stream.ends)}`);
      const errors = nginx!
        .errorLog()
        .split('\n')
        .filter((l) => l.trim());
      if (errors.length) log(`nginx error log (${errors.length} lines):\n${errors.slice(0, 30).join('\n')}`);

      assert.deepEqual(restartProblems, [], 'each API stopped with 0 on SIGTERM');
      assert.ok(restarts.length >= 2, 'both APIs were restarted');
      // The known race (see the todo test below): a POST sent on a kept-alive upstream connection that the
      // stopping instance reset as idle. nginx retries that only for idempotent methods; the client sees 502.
      const reset = (f: (typeof failures)[number]) =>
        f.status === 502 &&
        f.method === 'POST' &&
        errors.some(
          (l) =>
            l.includes('recv() failed (104: Connection reset by peer) while reading response header from upstream') &&
            l.includes(`request: "POST ${f.path} HTTP/1.1"`),
        );
      idleResets.push(...failures.filter(reset).map((f) => f.line));
      const other = failures.filter((f) => !reset(f)).map((f) => f.line);
      assert.deepEqual(other.slice(0, 30), [], `${other.length} request(s) failed for the client`);
      assert.ok((outcomes.get('create 201') ?? 0) >= 20, `VMs were created: ${JSON.stringify([...outcomes])}`);

      // The stream: reconnected when its instance stopped, never refused, and saw each VM of its user once.
      assert.deepEqual(stream.failures, [], 'every (re)connection of the stream opened');
      assert.ok(stream.opens >= 2, `the stream was ended by a restart and reopened: ${stream.opens} opens`);
      const ids = stream.events.map((e) => e.id);
      assert.equal(new Set(ids).size, ids.length, 'no event arrived twice across reconnections');
      const mine = (await db.pool.query<{ id: string }>('SELECT id FROM vms WHERE user_id = $1', [users[0]!.id])).rows;
      const seen = new Set(
        stream.events.filter((e) => e.type === 'vm.created').map((e) => String(field(e.data, 'vm_id'))),
      );
      const missed = mine.filter((v) => !seen.has(v.id) && createdIds.has(v.id));
      assert.deepEqual(missed, [], 'every VM the stream user created during the load has its vm.created on the stream');

      // No duplicate VM: every VM of the load users is one some create answered with.
      const loadUsers = users.slice(0, LOOPS).map((u) => u.id);
      const inDb = (
        await db.pool.query<{ id: string }>('SELECT id FROM vms WHERE user_id = ANY($1::int8[])', [loadUsers])
      ).rows;
      // users[0] also made the WebSocket test's VM before the load.
      const unknown = inDb.filter((v) => !createdIds.has(v.id) && v.id !== wsVmId).map((v) => v.id);
      assert.deepEqual(unknown, [], 'no VM in the database that no create answered with (a duplicate)');
      assert.equal(inDb.length, createdIds.size + (wsVmId ? 1 : 0), 'one VM per successful create');

      // Settle: every VM destroyed and no hypervisor action pending, then the ledger.
      await waitFor('every VM destroyed with nothing pending', 30_000, async () => {
        const busy = await db.pool.query<{ n: number }>(
          `SELECT count(*)::int AS n FROM vms WHERE status <> 'destroyed' OR hv_action IS NOT NULL OR claim_token IS NOT NULL`,
        );
        return busy.rows[0]!.n === 0 ? true : undefined;
      });
      for (const i of [...apis, worker!]) {
        const r = await i.stop(20_000);
        assert.ok(!r.killed && r.code === 0, `${i.name} stops with 0: ${r.code ?? r.signal}`);
      }
      const lc = ledgerCheck({ ...baseEnv });
      assert.equal(lc.status, 0, `ledger-check exits 0:\n${lc.stdout}\n${lc.stderr}`);
      assert.match(lc.stdout, /Ledger OK/);
    });

    // A stopping instance used to destroy its idle keep-alive connections at once: nginx, having just sent a
    // request on one from its upstream pool, saw "recv() failed (104: Connection reset by peer)" and, the
    // request being sent already, retried only idempotent methods elsewhere, so a POST got 502. The instance
    // now keeps its open connections for a drain period, answering 503 with Connection: close.
    test('rolling restart: no POST meets a reset kept-alive upstream connection (502)', () => {
      assert.deepEqual(idleResets, [], `${idleResets.length} POST(s) answered 502 after an upstream reset`);
    });
  },
);
