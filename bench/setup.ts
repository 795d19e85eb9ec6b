/**
 * The bench's world, made through the HTTP API of a running service: the
 * administrator logs in and registers nodes of 8 GPUs (enough for the 50 VMs
 * and one VM per connection of the create/destroy cycle); a customer
 * registers, gets 1,000,000 of credit, limits of 1000 VMs and 1000 GPUs, an
 * SSH key (ssh-keygen) and a read_write API key, and creates 50 one-GPU VMs,
 * which the bench waits to see running. Ten more customers, made the same way
 * without VMs, share the many-customer create/destroy cycle. Used by
 * bench/http.ts, not run alone.
 */
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { must } from '../scripts/soak/client.js';
import type { Credentials } from './service.js';

const VM_COUNT = 50;
/** Customers of the many-customer create/destroy cycle (its connections are shared out among them). */
export const CYCLE_CUSTOMERS = 10;
const GPUS_PER_NODE = 8;
const TIMEOUT_MS = 30_000;
const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

export interface World {
  base: string;
  nodes: string[];
  customer: Credentials & { id: number };
  apiKey: string;
  /** The 50 VMs made at setup. */
  vmIds: string[];
  /** The read_write API keys of the many-customer cycle's customers. */
  cycleKeys: string[];
}

interface Vm {
  id: string;
  status: string;
}

/** The body of POST /vms for one GPU on `node`. */
export function vmRequest(node: string) {
  return { node, gpu_type: '4090', gpu_count: 1, storage_gb: 50, template_vmid: 100 };
}

export async function login(base: string, who: Credentials): Promise<string> {
  const pair = await must<{ access_token?: string }>(base, 'POST', '/auth/login', {
    body: { email: who.email, password: who.password },
    timeoutMs: TIMEOUT_MS,
  });
  if (!pair.access_token) throw new Error(`POST /auth/login for ${who.email}: no access token (two-factor on?)`);
  return pair.access_token;
}

async function registerNodes(base: string, adminToken: string, count: number): Promise<string[]> {
  const nodes = Array.from({ length: count }, (_, i) => `bench-${String(i + 1).padStart(2, '0')}`);
  for (const node of nodes) {
    const body = {
      node,
      gpu_type: '4090',
      gpu_count: GPUS_PER_NODE,
      ram_gb: 512,
      cpu_cores: 64,
      cpu_model: 'Bench EPYC',
      pcie_gen: '4.0',
      max_storage_gb: 2000,
      location: 'bench',
      cluster_name: 'bench',
    };
    await must(base, 'POST', '/admin/nodes', { token: adminToken, body, timeoutMs: TIMEOUT_MS });
  }
  return nodes;
}

async function registerCustomer(base: string, adminToken: string): Promise<Credentials & { id: number }> {
  const who = {
    email: `bench-${randomBytes(4).toString('hex')}@example.com`,
    password: `bench-pw-${randomBytes(9).toString('hex')}`,
  };
  const { id } = await must<{ id: number }>(base, 'POST', '/auth/register', {
    body: { ...who, name: 'Bench customer' },
    timeoutMs: TIMEOUT_MS,
  });
  await must(base, 'POST', `/admin/users/${id}/credits`, {
    token: adminToken,
    body: { amount: 1_000_000, description: 'bench credit' },
    timeoutMs: TIMEOUT_MS,
  });
  await must(base, 'PATCH', `/admin/users/${id}`, {
    token: adminToken,
    body: { max_vms: 1000, max_gpus: 1000 },
    timeoutMs: TIMEOUT_MS,
  });
  return { ...who, id };
}

async function addSshKey(base: string, token: string, tmpDir: string): Promise<void> {
  const file = join(tmpDir, `id_ed25519-${randomBytes(4).toString('hex')}`);
  execFileSync('ssh-keygen', ['-t', 'ed25519', '-N', '', '-f', file, '-q', '-C', 'bench']);
  const line = readFileSync(`${file}.pub`, 'utf8').trim();
  await must(base, 'POST', '/ssh-keys', {
    token,
    body: { ssh_public_key: line, label: 'bench' },
    timeoutMs: TIMEOUT_MS,
  });
}

/** Every VM of the caller that is not destroyed. */
export async function liveVms(base: string, token: string): Promise<Vm[]> {
  const all: Vm[] = [];
  for (let offset = 0; ; offset += 100) {
    const page = await must<Vm[]>(base, 'GET', `/vms?limit=100&offset=${offset}`, { token, timeoutMs: TIMEOUT_MS });
    all.push(...page);
    if (page.length < 100) return all;
  }
}

async function untilRunning(base: string, token: string, ids: string[]): Promise<void> {
  const wanted = new Set(ids);
  for (let i = 0; i < 300; i++) {
    const vms = (await liveVms(base, token)).filter((v) => wanted.has(v.id));
    if (vms.length === ids.length && vms.every((v) => v.status === 'running')) return;
    await sleep(200);
  }
  throw new Error(`the ${ids.length} VMs of the setup were not all running after 60 s`);
}

/** The world on the service at `base`; `cycleConnections` one-GPU VMs must fit next to the 50. */
export async function setupWorld(
  base: string,
  admin: Credentials,
  tmpDir: string,
  cycleConnections: number,
): Promise<World> {
  const adminToken = await login(base, admin);
  const nodes = await registerNodes(base, adminToken, Math.ceil((VM_COUNT + cycleConnections) / GPUS_PER_NODE));
  const { customer, token, key } = await readyCustomer(base, adminToken, tmpDir);
  const cycleKeys: string[] = [];
  for (let i = 0; i < CYCLE_CUSTOMERS; i++) cycleKeys.push((await readyCustomer(base, adminToken, tmpDir)).key);
  const vmIds: string[] = [];
  for (let i = 0; i < VM_COUNT; i++) {
    const body = vmRequest(nodes[i % nodes.length]!);
    vmIds.push((await must<Vm>(base, 'POST', '/vms', { token, body, timeoutMs: TIMEOUT_MS })).id);
  }
  await untilRunning(base, token, vmIds);
  console.log(
    `  setup: ${nodes.length} nodes of ${GPUS_PER_NODE} GPUs, a customer with ${VM_COUNT} running VMs, an SSH key and a read_write API key, ${CYCLE_CUSTOMERS} more customers with a key each`,
  );
  return { base, nodes, customer, apiKey: key, vmIds, cycleKeys };
}

/** A registered customer with credit, high limits, an SSH key, a session token and a read_write API key. */
async function readyCustomer(base: string, adminToken: string, tmpDir: string) {
  const customer = await registerCustomer(base, adminToken);
  const token = await login(base, customer);
  await addSshKey(base, token, tmpDir);
  const { key } = await must<{ key: string }>(base, 'POST', '/api-keys', {
    token,
    body: { name: 'bench', scope: 'read_write' },
    timeoutMs: TIMEOUT_MS,
  });
  return { customer, token, key };
}
