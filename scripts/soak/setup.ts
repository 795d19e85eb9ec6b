/**
 * Setup over HTTP for the soak: admin login, nodes, users with credits, SSH
 * keys, tokens and API keys; and the client-side records of users, nodes and
 * the VMs it tracks.
 */
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { must } from './client.js';

export interface TrackedVm {
  id: string;
  status: string;
  /** 0: created (stop next), 1: stopped once (start next), 2: restarted (destroy next). */
  step: 0 | 1 | 2;
  busy: boolean;
  gpus: number;
  /**
   * performance.now() of the last status change, of the last mutation's answer, of the start of the last read
   * applied.
   */
  statusSince: number;
  mutatedAt: number;
  observedAt: number;
  /** A start was refused (no free GPUs, balance): destroy it instead. */
  startRefused: boolean;
  stuckReported: boolean;
}

export interface SoakUser {
  idx: number;
  id: number;
  email: string;
  password: string;
  token: string;
  apiKey: string;
  sshKeyId: string;
  maxLive: number;
  maxGpus: number;
  vms: Map<string, TrackedVm>;
  /** VMs destroyed or failed: never tracked again when a list still shows them. */
  forgotten: Set<string>;
  creating: number;
  creatingGpus: number;
}

export interface SoakNode {
  node: string;
  gpu_type: '4090' | '5090' | 'pro6000';
  gpu_count: number;
  max_storage_gb: number;
}

export interface World {
  base: string;
  runId: string;
  adminToken: string;
  users: SoakUser[];
  nodes: SoakNode[];
}

export interface SetupOptions {
  adminEmail: string;
  adminPassword: string;
  users: number;
  vmsPerUser: number;
  timeoutMs: number;
  tmpDir: string;
}

export interface TokenPair {
  access_token?: string;
  refresh_token?: string;
}

export async function setup(base: string, o: SetupOptions, log: (s: string) => void): Promise<World> {
  const t = o.timeoutMs;
  const runId = randomBytes(3).toString('hex');
  const login = async (email: string, password: string): Promise<TokenPair> => {
    const p = await must<TokenPair>(base, 'POST', '/auth/login', { body: { email, password }, timeoutMs: t });
    if (!p.access_token || !p.refresh_token)
      throw new Error(`POST /auth/login for ${email}: no token pair (two-factor on?)`);
    return p;
  };
  const adminToken = (await login(o.adminEmail, o.adminPassword)).access_token!;
  const nodes: SoakNode[] = [
    { node: `soak-${runId}-a`, gpu_type: '4090', gpu_count: 8, max_storage_gb: 2000 },
    { node: `soak-${runId}-b`, gpu_type: '4090', gpu_count: 4, max_storage_gb: 2000 },
    { node: `soak-${runId}-c`, gpu_type: '5090', gpu_count: 8, max_storage_gb: 2000 },
    { node: `soak-${runId}-d`, gpu_type: 'pro6000', gpu_count: 4, max_storage_gb: 4000 },
  ];
  for (const n of nodes) {
    await must(base, 'POST', '/admin/nodes', {
      token: adminToken,
      timeoutMs: t,
      body: {
        ...n,
        ram_gb: 512,
        cpu_cores: 128,
        cpu_model: 'Soak EPYC',
        pcie_gen: '4.0',
        location: 'soak',
        cluster_name: `soak-${runId}`,
      },
    });
  }
  const users: SoakUser[] = [];
  for (let i = 0; i < o.users; i++) {
    const email = `soak-${runId}-${i}@example.com`;
    const password = `soak-pw-${randomBytes(9).toString('hex')}`;
    const acct = await must<{ id: number }>(base, 'POST', '/auth/register', {
      body: { email, password, name: `Soak ${i}` },
      timeoutMs: t,
    });
    await must(base, 'POST', `/admin/users/${acct.id}/credits`, {
      token: adminToken,
      body: { amount: 10_000, description: 'soak test credit' },
      timeoutMs: t,
    });
    const admView = await must<{ max_vms: number | null; max_gpus: number | null }>(
      base,
      'GET',
      `/admin/users/${acct.id}`,
      { token: adminToken, timeoutMs: t },
    );
    const keyFile = join(o.tmpDir, `id_ed25519_${i}`);
    execFileSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-C', `soak-${i}`, '-f', keyFile]);
    const pair = await login(email, password);
    const sshKey = await must<{ id: string }>(base, 'POST', '/ssh-keys', {
      token: pair.access_token,
      body: { ssh_public_key: readFileSync(`${keyFile}.pub`, 'utf8').trim(), label: `soak-${i}` },
      timeoutMs: t,
    });
    const apiKey = await must<{ key: string }>(base, 'POST', '/api-keys', {
      token: pair.access_token,
      body: { name: `soak-${i}`, scope: 'read_only' },
      timeoutMs: t,
    });
    // The server's defaults when null: 10 VMs, 16 GPUs (D-limits, GET /admin/users/{id}).
    const maxVms = admView.max_vms ?? 10;
    const maxGpus = admView.max_gpus ?? 16;
    users.push({
      idx: i,
      id: acct.id,
      email,
      password,
      token: pair.access_token!,
      apiKey: apiKey.key,
      sshKeyId: sshKey.id,
      maxLive: Math.min(o.vmsPerUser, maxVms, 10),
      maxGpus,
      vms: new Map(),
      forgotten: new Set(),
      creating: 0,
      creatingGpus: 0,
    });
  }
  log(
    `setup: run ${runId}: ${nodes.length} nodes (${nodes.reduce((s, n) => s + n.gpu_count, 0)} GPUs), ${users.length} users with 10000 credit, an SSH key and a read_only API key each`,
  );
  return { base, runId, adminToken, users, nodes };
}
