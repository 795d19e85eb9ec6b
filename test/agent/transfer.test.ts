/**
 * A stopped VM's disk moved between two real `gpucloud agent` processes on
 * this machine (separate data directories and ports), with the real qemu-img
 * and real HTTP: host A exports a VM's disk (flattened over its template,
 * hashed, served with Range to the export's transfer token), host B, which
 * does not have the template, imports it (downloads, checks the SHA-256 and
 * the image, grows it, writes the seed) and lists it `stopped`. Data written
 * into A's disk with qemu-io is read back from B's. Also: the transfer token
 * opens the disk route and nothing else; a client gone mid-download; a
 * checksum mismatch, a refused token, an unreachable source and a DELETE
 * during an import; a raw image from a store (a real HTTP server,
 * image-source.ts) converted, with a cut resumed at once, and images the
 * checks refuse; an agent killed mid-import that resumes the part; an export
 * from an earlier boot not served; an export refused for a running VM (QEMU
 * launched on a blank disk, as concurrency.test.ts does: no guest boots) and
 * one whose disk is locked that fails and is made again.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import { createHash, randomBytes, randomUUID } from 'node:crypto';
import { existsSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { genisoimage, qemu, qemuImg } from './qemu-helpers.js';
import { ImageSource } from './image-source.js';
import { cli, freePort, kill, qemuPidsUnder, startAgentProcess, workDir, type AgentProcess } from './real-vms.js';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const sha256 = (b: Buffer) => createHash('sha256').update(b).digest('hex');
const KEY = 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl me@laptop';
const MIB = 1024 * 1024;
const TEMPLATE = 105;

interface Host {
  name: string;
  dataDir: string;
  token: string;
  args: string[];
  agent: AgentProcess | null;
}

interface Answer {
  status: number;
  body: any;
  raw: Buffer;
  headers: Headers;
}

describe(
  'moving a stopped VM between two agents: export and import',
  { skip: qemuImg.skip || genisoimage.skip },
  () => {
    let dir: string;
    const hosts: Host[] = [];
    const A = () => hosts[0]!;
    const B = () => hosts[1]!;

    const call = async (
      h: Host,
      method: string,
      path: string,
      o: { body?: unknown; token?: string | null; headers?: Record<string, string> } = {},
    ): Promise<Answer> => {
      const token = o.token === undefined ? h.token : o.token;
      const res = await fetch(`${h.agent!.url}${path}`, {
        method,
        headers: {
          ...(token === null ? {} : { authorization: `Bearer ${token}` }),
          ...(o.body === undefined ? {} : { 'content-type': 'application/json' }),
          ...o.headers,
        },
        ...(o.body === undefined ? {} : { body: JSON.stringify(o.body) }),
      });
      const raw = Buffer.from(await res.arrayBuffer());
      let body: any = undefined;
      if ((res.headers.get('content-type') ?? '').includes('json')) body = JSON.parse(raw.toString('utf8'));
      return { status: res.status, body, raw, headers: res.headers };
    };
    const spec = (vmid: number, extra: Record<string, unknown> = {}) => ({
      vmid,
      template_vmid: TEMPLATE,
      cpu_cores: 1,
      ram_mb: 256,
      storage_gb: 1,
      gpu_count: 0,
      auth_method: 'ssh_key',
      ssh_public_key: KEY,
      password: null,
      ...extra,
    });
    const until = async <T>(what: string, get: () => Promise<T>, ok: (v: T) => boolean, ms = 30_000): Promise<T> => {
      const end = Date.now() + ms;
      for (;;) {
        const v = await get();
        if (ok(v)) return v;
        if (Date.now() > end) assert.fail(`${what}: ${JSON.stringify(v)}`);
        await sleep(50);
      }
    };
    const vm = async (h: Host, id: string) => (await call(h, 'GET', `/v1/vms/${id}`)).body;
    const vmDir = (h: Host, vmid: number) => join(h.dataDir, 'vms', String(vmid));
    const qemuIo = (file: string, ...commands: string[]) => {
      const r = spawnSync('qemu-io', ['-f', 'qcow2', '-t', 'unsafe', ...commands.flatMap((c) => ['-c', c]), file], {
        encoding: 'utf8',
      });
      assert.equal(r.status, 0, r.stderr);
      assert.doesNotMatch(r.stdout, /verification failed|error/i, r.stdout);
      return r.stdout;
    };
    const info = (file: string) =>
      JSON.parse(execFileSync('qemu-img', ['info', '--output=json', file], { encoding: 'utf8' })) as Record<
        string,
        any
      >;
    /** A VM provisioned on A from the template, with `mb` MiB of 0xab at 0 and 4 MiB of 0xcd at 512 MiB. */
    const vmOnA = async (vmid: number, mb = 16) => {
      const id = randomUUID();
      const r = await call(A(), 'PUT', `/v1/vms/${id}`, { body: spec(vmid) });
      assert.equal(r.status, 200, JSON.stringify(r.body));
      assert.equal(r.body.state, 'stopped');
      qemuIo(join(vmDir(A(), vmid), 'disk.qcow2'), `write -P 0xab 0 ${mb}M`, 'write -P 0xcd 512M 4M');
      return id;
    };
    /** Exports a VM on A and waits until it is ready. */
    const exported = async (id: string, token = randomBytes(24).toString('hex')) => {
      const r = await call(A(), 'POST', `/v1/vms/${id}/export`, { body: { token } });
      assert.ok(r.status === 202 || r.status === 200, JSON.stringify(r.body));
      const s = await until(
        'the export ready',
        async () => (await call(A(), 'GET', `/v1/vms/${id}/export`)).body,
        (b) => b.state !== 'exporting',
      );
      assert.equal(s.state, 'ready', JSON.stringify(s));
      return {
        token,
        sha256: s.sha256 as string,
        size: s.size_bytes as number,
        url: `${A().agent!.url}/v1/vms/${id}/export/disk`,
      };
    };
    const source = (e: Awaited<ReturnType<typeof exported>>, extra: Record<string, unknown> = {}) => ({
      url: e.url,
      token: e.token,
      sha256: e.sha256,
      size_bytes: e.size,
      format: 'qcow2',
      ...extra,
    });
    const start = async (h: Host, extra: string[] = []) => {
      h.agent = await startAgentProcess([...h.args, ...extra]);
    };

    before(async () => {
      for (const tool of [qemuImg, genisoimage]) tool.ensure();
      dir = workDir('mv');
      const template = join(dir, 'template.qcow2');
      execFileSync('qemu-img', ['create', '-q', '-f', 'qcow2', template, '64M']);
      for (const name of ['a', 'b']) {
        const token = `transfer-${name}-`.padEnd(48, name);
        const sshFrom = 20000 + Math.floor(Math.random() * 4000) * 10;
        const dataDir = join(dir, name);
        const args = ['--listen', `127.0.0.1:${await freePort()}`, '--data-dir', dataDir, '--token', token];
        args.push('--accel', 'tcg', '--fake-gpus', '1', '--ssh-ports', `${sshFrom}-${sshFrom + 9}`);
        hosts.push({ name, dataDir, token, args, agent: null });
      }
      // Only A has the template.
      const add = cli([
        'agent',
        'template',
        'add',
        String(TEMPLATE),
        template,
        '--user',
        'debian',
        '--data-dir',
        A().dataDir,
      ]);
      assert.equal(add.status, 0, add.stderr);
      await Promise.all(hosts.map((h) => start(h)));
    });

    after(async () => {
      for (const h of hosts) if (h.agent) await kill(h.agent.child);
      if (dir) for (const pid of qemuPidsUnder(dir)) process.kill(pid, 'SIGKILL');
      if (dir) rmSync(dir, { recursive: true, force: true });
    });

    test('a VM exported on A is imported on B, which has no template: the same bytes, verified, standing alone', async () => {
      const id = await vmOnA(301, 64);
      const token = randomBytes(24).toString('hex');
      assert.equal((await call(A(), 'POST', `/v1/vms/${id}/export`, { body: { token: 'short' } })).status, 422);
      const missing = await call(A(), 'POST', `/v1/vms/${randomUUID()}/export`, { body: { token } });
      assert.equal(missing.status, 404);
      assert.equal(missing.body.code, 'not_found');
      assert.equal((await call(A(), 'GET', `/v1/vms/${id}/export`)).status, 404, 'no export yet');

      const begun = await call(A(), 'POST', `/v1/vms/${id}/export`, { body: { token } });
      assert.equal(begun.status, 202, JSON.stringify(begun.body));
      assert.deepEqual(begun.body, {
        state: 'exporting',
        sha256: null,
        size_bytes: null,
        format: 'qcow2',
        error: null,
      });
      const refused = await call(A(), 'POST', `/v1/vms/${id}/start`);
      assert.equal(refused.status, 409, JSON.stringify(refused.body));
      assert.equal(refused.body.code, 'exporting');
      const early = await call(A(), 'GET', `/v1/vms/${id}/export/disk`, { token });
      assert.ok([409, 200].includes(early.status), `${early.status}`);
      if (early.status === 409) assert.equal(early.body.code, 'export_not_ready');

      const e = await exported(id, token);
      const file = join(vmDir(A(), 301), 'export.qcow2');
      const bytes = readFileSync(file);
      assert.equal(e.sha256, sha256(bytes));
      assert.equal(e.size, bytes.length);
      const i = info(file);
      assert.equal(i.format, 'qcow2');
      assert.equal(i['backing-filename'], undefined, 'the export stands alone');
      assert.ok(
        info(join(vmDir(A(), 301), 'disk.qcow2'))['backing-filename'],
        'while the VM itself stands on its template',
      );
      assert.ok(existsSync(join(vmDir(A(), 301), 'export.json')));
      assert.doesNotMatch(
        readFileSync(join(vmDir(A(), 301), 'export.json'), 'utf8'),
        new RegExp(token),
        'no token on disk',
      );
      const again = await call(A(), 'POST', `/v1/vms/${id}/export`, { body: { token } });
      assert.equal(again.status, 200);
      assert.deepEqual(again.body, {
        state: 'ready',
        sha256: e.sha256,
        size_bytes: e.size,
        format: 'qcow2',
        error: null,
      });

      // The disk route: the node's token or the transfer token, with Range.
      const path = `/v1/vms/${id}/export/disk`;
      assert.equal((await call(A(), 'GET', path, { token: null })).status, 401);
      assert.equal((await call(A(), 'GET', path, { token: 'x'.repeat(48) })).status, 401);
      for (const t of [token, A().token]) {
        const whole = await call(A(), 'GET', path, { token: t });
        assert.equal(whole.status, 200);
        assert.equal(whole.headers.get('content-length'), String(bytes.length));
        assert.equal(sha256(whole.raw), e.sha256);
      }
      const part = await call(A(), 'GET', path, { token, headers: { range: 'bytes=1000-' } });
      assert.equal(part.status, 206);
      assert.equal(part.headers.get('content-range'), `bytes 1000-${bytes.length - 1}/${bytes.length}`);
      assert.equal(part.headers.get('content-length'), String(bytes.length - 1000));
      assert.ok(part.raw.equals(bytes.subarray(1000)));
      // A client gone in the middle: the agent lets go of that download and answers the next calls.
      const abort = new AbortController();
      const cut = await fetch(`${A().agent!.url}${path}`, {
        headers: { authorization: `Bearer ${token}` },
        signal: abort.signal,
      });
      const reader = cut.body!.getReader();
      assert.ok((await reader.read()).value!.length > 0);
      abort.abort();
      await reader.read().catch(() => undefined);
      await sleep(200);
      assert.equal((await call(A(), 'GET', '/v1/host')).status, 200);
      assert.equal(sha256((await call(A(), 'GET', path, { token })).raw), e.sha256);
      const past = await call(A(), 'GET', path, { token, headers: { range: `bytes=${bytes.length}-` } });
      assert.equal(past.status, 416);
      assert.equal(past.headers.get('content-range'), `bytes */${bytes.length}`);
      // The transfer token opens that route and nothing else.
      for (const [method, p] of [
        ['GET', '/v1/host'],
        ['GET', `/v1/vms/${id}`],
        ['GET', `/v1/vms/${id}/export`],
        ['GET', `/v1/vms/${id}/console`],
        ['POST', `/v1/vms/${id}/start`],
        ['DELETE', `/v1/vms/${id}/export`],
        ['DELETE', `/v1/vms/${id}`],
        ['GET', `/v1/vms/${randomUUID()}/export/disk`],
      ] as const) {
        const r = await call(A(), method, p, { token });
        assert.equal(r.status, 401, `${method} ${p} with the transfer token`);
      }

      // B imports it: answered at once, `importing`; then stopped, with the bytes checked.
      assert.equal((await call(B(), 'GET', '/v1/host')).body.templates.length, 0, 'B has no template');
      const put = await call(B(), 'PUT', `/v1/vms/${id}`, { body: spec(301, { disk: source(e) }) });
      assert.equal(put.status, 202, JSON.stringify(put.body));
      assert.equal(put.body.state, 'importing');
      assert.equal(put.body.import.size_bytes, e.size);
      assert.equal(put.body.import.error, null);
      const repeat = await call(B(), 'PUT', `/v1/vms/${id}`, { body: spec(301, { disk: source(e) }) });
      assert.ok(
        (repeat.status === 202 && repeat.body.state === 'importing') ||
          (repeat.status === 200 && repeat.body.state === 'stopped'),
        JSON.stringify(repeat.body),
      );
      const done = await until(
        'stopped on B',
        () => vm(B(), id),
        (v) => v.state !== 'importing' || v.import.error,
      );
      assert.equal(done.state, 'stopped', JSON.stringify(done));
      assert.equal(done.import, undefined);
      assert.equal(done.ssh.user, 'root', 'B does not know the template: its user is root');

      const disk = join(vmDir(B(), 301), 'disk.qcow2');
      const di = info(disk);
      assert.equal(di['backing-filename'], undefined, "B's disk stands alone");
      assert.equal(di['virtual-size'], 1024 ** 3, 'grown to storage_gb');
      qemuIo(disk, 'read -P 0xab 0 64M', 'read -P 0xcd 512M 4M', 'read -P 0 64M 1M');
      const cmp = spawnSync('qemu-img', ['compare', '-f', 'qcow2', '-F', 'qcow2', file, disk], { encoding: 'utf8' });
      assert.equal(cmp.status, 0, cmp.stdout + cmp.stderr);
      const rec = JSON.parse(readFileSync(join(vmDir(B(), 301), 'vm.json'), 'utf8'));
      assert.deepEqual(rec.disk_source, { sha256: e.sha256, format: 'qcow2' });
      assert.equal(rec.image, undefined);
      assert.equal(rec.template_vmid, TEMPLATE);
      assert.ok(existsSync(join(vmDir(B(), 301), 'seed.iso')));
      assert.ok(!existsSync(join(B().dataDir, 'vms', '301.import')), 'the import folder is gone');
      const host = (await call(B(), 'GET', '/v1/host')).body;
      assert.deepEqual(
        host.vms.map((v: any) => [v.id, v.state]),
        [[id, 'stopped']],
      );
      const twice = await call(B(), 'PUT', `/v1/vms/${id}`, { body: spec(301, { disk: source(e) }) });
      assert.equal(twice.status, 200);
      assert.equal(twice.body.state, 'stopped');

      // The VM's disk changed since (it ran): the next POST makes the export again, for the new token only.
      qemuIo(join(vmDir(A(), 301), 'disk.qcow2'), 'write -P 0x11 0 1M');
      const e2 = await exported(id);
      assert.notEqual(e2.sha256, e.sha256);
      assert.equal((await call(A(), 'GET', path, { token })).status, 401, 'the old token no longer opens it');
      assert.equal((await call(A(), 'GET', path, { token: e2.token })).status, 200);

      // DELETE removes the export (repeat-safe).
      for (let n = 0; n < 2; n++) assert.equal((await call(A(), 'DELETE', `/v1/vms/${id}/export`)).status, 204);
      assert.equal((await call(A(), 'GET', `/v1/vms/${id}/export`)).status, 404);
      assert.equal((await call(A(), 'GET', path)).status, 404);
      assert.equal((await call(A(), 'GET', path, { token: e2.token })).status, 401);
      for (const f of ['export.qcow2', 'export.json', 'export.qcow2.part'])
        assert.ok(!existsSync(join(vmDir(A(), 301), f)), `${f} removed`);
    });

    test('bad sources leave the VM importing with the reason and nothing built; the next provision retries; DELETE cancels', async () => {
      const id = await vmOnA(302);
      const e = await exported(id);

      // Checks of the disk source.
      for (const bad of [
        { url: 'ftp://127.0.0.1/x' },
        { url: 'http://user:pw@127.0.0.1/x' },
        { token: '' },
        { sha256: e.sha256.toUpperCase() },
        { sha256: 'abc' },
        { size_bytes: 0 },
        { size_bytes: 1.5 },
        { format: 'vmdk' },
        { extra: 1 },
      ]) {
        const r = await call(B(), 'PUT', `/v1/vms/${randomUUID()}`, { body: spec(399, { disk: source(e, bad) }) });
        assert.equal(r.status, 422, JSON.stringify(bad));
        assert.equal(r.body.code, 'validation_error');
      }

      // A checksum mismatch: the part goes, nothing is built.
      const wrong = randomUUID();
      const sha = (e.sha256[0] === '0' ? '1' : '0') + e.sha256.slice(1);
      const r = await call(B(), 'PUT', `/v1/vms/${wrong}`, { body: spec(303, { disk: source(e, { sha256: sha }) }) });
      assert.equal(r.status, 202);
      const failed = await until(
        'the mismatch',
        () => vm(B(), wrong),
        (v) => v.import?.error,
      );
      assert.equal(failed.state, 'importing');
      assert.match(failed.import.error, /^checksum mismatch/);
      assert.equal(failed.import.bytes_done, 0);
      assert.ok(!existsSync(vmDir(B(), 303)), 'no VM folder');
      assert.ok(!existsSync(join(B().dataDir, 'vms', '303.import', 'disk.part')), 'the part is gone');
      const listed = (await call(B(), 'GET', '/v1/host')).body.vms.find((v: any) => v.id === wrong);
      assert.equal(listed.state, 'importing', 'GET /v1/host lists it');
      assert.match(listed.import.error, /checksum mismatch/);
      const start = await call(B(), 'POST', `/v1/vms/${wrong}/start`);
      assert.equal(start.status, 409);
      assert.equal(start.body.code, 'importing');
      const exp = await call(B(), 'POST', `/v1/vms/${wrong}/export`, { body: { token: e.token } });
      assert.equal(exp.status, 409);
      assert.equal(exp.body.code, 'not_stopped');
      const taken = await call(B(), 'PUT', `/v1/vms/${randomUUID()}`, { body: spec(303, { disk: source(e) }) });
      assert.equal(taken.status, 409, 'its vmid stays claimed');
      assert.equal(taken.body.code, 'conflict');
      assert.equal((await call(B(), 'DELETE', `/v1/vms/${wrong}`)).status, 204);
      assert.equal((await call(B(), 'GET', `/v1/vms/${wrong}`)).status, 404);
      assert.ok(!existsSync(join(B().dataDir, 'vms', '303.import')));

      // A refused token, then the right one: the next provision retries.
      const retried = randomUUID();
      const bad = await call(B(), 'PUT', `/v1/vms/${retried}`, {
        body: spec(304, { disk: source(e, { token: 'not-the-transfer-token'.padEnd(40, '!') }) }),
      });
      assert.equal(bad.status, 202);
      const refused = await until(
        'the refusal',
        () => vm(B(), retried),
        (v) => v.import?.error,
      );
      assert.match(refused.import.error, /refused the token \(HTTP 401\)/);
      const unreachable = await call(B(), 'PUT', `/v1/vms/${retried}`, {
        body: spec(304, { disk: source(e, { url: `http://127.0.0.1:${await freePort()}/x` }) }),
      });
      assert.equal(unreachable.status, 202);
      const gone = await until(
        'unreachable',
        () => vm(B(), retried),
        (v) => v.import?.error,
      );
      assert.match(gone.import.error, /unreachable/);
      const good = await call(B(), 'PUT', `/v1/vms/${retried}`, { body: spec(304, { disk: source(e) }) });
      assert.equal(good.status, 202);
      const built = await until(
        'built',
        () => vm(B(), retried),
        (v) => v.state !== 'importing' || v.import.error,
      );
      assert.equal(built.state, 'stopped', JSON.stringify(built));
      qemuIo(join(vmDir(B(), 304), 'disk.qcow2'), 'read -P 0xab 0 16M');

      // Destroying the VM on A removes its export with its folder.
      assert.equal((await call(A(), 'DELETE', `/v1/vms/${id}`)).status, 204);
      assert.ok(!existsSync(vmDir(A(), 302)));
      assert.equal((await call(A(), 'GET', `/v1/vms/${id}/export/disk`, { token: e.token })).status, 401);
    });

    test('an image of a store: a raw one is converted, a cut resumed at once; images the checks refuse', async () => {
      const store = new ImageSource('store-token-'.padEnd(40, 's'));
      await store.start();
      try {
        const fromStore = (sha: string, format: 'raw' | 'qcow2') => ({
          url: `${store.url}/images/${sha}`,
          token: 'store-token-'.padEnd(40, 's'),
          sha256: sha,
          size_bytes: store.images.get(sha)!.length,
          format,
        });
        const rawBytes = randomBytes(8 * MIB);
        rawBytes.fill(0, 0, 512); // nothing takes it for another format
        const rawSha = store.add(rawBytes);
        store.faults.set(rawSha, { cutAt: 3 * MIB, once: true });
        const id = randomUUID();
        const r = await call(B(), 'PUT', `/v1/vms/${id}`, { body: spec(311, { disk: fromStore(rawSha, 'raw') }) });
        assert.equal(r.status, 202);
        const done = await until(
          'built',
          () => vm(B(), id),
          (v) => v.state !== 'importing' || v.import.error,
        );
        assert.equal(done.state, 'stopped', JSON.stringify(done));
        const asked = store.requests.filter((q) => q.sha256 === rawSha);
        assert.equal(asked.length, 2, 'cut once, resumed at once');
        assert.match(asked[1]!.range ?? '', /^bytes=\d+-$/);
        const disk = join(vmDir(B(), 311), 'disk.qcow2');
        assert.equal(info(disk).format, 'qcow2', 'converted to qcow2');
        assert.equal(info(disk)['virtual-size'], 1024 ** 3);
        const raw = join(dir, 'store.raw');
        writeFileSync(raw, rawBytes);
        const cmp = spawnSync('qemu-img', ['compare', '-f', 'raw', '-F', 'qcow2', raw, disk], { encoding: 'utf8' });
        assert.equal(cmp.status, 0, cmp.stdout + cmp.stderr);

        // Refused by the checks: larger than storage_gb, a backing file, another format than declared.
        const big = join(dir, 'big.qcow2');
        execFileSync('qemu-img', ['create', '-q', '-f', 'qcow2', big, '2G']);
        const backed = join(dir, 'backed.qcow2');
        execFileSync('qemu-img', ['create', '-q', '-f', 'qcow2', '-F', 'raw', '-b', '/etc/hostname', backed, '1M']);
        for (const [file, format, reason, vmid] of [
          [big, 'qcow2', /more than the VM's storage_gb \(1\)/, 312],
          [backed, 'qcow2', /backing file/, 313],
          [raw, 'qcow2', /it is raw/, 314],
        ] as const) {
          const sha = store.add(readFileSync(file));
          const vmId = randomUUID();
          assert.equal(
            (await call(B(), 'PUT', `/v1/vms/${vmId}`, { body: spec(vmid, { disk: fromStore(sha, format) }) })).status,
            202,
          );
          const v = await until(
            'refused',
            () => vm(B(), vmId),
            (x) => x.import?.error,
          );
          assert.match(v.import.error, /^the image was refused/);
          assert.match(v.import.error, reason);
          assert.ok(!existsSync(vmDir(B(), vmid)), 'nothing built');
          assert.ok(!existsSync(join(B().dataDir, 'vms', `${vmid}.import`, 'disk.part')), 'the part is gone');
          assert.equal((await call(B(), 'DELETE', `/v1/vms/${vmId}`)).status, 204);
        }
      } finally {
        await store.stop();
      }
    });

    test('an agent killed mid-import lists the VM importing after its restart; the next provision resumes the part', async () => {
      const id = await vmOnA(306, 32);
      const e = await exported(id);
      // Slowed down, so the kill lands in the middle.
      await kill(B().agent!.child);
      await start(B(), ['--download-limit', '4']);
      const put = await call(B(), 'PUT', `/v1/vms/${id}`, { body: spec(306, { disk: source(e) }) });
      assert.equal(put.status, 202);
      await until(
        'the download under way',
        () => vm(B(), id),
        (v) => v.import.bytes_done > 8 * MIB,
      );
      const start1 = await call(B(), 'POST', `/v1/vms/${id}/start`);
      assert.equal(start1.status, 409);
      assert.equal(start1.body.code, 'importing');
      const stop = await call(B(), 'POST', `/v1/vms/${id}/stop`, { body: { timeout_s: 0 } });
      assert.equal(stop.body.state, 'importing', 'stop changes nothing');
      const repeat = await call(B(), 'PUT', `/v1/vms/${id}`, { body: spec(306, { disk: source(e) }) });
      assert.equal(repeat.status, 202);
      assert.ok(repeat.body.import.bytes_done > 8 * MIB, 'the repeated provision changes nothing');
      assert.equal(repeat.body.import.error, null);
      await kill(B().agent!.child);
      assert.equal((await call(A(), 'GET', `/v1/vms/${id}/export`)).status, 200, 'A lives on after the cut');
      const part = join(B().dataDir, 'vms', '306.import', 'disk.part');
      const had = statSync(part).size;
      assert.ok(had > 0 && had < e.size, `a part of ${had} bytes`);

      // A restarted too: its ready export is still served, to the same transfer token.
      await kill(A().agent!.child);
      await start(A());
      const s = await call(A(), 'GET', `/v1/vms/${id}/export`);
      assert.equal(s.body.state, 'ready');
      assert.equal(s.body.sha256, e.sha256);

      await start(B());
      const listed = (await call(B(), 'GET', '/v1/host')).body.vms.find((v: any) => v.id === id);
      assert.equal(listed.state, 'importing');
      assert.equal(listed.import.bytes_done, had);
      assert.match(listed.import.error, /restarted/);
      const resumed = await call(B(), 'PUT', `/v1/vms/${id}`, { body: spec(306, { disk: source(e) }) });
      assert.equal(resumed.status, 202);
      assert.ok(
        resumed.body.import.bytes_done >= had,
        `resumed at ${resumed.body.import.bytes_done}, the part had ${had}`,
      );
      const done = await until(
        'stopped on B',
        () => vm(B(), id),
        (v) => v.state !== 'importing' || v.import.error,
      );
      assert.equal(done.state, 'stopped', JSON.stringify(done));
      const log = B().agent!.output();
      assert.match(log, new RegExp(`"resume_from":${had}`), 'the download resumed where the part ended');
      qemuIo(join(vmDir(B(), 306), 'disk.qcow2'), 'read -P 0xab 0 32M', 'read -P 0xcd 512M 4M');

      // The export is not flushed to disk: one recorded in an earlier boot of the host is not served.
      await kill(A().agent!.child);
      const meta = join(vmDir(A(), 306), 'export.json');
      writeFileSync(meta, readFileSync(meta, 'utf8').replace(/"boot_id": "[^"]*"/, '"boot_id": "an-earlier-boot"'));
      await start(A());
      const stale = await call(A(), 'GET', `/v1/vms/${id}/export`);
      assert.equal(stale.body.state, 'failed');
      assert.match(stale.body.error, /the host restarted/);
      assert.equal((await call(A(), 'GET', `/v1/vms/${id}/export/disk`, { token: e.token })).status, 401);
      const remade = await exported(id);
      assert.equal(remade.sha256, e.sha256, 'made again from the same disk: the same bytes');

      // DELETE in the middle of an import: the download stops, its part and claims go.
      await kill(B().agent!.child);
      await start(B(), ['--download-limit', '4']);
      const other = randomUUID();
      assert.equal(
        (await call(B(), 'PUT', `/v1/vms/${other}`, { body: spec(307, { disk: source(remade) }) })).status,
        202,
      );
      await until(
        'under way',
        () => vm(B(), other),
        (v) => v.import.bytes_done > 2 * MIB,
      );
      assert.equal((await call(B(), 'DELETE', `/v1/vms/${other}`)).status, 204);
      assert.equal((await call(B(), 'GET', `/v1/vms/${other}`)).status, 404);
      assert.ok(!existsSync(join(B().dataDir, 'vms', '307.import')), 'the part is gone');
      const again = await call(B(), 'PUT', `/v1/vms/${randomUUID()}`, { body: spec(307, { disk: source(remade) }) });
      assert.equal(again.status, 202, 'its vmid is free again');
      await kill(B().agent!.child);
      await start(B());
    });

    test(
      'a locked disk fails the export, the next POST makes it again; a running VM is not exported',
      { skip: qemu.skip },
      async () => {
        qemu.ensure();
        const id = await vmOnA(308);
        // qemu-io holding the disk open for writing: qemu-img cannot take its lock.
        const holder = spawn('qemu-io', ['-f', 'qcow2', join(vmDir(A(), 308), 'disk.qcow2')], {
          stdio: ['pipe', 'ignore', 'ignore'],
        });
        await sleep(300);
        const token = randomBytes(24).toString('hex');
        try {
          assert.equal((await call(A(), 'POST', `/v1/vms/${id}/export`, { body: { token } })).status, 202);
          const failed = await until(
            'the export failed',
            async () => (await call(A(), 'GET', `/v1/vms/${id}/export`)).body,
            (b) => b.state !== 'exporting',
          );
          assert.equal(failed.state, 'failed');
          assert.match(failed.error, /qemu-img convert failed: .*lock/);
          assert.equal((await call(A(), 'GET', `/v1/vms/${id}/export/disk`)).status, 409);
          assert.equal((await call(A(), 'GET', `/v1/vms/${id}/export/disk`, { token })).status, 401);
        } finally {
          holder.kill('SIGKILL');
          await new Promise((r) => holder.once('exit', r));
        }
        const e = await exported(id, token);
        assert.equal(e.sha256, sha256(readFileSync(join(vmDir(A(), 308), 'export.qcow2'))));

        // A running VM (QEMU on a blank disk: it stays booting) is refused.
        const started = await call(A(), 'POST', `/v1/vms/${id}/start`);
        assert.equal(started.status, 200, JSON.stringify(started.body));
        assert.equal(started.body.state, 'booting');
        const r = await call(A(), 'POST', `/v1/vms/${id}/export`, { body: { token } });
        assert.equal(r.status, 409);
        assert.equal(r.body.code, 'not_stopped');
        assert.equal((await call(A(), 'DELETE', `/v1/vms/${id}`)).status, 204);
        assert.ok(!existsSync(vmDir(A(), 308)));
      },
    );
  },
);
