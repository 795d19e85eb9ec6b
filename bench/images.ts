/**
 * The images case: one image pushed to the control plane (`npm start` of
 * --repo) and distributed to two real host agents on this machine. The
 * figures:
 *
 *   - the upload: a raw image of random bytes (--image-mb, default 1024)
 *     sent through the API in 32 MiB ranges, in MB/s, and the seconds the
 *     completion takes (the whole file's SHA-256 and qemu-img's checks);
 *   - the distribution: two `gpucloud agent` processes (separate data
 *     directories, in the same temporary directory as the image) registered
 *     as nodes at once; registration hands them the template set, and each
 *     downloads the image from GET /agent/v1/nodes/{node}/images/{sha256}.
 *     Per agent: seconds from registration to `ready` as the control plane
 *     shows it (GET /admin/nodes/{node}/templates, polled every 200 ms); the
 *     download's MB/s (target: at least 200 each), read from the agent's
 *     `.part` file on disk every 100 ms (the control plane only learns
 *     bytes_done at heartbeats, so its view is printed beside it); and the
 *     seconds from the last byte to the image in place (fsync, qemu-img info,
 *     rename: the SHA-256 is computed while the bytes arrive);
 *   - the service's RSS (VmRSS, every 100 ms) from just before registration
 *     until both are ready: the growth, highest minus before (target: under
 *     50 MB). Printed too: the CPU seconds of the service and of each agent,
 *     and the load average (other work on the machine slows every figure).
 *
 * The service runs with GPUCLOUD_AGENT_HEARTBEAT_S=1 (the default is 10), so
 * that the control plane's view of readiness lags the agents by a second at
 * most. 1 MB here is 1 MiB (1,048,576 bytes). The image is held four times on
 * disk (the file, the store, two hosts): with less room than that the size is
 * reduced, and the output says so.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createHash, randomBytes, randomFillSync } from 'node:crypto';
import {
  closeSync,
  createReadStream,
  existsSync,
  openSync,
  readFileSync,
  statfsSync,
  statSync,
  writeSync,
} from 'node:fs';
import http from 'node:http';
import { loadavg } from 'node:os';
import { join } from 'node:path';
import { must } from '../scripts/soak/client.js';
import { freePort } from '../test/helpers/ports.js';
import { withScope, type Scope } from './cleanup.js';
import type { BenchOptions, BenchResult } from './types.js';
import { benchAdmin, freshDatabase, startService } from './service.js';
import { login } from './setup.js';

const MIB = 1024 * 1024;
const RANGE = 32 * MIB;
const VMID = 150;
const TARGET_MBPS = 200;
const TARGET_RSS_MB = 50;
const TIMEOUT_MS = 30_000;
const READY_TIMEOUT_MS = 600_000;
/** Room left free beside the image's four copies. */
const SPARE = 512 * MIB;

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));
const procStatus = (pid: number, field: string) =>
  Number(new RegExp(`${field}:\\s+(\\d+) kB`).exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1] ?? 0) / 1024;
/** User plus system CPU seconds of a process (clock ticks of 1/100 s). */
const cpuS = (pid: number) => {
  const f = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
  return (Number(f[11]) + Number(f[12])) / 100;
};
const f1 = (n: number | null) => (n === null ? '-' : n.toFixed(1));
const f2 = (n: number | null) => (n === null ? '-' : n.toFixed(2));

interface TemplateState {
  template_vmid: number;
  state: string;
  bytes_done: number;
  size_bytes: number;
  reason: string | null;
}

/** A sample at `t` seconds after registration. */
interface Sample {
  t: number;
  bytes: number;
  state: string;
}

interface Host {
  label: string;
  node: string;
  dir: string;
  token: string;
  url: string;
  child: ChildProcess;
  /** The control plane's view (bytes_done, state) and the file on disk (state `in place` once renamed). */
  cp: Sample[];
  disk: Sample[];
  readyAt: number | null;
  rssMaxMb: number;
}

/** The environment without GPUCLOUD_* variables of this shell. */
function cleanEnv(): NodeJS.ProcessEnv {
  return Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('GPUCLOUD_')));
}

/** Writes `bytes` random bytes to `file`; answers their SHA-256. */
function makeImage(file: string, bytes: number): string {
  const hash = createHash('sha256');
  const buf = Buffer.allocUnsafe(8 * MIB);
  const fd = openSync(file, 'w', 0o600);
  try {
    for (let at = 0; at < bytes;) {
      const chunk = buf.subarray(0, Math.min(buf.length, bytes - at));
      randomFillSync(chunk);
      for (let off = 0; off < chunk.length;) off += writeSync(fd, chunk, off);
      hash.update(chunk);
      at += chunk.length;
    }
  } finally {
    closeSync(fd);
  }
  return hash.digest('hex');
}

/** PUT one range of `file` (bytes start..end-1) to an upload. */
function putRange(base: string, token: string, id: string, file: string, start: number, end: number): Promise<void> {
  return new Promise((resolve, reject) => {
    const req = http.request(
      new URL(`/admin/images/uploads/${id}?offset=${start}`, base),
      {
        method: 'PUT',
        headers: {
          authorization: `Bearer ${token}`,
          'content-type': 'application/octet-stream',
          'content-length': String(end - start),
        },
      },
      (res) => {
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (c: string) => (text += c));
        res.on('end', () =>
          res.statusCode === 200
            ? resolve()
            : reject(new Error(`PUT range at ${start}: ${res.statusCode} ${text.slice(0, 300)}`)),
        );
      },
    );
    req.on('error', reject);
    createReadStream(file, { start, end: end - 1, highWaterMark: MIB })
      .on('error', reject)
      .pipe(req);
  });
}

/** A `gpucloud agent` of `repo` on a free port; killed with the scope. */
async function startAgent(scope: Scope, repo: string, dir: string, token: string) {
  const port = await freePort();
  const ssh = 20000 + Math.floor(Math.random() * 4000) * 10;
  const args = ['--listen', `127.0.0.1:${port}`, '--data-dir', dir, '--token', token, '--accel', 'tcg'];
  args.push('--fake-gpus', '1', '--ssh-ports', `${ssh}-${ssh + 9}`);
  const child = spawn(process.execPath, [join(repo, 'dist/bin/gpucloud.js'), 'agent', ...args], {
    cwd: repo,
    env: cleanEnv(),
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  scope.defer(async () => {
    if (child.exitCode !== null || child.signalCode !== null) return;
    const gone = new Promise((r) => child.once('exit', r));
    child.kill('SIGKILL');
    await gone;
  });
  let out = '';
  child.stderr!.on('data', (d) => (out = (out + String(d)).slice(-4000)));
  const url = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`the agent did not start: ${out}`)), 60_000);
    child.stdout!.on('data', (d) => {
      out = (out + String(d)).slice(-4000);
      const m = /gpucloud agent listening on (\S+)/.exec(out);
      if (m) {
        clearTimeout(timer);
        resolve(m[1]!);
      }
    });
    child.once('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`the agent exited ${code}: ${out}`));
    });
  });
  child.stdout!.resume();
  return { child, url };
}

/** The image size to use: `wantMb`, or less when four copies do not fit in `dir`'s file system. */
function sizeThatFits(dir: string, wantMb: number): number {
  const s = statfsSync(dir);
  const free = s.bavail * s.bsize;
  const fits = Math.floor((free - SPARE) / 4 / MIB);
  if (fits >= wantMb) return wantMb;
  if (fits < 64) throw new Error(`${dir}: ${Math.round(free / MIB)} MB free, too little for 4 copies of a 64 MB image`);
  console.log(
    `  NOTE: ${Math.round(free / MIB)} MB free in ${dir}, too little for 4 copies of ${wantMb} MB: using ${fits} MB`,
  );
  return fits;
}

/**
 * MB/s between the first sample with bytes and the first with them all; null if both are the same sample
 * (the transfer fell between two samples). Answers also when those samples were taken.
 */
function rate(samples: Sample[], size: number) {
  const first = samples.find((s) => s.bytes > 0);
  const full = samples.find((s) => s.bytes >= size);
  const mbps = first && full && full.t > first.t ? (full.bytes - first.bytes) / MIB / (full.t - first.t) : null;
  return { first: first ?? null, full: full ?? null, mbps };
}

/** Where the image is on a host's disk now: in place (renamed), a part of N bytes, or nothing. */
function onDisk(h: Host, sha256: string, t: number): Sample {
  const final = join(h.dir, 'images', `${sha256}.raw`);
  try {
    if (existsSync(final)) return { t, bytes: statSync(final).size, state: 'in place' };
    return { t, bytes: statSync(`${final}.part`).size, state: 'part' };
  } catch {
    return { t, bytes: 0, state: 'none' };
  }
}

/** The control plane's view over time, one entry per change: "0.4 s 12%, 1.4 s 40%, 5.1 s ready". */
function timeline(samples: Sample[], size: number): string {
  const out: string[] = [];
  let last = '';
  for (const s of samples) {
    const what = s.state === 'downloading' ? `${Math.floor((s.bytes * 100) / size)}%` : s.state;
    if (what !== last) out.push(`${s.t.toFixed(1)} s ${what}`);
    last = what;
  }
  return out.join(', ');
}

export async function imagesBench(o: BenchOptions, imageMb: number): Promise<BenchResult[]> {
  return withScope(async (scope) => {
    const dir = scope.tempDir();
    const mb = sizeThatFits(dir, imageMb);
    const size = mb * MIB;
    const file = join(dir, 'image.raw');
    let t0 = performance.now();
    const sha256 = makeImage(file, size);
    console.log(`  image: ${mb} MB of random bytes, raw, made in ${((performance.now() - t0) / 1000).toFixed(1)} s`);

    const db = await freshDatabase(scope, o.db);
    db.env.GPUCLOUD_AGENT_HEARTBEAT_S = '1';
    const admin = benchAdmin();
    const svc = await startService(scope, o.repo, db, admin);
    const token = await login(svc.url, admin);
    const call = <T>(method: string, path: string, body?: unknown) =>
      must<T>(svc.url, method, path, { token, body, timeoutMs: TIMEOUT_MS });
    await call('POST', '/admin/templates', {
      template_vmid: VMID,
      name: 'bench-image',
      description: 'The images bench: random bytes',
      os: 'none',
      default_user: 'root',
    });

    // The upload, in ranges, then its completion (the whole file hashed and checked again).
    const rssUpload0 = procStatus(svc.pid, 'VmRSS');
    let rssUploadMax = rssUpload0;
    const uploadTimer = setInterval(() => (rssUploadMax = Math.max(rssUploadMax, procStatus(svc.pid, 'VmRSS'))), 100);
    let uploadS: number, completeS: number;
    try {
      const up = await call<{ id: string }>('POST', '/admin/images/uploads', {
        size_bytes: size,
        sha256,
        template_vmid: VMID,
      });
      t0 = performance.now();
      for (let at = 0; at < size; at += RANGE)
        await putRange(svc.url, token, up.id, file, at, Math.min(size, at + RANGE));
      uploadS = (performance.now() - t0) / 1000;
      t0 = performance.now();
      const image = await call<{ sha256: string; format: string }>('POST', `/admin/images/uploads/${up.id}/complete`);
      completeS = (performance.now() - t0) / 1000;
      if (image.sha256 !== sha256 || image.format !== 'raw') throw new Error(`stored as ${JSON.stringify(image)}`);
    } finally {
      clearInterval(uploadTimer);
    }
    const uploadMbps = mb / uploadS;
    console.log(
      `  upload: ${mb} MB in ${Math.ceil(size / RANGE)} ranges of 32 MB, ${uploadS.toFixed(2)} s (${uploadMbps.toFixed(0)} MB/s); complete (SHA-256 + qemu-img) ${completeS.toFixed(2)} s; RSS ${rssUpload0.toFixed(0)} -> max ${rssUploadMax.toFixed(0)} MB`,
    );

    const hosts: Host[] = [];
    for (const label of ['a', 'b']) {
      const hostDir = join(dir, `agent-${label}`);
      const agentToken = randomBytes(24).toString('hex');
      const agent = await startAgent(scope, o.repo, hostDir, agentToken);
      const base = { label, node: `bench-images-${label}`, dir: hostDir, token: agentToken, ...agent };
      hosts.push({ ...base, cp: [], disk: [], readyAt: null, rssMaxMb: 0 });
    }
    await sleep(1000); // the service settles after the upload
    const rssBefore = procStatus(svc.pid, 'VmRSS');
    const cpu0 = [svc.pid, ...hosts.map((h) => h.child.pid!)].map(cpuS);
    let rssMax = rssBefore;
    const start = performance.now();
    const since = () => (performance.now() - start) / 1000;
    const sampler = setInterval(() => {
      rssMax = Math.max(rssMax, procStatus(svc.pid, 'VmRSS'));
      for (const h of hosts) {
        h.disk.push(onDisk(h, sha256, since()));
        h.rssMaxMb = Math.max(h.rssMaxMb, procStatus(h.child.pid!, 'VmRSS'));
      }
    }, 100);
    let cpu1: number[];
    try {
      // Both at once: registration sends each agent the template set, and both download together.
      await Promise.all(
        hosts.map((h) =>
          call('POST', '/admin/nodes', {
            node: h.node,
            gpu_type: '4090',
            gpu_count: 1,
            ram_gb: 1,
            cpu_cores: 2,
            max_storage_gb: 100,
            cpu_model: 'Bench EPYC',
            pcie_gen: '4.0',
            location: 'bench',
            cluster_name: 'bench',
            agent_url: h.url,
            agent_token: h.token,
          }),
        ),
      );
      const registeredS = since();
      while (hosts.some((h) => h.readyAt === null)) {
        if (since() * 1000 > READY_TIMEOUT_MS) throw new Error(`not ready within ${READY_TIMEOUT_MS / 1000} s`);
        const gone = hosts.find((h) => h.child.exitCode !== null || h.child.signalCode !== null);
        if (gone) throw new Error(`the agent of ${gone.node} exited during the download`);
        await Promise.all(
          hosts
            .filter((h) => h.readyAt === null)
            .map(async (h) => {
              const list = await call<TemplateState[]>('GET', `/admin/nodes/${h.node}/templates`);
              const s = list.find((x) => x.template_vmid === VMID);
              const t = since();
              h.cp.push({ t, bytes: s?.bytes_done ?? 0, state: s?.state ?? 'absent' });
              if (s?.state === 'failed') throw new Error(`template ${VMID} failed on ${h.node}: ${s.reason}`);
              if (s?.state === 'ready') h.readyAt = t;
            }),
        );
        await sleep(200);
      }
      cpu1 = [svc.pid, ...hosts.map((h) => h.child.pid!)].map(cpuS);
      console.log(`  registration of both nodes took ${registeredS.toFixed(2)} s (the template set is sent in it)`);
    } finally {
      clearInterval(sampler);
    }
    await svc.stop(); // before the agents go: no missed heartbeats in the output
    const growth = rssMax - rssBefore;
    const load = loadavg()[0]!.toFixed(1);
    const cpu = cpu1.map((c, i) => c - cpu0[i]!);

    console.log('');
    console.log(
      [
        'agent'.padEnd(7),
        'to ready s'.padStart(10),
        '1st byte s'.padStart(10),
        'last byte s'.padStart(11),
        'in place s'.padStart(10),
        'MB/s disk'.padStart(9),
        'MB/s cp'.padStart(8),
        'verify s'.padStart(8),
        'CPU s'.padStart(6),
        'RSS MB'.padStart(7),
        `  target >= ${TARGET_MBPS} MB/s`,
      ].join(' '),
    );
    const results: BenchResult[] = [
      { kind: 'metering', name: `images: upload ${mb} MB in 32 MB ranges, MB/s`, db: o.db, seconds: uploadMbps },
      { kind: 'metering', name: 'images: upload complete (SHA-256, qemu-img), s', db: o.db, seconds: completeS },
    ];
    for (const [i, h] of hosts.entries()) {
      const disk = rate(h.disk, size);
      const cp = rate(
        h.cp.filter((s) => s.state === 'downloading' || s.state === 'ready'),
        size,
      );
      const inPlace = h.disk.find((s) => s.state === 'in place') ?? null;
      const verifyS = inPlace && disk.full ? inPlace.t - disk.full.t : null;
      const ok = disk.mbps !== null && disk.mbps >= TARGET_MBPS;
      console.log(
        [
          h.label.padEnd(7),
          f2(h.readyAt).padStart(10),
          f2(disk.first?.t ?? null).padStart(10),
          f2(disk.full?.t ?? null).padStart(11),
          f2(inPlace?.t ?? null).padStart(10),
          f1(disk.mbps).padStart(9),
          f1(cp.mbps).padStart(8),
          f2(verifyS).padStart(8),
          cpu[i + 1]!.toFixed(1).padStart(6),
          h.rssMaxMb.toFixed(0).padStart(7),
          `  ${ok ? 'ok' : 'MISSED'}`,
        ].join(' '),
      );
      console.log(`          control plane's view: ${timeline(h.cp, size)}`);
      results.push(
        { kind: 'metering', name: `images: agent ${h.label}, registration to ready, s`, db: o.db, seconds: h.readyAt! },
        {
          kind: 'metering',
          name: `images: agent ${h.label}, download MB/s (target >= ${TARGET_MBPS})`,
          db: o.db,
          seconds: disk.mbps ?? 0,
          ok,
        },
        {
          kind: 'metering',
          name: `images: agent ${h.label}, last byte to in place, s`,
          db: o.db,
          seconds: verifyS ?? 0,
        },
      );
    }
    const rssOk = growth < TARGET_RSS_MB;
    console.log(
      `  service: RSS ${rssBefore.toFixed(0)} MB before, max ${rssMax.toFixed(0)} MB while serving (+${growth.toFixed(1)} MB, target < ${TARGET_RSS_MB}: ${rssOk ? 'ok' : 'MISSED'}); ${cpu[0]!.toFixed(1)} CPU s; load average ${load}`,
    );
    results.push({
      kind: 'metering',
      name: `images: service RSS growth serving 2 agents, MB (target < ${TARGET_RSS_MB})`,
      db: o.db,
      seconds: growth,
      ok: rssOk,
    });
    return results;
  });
}
