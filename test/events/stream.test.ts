/**
 * GET /events/stream over a real port: live events within about a second,
 * resuming after Last-Event-ID with what was missed first, filters, other
 * users' events never shown, an event written through another instance
 * arriving, and streams ended when the server closes. A stream ends soon
 * after its credential stops working (a revoked key, an ended session, an
 * expired access token, a suspension, a new role), through whichever
 * instance, and hands on nothing committed after that. The poller's handling
 * of events that commit out of order is checked against PostgreSQL.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { FastifyInstance } from 'fastify';
import { describeEachDb } from '../helpers/app.js';
import { createApiKey, createNode, createUser, credit, uploadSshKey, type TestUser } from '../helpers/factories.js';
import { api } from '../helpers/api.js';
import { DB_KINDS, createTestDb } from '../helpers/db.js';
import { EventHub } from '../../src/modules/events/hub.js';
import { MAX_STREAMS_PER_USER } from '../../src/modules/events/routes.js';
import type { EventRow } from '../../src/modules/events/repository.js';
import { newOrderedId } from '../../src/ids.js';

type Ev = { id: string; type: string; created_at: string; vm_id: string | null; data: Record<string, unknown> };

/** An open stream: the events received so far, in order, and a way to wait for more. */
class Stream {
  readonly events: (Ev & { sseId: string; sseEvent: string })[] = [];
  /** Comment lines received, without the colon (`ping`, `closed: <reason>`). */
  readonly comments: string[] = [];
  status = 0;
  private readonly abort = new AbortController();
  private done: Promise<void> = Promise.resolve();
  ended = false;

  static async open(base: string, token: string, query = '', headers: Record<string, string> = {}): Promise<Stream> {
    const s = new Stream();
    const res = await fetch(`${base}/events/stream${query}`, {
      headers: { authorization: `Bearer ${token}`, ...headers },
      signal: s.abort.signal,
    });
    s.status = res.status;
    if (res.status !== 200) {
      s.body = await res.text();
      return s;
    }
    assert.match(res.headers.get('content-type') ?? '', /^text\/event-stream/);
    assert.ok(res.headers.get('x-request-id'));
    const reader = res.body!.getReader();
    s.done = (async () => {
      let buf = '';
      try {
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += new TextDecoder().decode(value);
          for (let i = buf.indexOf('\n\n'); i >= 0; i = buf.indexOf('\n\n')) {
            const block = buf.slice(0, i);
            buf = buf.slice(i + 2);
            for (const l of block.split('\n')) if (l.startsWith(':')) s.comments.push(l.slice(1).trim());
            const fields = Object.fromEntries(
              block
                .split('\n')
                .filter((l) => !l.startsWith(':') && l.includes(': '))
                .map((l) => [l.slice(0, l.indexOf(': ')), l.slice(l.indexOf(': ') + 2)]),
            );
            if (fields.data) s.events.push({ ...JSON.parse(fields.data), sseId: fields.id, sseEvent: fields.event });
          }
        }
      } catch {
        // aborted
      }
      s.ended = true;
    })();
    return s;
  }

  body = '';

  /** Waits until `n` events arrived (at most `ms`). */
  async waitFor(n: number, ms = 10_000): Promise<void> {
    const until = Date.now() + ms;
    while (this.events.length < n && Date.now() < until && !this.ended) await new Promise((r) => setTimeout(r, 20));
    assert.ok(
      this.events.length >= n,
      `expected ${n} events, got ${this.events.length}: ${JSON.stringify(this.events.map((e) => e.type))}`,
    );
  }

  /** Waits until the server ended the stream (at most `ms`); returns how long that took. */
  async waitEnded(ms = 5000): Promise<number> {
    const started = Date.now();
    while (!this.ended && Date.now() - started < ms) await new Promise((r) => setTimeout(r, 20));
    assert.ok(this.ended, `the stream is still open after ${ms} ms`);
    return Date.now() - started;
  }

  /** The reason given by the last line of a stream the server ended, if any. */
  get closedBecause(): string | undefined {
    return this.comments.find((c) => c.startsWith('closed: '))?.slice('closed: '.length);
  }

  async close(): Promise<void> {
    this.abort.abort();
    await this.done;
  }
}

/** The `exp` claim of an access token (seconds). */
const expOf = (token: string): number =>
  (JSON.parse(Buffer.from(token.split('.')[1]!, 'base64url').toString()) as { exp: number }).exp;

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function listen(app: FastifyInstance): Promise<string> {
  await app.listen({ port: 0, host: '127.0.0.1' });
  const addr = app.server.address();
  assert.ok(addr && typeof addr === 'object');
  return `http://127.0.0.1:${addr.port}`;
}

describeEachDb('event stream', (t) => {
  let base: string;
  let admin: TestUser;
  let adminKey: string;
  let u: TestUser;
  let key: string;
  let node: string;

  test('live: events written from now on arrive within a second or so, as GET /events has them', async () => {
    base = await listen(t().app);
    admin = await createUser(t(), { admin: true });
    adminKey = await createApiKey(t(), admin.token, 'read_write', 'admin');
    u = await createUser(t());
    key = await createApiKey(t(), u.token, 'read_write', 'u');
    await credit(t(), adminKey, u.id, 100);
    ({ node } = await createNode(t(), adminKey, { gpu_type: '4090', gpu_count: 8 }));

    const s = await Stream.open(base, key);
    assert.equal(s.status, 200);
    const other = await Stream.open(base, (await createUser(t())).token);
    await new Promise((r) => setTimeout(r, 200));
    assert.equal(s.events.length, 0, 'nothing from before the stream opened');
    const started = Date.now();
    const ssh = await t().req('POST', '/api-keys', { token: key, body: { name: 'live', scope: 'read_only' } });
    assert.equal(ssh.status, 201);
    await s.waitFor(1);
    assert.ok(Date.now() - started < 3000, `arrived after ${Date.now() - started} ms`);
    const vm = await t().req('POST', '/vms', {
      token: key,
      body: {
        node,
        gpu_type: '4090',
        gpu_count: 1,
        storage_gb: 50,
        template_vmid: 100,
        auth_method: 'password',
        password: 'a-vm-password-1234',
      },
    });
    assert.equal(vm.status, 201, vm.text);
    await t().services.clock.advance(0);
    await s.waitFor(4);
    const listed = (await t().req('GET', `/events?limit=200`, { token: key })).body as Ev[];
    const tail = listed.slice(-s.events.length);
    for (const e of s.events)
      assert.deepEqual([e.sseId, e.sseEvent], [e.id, e.type], "the SSE id and event are the event's id and type");
    assert.deepEqual(
      s.events.map((e) => ({ id: e.id, type: e.type, created_at: e.created_at, vm_id: e.vm_id, data: e.data })),
      tail,
    );
    assert.deepEqual(
      s.events.map((e) => e.type),
      ['api_key.created', 'vm.created', 'vm.status_changed', 'vm.status_changed'],
    );
    assert.equal(other.events.length, 0, 'another user sees none of them');
    await Promise.all([s.close(), other.close()]);
  });

  test('resuming after Last-Event-ID sends what was missed first, then live ones; filters apply to both', async () => {
    const all = (await t().req('GET', '/events?limit=200', { token: key })).body as Ev[];
    const from = all[0]!; // the first login
    const s = await Stream.open(base, key, '', { 'last-event-id': from.id });
    await s.waitFor(all.length - 1);
    assert.deepEqual(
      s.events.map((e) => e.id),
      all.slice(1).map((e) => e.id),
      'missed events, in order',
    );
    const vmId = all.find((e) => e.type === 'vm.created')!.vm_id!;
    const filtered = await Stream.open(
      base,
      key,
      `?after=${from.id}&type=vm.status_changed,vm.destroyed&vm_id=${vmId}`,
    );
    await filtered.waitFor(2);
    assert.equal((await t().req('DELETE', `/vms/${vmId}`, { token: key })).status, 200);
    await s.waitFor(all.length + 1);
    await filtered.waitFor(4);
    assert.deepEqual(
      filtered.events.map((e) => [e.type, e.data.to ?? e.data.reason]),
      [
        ['vm.status_changed', 'starting'],
        ['vm.status_changed', 'running'],
        ['vm.status_changed', 'destroyed'],
        ['vm.destroyed', 'user'],
      ],
    );
    assert.deepEqual(
      s.events.slice(-2).map((e) => e.type),
      ['vm.status_changed', 'vm.destroyed'],
    );
    await Promise.all([s.close(), filtered.close()]);
  });

  test('operators follow their nodes; refusals come before the stream starts', async () => {
    const ops = await Stream.open(base, adminKey, '?type=node.offline,node.online');
    const customer = await Stream.open(base, key);
    await new Promise((r) => setTimeout(r, 100));
    assert.equal(
      (await t().req('PATCH', `/admin/nodes/${node}`, { token: adminKey, body: { status: 'offline' } })).status,
      200,
    );
    assert.equal(
      (await t().req('PATCH', `/admin/nodes/${node}`, { token: adminKey, body: { status: 'active' } })).status,
      200,
    );
    await ops.waitFor(2);
    assert.deepEqual(
      ops.events.map((e) => e.type),
      ['node.offline', 'node.online'],
    );
    await new Promise((r) => setTimeout(r, 700));
    assert.deepEqual(
      customer.events.filter((e) => e.type.startsWith('node.')),
      [],
    );
    await Promise.all([ops.close(), customer.close()]);

    const unauthenticated = await fetch(`${base}/events/stream`);
    assert.equal(unauthenticated.status, 401);
    for (const [headers, query] of [
      [{ 'last-event-id': 'nope' }, ''],
      [{ 'last-event-id': newOrderedId() }, ''],
      [{}, '?type=vm.nope'],
      [{}, '?after=nope'],
    ] as const) {
      const r = await Stream.open(base, key, query, headers);
      assert.equal(r.status, 422, `${JSON.stringify(headers)} ${query}: ${r.body}`);
      assert.equal(JSON.parse(r.body).code, 'validation_error');
    }
    const billing = await createApiKey(t(), key, 'billing_only', 'b');
    assert.equal((await Stream.open(base, billing)).status, 403);
    assert.equal((await Stream.open(base, await createApiKey(t(), key, 'read_only', 'ro'))).status, 200);
  });

  test(`a user holds at most ${MAX_STREAMS_PER_USER} streams at once (then 429); a closed one makes room; others are not affected`, async () => {
    const heavy = await createUser(t());
    const heavyKey = await createApiKey(t(), heavy.token, 'read_only', 'streams');
    const streams = await Promise.all(Array.from({ length: MAX_STREAMS_PER_USER }, () => Stream.open(base, heavyKey)));
    assert.deepEqual([...new Set(streams.map((x) => x.status))], [200]);
    const refused = await fetch(`${base}/events/stream`, { headers: { authorization: `Bearer ${heavy.token}` } });
    assert.equal(refused.status, 429, 'every key and session of the user counts');
    assert.equal((await refused.json()).code, 'rate_limited');
    assert.equal(refused.headers.get('retry-after'), '5');
    const other = await Stream.open(base, key);
    assert.equal(other.status, 200, 'another user is not affected');
    await streams.pop()!.close();
    let again: Stream | undefined;
    for (const until = Date.now() + 5000; Date.now() < until; await new Promise((r) => setTimeout(r, 50))) {
      again = await Stream.open(base, heavyKey);
      if (again.status === 200) break;
    }
    assert.equal(again?.status, 200, 'a closed stream makes room');
    await Promise.all([...streams, other, again!].map((x) => x.close()));
  });

  test('an event written through another instance reaches a stream held by this one', async () => {
    const second = await t().another();
    const base2 = await listen(second);
    const s = await Stream.open(base2, key, '?type=api_key.created');
    await new Promise((r) => setTimeout(r, 100));
    const started = Date.now();
    assert.equal(
      (await t().req('POST', '/api-keys', { token: key, body: { name: 'elsewhere', scope: 'read_only' } })).status,
      201,
    );
    await s.waitFor(1);
    assert.ok(Date.now() - started < 3000, `arrived after ${Date.now() - started} ms`);
    assert.equal(s.events[0]!.data.name, 'elsewhere');
    // Closing the server ends its open streams instead of waiting for them.
    await second.close();
    const until = Date.now() + 5000;
    while (!s.ended && Date.now() < until) await new Promise((r) => setTimeout(r, 20));
    assert.ok(s.ended, 'the stream ended with the server');
  });

  test('a revoked API key: its stream ends within a few seconds, saying why, and hands on nothing from then on', async () => {
    const owner = await createUser(t());
    const made = await api(t(), owner.token).post('/api-keys', { body: { name: 'ro', scope: 'read_only' } });
    assert.equal(made.status, 201, made.text);
    t().forbidSecret(made.body.key);
    const mine = await createApiKey(t(), owner.token, 'read_only', 'stays');
    const s = await Stream.open(base, made.body.key);
    const kept = await Stream.open(base, mine);
    assert.deepEqual([s.status, kept.status], [200, 200]);
    await uploadSshKey(t(), owner.token);
    await Promise.all([s.waitFor(1), kept.waitFor(1)]);

    const revokedAt = Date.now();
    const del = await api(t(), owner.token).delete('/api-keys/{key_id}', { params: { key_id: made.body.id } });
    assert.equal(del.status, 204, del.text);
    await uploadSshKey(t(), owner.token);
    const took = await s.waitEnded();
    assert.ok(Date.now() - revokedAt < 4000, `ended ${Date.now() - revokedAt} ms after the revocation (${took})`);
    assert.equal(s.closedBecause, 'credential_revoked');
    assert.deepEqual(
      s.events.map((e) => e.type),
      ['ssh_key.created'],
      'not even the revocation itself: it committed with the revocation',
    );
    // The owner's other key was not touched: its stream goes on and sees what came after.
    await kept.waitFor(3);
    assert.deepEqual(
      kept.events.map((e) => e.type),
      ['ssh_key.created', 'api_key.revoked', 'ssh_key.created'],
    );
    assert.equal(kept.ended, false);
    assert.equal((await Stream.open(base, made.body.key)).status, 401);
    await Promise.all([s.close(), kept.close()]);
  });

  test("logging out everywhere ends the session's streams", async () => {
    const who = await createUser(t());
    const s = await Stream.open(base, who.token);
    assert.equal(s.status, 200);
    await sleep(700); // a poll or so: an open stream is not ended while its session stands
    assert.equal(s.ended, false);
    assert.equal((await api(t(), who.token).post('/auth/logout-all')).status, 204);
    await credit(t(), adminKey, who.id, 5);
    await s.waitEnded();
    assert.equal(s.closedBecause, 'credential_revoked');
    assert.deepEqual(s.events, []);
    await s.close();
  });

  test("a suspension ends the account's streams, by key and by session", async () => {
    const who = await createUser(t());
    const whoKey = await createApiKey(t(), who.token, 'read_only', 'ro');
    const byKey = await Stream.open(base, whoKey);
    const bySession = await Stream.open(base, who.token);
    assert.deepEqual([byKey.status, bySession.status], [200, 200]);
    const r = await api(t(), adminKey).patch('/admin/users/{user_id}', {
      params: { user_id: who.id },
      body: { suspended: true },
    });
    assert.equal(r.status, 200, r.text);
    await credit(t(), adminKey, who.id, 5);
    await Promise.all([byKey.waitEnded(), bySession.waitEnded()]);
    assert.deepEqual([byKey.closedBecause, bySession.closedBecause], ['account_suspended', 'account_suspended']);
    assert.deepEqual([...byKey.events, ...bySession.events], []);
    assert.equal((await Stream.open(base, whoKey)).status, 403);
    await Promise.all([byKey.close(), bySession.close()]);
  });

  test("a demoted administrator's stream ends, and the nodes' events with it", async () => {
    const op = await createUser(t(), { admin: true });
    const s = await Stream.open(base, op.token, '?type=node.offline,node.online');
    assert.equal(s.status, 200);
    const setNode = async (status: 'offline' | 'active') =>
      assert.equal(
        (await api(t(), adminKey).patch('/admin/nodes/{node}', { params: { node }, body: { status } })).status,
        200,
      );
    await setNode('offline');
    await s.waitFor(1);
    const r = await api(t(), adminKey).patch('/admin/users/{user_id}', {
      params: { user_id: op.id },
      body: { role: 'user' },
    });
    assert.equal(r.status, 200, r.text);
    await setNode('active');
    await s.waitEnded();
    assert.equal(s.closedBecause, 'role_changed');
    assert.deepEqual(
      s.events.map((e) => e.type),
      ['node.offline'],
    );
    // Open again, the stream is a customer's: no node events.
    const again = await Stream.open(base, op.token, '?type=node.offline,node.online');
    assert.equal(again.status, 200);
    await setNode('offline');
    await setNode('active');
    await sleep(1200);
    assert.deepEqual(again.events, []);
    await Promise.all([s.close(), again.close()]);
  });

  test('a revocation made through another instance ends a stream held by this one', async () => {
    const second = await t().another();
    const who = await createUser(t());
    const made = await api(t(), who.token).post('/api-keys', { body: { name: 'elsewhere', scope: 'read_only' } });
    assert.equal(made.status, 201, made.text);
    t().forbidSecret(made.body.key);
    const byKey = await Stream.open(base, made.body.key);
    const bySession = await Stream.open(base, who.token);
    assert.deepEqual([byKey.status, bySession.status], [200, 200]);
    // This instance has just answered for both credentials: what it remembers of them is fresh.
    assert.equal((await api(t(), made.body.key).get('/events')).status, 200);
    const inject = (method: 'DELETE' | 'POST', url: string) =>
      second.inject({ method, url, headers: { authorization: `Bearer ${who.token}` } });
    assert.equal((await inject('DELETE', `/api-keys/${made.body.id}`)).statusCode, 204);
    await byKey.waitEnded();
    assert.equal(byKey.closedBecause, 'credential_revoked');
    assert.equal(bySession.ended, false);
    // The session still stands: the revocation's event reaches its stream. (The poll that ended the key's stream may
    // have read the events just before the revocation committed: the event then comes with the next poll.)
    await bySession.waitFor(1);
    assert.equal((await inject('POST', '/auth/logout-all')).statusCode, 204);
    await bySession.waitEnded();
    assert.equal(bySession.closedBecause, 'credential_revoked');
    assert.deepEqual(byKey.events, [], "the key's stream did not hand on its own revocation");
    assert.deepEqual(
      bySession.events.map((e) => e.type),
      ['api_key.revoked'],
      'the session stood then',
    );
    await Promise.all([byKey.close(), bySession.close(), second.close()]);
  });

  // Last: it moves the service clock past the life of every access token made so far.
  test('an access token ends its stream when it expires, by the service clock; an API key goes on', async () => {
    const who = await createUser(t());
    const s = await Stream.open(base, who.token);
    const byKey = await Stream.open(base, key);
    assert.deepEqual([s.status, byKey.status], [200, 200]);
    const left = expOf(who.token) - Math.floor(t().clock.nowMs() / 1000);
    await t().services.clock.advance(left - 1);
    await sleep(1200);
    assert.equal(s.ended, false, 'a second before its expiry');
    await t().services.clock.advance(1);
    await s.waitEnded();
    assert.equal(s.closedBecause, 'credential_expired');
    assert.equal(byKey.ended, false);
    await Promise.all([s.close(), byKey.close()]);
  });
});

if (DB_KINDS.includes('postgres')) {
  test('the poller hands on an event whose transaction commits after later ones, once [postgres]', async () => {
    const tdb = await createTestDb('postgres');
    const other = await tdb.openAnother();
    const hub = new EventHub(tdb.db, { pollMs: 3_600_000, graceMs: 60_000 });
    const got: EventRow[] = [];
    const insert = (q: { query: (sql: string, p: unknown[]) => Promise<unknown> }, n: number) =>
      q.query(`INSERT INTO events (id, type, user_id, data, created_at) VALUES ($1, 'node.offline', NULL, $2, now())`, [
        newOrderedId(),
        JSON.stringify({ n }),
      ]);
    try {
      const unsubscribe = await hub.subscribe(
        { reader: { userId: -1, operator: true }, types: null, vmId: null },
        (e) => got.push(e),
      );
      let release!: () => void;
      const held = new Promise<void>((r) => (release = r));
      let inserted!: () => void;
      const firstInserted = new Promise<void>((r) => (inserted = r));
      // Event 1 takes its number first but commits last.
      const slow = other.transaction(async (tx) => {
        await insert(tx, 1);
        inserted();
        await held;
      });
      await firstInserted;
      await insert(tdb.db, 2);
      await hub.tick();
      assert.deepEqual(
        got.map((e) => e.data.n),
        [2],
      );
      release();
      await slow;
      await hub.tick();
      await insert(tdb.db, 3);
      await hub.tick();
      await hub.tick();
      assert.deepEqual(
        got.map((e) => e.data.n),
        [2, 1, 3],
        'the late one arrives once it commits, and nothing twice',
      );
      unsubscribe();
    } finally {
      await tdb.cleanup();
    }
  });
}
