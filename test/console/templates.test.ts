/**
 * The template catalogue in the web console, in headless Chromium against a
 * real server: the launch form offers the templates ready on its node (the
 * others shown, not offered) and launches the one chosen; the Templates page
 * lists where each is ready, with links that launch it there; operators add,
 * edit and delete templates (the API's refusal shown in the dialog), see and
 * delete images (pushing is the command line's, and the page says so), and see
 * each template's state on a node's host.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Browser, BrowserContext, Page } from 'playwright-core';
import { buildTestApp, type TestApp } from '../helpers/app.js';
import { api } from '../helpers/api.js';
import { createNode, createUser, credit, type TestUser } from '../helpers/factories.js';
import { FakeAgent } from '../helpers/fake-agent.js';
import { browserSkipReason, buildConsole, launchChromium } from '../helpers/browser.js';
import { generateKey } from '../ssh-keys/keygen.js';

const skip = browserSkipReason();
const PASSWORD = 'a-long-password-123';
const AGENT_TOKEN = 'agent-token-'.padEnd(40, 'd');

describe('templates in the web console', { skip: skip ?? false }, () => {
  let t: TestApp;
  let base: string;
  let browser: Browser;
  let built: { dir: string; cleanup: () => void };
  let admin: TestUser;
  let renter: TestUser;
  let node: string;
  let agent: FakeAgent;
  let agentNode: string;
  let dir: string;
  const contexts: BrowserContext[] = [];

  before(async () => {
    built = buildConsole();
    t = await buildTestApp('pglite', { consoleDir: built.dir });
    base = await t.app.listen({ port: 0, host: '127.0.0.1' });
    admin = await createUser(t, { admin: true });
    node = (await createNode(t, admin.token, { gpu_type: '5090', gpu_count: 4 })).node;
    renter = await createUser(t, { password: PASSWORD });
    await credit(t, admin.token, renter.id, 500);
    const key = await api(t, renter.token).post('/ssh-keys', { body: { ssh_public_key: generateKey('ed25519').line } });
    assert.equal(key.status, 201, key.text);
    agent = new FakeAgent(AGENT_TOKEN);
    await agent.start();
    agentNode = (
      await createNode(t, admin.token, {
        gpu_type: 'pro6000',
        gpu_count: 1,
        agent_url: agent.url,
        agent_token: AGENT_TOKEN,
        ram_gb: 8,
        cpu_cores: 8,
      })
    ).node;
    dir = mkdtempSync(join(tmpdir(), 'gpucloud-console-templates-'));
    browser = await launchChromium();
  });
  after(async () => {
    await browser?.close();
    await agent?.stop();
    await t?.close();
    built?.cleanup();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  async function newPage(): Promise<Page> {
    const ctx = await browser.newContext({ baseURL: base, viewport: { width: 1280, height: 900 } });
    contexts.push(ctx);
    const page = await ctx.newPage();
    page.setDefaultTimeout(15_000);
    return page;
  }

  async function signIn(page: Page, u: TestUser, password = PASSWORD): Promise<void> {
    await page.goto('/console/');
    await page.getByLabel('Email').fill(u.email);
    await page.getByLabel('Password').fill(password);
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.getByRole('link', { name: 'VMs', exact: true }).waitFor();
  }

  async function destroy(u: TestUser, vmId: string): Promise<void> {
    const r = await api(t, u.token).delete('/vms/{vm_id}', { params: { vm_id: vmId } });
    assert.equal(r.status, 200, r.text);
    for (let i = 0; i < 100; i++) {
      const v = await api(t, u.token).get('/vms/{vm_id}', { params: { vm_id: vmId } });
      assert.equal(v.status, 200, v.text);
      if (v.body.status === 'destroyed') return;
      await t.services.clock.advance(5);
    }
    assert.fail(`VM ${vmId} was not destroyed`);
  }

  test('the launch form offers the templates ready on its node, the others greyed out; the one chosen is launched', async () => {
    // Held by 4090 nodes only: the 5090 node offers it not.
    const only = await api(t, admin.token).post('/admin/templates', {
      body: {
        template_vmid: 170,
        name: 'only-4090',
        description: 'A template for 4090 hosts',
        os: 'Ubuntu 24.04',
        default_user: 'ubuntu',
        gpu_types: ['4090'],
      },
    });
    assert.equal(only.status, 201, only.text);
    const page = await newPage();
    await signIn(page, renter);
    await page.goto(`/console/offers/${node}/launch`);
    const def = page.getByRole('radio', { name: /ubuntu-24\.04/ });
    await def.waitFor();
    assert.ok(await def.isChecked(), 'the default template, 101, is chosen first');
    const unavailable = page.getByRole('radio', { name: /only-4090/ });
    assert.ok(await unavailable.isDisabled(), 'a template the node lacks is not offered');
    await page.locator('.choice').filter({ hasText: 'only-4090' }).getByText('not available on this node').waitFor();
    assert.ok(await page.getByRole('radio', { name: /stable-diffusion/ }).isEnabled());
    await page
      .locator('.choice')
      .filter({ hasText: 'stable-diffusion' })
      .getByText(/SSH, WebUI, Jupyter/)
      .waitFor();

    await page.getByRole('radio', { name: /comfyui/ }).check();
    await page.getByRole('button', { name: 'Launch' }).click();
    await page.waitForURL(/\/console\/vms\/[0-9a-f-]{36}$/);
    const vmId = page.url().split('/').pop()!;
    const vm = await api(t, renter.token).get('/vms/{vm_id}', { params: { vm_id: vmId } });
    assert.equal(vm.status, 200, vm.text);
    assert.equal(vm.body.template_vmid, 103);
    // The VM's page names its template from the catalogue.
    await page
      .locator('dd')
      .filter({ hasText: /^comfyui \(103\)$/ })
      .waitFor();
    await destroy(renter, vmId);

    // The Templates page: where each is ready, each node a link that launches the template there.
    await page.getByRole('link', { name: 'Templates', exact: true }).click();
    await page.getByRole('heading', { name: 'Templates', exact: true }).waitFor();
    const row = page.locator('tr[data-template="102"]');
    await row.getByText('SSH, WebUI, Jupyter', { exact: true }).waitFor();
    await page.locator('tr[data-template="170"]').getByText('only-4090').waitFor();
    await row.getByRole('link', { name: node, exact: true }).click();
    await page.waitForURL(new RegExp(`/console/offers/${node}/launch\\?template=102$`));
    const sd = page.getByRole('radio', { name: /stable-diffusion/ });
    await sd.waitFor();
    await page.waitForFunction(() =>
      Array.from(document.querySelectorAll<HTMLInputElement>('input[name="template_vmid"]')).some(
        (i) => i.checked && i.value === '102',
      ),
    );
  });

  test('operators add, edit and delete templates; a refusal is shown in the dialog', async () => {
    const page = await newPage();
    await signIn(page, admin, admin.password);
    await page.getByRole('link', { name: 'Catalogue', exact: true }).click();
    await page.getByRole('heading', { name: 'Template catalogue' }).waitFor();
    await page.locator('tr[data-template="101"]').waitFor();

    const form = page.getByRole('form', { name: 'Add a template' });
    await form.getByLabel('Template id').fill('171');
    await form.getByLabel('Name', { exact: true }).fill('Bad Name');
    await form.getByLabel('Description').fill('Made in the console');
    await form.getByLabel('WebUI port').fill('7000');
    await form.getByRole('button', { name: 'Add template' }).click();
    await form.getByRole('alert').filter({ hasText: /name/ }).waitFor();
    assert.equal((await api(t).get('/templates/{template_vmid}', { params: { template_vmid: 171 } })).status, 404);
    await form.getByLabel('Name', { exact: true }).fill('console-tpl');
    await form.getByLabel('4090').check();
    await form.getByRole('button', { name: 'Add template' }).click();
    const row = page.locator('tr[data-template="171"]');
    await row.getByText('console-tpl').waitFor();
    const added = await api(t).get('/templates/{template_vmid}', { params: { template_vmid: 171 } });
    assert.equal(added.status, 200, added.text);
    assert.equal(added.body.description, 'Made in the console');
    assert.deepEqual(added.body.access, { ssh: true, webui_port: 7000, jupyter_port: null });
    assert.deepEqual(added.body.gpu_types, ['4090']);

    await page.getByRole('button', { name: 'Edit template 171' }).click();
    const edit = page.getByRole('dialog', { name: 'Edit template 171' });
    await edit.getByLabel('Description').fill('Changed in the console');
    await edit.getByLabel('4090').uncheck();
    await edit.getByRole('button', { name: 'Save template' }).click();
    await row.getByText('Changed in the console').waitFor();
    const edited = await api(t).get('/templates/{template_vmid}', { params: { template_vmid: 171 } });
    assert.equal(edited.status, 200, edited.text);
    assert.equal(edited.body.description, 'Changed in the console');
    assert.equal(edited.body.gpu_types, null, 'no GPU type checked: every type');

    // A VM built from it: the API refuses the delete, and the dialog says why.
    const vm = await api(t, renter.token).post('/vms', {
      body: { node, gpu_type: '5090', gpu_count: 1, storage_gb: 50, template_vmid: 171 },
    });
    assert.equal(vm.status, 201, vm.text);
    await page.getByRole('button', { name: 'Delete template 171' }).click();
    const del = page.getByRole('dialog', { name: /Delete template 171/ });
    await del.getByRole('button', { name: 'Delete template' }).click();
    await del
      .getByRole('alert')
      .filter({ hasText: /in use by 1 VM\(s\) that are not destroyed/ })
      .waitFor();
    await del.getByRole('button', { name: 'Cancel' }).click();
    assert.equal((await api(t).get('/templates/{template_vmid}', { params: { template_vmid: 171 } })).status, 200);

    await destroy(renter, vm.body.id);
    await page.getByRole('button', { name: 'Delete template 171' }).click();
    await page
      .getByRole('dialog', { name: /Delete template 171/ })
      .getByRole('button', { name: 'Delete template' })
      .click();
    await row.waitFor({ state: 'detached' });
    assert.equal((await api(t).get('/templates/{template_vmid}', { params: { template_vmid: 171 } })).status, 404);
  });

  test('operators see the images (pushing is the command line’s) and delete one; a node’s templates show their state', async () => {
    // An image pushed through the API as template 172's.
    const raw = join(dir, 'img.raw');
    writeFileSync(raw, randomBytes(1024 * 1024));
    const file = join(dir, 'img.qcow2');
    execFileSync('qemu-img', ['convert', '-f', 'raw', '-O', 'qcow2', raw, file]);
    const bytes = readFileSync(file);
    const tpl = await api(t, admin.token).post('/admin/templates', {
      body: {
        template_vmid: 172,
        name: 'imaged',
        description: 'With an image',
        os: 'Debian 12',
        default_user: 'debian',
      },
    });
    assert.equal(tpl.status, 201, tpl.text);
    const up = await api(t, admin.token).post('/admin/images/uploads', {
      body: { size_bytes: bytes.length, template_vmid: 172 },
    });
    assert.equal(up.status, 201, up.text);
    const put = await t.app.inject({
      method: 'PUT',
      url: `/admin/images/uploads/${up.body.id}?offset=0`,
      headers: { authorization: `Bearer ${admin.token}`, 'content-type': 'application/octet-stream' },
      payload: bytes,
    });
    assert.equal(put.statusCode, 200, put.body);
    const done = await api(t, admin.token).post('/admin/images/uploads/{upload_id}/complete', {
      params: { upload_id: up.body.id },
    });
    assert.equal(done.status, 201, done.text);
    const sha = done.body.sha256;

    const page = await newPage();
    await signIn(page, admin, admin.password);
    await page.getByRole('link', { name: 'Images', exact: true }).click();
    await page.getByText('gpucloud admin images push FILE --template ID', { exact: true }).waitFor();
    const row = page.locator(`tr[data-sha256="${sha}"]`);
    await row.getByRole('cell', { name: '172', exact: true }).waitFor();
    await row.getByRole('button', { name: /Delete image/ }).click();
    const del = page.getByRole('dialog', { name: /Delete image/ });
    await del.getByRole('button', { name: 'Delete image' }).click();
    await del
      .getByRole('alert')
      .filter({ hasText: /template 172's/ })
      .waitFor();
    await del.getByRole('button', { name: 'Cancel' }).click();
    const unset = await api(t, admin.token).patch('/admin/templates/{template_vmid}', {
      params: { template_vmid: 172 },
      body: { image_sha256: null },
    });
    assert.equal(unset.status, 200, unset.text);
    await row.getByRole('button', { name: /Delete image/ }).click();
    await page
      .getByRole('dialog', { name: /Delete image/ })
      .getByRole('button', { name: 'Delete image' })
      .click();
    await row.waitFor({ state: 'detached' });
    await page.getByText('No image in the store yet.').waitFor();

    // The agent's host: one template ready (added there), one downloading, one failed with its reason.
    agent.templateStates = [
      { vmid: 100, user: 'root', source: 'local', state: 'ready', sha256: null, bytes_done: 0, size_bytes: 0 },
      {
        vmid: 102,
        user: 'ubuntu',
        source: 'pulled',
        state: 'downloading',
        sha256: 'e'.repeat(64),
        bytes_done: 400,
        size_bytes: 1000,
        reason: null,
      },
      {
        vmid: 103,
        user: 'ubuntu',
        source: 'pulled',
        state: 'failed',
        sha256: 'e'.repeat(64),
        bytes_done: 0,
        size_bytes: 1000,
        reason: 'no space left on device',
      },
    ];
    await t.services.hostMonitor.checkNode(agentNode);
    await page.getByRole('link', { name: 'Nodes', exact: true }).click();
    const nodeRow = page.getByRole('row').filter({ has: page.getByText(agentNode, { exact: true }) });
    await nodeRow.getByText('Templates', { exact: true }).click();
    const list = nodeRow.getByRole('list', { name: `Templates on ${agentNode}` });
    await list
      .locator('li[data-state="ready"]')
      .filter({ hasText: 'ubuntu-22.04' })
      .getByText('ready (added on the host)')
      .waitFor();
    await list.locator('li').filter({ hasText: 'stable-diffusion' }).getByText('downloading 40%').waitFor();
    await list.locator('li').filter({ hasText: 'comfyui' }).getByText('no space left on device').waitFor();
    await list.locator('li').filter({ hasText: 'ubuntu-24.04' }).getByText('missing').waitFor();
  });
});
