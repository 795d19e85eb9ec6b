/**
 * The move case: a stopped VM's disk moved between two real host agents on
 * this machine, over loopback, the way the control plane moves a VM to
 * another host. Two `gpucloud agent` processes of this checkout (its sources
 * compiled as the tests run them, test/agent/real-vms.ts), separate data
 * directories; A holds a local template (an empty qcow2 image), B none.
 *
 * A VM is provisioned on A and --image-mb MiB (default 1024) of data written
 * into its disk with qemu-io (non-zero patterns, 64 MiB each), then flushed
 * (`sync`). Timed, end to end:
 *
 *   - export: `POST /v1/vms/{id}/export` on A until `GET .../export` says
 *     ready; split into qemu-img convert and hash as A records them in
 *     export.json;
 *   - import: `PUT /v1/vms/{id}` on B with A's export URL and transfer token
 *     until B reports the VM `stopped` (downloaded, SHA-256 checked, qemu-img
 *     info, grown, seed written); split at the last byte of the part file
 *     (sampled every 20 ms): the transfer, then the checks and the build; and
 *     as B's log line says: the download to its fsync, qemu-img info, the
 *     VM's folder and seed.
 *
 * The figure: MB/s = the data written / (export + import seconds), target at
 * least 150. 1 MB here is 1 MiB. Afterwards (untimed) `qemu-img compare`
 * checks that B's disk holds A's export. The CPU seconds of each agent and
 * the load average are printed beside it (other work on the machine slows
 * every figure). The source disk is in the page cache, as a VM just stopped
 * mostly is.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { randomBytes, randomUUID } from 'node:crypto';
import { existsSync, readFileSync, statfsSync, statSync } from 'node:fs';
import { loadavg } from 'node:os';
import { join } from 'node:path';
import { qemuAvailable } from '../src/host-agent/qemu/process.js';
import { cli, freePort, startAgentProcess } from '../test/agent/real-vms.js';
import { withScope } from './cleanup.js';
import type { BenchResult } from './types.js';

const MIB = 1024 * 1024;
const TARGET_MBPS = 150;
const TEMPLATE = 190;
const VMID = 191;
const TIMEOUT_MS = 600_000;

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));
/** User plus system CPU seconds of a process (clock ticks of 1/100 s). */
const cpuS = (pid: number) => {
  const f = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
  return (Number(f[11]) + Number(f[12])) / 100;
};

async function call<T = any>(base: string, token: string, method: string, path: string, body?: unknown): Promise<T> {
  const res = await fetch(`${base}${path}`, {
    method,
    headers: {
      authorization: `Bearer ${token}`,
      ...(body === undefined ? {} : { 'content-type': 'application/json' }),
    },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });
  const text = await res.text();
  if (!res.ok) throw new Error(`${method} ${path}: ${res.status} ${text.slice(0, 300)}`);
  return (text ? JSON.parse(text) : undefined) as T;
}

export async function moveBench(dataMb: number): Promise<BenchResult[]> {
  if (!qemuAvailable('qemu-img') || !qemuAvailable('qemu-io') || !qemuAvailable('genisoimage')) {
    console.log('  skipped: qemu-img, qemu-io or genisoimage is missing (apt-get install qemu-utils genisoimage)');
    return [];
  }
  return withScope(async (scope) => {
    const dir = scope.tempDir();
    // A's disk, its export, B's download: three copies.
    const s = statfsSync(dir);
    const free = s.bavail * s.bsize;
    let mb = dataMb;
    if (free - 512 * MIB < 3 * mb * MIB) {
      mb = Math.floor((free - 512 * MIB) / 3 / MIB / 64) * 64;
      if (mb < 64) throw new Error(`${dir}: ${Math.round(free / MIB)} MB free, too little for the move case`);
      console.log(`  NOTE: ${Math.round(free / MIB)} MB free in ${dir}: moving ${mb} MB instead of ${dataMb}`);
    }
    const storageGb = Math.ceil(mb / 1024) + 1;

    const template = join(dir, 'template.qcow2');
    execFileSync('qemu-img', ['create', '-q', '-f', 'qcow2', template, '64M']);
    const hosts: { dataDir: string; token: string; url: string; pid: number; output: () => string }[] = [];
    for (const name of ['a', 'b']) {
      const dataDir = join(dir, name);
      const token = randomBytes(24).toString('hex');
      if (name === 'a') {
        const add = cli(['agent', 'template', 'add', String(TEMPLATE), template, '--data-dir', dataDir]);
        if (add.status !== 0) throw new Error(`template add: ${add.stderr}`);
      }
      const ssh = 20000 + Math.floor(Math.random() * 4000) * 10;
      const agent = await startAgentProcess([
        ...['--listen', `127.0.0.1:${await freePort()}`, '--data-dir', dataDir, '--token', token],
        ...['--accel', 'tcg', '--fake-gpus', '1', '--ssh-ports', `${ssh}-${ssh + 9}`],
      ]);
      scope.defer(async () => {
        if (agent.child.exitCode !== null || agent.child.signalCode !== null) return;
        const gone = new Promise((r) => agent.child.once('exit', r));
        agent.child.kill('SIGKILL');
        await gone;
      });
      hosts.push({ dataDir, token, url: agent.url, pid: agent.child.pid!, output: agent.output });
    }
    const [a, b] = [hosts[0]!, hosts[1]!];
    const id = randomUUID();
    const spec = {
      vmid: VMID,
      template_vmid: TEMPLATE,
      cpu_cores: 1,
      ram_mb: 512,
      storage_gb: storageGb,
      gpu_count: 0,
      auth_method: 'password',
      ssh_public_key: null,
      password: 'bench-password',
    };
    await call(a.url, a.token, 'PUT', `/v1/vms/${id}`, spec);
    const disk = join(a.dataDir, 'vms', String(VMID), 'disk.qcow2');
    let t = performance.now();
    const writes: string[] = [];
    for (let at = 0; at < mb; at += 64)
      writes.push('-c', `write -P ${1 + ((0x10 + (at / 64) * 7) % 0xfe)} ${at}M ${Math.min(64, mb - at)}M`);
    execFileSync('qemu-io', ['-f', 'qcow2', '-t', 'unsafe', ...writes, disk], { stdio: 'ignore' });
    spawnSync('sync');
    console.log(`  ${mb} MB written into the VM's disk on A in ${((performance.now() - t) / 1000).toFixed(1)} s`);

    const cpu0 = hosts.map((h) => cpuS(h.pid));
    const token = randomBytes(24).toString('hex');
    // The export.
    t = performance.now();
    await call(a.url, a.token, 'POST', `/v1/vms/${id}/export`, { token });
    let e: { state: string; sha256: string; size_bytes: number; error: string | null };
    for (;;) {
      e = await call(a.url, a.token, 'GET', `/v1/vms/${id}/export`);
      if (e.state !== 'exporting') break;
      if (performance.now() - t > TIMEOUT_MS) throw new Error('the export did not finish');
      await sleep(20);
    }
    if (e.state !== 'ready') throw new Error(`the export failed: ${e.error}`);
    const exportS = (performance.now() - t) / 1000;
    const rec = JSON.parse(readFileSync(join(a.dataDir, 'vms', String(VMID), 'export.json'), 'utf8')) as {
      convert_ms: number;
      hash_ms: number;
    };

    // The import.
    const part = join(b.dataDir, 'vms', `${VMID}.import`, 'disk.part');
    t = performance.now();
    const put = {
      ...spec,
      disk: {
        url: `${a.url}/v1/vms/${id}/export/disk`,
        token,
        sha256: e.sha256,
        size_bytes: e.size_bytes,
        format: 'qcow2',
      },
    };
    await call(b.url, b.token, 'PUT', `/v1/vms/${id}`, put);
    let lastByte: number | null = null;
    for (;;) {
      if (lastByte === null && existsSync(part) && statSync(part).size >= e.size_bytes)
        lastByte = (performance.now() - t) / 1000;
      const v = await call(b.url, b.token, 'GET', `/v1/vms/${id}`);
      if (v.state === 'stopped') break;
      if (v.import?.error) throw new Error(`the import failed: ${v.import.error}`);
      if (performance.now() - t > TIMEOUT_MS) throw new Error('the import did not finish');
      await sleep(20);
    }
    const importS = (performance.now() - t) / 1000;
    const cpu = hosts.map((h, i) => cpuS(h.pid) - cpu0[i]!);
    const load = loadavg()[0]!.toFixed(1);
    const transferS = lastByte ?? importS;
    // B's own split (its log line, written just after): the download (to its fsync), qemu-img info, the VM's
    // folder and seed.
    let line = '';
    for (let i = 0; i < 100 && !line; i++, await sleep(50))
      line = /[^\n]*VM disk imported[^\n]*/.exec(b.output())?.[0] ?? '';
    const field = (k: string) => Number(new RegExp(`"${k}":(\\d+)`).exec(line)?.[1] ?? NaN) / 1000;
    const [downloadS, checkS, buildS] = [field('download_ms'), field('check_ms'), field('build_ms')];
    const totalS = exportS + importS;
    const mbps = mb / totalS;
    const ok = mbps >= TARGET_MBPS;

    // Untimed: B's disk holds A's export.
    const cmp = spawnSync('qemu-img', [
      'compare',
      '-f',
      'qcow2',
      '-F',
      'qcow2',
      join(a.dataDir, 'vms', String(VMID), 'export.qcow2'),
      join(b.dataDir, 'vms', String(VMID), 'disk.qcow2'),
    ]);
    if (cmp.status !== 0) throw new Error(`B's disk differs from A's export: ${String(cmp.stdout)}`);

    const size = e.size_bytes / MIB;
    console.log(`  export file ${size.toFixed(0)} MB; B's disk is identical (qemu-img compare)`);
    console.log(
      `  export ${exportS.toFixed(2)} s (convert ${(rec.convert_ms / 1000).toFixed(2)} s, hash ${(rec.hash_ms / 1000).toFixed(2)} s)`,
    );
    console.log(
      `  import ${importS.toFixed(2)} s (transfer ${transferS.toFixed(2)} s = ${(size / transferS).toFixed(0)} MB/s, checks + build ${(importS - transferS).toFixed(2)} s)`,
    );
    console.log(
      `    B's log: download ${downloadS.toFixed(2)} s (to the last byte and its fsync), qemu-img info ${checkS.toFixed(2)} s, VM folder + seed ${buildS.toFixed(2)} s`,
    );
    console.log(
      `  total ${totalS.toFixed(2)} s: ${mbps.toFixed(0)} MB/s (target >= ${TARGET_MBPS}: ${ok ? 'ok' : 'MISSED'}); CPU s: A ${cpu[0]!.toFixed(1)}, B ${cpu[1]!.toFixed(1)}; load average ${load}`,
    );
    const row = (name: string, seconds: number, extra: Partial<BenchResult> = {}): BenchResult => ({
      kind: 'metering',
      name: `move ${mb} MB: ${name}`,
      db: '-',
      seconds,
      ...extra,
    });
    return [
      row('export, s', exportS),
      row('export: qemu-img convert, s', rec.convert_ms / 1000),
      row('export: hash, s', rec.hash_ms / 1000),
      row('import: transfer, s', transferS),
      row('import: checks + build, s', importS - transferS),
      row(`end to end MB/s (target >= ${TARGET_MBPS})`, mbps, { ok }),
    ];
  });
}
