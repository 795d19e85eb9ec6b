/**
 * Takes the README's screenshots of the web console with the same tooling as
 * the browser tests (Debian's Chromium driven by playwright-core):
 *
 *   npm run screenshot      writes docs/console-dashboard.png and docs/console-vm.png
 *
 * It builds the console into a temporary directory, starts the service on a
 * throwaway in-memory database with the manual clock, makes a customer with
 * credit, an SSH key and two running VMs, signs in, and captures the pages.
 * Run it after changing how the console looks.
 */
import { rmSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { loadConfig } from '../src/config.js';
import { PgliteDb } from '../src/db/db.js';
import { migrate } from '../src/db/migrate.js';
import { ClockService } from '../src/modules/clock/service.js';
import { MemoryRateLimitStore } from '../src/http/rate-limit-store.js';
import { buildApp, createServices } from '../src/app.js';
import { browserSkipReason, buildConsole, launchChromium } from '../test/helpers/browser.js';
import { generateKey } from '../test/ssh-keys/keygen.js';

const OUT = (name: string) => fileURLToPath(new URL(`../docs/${name}`, import.meta.url));

async function main(): Promise<void> {
  const reason = browserSkipReason();
  if (reason) throw new Error(reason);
  const built = buildConsole();
  const jwtSecret = 'screenshot-'.padEnd(48, 'x');
  const config = loadConfig({
    GPUCLOUD_CLOCK: 'manual',
    GPUCLOUD_CLOCK_START: '2026-11-02T09:00:00Z',
    LOG_LEVEL: 'silent',
    GPUCLOUD_JWT_SECRET: jwtSecret,
    GPUCLOUD_SIM_PROVISION_MS: '0',
  });
  const db = await PgliteDb.open();
  await migrate(db);
  const clock = await ClockService.create(db, 'manual', config.clockStartMs);
  const rateLimitStore = new MemoryRateLimitStore();
  const deps = { config, db, clock, rateLimitStore, jwtSecret, consoleDir: built.dir };
  const services = createServices(deps);
  await services.inventory.ensureDefaultPricing();
  const app = await buildApp(deps, services);
  const base = await app.listen({ port: 0, host: '127.0.0.1' });
  const browser = await launchChromium();
  try {
    const call = async (method: string, url: string, token?: string, body?: unknown) => {
      const r = await fetch(base + url, {
        method,
        headers: {
          ...(body ? { 'content-type': 'application/json' } : {}),
          ...(token ? { authorization: `Bearer ${token}` } : {}),
        },
        ...(body ? { body: JSON.stringify(body) } : {}),
      });
      const text = await r.text();
      if (!r.ok) throw new Error(`${method} ${url}: ${r.status} ${text}`);
      return text ? JSON.parse(text) : undefined;
    };
    const login = async (email: string, password: string) =>
      (await call('POST', '/auth/login', undefined, { email, password })).access_token as string;

    await services.auth.ensureUser('ops@gpucloud.example', 'operator-password-1', 'admin');
    let adminToken = await login('ops@gpucloud.example', 'operator-password-1');
    for (const [node, gpu_type, gpu_count, location] of [
      ['fra-a100', '4090', 8, 'Frankfurt'],
      ['ams-5090', '5090', 4, 'Amsterdam'],
      ['par-pro6000', 'pro6000', 8, 'Paris'],
    ] as const) {
      await call('POST', '/admin/nodes', adminToken, {
        node,
        gpu_type,
        gpu_count,
        ram_gb: 512,
        cpu_cores: 64,
        cpu_model: 'AMD EPYC 7543',
        pcie_gen: '4.0',
        max_storage_gb: 4000,
        location,
        cluster_name: 'eu-1',
      });
    }
    const email = 'ada@example.com';
    const password = 'a-long-password-123';
    await call('POST', '/auth/register', undefined, { email, password, name: 'Ada' });
    const token = await login(email, password);
    const me = await call('GET', '/account', token);
    await call('POST', `/admin/users/${me.id}/credits`, adminToken, { amount: 250, description: 'Welcome credit' });
    await call('POST', '/ssh-keys', token, {
      ssh_public_key: generateKey('ed25519', { comment: 'ada@laptop' }).line,
      label: 'laptop',
    });
    const vm = await call('POST', '/vms', token, {
      node: 'fra-a100',
      gpu_type: '4090',
      gpu_count: 2,
      storage_gb: 200,
      template_vmid: 101,
      instance_label: 'training',
    });
    await call('POST', '/vms', token, {
      node: 'ams-5090',
      gpu_type: '5090',
      gpu_count: 1,
      storage_gb: 100,
      template_vmid: 103,
      rental_type: 'interruptible',
      instance_label: 'comfyui',
    });
    await call('POST', '/admin/clock/advance', adminToken, { seconds: 5 * 3600 + 17 * 60 });
    adminToken = await login('ops@gpucloud.example', 'operator-password-1');

    const page = await (
      await browser.newContext({ baseURL: base, viewport: { width: 1280, height: 760 }, deviceScaleFactor: 1 })
    ).newPage();
    await page.goto('/console/');
    await page.getByLabel('Email').fill(email);
    await page.getByLabel('Password').fill(password);
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.getByText('Balance', { exact: true }).waitFor();
    await page.waitForTimeout(300);
    await page.screenshot({ path: OUT('console-dashboard.png') });
    await page.goto(`/console/vms/${vm.id}`);
    await page
      .getByText(/ssh .*@/)
      .first()
      .waitFor();
    await page.waitForTimeout(300);
    await page.screenshot({ path: OUT('console-vm.png') });
    console.log(`screenshot: wrote docs/console-dashboard.png and docs/console-vm.png`);
  } finally {
    await browser.close();
    await app.close();
    await rateLimitStore.close();
    await db.close();
    rmSync(built.dir, { recursive: true, force: true });
  }
}

main().catch((err: unknown) => {
  console.error(err instanceof Error ? err.message : err);
  process.exit(1);
});
