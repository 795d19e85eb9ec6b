/**
 * Real VMs on the test image (QEMU under TCG here, KVM on real hosts):
 *  - POST /vms -> running, through the API, its reconciler loop and an agent;
 *  - running -> a working SSH login with what access-info says;
 *  - the agent alone: provision + start -> running over its own API;
 *  - bare QEMU, the baseline: the same disk, seed and command line launched
 *    directly -> SSH banner.
 * The agent's overhead is its start -> running minus bare QEMU's start ->
 * banner (medians); it should stay under a second.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { loadConfig } from '../src/config.js';
import { startServer } from '../src/server.js';
import { startAgent } from '../src/host-agent/main.js';
import { parseAgentOptions } from '../src/host-agent/options.js';
import { qemuArgs, vmFiles } from '../src/host-agent/qemu/command.js';
import { isAlive, launchQemu, qemuAvailable, readPid } from '../src/host-agent/qemu/process.js';
import { writeSeed, normalizeSshKey } from '../src/host-agent/images/seed.js';
import { freePortInRange, sshBanner } from '../src/host-agent/network/ssh-probe.js';
import { HostAgentClient } from '../src/hypervisor/host-agent-client.js';
import { qemuPidsUnder, testImage } from '../test/agent/real-vms.js';
import type { BenchResult } from './types.js';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const now = () => performance.now() / 1000;

function sshWorks(port: number, key: string, user = 'root'): boolean {
  const r = spawnSync(
    'ssh',
    [
      '-p',
      String(port),
      '-i',
      key,
      '-o',
      'StrictHostKeyChecking=no',
      '-o',
      'UserKnownHostsFile=/dev/null',
      '-o',
      'BatchMode=yes',
      '-o',
      'ConnectTimeout=5',
      '-o',
      'LogLevel=ERROR',
      `${user}@127.0.0.1`,
      'true',
    ],
    { timeout: 20_000 },
  );
  return r.status === 0;
}

async function untilSsh(port: number, key: string): Promise<number> {
  const t0 = now();
  for (let i = 0; i < 300; i++) {
    if (sshWorks(port, key)) return now() - t0;
    await sleep(100);
  }
  throw new Error('no SSH login within 30 s');
}

function stats(name: string, xs: number[], extra: Partial<BenchResult> = {}): BenchResult {
  return {
    name,
    db: 'embedded',
    seconds: median(xs),
    min_s: Math.min(...xs),
    max_s: Math.max(...xs),
    runs: xs.length,
    ...extra,
  };
}

export async function realVmBench(runs: number): Promise<BenchResult[]> {
  if (!qemuAvailable()) {
    console.log(
      'real-vm: skipped (qemu-system-x86_64 not installed: apt-get install qemu-system-x86 qemu-utils genisoimage)',
    );
    return [];
  }
  const image = testImage();
  const dir = mkdtempSync('/tmp/gc-bench-');
  const key = join(dir, 'id');
  execFileSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-f', key]);
  const pub = readFileSync(`${key}.pub`, 'utf8');
  const token = 'bench-agent-token-'.padEnd(40, 'b');
  const results: BenchResult[] = [];
  const agentData = join(dir, 'agent');
  execFileSync(process.execPath, [
    '--import',
    'tsx',
    'src/main.ts',
    'agent',
    'template',
    'add',
    '100',
    image,
    '--data-dir',
    agentData,
  ]);
  const agent = await startAgent(
    parseAgentOptions(
      [
        '--listen',
        '127.0.0.1:0',
        '--data-dir',
        agentData,
        '--token',
        token,
        '--accel',
        'tcg',
        '--fake-gpus',
        '1',
        '--ssh-ports',
        '23500-23599',
      ],
      {},
    ),
    false,
  );
  const admin = { email: 'bench@example.com', password: 'bench-password-123' };
  const server = await startServer(
    loadConfig({
      GPUCLOUD_DATA_DIR: join(dir, 'data'),
      PORT: '0',
      LOG_LEVEL: 'silent',
      GPUCLOUD_DEMO: '0',
      GPUCLOUD_ADMIN_EMAIL: admin.email,
      GPUCLOUD_ADMIN_PASSWORD: admin.password,
      GPUCLOUD_RATE_LIMIT_DEFAULT: '1000000',
    }),
  );
  try {
    const api = async (method: string, path: string, tok?: string, body?: unknown) => {
      const r = await fetch(`${server.url}${path}`, {
        method,
        headers: {
          ...(tok ? { authorization: `Bearer ${tok}` } : {}),
          ...(body ? { 'content-type': 'application/json' } : {}),
        },
        body: body ? JSON.stringify(body) : undefined,
      });
      const text = await r.text();
      if (r.status >= 400) throw new Error(`${method} ${path}: ${r.status} ${text}`);
      return text ? JSON.parse(text) : undefined;
    };
    const tok = (await api('POST', '/auth/login', undefined, admin)).access_token as string;
    const me = await api('GET', '/account', tok);
    await api('POST', `/admin/users/${me.id}/credits`, tok, { amount: 100, description: 'bench' });
    await api('POST', '/ssh-keys', tok, { ssh_public_key: pub });
    await api('POST', '/admin/nodes', tok, {
      node: 'bench',
      gpu_type: '4090',
      gpu_count: 1,
      ram_gb: 1,
      cpu_cores: 1,
      cpu_model: 'bench',
      pcie_gen: '4.0',
      max_storage_gb: 100,
      location: 'local',
      cluster_name: 'bench',
      agent_url: agent.url,
      agent_token: token,
    });

    // Through the API: POST /vms -> running -> SSH login.
    const toRunning: number[] = [];
    const toLogin: number[] = [];
    for (let i = 0; i < runs; i++) {
      const t0 = now();
      const vm = await api('POST', '/vms', tok, {
        node: 'bench',
        gpu_type: '4090',
        gpu_count: 1,
        storage_gb: 50,
        template_vmid: 100,
      });
      while ((await api('GET', `/vms/${vm.id}`, tok)).status !== 'running') await sleep(50);
      toRunning.push(now() - t0);
      const info = (await api('GET', `/vms/${vm.id}/access-info`, tok)).ssh;
      toLogin.push(await untilSsh(info.port, key));
      await api('DELETE', `/vms/${vm.id}`, tok);
      while ((await api('GET', '/admin/vms?node=bench', tok)).some((v: { status: string }) => v.status !== 'destroyed'))
        await sleep(200);
      await sleep(1500); // the destroy reaches the agent
    }
    results.push(stats('POST /vms -> running (API + agent)', toRunning), stats('running -> SSH login', toLogin));

    // The agent alone, over its API.
    const client = new HostAgentClient({ url: agent.url, token });
    const agentStart: number[] = [];
    for (let i = 0; i < runs; i++) {
      const id = randomUUID();
      await client.provision(id, {
        vmid: 9000 + i,
        template_vmid: 100,
        cpu_cores: 1,
        ram_mb: 1024,
        storage_gb: 50,
        gpu_count: 1,
        auth_method: 'ssh_key',
        ssh_public_key: pub,
        password: null,
      });
      const t0 = now();
      await client.start(id);
      while ((await client.vm(id)).state !== 'running') await sleep(50);
      agentStart.push(now() - t0);
      await client.destroy(id);
    }
    results.push(stats('agent: start -> running (ready for logins)', agentStart));

    // Bare QEMU: the same disk, seed and command line, launched directly.
    const bare: number[] = [];
    for (let i = 0; i < runs; i++) {
      const vmDir = join(dir, `bare${i}`);
      mkdirSync(vmDir, { mode: 0o700 });
      execFileSync('qemu-img', [
        'create',
        '-q',
        '-f',
        'qcow2',
        '-F',
        'qcow2',
        '-b',
        join(agentData, 'templates/100/disk.qcow2'),
        join(vmDir, 'disk.qcow2'),
        '50G',
      ]);
      await writeSeed(vmDir, {
        instanceId: randomUUID(),
        hostname: `bare-${i}`,
        user: 'root',
        authMethod: 'ssh_key',
        sshPublicKeys: [normalizeSshKey(pub)],
        passwordHash: null,
      });
      const port = (await freePortInRange(23600, 23699, new Set(), '127.0.0.1'))!;
      const args = qemuArgs({
        name: `bare-${i}`,
        vmDir,
        accel: 'tcg',
        cpuCores: 1,
        ramMb: 1024,
        diskPath: join(vmDir, 'disk.qcow2'),
        seedPath: join(vmDir, 'seed.iso'),
        gpus: [],
        net: { kind: 'user', hostfwdHost: '127.0.0.1', sshPort: port },
      });
      const t0 = now();
      await launchQemu(args);
      while (!(await sshBanner('127.0.0.1', port, 1000))) await sleep(50);
      bare.push(now() - t0);
      const pid = readPid(vmFiles(vmDir).pidFile);
      if (pid) {
        process.kill(pid, 'SIGKILL');
        while (isAlive(pid)) await sleep(50);
      }
    }
    results.push(stats('bare QEMU: launch -> SSH banner (baseline)', bare));
    const overhead = median(agentStart) - median(bare);
    results.push({
      name: 'agent overhead over bare QEMU',
      db: 'embedded',
      seconds: overhead,
      baseline: 'bare QEMU: launch -> SSH banner (baseline)',
      baseline_s: median(bare),
      target_s: 1,
      ok: overhead < 1,
    });
  } finally {
    await server.close();
    await agent.close();
    // A run that failed half-way may leave guests behind: they are this run's alone.
    for (const pid of qemuPidsUnder(dir)) process.kill(pid, 'SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  }
  return results;
}
