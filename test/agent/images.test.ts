/**
 * Images the control plane wants on a host (`PUT /v1/templates`), pulled by the
 * agent from a real HTTP server (test/agent/image-source.ts) into real files and
 * checked with the real qemu-img: ready after a download, resumed after a cut
 * and after an agent restart, a checksum mismatch failed then retried, a
 * corrupted copy fetched again, a backing file refused, a full disk, one
 * download at a time, the bandwidth cap, the clean-up once the last VM is gone,
 * and provisions refused while a template is not ready. No VM is started.
 */
import { after, afterEach, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { randomBytes, randomUUID } from 'node:crypto';
import { chmodSync, existsSync, mkdirSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { FastifyInstance } from 'fastify';
import type { AgentDesiredTemplate, AgentTemplateState } from '../../src/host-agent/api.js';
import { buildAgentApp } from '../../src/host-agent/server.js';
import { TemplateStore } from '../../src/host-agent/templates.js';
import { VmManager } from '../../src/host-agent/vms.js';
import { ImagePuller } from '../../src/host-agent/images/pull.js';
import { genisoimage, qemuImg } from './qemu-helpers.js';
import { workDir } from './real-vms.js';
import { ImageSource } from './image-source.js';

const TOKEN = 'agent-images-test-token-'.padEnd(40, 'i');
const KEY = 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl me@laptop';
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

interface Agent {
  dataDir: string;
  app: FastifyInstance;
  images: ImagePuller;
  templates: TemplateStore;
  vms: VmManager;
  call(method: string, url: string, body?: unknown, token?: string): Promise<{ status: number; body: any }>;
  states(): Promise<AgentTemplateState[]>;
  state(vmid: number): Promise<AgentTemplateState | undefined>;
  close(): Promise<void>;
}

describe('agent images: pulled from the control plane', { skip: qemuImg.skip || genisoimage.skip }, () => {
  let root: string;
  const source = new ImageSource(TOKEN);
  const open: Agent[] = [];
  const mounts: string[] = [];
  let port = 43000 + Math.floor(Math.random() * 200) * 10;

  const startAgent = async (dataDir: string, o: { limitMbps?: number; retryBaseMs?: number } = {}): Promise<Agent> => {
    const images = new ImagePuller({
      dir: join(dataDir, 'images'),
      token: TOKEN,
      limitMbps: o.limitMbps ?? null,
      retryBaseMs: o.retryBaseMs ?? 300,
      retryMaxMs: 2000,
    });
    images.load();
    const templates = new TemplateStore(join(dataDir, 'templates'), images);
    const vms = new VmManager(
      {
        dataDir,
        accel: 'tcg',
        publicHost: '127.0.0.1',
        forwardHost: '127.0.0.1',
        sshPorts: { from: port, to: port + 5 },
        fakeGpus: 1,
      },
      templates,
    );
    port += 10;
    await vms.load();
    images.start();
    const app = await buildAgentApp(vms, templates, { token: TOKEN, accel: 'tcg', publicHost: '127.0.0.1' });
    const call = async (method: string, url: string, body?: unknown, token = TOKEN) => {
      const r = await app.inject({
        method: method as 'GET',
        url,
        headers: { authorization: `Bearer ${token}` },
        ...(body === undefined ? {} : { payload: body as object }),
      });
      return { status: r.statusCode, body: r.body ? JSON.parse(r.body) : undefined };
    };
    const states = async () => (await call('GET', '/v1/host')).body.templates as AgentTemplateState[];
    const agent: Agent = {
      dataDir,
      app,
      images,
      templates,
      vms,
      call,
      states,
      state: async (vmid) => (await states()).find((t) => t.vmid === vmid),
      close: async () => {
        await app.close();
        await images.close();
        vms.close();
      },
    };
    open.push(agent);
    return agent;
  };
  const fresh = async (tag: string, o?: { limitMbps?: number; retryBaseMs?: number }) => {
    const d = join(root, tag);
    mkdirSync(d);
    return startAgent(d, o);
  };
  const desired = (vmid: number, sha256: string, format: 'qcow2' | 'raw' = 'raw'): AgentDesiredTemplate => ({
    vmid,
    user: 'debian',
    sha256,
    size_bytes: source.images.get(sha256)?.length ?? 1,
    format,
    url: `${source.url}/images/${sha256}`,
  });
  const push = async (a: Agent, list: AgentDesiredTemplate[]) => {
    const r = await a.call('PUT', '/v1/templates', { templates: list });
    assert.equal(r.status, 200, JSON.stringify(r.body));
    assert.ok(Array.isArray(r.body), 'the answer is the list of states');
    return r.body as AgentTemplateState[];
  };
  const until = async (a: Agent, vmid: number, ok: (s: AgentTemplateState | undefined) => boolean, ms = 20_000) => {
    const end = Date.now() + ms;
    for (;;) {
      const s = await a.state(vmid);
      if (ok(s)) return s!;
      if (Date.now() > end) assert.fail(`template ${vmid} never got there: ${JSON.stringify(s)}`);
      await sleep(25);
    }
  };
  const ready = (a: Agent, vmid: number) => until(a, vmid, (s) => s?.state === 'ready');
  /** A raw image of random bytes (its first sector zero, so nothing takes it for another format). */
  const rawImage = (bytes: number) => {
    const b = randomBytes(bytes);
    b.fill(0, 0, 512);
    return source.add(b);
  };
  /** A qcow2 image made by qemu-img (sizes differ, so do their bytes). */
  let qcowSize = 8;
  const qcowImage = (extra: string[] = []) => {
    const f = join(root, `img-${qcowSize}.qcow2`);
    execFileSync('qemu-img', ['create', '-q', '-f', 'qcow2', ...extra, f, `${qcowSize++}M`]);
    return source.add(readFileSync(f));
  };
  const pulledFile = (a: Agent, sha: string, format = 'raw') => join(a.dataDir, 'images', `${sha}.${format}`);
  const spec = (vmid: number, template: number) => ({
    vmid,
    template_vmid: template,
    cpu_cores: 1,
    ram_mb: 256,
    storage_gb: 1,
    gpu_count: 0,
    auth_method: 'ssh_key',
    ssh_public_key: KEY,
    password: null,
  });

  before(async () => {
    qemuImg.ensure();
    genisoimage.ensure();
    root = workDir('img');
    await source.start();
  });

  afterEach(async () => {
    for (const a of open.splice(0)) await a.close().catch(() => undefined);
  });

  after(async () => {
    for (const a of open) await a.close().catch(() => undefined);
    await source.stop();
    for (const m of mounts) spawnSync('umount', ['-l', m]);
    if (root) rmSync(root, { recursive: true, force: true });
  });

  test('ready after a download with the agent token; GET /v1/host shows the same states; a local template shows as local', async () => {
    const a = await fresh('ready');
    const local = join(root, 'local.raw');
    execFileSync('qemu-img', ['create', '-q', '-f', 'raw', local, '4M']);
    await a.templates.add(100, local, 'ubuntu');
    const sha = qcowImage();
    const answer = await push(a, [desired(105, sha, 'qcow2')]);
    assert.deepEqual(
      answer.map((t) => [t.vmid, t.source, t.user]),
      [
        [100, 'local', 'ubuntu'],
        [105, 'pulled', 'debian'],
      ],
    );
    assert.ok(['queued', 'downloading'].includes(answer[1]!.state!), JSON.stringify(answer[1]));
    const s = await ready(a, 105);
    const size = source.images.get(sha)!.length;
    assert.deepEqual(s, {
      vmid: 105,
      user: 'debian',
      sha256: sha,
      source: 'pulled',
      state: 'ready',
      bytes_done: size,
      size_bytes: size,
      reason: null,
    });
    const file = pulledFile(a, sha, 'qcow2');
    assert.equal(statSync(file).mode & 0o777, 0o400);
    assert.ok(!existsSync(`${file}.part`));
    const meta = JSON.parse(readFileSync(join(a.dataDir, 'images', `${sha}.json`), 'utf8'));
    assert.equal(meta.size_bytes, size);
    assert.equal(meta.mtime_ms, statSync(file).mtimeMs);
    const reqs = source.requests.filter((r) => r.sha256 === sha);
    assert.equal(reqs.length, 1);
    assert.equal(reqs[0]!.authorization, `Bearer ${TOKEN}`);
    assert.equal(reqs[0]!.range, undefined);
    const again = await push(a, [desired(105, sha, 'qcow2')]);
    assert.deepEqual(again, await a.states(), 'PUT answers what GET /v1/host shows');
    assert.equal(source.requests.filter((r) => r.sha256 === sha).length, 1, 'nothing fetched twice');
    const local100 = again.find((t) => t.vmid === 100)!;
    assert.equal(local100.state, 'ready');
    assert.equal(local100.sha256, a.templates.get(100)!.sha256);
  });

  test('PUT /v1/templates: the token, and strict validation', async () => {
    const a = await fresh('valid');
    const good = desired(105, 'a'.repeat(64));
    const wrong = await a.call('PUT', '/v1/templates', { templates: [good] }, 'not-the-token');
    assert.equal(wrong.status, 401);
    assert.equal(wrong.body.code, 'unauthorized');
    const bad: [unknown, string][] = [
      [{ ...good, sha256: 'A'.repeat(64) }, 'uppercase sha256'],
      [{ ...good, sha256: 'a'.repeat(63) }, 'short sha256'],
      [{ ...good, url: 'ftp://cp.example.com/x' }, 'ftp url'],
      [{ ...good, url: 'http://user:pw@cp.example.com/x' }, 'credentials in the url'],
      [{ ...good, format: 'vmdk' }, 'format'],
      [{ ...good, size_bytes: 0 }, 'size 0'],
      [{ ...good, size_bytes: '10' }, 'size as a string'],
      [{ ...good, user: 'Root Admin' }, 'user'],
      [{ ...good, vmid: 0 }, 'vmid 0'],
      [{ ...good, extra: 1 }, 'an unknown field'],
    ];
    for (const [t, what] of bad) {
      const r = await a.call('PUT', '/v1/templates', { templates: [t] });
      assert.equal(r.status, 422, `${what}: ${JSON.stringify(r.body)}`);
      assert.equal(r.body.code, 'validation_error');
    }
    const twice = await a.call('PUT', '/v1/templates', { templates: [good, { ...good, user: 'other' }] });
    assert.equal(twice.status, 422);
    assert.match(twice.body.detail, /template 105 is listed twice/);
    assert.equal((await a.call('PUT', '/v1/templates', { templates: [], more: 1 })).status, 422);
    assert.ok(!existsSync(join(a.dataDir, 'images', 'desired.json')), 'nothing refused was kept');
    assert.deepEqual(await push(a, []), []);
  });

  test('a cut download resumes from the part with a Range request, not from 0', async () => {
    const a = await fresh('cut');
    const sha = rawImage(2_000_000);
    source.faults.set(sha, { cutAt: 700_000, once: true });
    const part = `${pulledFile(a, sha)}.part`;
    const partAtRequest: number[] = [];
    source.onRequest = (r) => {
      if (r.sha256 === sha) partAtRequest.push(existsSync(part) ? statSync(part).size : 0);
    };
    await push(a, [desired(105, sha)]);
    await ready(a, 105);
    source.onRequest = null;
    const reqs = source.requests.filter((r) => r.sha256 === sha);
    assert.equal(reqs.length, 2, JSON.stringify(reqs));
    assert.equal(reqs[0]!.range, undefined);
    assert.ok(partAtRequest[1]! > 0 && partAtRequest[1]! <= 700_000, String(partAtRequest));
    assert.equal(reqs[1]!.range, `bytes=${partAtRequest[1]}-`, 'resumed where the part ends');
    assert.deepEqual(readFileSync(pulledFile(a, sha)), source.images.get(sha));

    // A source that answers a Range request with 200: the download starts over (after the backoff: cut
    // at the same place again, it made no progress), and still ends right.
    const whole = rawImage(1_000_000);
    source.faults.set(whole, { cutAt: 400_000, ignoreRange: true });
    await push(a, [desired(106, whole)]);
    await until(a, 106, () => source.requests.filter((r) => r.sha256 === whole).length >= 2);
    source.faults.delete(whole);
    await ready(a, 106);
    assert.deepEqual(readFileSync(pulledFile(a, whole)), source.images.get(whole));
  });

  test('an agent stopped mid-download resumes at its next start', async () => {
    const a = await fresh('restart');
    const sha = rawImage(1_500_000);
    source.faults.set(sha, { holdAt: 600_000, once: true });
    await push(a, [desired(105, sha)]);
    await until(a, 105, (s) => s?.state === 'downloading' && s.bytes_done! >= 600_000);
    await a.close();
    const part = `${pulledFile(a, sha)}.part`;
    const kept = statSync(part).size;
    assert.ok(kept > 0 && kept <= 600_000, `the part stays: ${kept}`);
    source.release();
    const b = await startAgent(a.dataDir); // no PUT: the desired set was kept
    assert.ok((await b.state(105))!.bytes_done! >= kept, 'its progress is the part kept');
    await ready(b, 105);
    const reqs = source.requests.filter((r) => r.sha256 === sha);
    assert.equal(reqs.length, 2);
    assert.equal(reqs[1]!.range, `bytes=${kept}-`);
    assert.deepEqual(readFileSync(pulledFile(b, sha)), source.images.get(sha));
  });

  test('a checksum mismatch fails (the part deleted), is retried later, and at once for another checksum', async () => {
    const a = await fresh('sum');
    const sha = rawImage(300_000);
    source.faults.set(sha, { wrong: randomBytes(300_000) });
    await push(a, [desired(105, sha)]);
    const failed = await until(a, 105, (s) => s?.state === 'failed');
    assert.match(
      failed.reason!,
      /^checksum mismatch: the downloaded file's SHA-256 is [0-9a-f]{64}, the control plane declared/,
    );
    assert.ok(!existsSync(`${pulledFile(a, sha)}.part`), 'the bad part is gone');
    assert.ok(!existsSync(pulledFile(a, sha)), 'nothing was put in place');
    const refused = await a.call('PUT', `/v1/vms/${randomUUID()}`, spec(3100, 105));
    assert.equal(refused.status, 409);
    assert.equal(refused.body.code, 'template_unavailable');
    assert.match(refused.body.detail, /template 105 failed on this host: checksum mismatch/);
    source.faults.delete(sha);
    await ready(a, 105); // the backoff's next try (300 ms here)
    assert.ok(source.requests.filter((r) => r.sha256 === sha).length >= 2);

    // A long backoff: a new checksum from the control plane is fetched at once all the same.
    const slow = await fresh('sum-slow', { retryBaseMs: 600_000 });
    const bad = rawImage(200_000);
    source.faults.set(bad, { wrong: randomBytes(200_000) });
    await push(slow, [desired(106, bad)]);
    await until(slow, 106, (s) => s?.state === 'failed');
    const good = rawImage(200_000);
    await push(slow, [desired(106, good)]);
    const s = await until(slow, 106, (x) => x?.state === 'ready', 5000);
    assert.equal(s.sha256, good);
  });

  test('a ready copy changed on disk is verified again: a touch keeps it, a corruption is fetched again', async () => {
    const a = await fresh('corrupt');
    const sha = rawImage(400_000);
    await push(a, [desired(105, sha)]);
    await ready(a, 105);
    const file = pulledFile(a, sha);
    const count = () => source.requests.filter((r) => r.sha256 === sha).length;

    const later = new Date(Date.now() + 5000);
    execFileSync('touch', ['-d', later.toISOString(), file]); // same bytes, another mtime
    const id = randomUUID();
    const ok = await a.call('PUT', `/v1/vms/${id}`, spec(3200, 105));
    assert.equal(ok.status, 200, JSON.stringify(ok.body));
    assert.equal(count(), 1, 'hashed again, still good: not fetched');
    assert.equal(
      JSON.parse(readFileSync(join(a.dataDir, 'images', `${sha}.json`), 'utf8')).mtime_ms,
      statSync(file).mtimeMs,
    );

    // Corrupted before a provision: refused, deleted, fetched again.
    chmodSync(file, 0o600); // root writes anyway; another user needs this
    const f = readFileSync(file);
    f[1000] = f[1000]! ^ 0xff;
    writeFileSync(file, f);
    const refused = await a.call('PUT', `/v1/vms/${randomUUID()}`, spec(3201, 105));
    assert.equal(refused.status, 409, JSON.stringify(refused.body));
    assert.equal(refused.body.code, 'template_unavailable');
    assert.match(refused.body.detail, /the copy on the host was corrupted/);
    await ready(a, 105);
    assert.equal(count(), 2);
    assert.deepEqual(readFileSync(file), source.images.get(sha));

    // Corrupted before a desired push: noticed there too.
    chmodSync(file, 0o600);
    const g = readFileSync(file);
    g[2000] = g[2000]! ^ 0xff;
    writeFileSync(file, g);
    await push(a, [desired(105, sha)]);
    await until(a, 105, (s) => s?.state !== 'ready' || count() === 3);
    await ready(a, 105);
    assert.equal(count(), 3);
    assert.deepEqual(readFileSync(file), source.images.get(sha));
    assert.equal((await a.call('DELETE', `/v1/vms/${id}`)).status, 204);
  });

  test('an image with a backing file (or another format than declared) is refused and not fetched again', async () => {
    const a = await fresh('backing');
    const evil = qcowImage(['-F', 'raw', '-b', '/etc/shadow']);
    const mislabelled = qcowImage();
    await push(a, [desired(105, evil, 'qcow2'), desired(106, mislabelled, 'raw')]);
    const s = await until(a, 105, (x) => x?.state === 'failed');
    assert.match(
      s.reason!,
      /the image was refused: it has a backing file \(\/etc\/shadow\); an image must stand alone/,
    );
    const t = await until(a, 106, (x) => x?.state === 'failed');
    assert.match(t.reason!, /the image was refused: it is qcow2, the control plane declared raw/);
    for (const [sha, fmt] of [
      [evil, 'qcow2'],
      [mislabelled, 'raw'],
    ] as const) {
      assert.ok(!existsSync(pulledFile(a, sha, fmt)) && !existsSync(`${pulledFile(a, sha, fmt)}.part`));
    }
    await sleep(800); // beyond the test's backoff
    assert.equal(source.requests.filter((r) => r.sha256 === evil).length, 1, 'no retry under the same checksum');
    const refused = await a.call('PUT', `/v1/vms/${randomUUID()}`, spec(3300, 105));
    assert.equal(refused.status, 409);
    assert.match(refused.body.detail, /backing file/);
  });

  test('HTTP errors and an unreachable source: failed with the reason, then retried', async () => {
    const a = await fresh('http');
    const sha = rawImage(100_000);
    source.faults.set(sha, { status: 404 });
    const dead = { ...desired(107, rawImage(1000)), url: 'http://127.0.0.1:1/images/x' };
    await push(a, [desired(105, sha), { ...desired(106, rawImage(1000)), url: `${source.url}/nope` }, dead]);
    assert.match((await until(a, 105, (x) => x?.state === 'failed')).reason!, /does not have the image \(HTTP 404/);
    assert.match((await until(a, 107, (x) => x?.state === 'failed')).reason!, /image source is unreachable/);
    source.faults.set(sha, { status: 401 });
    await until(a, 105, (x) => /HTTP 401/.test(x?.reason ?? ''));
    assert.match((await a.state(105))!.reason!, /refused the agent's token \(HTTP 401: refused with 401\)/);
    source.faults.delete(sha);
    await ready(a, 105);
  });

  test('a full disk: refused before starting (statfs), and ENOSPC while writing on a small file system', async (t) => {
    const a = await fresh('full');
    const sha = rawImage(10_000);
    const huge = { ...desired(105, sha), size_bytes: 2 ** 49 };
    await push(a, [huge]);
    const s = await until(a, 105, (x) => x?.state === 'failed');
    assert.match(s.reason!, /^disk full on the host: [\d.]+ GB free, the image needs 562950 GB$/);
    assert.equal(source.requests.filter((r) => r.sha256 === sha).length, 0, 'nothing downloaded');

    const small = join(root, 'small');
    mkdirSync(join(small, 'images'), { recursive: true });
    if (spawnSync('mount', ['-t', 'tmpfs', '-o', 'size=3m', 'tmpfs', join(small, 'images')]).status !== 0) {
      t.diagnostic('no tmpfs (not root?): ENOSPC while writing was not tried');
      return; // the statfs refusal above is what can be tested here
    }
    mounts.push(join(small, 'images'));
    const b = await startAgent(small);
    const img = rawImage(2_000_000);
    source.faults.set(img, { holdAt: 500_000, once: true });
    await push(b, [desired(105, img)]);
    await until(b, 105, (x) => x?.state === 'downloading' && x.bytes_done! >= 500_000);
    writeFileSync(join(small, 'images', 'filler'), Buffer.alloc(2_000_000)); // someone else fills the disk
    source.release();
    const f = await until(b, 105, (x) => x?.state === 'failed');
    assert.match(f.reason!, /^disk full on the host: [\d.]+ GB free, the image needs 0\.002 GB$/);
    assert.ok(!existsSync(`${pulledFile(b, img)}.part`), 'the part is deleted: the room is the VMs');
    rmSync(join(small, 'images', 'filler'));
    await ready(b, 105);
  });

  test('one download at a time', async () => {
    const a = await fresh('one');
    source.chunkDelayMs = 10;
    source.maxActive = 0;
    try {
      const x = rawImage(1_000_000);
      const y = rawImage(1_000_000);
      const answer = await push(a, [desired(105, x), desired(106, y)]);
      assert.ok(answer.every((t) => t.state === 'queued' || t.state === 'downloading'));
      const during = await until(a, 105, (s) => s?.state === 'downloading');
      assert.equal(during.vmid, 105);
      assert.equal((await a.state(106))!.state, 'queued', 'the second waits for the first');
      await ready(a, 105);
      await ready(a, 106);
      assert.equal(source.maxActive, 1);
    } finally {
      source.chunkDelayMs = 0;
    }
  });

  test('the bandwidth cap slows a download down', async () => {
    const size = 2_500_000;
    const free = await fresh('uncapped');
    const quick = rawImage(size);
    let t0 = Date.now();
    await push(free, [desired(105, quick)]);
    await ready(free, 105);
    const uncapped = Date.now() - t0;

    const a = await fresh('capped', { limitMbps: 1 });
    const sha = rawImage(size);
    t0 = Date.now();
    await push(a, [desired(105, sha)]);
    await sleep(1000);
    const at1s = (await a.state(105))!.bytes_done!;
    await ready(a, 105);
    const capped = Date.now() - t0;
    assert.ok(at1s > 0 && at1s < 1_500_000, `about 1 MB after 1 s at 1 MB/s, got ${at1s}`);
    assert.ok(capped >= 2000, `2.5 MB at 1 MB/s takes over 2 s, took ${capped} ms`);
    assert.ok(capped > uncapped, `capped ${capped} ms, uncapped ${uncapped} ms`);
  });

  test('provisions: refused (409 template_unavailable) until ready; the overlay on the pulled image; clean-up after the last VM', async () => {
    const a = await fresh('vms');
    const local = join(root, 'local2.raw');
    execFileSync('qemu-img', ['create', '-q', '-f', 'raw', local, '4M']);
    await a.templates.add(100, local, 'ubuntu');
    const sha = qcowImage();
    const raw = rawImage(1_048_576);
    source.faults.set(sha, { holdAt: 1000, once: true });
    await push(a, [desired(105, sha, 'qcow2'), desired(106, raw)]);
    const early = await a.call('PUT', `/v1/vms/${randomUUID()}`, spec(3400, 105));
    assert.equal(early.status, 409, JSON.stringify(early.body));
    assert.equal(early.body.code, 'template_unavailable');
    assert.match(early.body.detail, /template 105 is (still downloading|queued for download) on this host/);
    const none = await a.call('PUT', `/v1/vms/${randomUUID()}`, spec(3400, 555));
    assert.equal(none.status, 409);
    assert.match(none.body.detail, /template 555 is not on this host/);
    assert.deepEqual(readdirSync(join(a.dataDir, 'vms')), [], 'refused provisions left nothing behind');
    source.release();
    await ready(a, 105);
    await ready(a, 106);

    const id = randomUUID();
    const vm = await a.call('PUT', `/v1/vms/${id}`, spec(3401, 105));
    assert.equal(vm.status, 200, JSON.stringify(vm.body));
    assert.equal(vm.body.ssh.user, 'debian', "the pulled template's user");
    const rec = JSON.parse(readFileSync(join(a.dataDir, 'vms', '3401', 'vm.json'), 'utf8'));
    assert.deepEqual(rec.image, { sha256: sha, path: pulledFile(a, sha, 'qcow2'), format: 'qcow2' });
    const info = (vmid: number) =>
      JSON.parse(
        execFileSync('qemu-img', ['info', '-U', '--output=json', join(a.dataDir, 'vms', String(vmid), 'disk.qcow2')], {
          encoding: 'utf8',
        }),
      );
    assert.equal(info(3401)['backing-filename'], pulledFile(a, sha, 'qcow2'));
    assert.equal(info(3401)['backing-filename-format'], 'qcow2');
    const rawId = randomUUID();
    assert.equal((await a.call('PUT', `/v1/vms/${rawId}`, spec(3402, 106))).status, 200);
    assert.equal(info(3402)['backing-filename-format'], 'raw', 'a raw image is a raw backing file');
    const localId = randomUUID();
    assert.equal((await a.call('PUT', `/v1/vms/${localId}`, spec(3403, 100))).status, 200);
    assert.equal(info(3403)['backing-filename'], a.templates.get(100)!.path);

    // The control plane drops every template: the images stay while VMs stand on them.
    const dropped = await push(a, []);
    assert.deepEqual(
      dropped.map((t) => [t.vmid, t.source]),
      [[100, 'local']],
      'the local template is never removed by the desired set',
    );
    assert.ok(existsSync(pulledFile(a, sha, 'qcow2')) && existsSync(pulledFile(a, raw)));
    assert.equal((await a.call('DELETE', `/v1/vms/${rawId}`)).status, 204);
    assert.ok(!existsSync(pulledFile(a, raw)), 'the raw image went with its last VM');
    assert.ok(!existsSync(join(a.dataDir, 'images', `${raw}.json`)));
    assert.ok(existsSync(pulledFile(a, sha, 'qcow2')), 'the other still has a VM');
    assert.equal((await a.call('DELETE', `/v1/vms/${id}`)).status, 204);
    assert.ok(!existsSync(pulledFile(a, sha, 'qcow2')), 'gone after the last VM');
    assert.equal((await a.call('DELETE', `/v1/vms/${localId}`)).status, 204);
    assert.ok(a.templates.get(100), 'the local template stays');
  });
});
