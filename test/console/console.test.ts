/**
 * The web console in headless Chromium against a real server (the embedded
 * database, the simulator, the manual clock the test moves): sign-up,
 * sign-in with two-factor authentication, staying signed in across a reload
 * and an expired access token, an SSH key, renting from an offer to
 * `running` and destroying, opening a VM's Jupyter and HTTP port through the
 * access portal (a new tab on the VM's own origin), an API key shown once, an
 * operator changing a price that customers then see, and the failures a user
 * meets on the way; VMs named by vmid, a failed VM's reason, the simulated
 * node's notice, billing's times and durations as people read them, the one
 * default disk, and the API reference at /docs with a clean browser console.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import type { Browser, BrowserContext, Page } from 'playwright-core';
import { buildTestApp, type TestApp } from '../helpers/app.js';
import { api, type RequestBody } from '../helpers/api.js';
import { createNode, createUser, credit, tokensOf, uniqueEmail, type TestUser } from '../helpers/factories.js';
import { browserSkipReason, buildConsole, launchChromium } from '../helpers/browser.js';
import { generateKey } from '../ssh-keys/keygen.js';
import { stepAt, totpAt } from '../../src/modules/auth/totp.js';

const skip = browserSkipReason();
const PASSWORD = 'a-long-password-123';

describe('web console in Chromium', { skip: skip ?? false }, () => {
  let t: TestApp;
  let base: string;
  let port: number;
  let browser: Browser;
  let built: { dir: string; cleanup: () => void };
  let admin: TestUser;
  let node: string;
  const contexts: BrowserContext[] = [];

  before(async () => {
    built = buildConsole();
    t = await buildTestApp('pglite', { consoleDir: built.dir });
    base = await t.app.listen({ port: 0, host: '127.0.0.1' });
    port = Number(new URL(base).port);
    // The portal's names, VMID-SERVICE.localhost, on this server's port: Chromium sends *.localhost to loopback.
    t.services.portal.links.setBase(`http://localhost:${port}`);
    admin = await createUser(t, { admin: true });
    node = (await createNode(t, admin.token, { gpu_type: '5090', gpu_count: 4 })).node;
    browser = await launchChromium();
  });
  after(async () => {
    await browser?.close();
    await t?.close();
    built?.cleanup();
  });

  /** A fresh page in its own browser profile (its own storage: a separate person). */
  async function newPage(opts: { mobile?: boolean; dark?: boolean } = {}): Promise<Page> {
    const ctx = await browser.newContext({
      baseURL: base,
      ...(opts.mobile
        ? { viewport: { width: 390, height: 800 }, isMobile: true, hasTouch: true }
        : { viewport: { width: 1280, height: 900 } }),
      colorScheme: opts.dark ? 'dark' : 'light',
    });
    contexts.push(ctx);
    const page = await ctx.newPage();
    page.setDefaultTimeout(15_000);
    return page;
  }

  async function adminToken(): Promise<string> {
    const r = await api(t).post('/auth/login', { body: { email: admin.email, password: admin.password } });
    assert.equal(r.status, 200, r.text);
    return tokensOf(r.body).access_token;
  }

  /** Moves the manual clock (jobs that came due run: provisioning, stopping, destroying). */
  async function advance(seconds: number): Promise<void> {
    const r = await api(t, await adminToken()).post('/admin/clock/advance', { body: { seconds } });
    assert.equal(r.status, 200, r.text);
  }

  /** Advances the clock a few seconds at a time until `check` holds (the page polls on its own). */
  async function advanceUntil(check: () => Promise<boolean>, what: string): Promise<void> {
    for (let i = 0; i < 40; i++) {
      if (await check()) return;
      await advance(5);
      await new Promise((r) => setTimeout(r, 250));
    }
    assert.fail(`timed out waiting for ${what}`);
  }

  async function signIn(page: Page, email: string, password = PASSWORD): Promise<void> {
    await page.goto('/console/');
    await page.getByLabel('Email').fill(email);
    await page.getByLabel('Password').fill(password);
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.getByRole('link', { name: 'VMs', exact: true }).waitFor();
  }

  async function registerApi(email = uniqueEmail('console')): Promise<TestUser> {
    const u = await createUser(t, { email, password: PASSWORD });
    return u;
  }

  /** A user with credit and an SSH key, and a VM of theirs created through the API (still `creating`). */
  async function userWithVm(over: Partial<RequestBody<'/vms', 'post'>> = {}) {
    const u = await registerApi();
    await credit(t, await adminToken(), u.id, 500);
    const sshKey = await api(t, u.token).post('/ssh-keys', { body: { ssh_public_key: generateKey('ed25519').line } });
    assert.equal(sshKey.status, 201, sshKey.text);
    const r = await api(t, u.token).post('/vms', {
      body: { node: over.node ?? node, gpu_type: '5090', gpu_count: 1, storage_gb: 50, template_vmid: 101, ...over },
    });
    assert.equal(r.status, 201, r.text);
    return { u, vm: r.body };
  }

  /** Advances the clock until the API shows the VM in `status`. */
  async function advanceToStatus(u: TestUser, vmId: string, status: string): Promise<void> {
    await advanceUntil(async () => {
      const r = await api(t, u.token).get('/vms/{vm_id}', { params: { vm_id: vmId } });
      assert.equal(r.status, 200, r.text);
      return r.body.status === status;
    }, `VM ${vmId} to be ${status}`);
  }

  /** An amount as the console's Money shows a rate (up to 6 decimals), formatted by the page's own browser. */
  async function moneyIn(page: Page, value: number): Promise<string> {
    return page.evaluate(
      (v) =>
        new Intl.NumberFormat(undefined, {
          style: 'currency',
          currency: 'USD',
          minimumFractionDigits: 2,
          maximumFractionDigits: 6,
        }).format(v),
      value,
    );
  }

  /** An ISO 8601 instant anywhere in a text. */
  const ISO_INSTANT = /\d{4}-\d{2}-\d{2}T\d{2}:\d{2}/;

  test('/ redirects to the console; the page carries a strict CSP', async () => {
    const res = await fetch(`${base}/`, { redirect: 'manual' });
    assert.equal(res.status, 302);
    assert.equal(res.headers.get('location'), '/console/');
    const page = await fetch(`${base}/console/vms/anything`);
    assert.equal(page.status, 200);
    assert.match(page.headers.get('content-security-policy') ?? '', /script-src 'self'/);
    assert.match(await page.text(), /<div id="app">/);
  });

  test('sign up, see the balance, sign out; a wrong password shows the API message', async () => {
    const page = await newPage();
    await page.goto('/console/');
    await page.getByRole('link', { name: 'Create account' }).click();
    const email = uniqueEmail('signup');
    await page.getByLabel('Email').fill(email);
    await page.getByLabel('Password').fill(PASSWORD);
    await page.getByRole('button', { name: 'Create account' }).click();
    await page.getByText('Balance', { exact: true }).waitFor();
    await page.getByText('$0.00').first().waitFor();
    for (const name of ['Offers', 'VMs', 'SSH keys', 'API keys', 'Billing', 'Reservations', 'Account']) {
      assert.equal(await page.getByRole('link', { name, exact: true }).count(), 1, name);
    }
    assert.equal(
      await page.getByRole('link', { name: 'Nodes', exact: true }).count(),
      0,
      'no operator pages for a customer',
    );

    // The account really exists.
    const login = await api(t).post('/auth/login', { body: { email, password: PASSWORD } });
    assert.equal(login.status, 200);

    await page.getByRole('button', { name: 'Sign out' }).click();
    await page.getByRole('button', { name: 'Sign in' }).waitFor();
    await page.getByLabel('Email').fill(email);
    await page.getByLabel('Password').fill('not-the-password-1');
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page
      .getByRole('alert')
      .filter({ hasText: /invalid|incorrect|wrong/i })
      .waitFor();
  });

  test('a session survives a reload and an expired access token (refresh-token rotation)', async () => {
    const u = await registerApi();
    const page = await newPage();
    await signIn(page, u.email);
    const before = await page.evaluate(() => localStorage.getItem('gpucloud.session'));
    assert.ok(before, 'the session is kept in this origin only');
    await page.reload();
    await page.getByRole('link', { name: 'VMs', exact: true }).waitFor();
    // Two hours later the access token has expired; the console refreshes and rotates.
    await advance(7200);
    await page.getByRole('link', { name: 'Billing', exact: true }).click();
    await page.getByText('Balance', { exact: false }).first().waitFor();
    await page.reload();
    await page.getByRole('link', { name: 'VMs', exact: true }).waitFor();
    const after = JSON.parse((await page.evaluate(() => localStorage.getItem('gpucloud.session')))!);
    assert.notEqual(after.refreshToken, JSON.parse(before!).refreshToken, 'the refresh token was rotated');
  });

  test('two tabs whose access token expired refresh one at a time: the session survives in both', async () => {
    const u = await registerApi();
    const first = await newPage();
    await signIn(first, u.email);
    const second = await first.context().newPage(); // the same profile: a second tab
    await second.goto('/console/billing');
    await second.getByRole('link', { name: 'VMs', exact: true }).waitFor();
    for (let round = 0; round < 3; round++) {
      await advance(7200); // both tabs' access tokens are expired now
      // Both tabs ask the API at once (in-app navigation: a page load in the middle of a refresh
      // would lose the rotated token the server already answered with).
      const pages = [first, second];
      const targets = round % 2 ? ['Billing', 'VMs'] : ['VMs', 'Billing'];
      await Promise.all(pages.map((p, i) => p.getByRole('link', { name: targets[i]!, exact: true }).click()));
      await Promise.all(pages.map((p, i) => p.getByRole('heading', { name: targets[i]!, exact: true }).waitFor()));
      for (const p of pages)
        assert.equal(await p.getByRole('button', { name: 'Sign in' }).count(), 0, 'still signed in');
    }
    // Had a tab presented a refresh token the other had already rotated, the whole session would be revoked.
    const stored = JSON.parse((await first.evaluate(() => localStorage.getItem('gpucloud.session')))!);
    const refreshed = await api(t).post('/auth/refresh', { body: { refresh_token: stored.refreshToken } });
    assert.equal(refreshed.status, 200, `the session is alive: ${refreshed.text}`);
  });

  test('sign in with two-factor authentication: the Code step', async () => {
    const u = await registerApi();
    const setup = await api(t, u.token).post('/auth/2fa/setup');
    assert.equal(setup.status, 200, setup.text);
    const secret = setup.body.secret;
    const code = () => totpAt(secret, stepAt(t.clock.now().getTime()));
    const enable = await api(t, u.token).post('/auth/2fa/enable', { body: { code: code() } });
    assert.equal(enable.status, 200, enable.text);
    await advance(60); // a code is good once: the next step's code for the sign-in

    const page = await newPage();
    await page.goto('/console/');
    await page.getByLabel('Email').fill(u.email);
    await page.getByLabel('Password').fill(PASSWORD);
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.getByLabel('Code').fill('000000');
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.getByRole('alert').waitFor();
    await page.getByLabel('Code').fill(code());
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.getByRole('link', { name: 'VMs', exact: true }).waitFor();
  });

  test('add an SSH key (a double click adds it once); its row shows the fingerprint', async () => {
    const u = await registerApi();
    const page = await newPage();
    await signIn(page, u.email);
    await page.getByRole('link', { name: 'SSH keys', exact: true }).click();
    const key = generateKey('ed25519');
    await page.getByLabel('Public key').fill(key.line);
    await page.getByLabel('Label').fill('laptop');
    await page.getByRole('button', { name: 'Add key' }).dblclick();
    await page.getByText(key.fingerprint).waitFor();
    const keys = await api(t, u.token).get('/ssh-keys');
    assert.equal(keys.status, 200, keys.text);
    assert.equal(keys.body.length, 1, 'a double click submits once');
    assert.equal(keys.body[0]!.fingerprint, key.fingerprint);

    await page.getByLabel('Public key').fill('ssh-ed25519 not-a-key');
    await page.getByRole('button', { name: 'Add key' }).click();
    await page.getByRole('alert').first().waitFor();
  });

  test('rent from an offer to running, see the SSH command, destroy after confirming', async () => {
    const u = await registerApi();
    await credit(t, await adminToken(), u.id, 500);
    const sshKey = await api(t, u.token).post('/ssh-keys', { body: { ssh_public_key: generateKey('ed25519').line } });
    assert.equal(sshKey.status, 201, sshKey.text);
    const page = await newPage();
    await signIn(page, u.email);
    await page.getByRole('link', { name: 'Offers', exact: true }).click();
    const row = page.getByRole('row').filter({ hasText: node });
    await row.getByRole('button', { name: 'Rent' }).click();
    await page.getByRole('button', { name: 'Launch' }).click();
    await page.waitForURL(/\/console\/vms\/[0-9a-f-]{36}$/);
    const vmId = page.url().split('/').pop()!;
    const vm = await api(t, u.token).get('/vms/{vm_id}', { params: { vm_id: vmId } });
    assert.equal(vm.status, 200, 'the page shows the VM just created');
    assert.equal(vm.body.node, node);

    await advanceUntil(
      async () => (await page.getByText('running', { exact: true }).count()) > 0,
      'the VM to show running',
    );
    await page
      .getByText(/ssh .*@/)
      .first()
      .waitFor();
    await page.getByRole('button', { name: 'Stop' }).waitFor();

    await page.getByRole('button', { name: 'Destroy' }).click();
    const dialog = page.getByRole('dialog');
    await dialog.getByRole('button', { name: 'Destroy' }).click();
    await advanceUntil(
      async () => (await page.getByText('destroyed', { exact: true }).count()) > 0,
      'the VM to show destroyed',
    );
    const gone = await api(t, u.token).get('/vms/{vm_id}', { params: { vm_id: vmId } });
    assert.equal(gone.status, 200, gone.text);
    assert.equal(gone.body.status, 'destroyed');

    // The VMs page (destroyed ones shown) names it by its vmid, as the CLI does; the UUID is the link's title.
    await page.getByRole('link', { name: 'VMs', exact: true }).click();
    await page.getByLabel('Show destroyed VMs').check();
    const link = page.getByRole('link', { name: `VM ${vm.body.vmid}`, exact: true });
    await link.waitFor();
    assert.match((await link.getAttribute('title')) ?? '', new RegExp(vmId));
    assert.equal(await page.getByRole('link', { name: vmId }).count(), 0, 'no link reads as the UUID');
  });

  test('the VM list names a VM by vmid and label (the UUID in its title); a simulated VM says its address is made up', async () => {
    const { u, vm } = await userWithVm({ instance_label: 'train-7' });
    await advanceToStatus(u, vm.id, 'running');
    const page = await newPage();
    await signIn(page, u.email);
    await page.getByRole('link', { name: 'VMs', exact: true }).click();
    const link = page.getByRole('link', { name: `VM ${vm.vmid} · train-7`, exact: true });
    await link.waitFor();
    assert.equal(await link.getAttribute('title'), `ID ${vm.id}`);
    assert.equal(await page.getByText(vm.id).count(), 0, 'the UUID is not the text of the list');
    await link.click();
    await page.waitForURL(new RegExp(`/console/vms/${vm.id}$`));
    await page.getByRole('heading', { name: `VM ${vm.vmid} · train-7` }).waitFor();

    // The node is simulated: the access card says so next to the SSH command, in the API's words.
    const info = await api(t, u.token).get('/vms/{vm_id}/access-info', { params: { vm_id: vm.id } });
    assert.equal(info.status, 200, info.text);
    assert.ok(info.body.notice, 'the API sets a notice for a simulated node');
    const access = page.locator('.vm-access');
    await access.getByTestId('ssh-command').waitFor();
    const notice = access.getByRole('note').filter({ hasText: 'simulated node' });
    await notice.waitFor();
    assert.equal((await notice.textContent())?.trim(), info.body.notice);
    await api(t, u.token).delete('/vms/{vm_id}', { params: { vm_id: vm.id } });
  });

  test('Start says no GPUs: "Start on another host" moves the VM to a node that has them, and it runs there', async () => {
    const token = await adminToken();
    const [a, b] = [
      (await createNode(t, token, { gpu_type: 'pro6000', gpu_count: 1, cluster_name: 'console-move' })).node,
      (await createNode(t, token, { gpu_type: 'pro6000', gpu_count: 1, cluster_name: 'console-move' })).node,
    ];
    const { u, vm } = await userWithVm({ node: a, gpu_type: 'pro6000', template_vmid: 100 });
    await advanceToStatus(u, vm.id, 'running');
    assert.equal((await api(t, u.token).post('/vms/{vm_id}/stop', { params: { vm_id: vm.id } })).status, 200);
    await advanceToStatus(u, vm.id, 'stopped');
    const taker = await userWithVm({ node: a, gpu_type: 'pro6000', template_vmid: 100 });
    assert.ok(taker.vm.id);

    const page = await newPage();
    await signIn(page, u.email);
    await page.goto(`/console/vms/${vm.id}`);
    await page.getByRole('button', { name: 'Start', exact: true }).click();
    const dialog = page.getByRole('dialog', { name: 'Start on another host?' });
    await dialog.waitFor();
    assert.match((await dialog.textContent()) ?? '', new RegExp(`Node ${a} has 0 free GPU`));
    await dialog.getByRole('button', { name: 'Start on another host' }).click();
    await page.getByText(`is moving to node ${b}`).first().waitFor();
    await advanceToStatus(u, vm.id, 'running');
    const after = await api(t, u.token).get('/vms/{vm_id}', { params: { vm_id: vm.id } });
    assert.equal(after.status, 200, after.text);
    assert.equal(after.body.node, b);
    await page.getByRole('button', { name: 'Stop' }).waitFor();
  });

  test('Save as image on a stopped VM; My images shows it ready, billing its cost; Launch starts a VM from it; Delete asks', async () => {
    const own = (await createNode(t, await adminToken(), { gpu_type: '5090', gpu_count: 2 })).node;
    const { u, vm } = await userWithVm({ node: own });
    await advanceToStatus(u, vm.id, 'running');
    assert.equal((await api(t, u.token).post('/vms/{vm_id}/stop', { params: { vm_id: vm.id } })).status, 200);
    await advanceToStatus(u, vm.id, 'stopped');

    const page = await newPage();
    await signIn(page, u.email);
    await page.goto(`/console/vms/${vm.id}`);
    await page.getByRole('button', { name: 'Save as image' }).click();
    const dialog = page.getByRole('dialog', { name: 'Save as image' });
    await dialog.getByLabel('Image name').fill('console-img');
    await dialog.getByRole('button', { name: 'Save image' }).click();
    await page.getByText(`Saving VM ${vm.vmid} as image “console-img”`).waitFor();
    let token = u.token;
    const images = async () => {
      const r = await api(t, token).get('/images');
      assert.equal(r.status, 200, r.text);
      return r.body;
    };
    assert.equal((await images())[0]?.name, 'console-img');
    await page.getByRole('link', { name: 'See it in My images' }).click();
    await page.getByRole('heading', { name: 'My images' }).waitFor();
    await advanceUntil(async () => (await images())[0]?.state === 'ready', 'the image to be ready');
    const [img] = await images();
    assert.ok(img?.hourly_cost);
    const row = page.locator(`tr[data-image="${img.id}"]`);
    await row.getByText('ready', { exact: true }).waitFor(); // the page reads the list again by itself
    await row.getByText(await moneyIn(page, img.hourly_cost)).waitFor();
    await row.getByRole('link', { name: `VM ${vm.vmid}`, exact: true }).waitFor();

    // Billing: what the image costs per hour now, in the spend.
    await page.getByRole('link', { name: 'Billing', exact: true }).click();
    const spend = page.locator(`tr[data-image="${img.id}"]`).first();
    await spend.getByText('console-img').waitFor();
    await spend.getByText(await moneyIn(page, img.hourly_cost)).waitFor();
    // An hour later its storage is in the usage, by image.
    await advance(3700);
    await page.reload();
    const login = await api(t).post('/auth/login', { body: { email: u.email, password: PASSWORD } });
    assert.equal(login.status, 200, login.text);
    token = tokensOf(login.body).access_token; // the first one has expired
    const usage = await api(t, token).get('/billing/usage');
    assert.equal(usage.status, 200, usage.text);
    const logs = usage.body.image_logs.filter((l) => l.image_id === img.id);
    assert.ok(logs.length > 0, 'the image has usage logs');
    const used = page.locator('.usage-images').getByRole('row').filter({ hasText: 'console-img' });
    await used
      .getByText(await moneyIn(page, logs.reduce((sum, l) => sum + Math.round(l.cost * 1e6), 0) / 1e6))
      .waitFor();

    // Launch: pick an offer, then the launch form starts from the image.
    await page.getByRole('navigation', { name: 'Main' }).getByRole('link', { name: 'My images' }).click();
    await page.getByRole('button', { name: 'Launch console-img' }).click();
    await page.waitForURL(new RegExp(`/console/offers\\?image=${img.id}$`));
    await page.getByText('Launching one of your images').waitFor();
    await page.getByRole('row').filter({ hasText: own }).getByRole('button', { name: 'Rent' }).click();
    await page.waitForURL(new RegExp(`/console/offers/${own}/launch\\?image=${img.id}$`));
    const step = page.locator('fieldset.launch-step').filter({ hasText: '3. Image' });
    await step.getByText('console-img').waitFor();
    assert.equal(await page.getByLabel('Disk size (GB)').inputValue(), '50');
    await page.getByRole('button', { name: 'Launch' }).click();
    await page.waitForURL(/\/console\/vms\/[0-9a-f-]{36}$/);
    const made = await api(t, token).get('/vms/{vm_id}', { params: { vm_id: page.url().split('/').pop()! } });
    assert.equal(made.status, 200, made.text);
    assert.equal(made.body.image_id, img.id);
    assert.equal(made.body.node, own);
    await page.getByText(img.id).waitFor();

    // Delete, after confirming: gone from the list (the VM made from it keeps its disk).
    await page.getByRole('navigation', { name: 'Main' }).getByRole('link', { name: 'My images' }).click();
    await page.getByRole('button', { name: 'Delete console-img' }).click();
    const confirm = page.getByRole('dialog', { name: 'Delete this image?' });
    await confirm.getByRole('button', { name: 'Delete image' }).click();
    await page.getByText('You have no images.').waitFor();
    assert.deepEqual(await images(), []);
  });

  test('a VM whose provisioning fails says why, on its page and in the list', async () => {
    const { u, vm } = await userWithVm();
    const fault = await api(t, await adminToken()).post('/admin/simulator/faults', {
      body: { node, action: 'provision', count: 1, vm_id: vm.id },
    });
    assert.ok(fault.status < 300, fault.text);
    await advanceToStatus(u, vm.id, 'failed');
    const failed = await api(t, u.token).get('/vms/{vm_id}', { params: { vm_id: vm.id } });
    assert.equal(failed.status, 200, failed.text);
    const reason = failed.body.failure_reason;
    assert.ok(reason, 'the API says why the VM failed');

    const page = await newPage();
    await signIn(page, u.email);
    await page.goto(`/console/vms/${vm.id}`);
    const alert = page.getByRole('alert').filter({ hasText: 'Why it failed' });
    await alert.waitFor();
    const shown = (await alert.textContent()) ?? '';
    assert.ok(shown.includes(reason), `the reason on the page: ${shown}`);

    await page.getByRole('link', { name: 'VMs', exact: true }).click();
    const row = page.getByRole('row').filter({ has: page.getByRole('link', { name: `VM ${vm.vmid}`, exact: true }) });
    await row.getByText('failed', { exact: true }).waitFor();
    assert.equal(await row.locator('.vm-failure-hint').getAttribute('title'), reason);
  });

  test('billing: the usage total reads like its rows; descriptions show times, not ISO instants', async () => {
    const { u, vm } = await userWithVm();
    await advanceToStatus(u, vm.id, 'running');
    await advance(180); // a few minutes of service time
    const gone = await api(t, u.token).delete('/vms/{vm_id}', { params: { vm_id: vm.id } });
    assert.equal(gone.status, 200, gone.text);
    await advanceToStatus(u, vm.id, 'destroyed');
    const usage = await api(t, u.token).get('/billing/usage');
    assert.equal(usage.status, 200, usage.text);
    assert.ok(usage.body.total_hours > 0 && usage.body.total_hours < 0.2, `a few minutes: ${usage.body.total_hours} h`);

    const page = await newPage();
    await signIn(page, u.email);
    await page.getByRole('link', { name: 'Billing', exact: true }).click();
    const total = page.getByTestId('usage-total-time');
    await total.waitFor();
    const row = page.getByRole('row').filter({ has: page.getByRole('link', { name: `VM ${vm.vmid}`, exact: true }) });
    const rowTime = (await row.getByRole('cell').nth(2).textContent())?.trim();
    const totalTime = (await total.textContent())?.trim();
    assert.match(totalTime ?? '', /^\d+ min$/, `minutes of VM time, not "0 hours": ${totalTime}`);
    assert.equal(totalTime, rowTime, 'one VM: the total and its row read the same');

    // The charge's description names the period in readable times; the exact instants stay in <time datetime>.
    const charge = page
      .getByRole('row')
      .filter({ hasText: `Usage of VM ${vm.vmid} from` })
      .first();
    const description = charge.locator('td.tx-description');
    await description.waitFor();
    const text = (await description.innerText()).split('\n')[0]!;
    assert.doesNotMatch(text, ISO_INSTANT, `no raw ISO instant in "${text}"`);
    const times = description.locator(':scope > time');
    assert.equal(await times.count(), 2, 'from and to');
    assert.match((await times.first().getAttribute('datetime')) ?? '', ISO_INSTANT);
    // The breakdown's period is shown the same way.
    await charge.getByText('Details').click();
    assert.doesNotMatch(await charge.locator('details').innerText(), ISO_INSTANT);
  });

  test('one default disk, 50 GB: the launch form starts at it and the offers total includes it', async () => {
    const own = (await createNode(t, await adminToken(), { gpu_type: '4090', gpu_count: 2 })).node;
    const u = await registerApi();
    const page = await newPage();
    await signIn(page, u.email);
    const offer = async (rental: 'on_demand' | 'interruptible') => {
      const r = await api(t).get('/search', { query: { rental_type: rental, gpu_type: '4090', limit: 100 } });
      assert.equal(r.status, 200, r.text);
      const o = r.body.find((x) => x.node === own);
      assert.ok(o, `${own} is offered`);
      return o;
    };

    // The API's total is for the GPUs and 50 GB of disk; the page shows it.
    const onDemand = await offer('on_demand');
    const micro = (x: number) => Math.round(x * 1e6);
    assert.equal(
      micro(onDemand.total_price_hourly),
      micro(onDemand.gpu_count * onDemand.gpu_price_hourly) + micro(50 * onDemand.storage_price_hourly),
    );
    await page.getByRole('link', { name: 'Offers', exact: true }).click();
    await page.getByText('plus a 50 GB disk').waitFor();
    const total = () => page.getByRole('row').filter({ hasText: own }).getByRole('cell').nth(7);
    await total()
      .getByText(await moneyIn(page, onDemand.total_price_hourly))
      .waitFor();

    // For interruptible the console works the total out itself, with the same 50 GB.
    const interruptible = await offer('interruptible');
    await page.goto('/console/offers?rental_type=interruptible');
    const expected =
      (micro(interruptible.gpu_count * interruptible.interruptible_rate) +
        micro(50 * interruptible.storage_price_hourly)) /
      1e6;
    await total()
      .getByText(await moneyIn(page, expected))
      .waitFor();

    // The launch form starts at the same 50 GB, and prices it.
    await page.goto(`/console/offers/${own}/launch`);
    const disk = page.getByLabel('Disk size (GB)');
    await disk.waitFor();
    assert.equal(await disk.inputValue(), '50');
    await page
      .locator('.launch-price')
      .getByText(/^50 GB ×/)
      .waitFor();
  });

  test('/docs renders the API reference with no Content Security Policy violation in the console', async () => {
    const page = await newPage();
    const messages: string[] = [];
    page.on('console', (m) => {
      if (m.type() === 'error' || m.type() === 'warning') messages.push(`${m.type()}: ${m.text()}`);
    });
    page.on('pageerror', (e) => messages.push(`pageerror: ${e.message}`));
    const res = await page.goto('/docs');
    assert.equal(res?.status(), 200);
    assert.match((await res?.headerValue('content-security-policy')) ?? '', /style-src 'self'/);
    await page.getByRole('heading', { name: /gpucloud API/ }).waitFor();
    await page.locator('.opblock').first().waitFor();
    // The top bar has rendered (its logo is put in after it), so everything that draws has drawn.
    await page.locator('.topbar img').waitFor();
    await page.waitForTimeout(300);
    const csp = messages.filter((m) => /content.security.policy/i.test(m));
    assert.deepEqual(csp, [], 'no CSP violation');
    assert.deepEqual(messages, [], 'a clean console');
  });

  test('a template-102 VM with HTTP ports: Open Jupyter and Open port open new tabs, signed in, on the portal', async () => {
    const u = await registerApi();
    await credit(t, await adminToken(), u.id, 500);
    const sshKey = await api(t, u.token).post('/ssh-keys', { body: { ssh_public_key: generateKey('ed25519').line } });
    assert.equal(sshKey.status, 201, sshKey.text);
    const page = await newPage();
    await signIn(page, u.email);
    await page.goto(`/console/offers/${node}/launch`);
    await page.getByRole('radio', { name: /stable-diffusion/ }).check();
    // The template's own web port is refused by the API, whose message the form shows.
    const ports = page.getByLabel('HTTP ports (optional)');
    await ports.fill('7860');
    await page.getByRole('button', { name: 'Launch' }).click();
    await page
      .getByRole('alert')
      .filter({ hasText: /7860 is the template's webui port/ })
      .waitFor();
    await ports.fill('8080, 8000');
    await page.getByRole('button', { name: 'Launch' }).click();
    await page.waitForURL(/\/console\/vms\/[0-9a-f-]{36}$/);
    const vmId = page.url().split('/').pop()!;
    const vm = await api(t, u.token).get('/vms/{vm_id}', { params: { vm_id: vmId } });
    assert.equal(vm.status, 200, vm.text);
    assert.equal(vm.body.template_vmid, 102);
    assert.deepEqual(vm.body.http_ports, [8000, 8080]);
    const vmid = vm.body.vmid;

    await advanceUntil(
      async () => (await page.getByRole('button', { name: 'Open Jupyter' }).count()) > 0,
      'the VM to run and show its services',
    );
    for (const name of ['Open WebUI', 'Open Jupyter', 'Open port 8000', 'Open port 8080'])
      assert.equal(await page.getByRole('button', { name, exact: true }).count(), 1, name);
    await page.getByText('8000, 8080', { exact: true }).waitFor();

    /** Clicks a service's button; the new tab, once the launch page has traded its token and landed on the app. */
    const open = async (button: string, service: string) => {
      const [tab] = await Promise.all([
        page.context().waitForEvent('page'),
        page.getByRole('button', { name: button, exact: true }).click(),
      ]);
      await tab.waitForURL(`http://${vmid}-${service}.localhost:${port}/`);
      return tab;
    };
    const jupyter = await open('Open Jupyter', 'jupyter');
    // The node is simulated: the portal answers itself, naming the port a real VM would serve Jupyter on.
    await jupyter.getByRole('heading', { name: `VM ${vmid} is simulated` }).waitFor();
    await jupyter.getByText(/port 8888/).waitFor();
    // The tab has no way back to the console, and the console's storage is not there: another origin.
    assert.equal(await jupyter.evaluate(() => window.opener), null);
    assert.equal(await jupyter.evaluate(() => localStorage.length), 0);
    assert.equal(await jupyter.evaluate(() => localStorage.getItem('gpucloud.session')), null);
    assert.ok(await page.evaluate(() => localStorage.getItem('gpucloud.session')), 'the console keeps its session');

    // Another click, another link (each signs in once): an HTTP port, on a host name of its own.
    const app = await open('Open port 8000', '8000');
    await app.getByText(/port 8000 of the VM/).waitFor();
    assert.equal(await app.evaluate(() => localStorage.length), 0);
    await jupyter.close();
    await app.close();
    const gone = await api(t, u.token).delete('/vms/{vm_id}', { params: { vm_id: vmId } });
    assert.equal(gone.status, 200, gone.text);
  });

  test('a launch without credit shows the API message (insufficient balance)', async () => {
    const u = await registerApi();
    const sshKey = await api(t, u.token).post('/ssh-keys', { body: { ssh_public_key: generateKey('ed25519').line } });
    assert.equal(sshKey.status, 201, sshKey.text);
    const page = await newPage();
    await signIn(page, u.email);
    await page.goto(`/console/offers/${node}/launch`);
    await page.getByRole('button', { name: 'Launch' }).click();
    await page
      .getByRole('alert')
      .filter({ hasText: /balance|credit/i })
      .first()
      .waitFor();
    const vms = await api(t, u.token).get('/vms');
    assert.equal(vms.status, 200, vms.text);
    assert.equal(vms.body.length, 0);
  });

  test('create an API key: the secret is shown once, and works', async () => {
    const u = await registerApi();
    const page = await newPage();
    await signIn(page, u.email);
    await page.getByRole('link', { name: 'API keys', exact: true }).click();
    await page.getByLabel(/name/i).first().fill('ci');
    await page.getByRole('button', { name: /create/i }).click();
    const secret = page.getByText(/gpc_[A-Za-z0-9_-]{20,}/).first();
    await secret.waitFor();
    const key = (await secret.textContent())!.match(/gpc_[A-Za-z0-9_-]+/)![0];
    t.forbidSecret(key);
    const me = await fetch(`${base}/account`, { headers: { authorization: `Bearer ${key}` } });
    assert.equal(me.status, 200);
    await page.reload();
    await page.getByRole('cell', { name: 'ci', exact: true }).waitFor();
    assert.equal(await page.getByText(key).count(), 0, 'the secret is not shown again');
  });

  test('an operator changes a price; customers see it on the offers page', async () => {
    const page = await newPage();
    await signIn(page, admin.email, admin.password);
    await page.getByRole('link', { name: 'Pricing', exact: true }).click();
    const field = page.getByLabel(/5090.*price per GPU-hour/i).first();
    await field.fill('3.21');
    await page.getByRole('row').filter({ has: field }).getByRole('button', { name: 'Save' }).click();
    await advanceUntil(async () => {
      const r = await api(t).get('/pricing');
      assert.equal(r.status, 200, r.text);
      return r.body.gpu_types.some((g) => g.gpu_type === '5090' && g.gpu_price_hourly === 3.21);
    }, 'the new price');
    const customer = await registerApi();
    const shopper = await newPage();
    await signIn(shopper, customer.email);
    await shopper.getByRole('link', { name: 'Offers', exact: true }).click();
    await shopper.getByRole('row').filter({ hasText: node }).getByText(/3\.21/).first().waitFor();
  });

  test('on a phone, in the dark: the menu opens and the theme follows the system', async () => {
    const u = await registerApi();
    const page = await newPage({ mobile: true, dark: true });
    await page.goto('/console/');
    await page.getByLabel('Email').fill(u.email);
    await page.getByLabel('Password').fill(PASSWORD);
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.getByRole('button', { name: 'Menu' }).click();
    await page.getByRole('link', { name: 'Billing', exact: true }).click();
    const bg = await page.evaluate(() => getComputedStyle(document.body).backgroundColor);
    const [r, g, b] = bg.match(/\d+/g)!.map(Number);
    assert.ok(r! + g! + b! < 150, `a dark background, got ${bg}`);
    const width = await page.evaluate(() => document.documentElement.scrollWidth);
    assert.ok(width <= 390, `nothing wider than the phone's screen (${width}px)`);
  });
});
