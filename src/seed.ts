/**
 * Demo data (docs/configuration.md#demo-data), seeded once: a few nodes of each GPU type and a
 * demo user with credit and nothing else, so that `npm start` then search,
 * create and watch a VM works at once.
 */
import type { Db } from './db/db.js';
import type { Services } from './app.js';
import * as seeds from './seed-repository.js';

export interface DemoLogin {
  email: string;
  password: string;
}

export const DEMO_LOGIN: DemoLogin = { email: 'demo@gpucloud.local', password: 'demo-password-123' };
export const DEMO_CREDIT_MICROS = 100 * 1_000_000;

const DEMO_NODES = [
  {
    node: 'vm01',
    gpu_type: '4090',
    gpu_count: 8,
    ram_gb: 512,
    cpu_cores: 64,
    cpu_model: 'AMD EPYC 7543',
    pcie_gen: '4.0',
    max_storage_gb: 4000,
    location: 'eu-central',
    cluster_name: 'fra-1',
  },
  {
    node: 'vm02',
    gpu_type: '4090',
    gpu_count: 4,
    ram_gb: 256,
    cpu_cores: 32,
    cpu_model: 'AMD EPYC 7543',
    pcie_gen: '4.0',
    max_storage_gb: 2000,
    location: 'us-east',
    cluster_name: 'nyc-1',
  },
  {
    node: 'vm03',
    gpu_type: '5090',
    gpu_count: 8,
    ram_gb: 768,
    cpu_cores: 96,
    cpu_model: 'AMD EPYC 9454',
    pcie_gen: '5.0',
    max_storage_gb: 8000,
    location: 'eu-central',
    cluster_name: 'fra-1',
  },
  {
    node: 'vm04',
    gpu_type: '5090',
    gpu_count: 2,
    ram_gb: 192,
    cpu_cores: 24,
    cpu_model: 'Intel Xeon w7-3465X',
    pcie_gen: '5.0',
    max_storage_gb: 2000,
    location: 'us-west',
    cluster_name: 'sfo-1',
  },
  {
    node: 'vm05',
    gpu_type: 'pro6000',
    gpu_count: 8,
    ram_gb: 1536,
    cpu_cores: 128,
    cpu_model: 'AMD EPYC 9654',
    pcie_gen: '5.0',
    max_storage_gb: 16000,
    location: 'us-east',
    cluster_name: 'nyc-1',
  },
  {
    node: 'vm06',
    gpu_type: 'pro6000',
    gpu_count: 4,
    ram_gb: 768,
    cpu_cores: 64,
    cpu_model: 'AMD EPYC 9554',
    pcie_gen: '5.0',
    max_storage_gb: 8000,
    location: 'eu-central',
    cluster_name: 'fra-1',
  },
] as const;

/**
 * Each step is idempotent and the seed is marked done only at the end, so a crash midway is finished by the next
 * start.
 */
export async function seedDemo(db: Db, services: Services): Promise<DemoLogin> {
  if (await seeds.isSeeded(db, 'demo')) return DEMO_LOGIN;
  await services.inventory.ensureDefaultPricing();
  for (const n of DEMO_NODES) {
    await services.inventory.createNode({ ...n }).catch((err: unknown) => {
      if ((err as { code?: string }).code !== 'conflict') throw err; // made by an earlier start, or concurrently
    });
  }
  const { user } = await services.auth.ensureUser(DEMO_LOGIN.email, DEMO_LOGIN.password, 'user', 'Demo User');
  await services.billing.creditOnce(user.id, DEMO_CREDIT_MICROS, 'Demo credit');
  await seeds.markSeeded(db, 'demo');
  return DEMO_LOGIN;
}
