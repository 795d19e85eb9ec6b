/**
 * `gpucloud vm open` and `vm create --http-port`, run as a child process
 * against a real server on both databases, its access portal listening on
 * `*.localhost` names of the same port: the link printed for the WebUI,
 * Jupyter and an HTTP port (one that really signs in, once), the default
 * service, `--json`, `--browser` with a stand-in opener and with none, and
 * the refusals: a VM without a web service, one that is stopped, a service it
 * does not have, a bad --service, a read_only key, and ports the API refuses.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { spawn } from 'node:child_process';
import { chmodSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { AddressInfo } from 'node:net';
import { describeEachDb } from '../helpers/app.js';
import { api, type BodyFor } from '../helpers/api.js';
import { createApiKey, createNode, createUser, credit, uploadSshKey, type TestUser } from '../helpers/factories.js';
import { gpucloudMain } from '../helpers/entry.js';

type VmOut = BodyFor<'/vms/{vm_id}', 'get', 200>;
interface OpenOut {
  vm_id: string;
  service: string;
  url: string;
  expires_at: string;
}
interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
}

describeEachDb('gpucloud vm open', (t) => {
  let port: number;
  let admin: TestUser;
  let user: TestUser;
  let node: string;
  let readWrite: string;
  let readOnly: string;
  let home: string;
  /** Holds a stand-in xdg-open that writes the URL it is given to `opened`. */
  let fakeBin: string;
  let emptyBin: string;
  let opened: string;

  before(async () => {
    await t().app.listen({ port: 0, host: '127.0.0.1' });
    port = (t().app.server.address() as AddressInfo).port;
    t().services.portal.links.setBase(`http://localhost:${port}`);
    admin = await createUser(t(), { admin: true });
    user = await createUser(t());
    await credit(t(), admin.token, user.id, 500);
    await uploadSshKey(t(), user.token);
    node = (await createNode(t(), admin.token, { gpu_type: '4090', gpu_count: 8 })).node;
    readWrite = await createApiKey(t(), user.token, 'read_write', 'cli');
    readOnly = await createApiKey(t(), user.token, 'read_only', 'ro');
    home = mkdtempSync(join(tmpdir(), 'gpucloud-cli-open-'));
    fakeBin = join(home, 'bin');
    emptyBin = join(home, 'empty');
    opened = join(home, 'opened.txt');
    mkdirSync(fakeBin);
    mkdirSync(emptyBin);
    writeFileSync(join(fakeBin, 'xdg-open'), `#!/bin/sh\nprintf '%s\\n' "$1" > '${opened}'\n`);
    chmodSync(join(fakeBin, 'xdg-open'), 0o755);
  });
  after(() => rmSync(home, { recursive: true, force: true }));

  function cli(args: string[], opts: { key?: string; env?: Record<string, string> } = {}): Promise<Run> {
    const env: NodeJS.ProcessEnv = {
      ...process.env,
      XDG_CONFIG_HOME: home,
      GPUCLOUD_API_URL: `http://127.0.0.1:${port}`,
      GPUCLOUD_API_KEY: opts.key ?? readWrite,
      ...opts.env,
    };
    const child = spawn(process.execPath, [gpucloudMain(), ...args], { env, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => (stderr += d));
    const timer = setTimeout(() => child.kill('SIGKILL'), 60_000);
    return new Promise((resolve) =>
      child.on('close', (code) => {
        clearTimeout(timer);
        resolve({ code, stdout, stderr });
      }),
    );
  }
  const ok = (r: Run) => assert.equal(r.code, 0, `exit ${r.code}\nstdout: ${r.stdout}\nstderr: ${r.stderr}`);
  const fails = (r: Run, code: number, stderr: RegExp) => {
    assert.equal(r.code, code, `exit ${r.code}\nstdout: ${r.stdout}\nstderr: ${r.stderr}`);
    assert.match(r.stderr, stderr);
    assert.equal(r.stdout, '', 'nothing on stdout');
  };

  /** Creates a VM with the CLI and lets the simulator run it. */
  async function running(args: string[]): Promise<VmOut> {
    const r = await cli(['vm', 'create', '--node', node, '--gpu', '4090', ...args, '--json']);
    ok(r);
    const vm = JSON.parse(r.stdout) as VmOut;
    await t().services.clock.advance(5);
    const now = await api(t(), user.token).get('/vms/{vm_id}', { params: { vm_id: vm.id } });
    assert.equal(now.status, 200, now.text);
    assert.equal(now.body.status, 'running');
    return now.body;
  }

  /** The link's token, traded on its own host as the portal's launch page does: 204 and a cookie, once. */
  function signIn(url: string): Promise<number> {
    const u = new URL(url);
    const token = /#launch_token=([A-Za-z0-9._-]+)$/.exec(url)![1]!;
    return new Promise((resolve, reject) => {
      const req = http.request(
        {
          host: '127.0.0.1',
          port,
          path: '/.gpucloud/session',
          method: 'POST',
          headers: { host: u.host, 'content-type': 'application/json', accept: 'application/json' },
          agent: false,
        },
        (res) => {
          res.resume();
          resolve(res.statusCode ?? 0);
        },
      );
      req.on('error', reject);
      req.end(JSON.stringify({ launch_token: token }));
    });
  }

  const linkRe = (vmid: number, service: string) =>
    new RegExp(`^http://${vmid}-${service}\\.localhost:${port}/\\.gpucloud/launch#launch_token=[A-Za-z0-9._-]+\\n$`);

  test('vm create --http-port (repeated or with commas); vm show lists the ports', async () => {
    const vm = await running(['--template', 'stable-diffusion', '--http-port', '9000,8000', '--http-port', '9001']);
    assert.deepEqual(vm.http_ports, [8000, 9000, 9001]);
    const show = await cli(['vm', 'show', String(vm.vmid)]);
    ok(show);
    assert.match(show.stdout, /^HTTP ports:\s+8000, 9000, 9001$/m);
    const plain = await running(['--template', 'ubuntu-24.04']);
    assert.deepEqual(plain.http_ports, []);
    const none = await cli(['vm', 'show', plain.id]);
    ok(none);
    assert.match(none.stdout, /^HTTP ports:\s+none$/m);
    for (const v of [vm, plain]) ok(await cli(['vm', 'destroy', v.id, '--yes']));
  });

  test('vm create --http-port: the API refuses a template port, one out of range, a repeat, a sixth; bad usage', async () => {
    for (const [args, why] of [
      [['--template', '102', '--http-port', '7860'], /7860/],
      [['--template', 'desktop', '--http-port', '8888'], /8888/],
      [['--http-port', '80'], /http_ports/],
      [['--http-port', '8000', '--http-port', '8000'], /http_ports/],
      [['--http-port', '8001,8002,8003,8004,8005,8006'], /http_ports/],
    ] as [string[], RegExp][]) {
      const r = await cli(['vm', 'create', '--node', node, '--gpu', '4090', ...args]);
      fails(r, 1, why);
      assert.match(r.stderr, /^Error: /);
    }
    fails(await cli(['vm', 'create', '--node', node, '--gpu', '4090', '--http-port', 'web']), 2, /--http-port/);
    const vms = await api(t(), user.token).get('/vms');
    assert.equal(vms.status, 200, vms.text);
    assert.deepEqual(vms.body, [], 'nothing was created');
  });

  test('vm open: the WebUI by default, Jupyter, a port; the link signs in once; --json', async () => {
    const vm = await running(['--template', 'comfyui', '--http-port', '8000']);
    const web = await cli(['vm', 'open', String(vm.vmid)]);
    ok(web);
    assert.match(web.stdout, linkRe(vm.vmid, 'webui'));
    assert.match(web.stderr, /once, within 5 minutes/);
    assert.match(web.stderr, /the WebUI of VM \d+/);
    assert.equal(await signIn(web.stdout.trim()), 204, 'the link printed is good');
    assert.equal(await signIn(web.stdout.trim()), 401, 'and good once');

    const jupyter = await cli(['vm', 'open', vm.id, '--service', 'jupyter']);
    ok(jupyter);
    assert.match(jupyter.stdout, linkRe(vm.vmid, 'jupyter'));
    assert.match(jupyter.stderr, /Jupyter of VM/);
    const port = await cli(['vm', 'open', String(vm.vmid), '--service', '8000']);
    ok(port);
    assert.match(port.stdout, linkRe(vm.vmid, '8000'));
    assert.match(port.stderr, /port 8000 of VM/);
    assert.equal(await signIn(port.stdout.trim()), 204);

    const json = await cli(['vm', 'open', String(vm.vmid), '--service', 'JUPYTER', '--json']);
    ok(json);
    const out = JSON.parse(json.stdout) as OpenOut;
    assert.equal(out.vm_id, vm.id);
    assert.equal(out.service, 'jupyter');
    assert.match(`${out.url}\n`, linkRe(vm.vmid, 'jupyter'));
    const left = Date.parse(out.expires_at) - t().clock.nowMs();
    assert.ok(Math.abs(left - 300_000) <= 1000, `five minutes, got ${left} ms`);
    ok(await cli(['vm', 'destroy', vm.id, '--yes']));
  });

  test('vm open: the first HTTP port when there is no WebUI; none at all is an error', async () => {
    const ports = await running(['--template', 'ubuntu-22.04', '--http-port', '9100', '--http-port', '9050']);
    const first = await cli(['vm', 'open', String(ports.vmid)]);
    ok(first);
    assert.match(first.stdout, linkRe(ports.vmid, '9050'));
    fails(
      await cli(['vm', 'open', String(ports.vmid), '--service', 'webui']),
      1,
      /has no WebUI: its template, 100 \(ubuntu-22\.04\), serves none/,
    );
    fails(
      await cli(['vm', 'open', String(ports.vmid), '--service', '9200']),
      1,
      /has no HTTP port 9200; its ports: 9050, 9100/,
    );

    const plain = await running(['--template', 'ubuntu-24.04']);
    fails(await cli(['vm', 'open', String(plain.vmid)]), 1, /has no web service/);
    fails(await cli(['vm', 'open', String(plain.vmid), '--service', 'jupyter']), 1, /has no Jupyter/);
    fails(await cli(['vm', 'open', String(plain.vmid), '--service', '8000']), 1, /has no HTTP port 8000; it has none/);
    for (const v of [ports, plain]) ok(await cli(['vm', 'destroy', v.id, '--yes']));
  });

  test('vm open: a stopped VM, a bad --service, a read_only key, an unknown VM', async () => {
    const vm = await running(['--template', 'stable-diffusion', '--http-port', '8000']);
    for (const bad of ['ssh', '80', '70000', '']) {
      fails(
        await cli(['vm', 'open', String(vm.vmid), '--service', bad]),
        2,
        /--service must be webui, jupyter or a port/,
      );
    }
    // A read_only key reads the VM but gets no link: interactive access needs a session or a read_write key.
    for (const service of ['webui', '8000']) {
      fails(
        await cli(['vm', 'open', String(vm.vmid), '--service', service], { key: readOnly }),
        1,
        /No link for .* read_write API key/,
      );
    }
    fails(await cli(['vm', 'open', '00000000-0000-4000-8000-000000000000']), 1, /^Error: /);

    ok(await cli(['vm', 'stop', vm.id]));
    await t().services.clock.advance(5);
    fails(
      await cli(['vm', 'open', String(vm.vmid)]),
      1,
      new RegExp(`VM ${vm.vmid} is stopped: .*gpucloud vm start ${vm.vmid}`),
    );
    ok(await cli(['vm', 'destroy', vm.id, '--yes']));
  });

  // The opener is xdg-open on Linux only (open on macOS, rundll32 on Windows).
  const notLinux = process.platform === 'linux' ? false : 'the stand-in opener is a Linux xdg-open';
  test(
    'vm open --browser: runs the opener with the link; without one, says so and still prints it',
    { skip: notLinux },
    async () => {
      const vm = await running(['--template', 'stable-diffusion']);
      const r = await cli(['vm', 'open', String(vm.vmid), '--browser'], { env: { PATH: fakeBin } });
      ok(r);
      assert.match(r.stdout, linkRe(vm.vmid, 'webui'));
      assert.equal(readFileSync(opened, 'utf8'), r.stdout, 'the opener got the link, fragment and all');
      assert.doesNotMatch(r.stderr, /Could not open/);

      const none = await cli(['vm', 'open', String(vm.vmid), '--browser'], { env: { PATH: emptyBin } });
      ok(none);
      assert.match(none.stdout, linkRe(vm.vmid, 'webui'));
      assert.match(none.stderr, /Could not open a browser \(xdg-open: ENOENT\); open the link above yourself/);
      ok(await cli(['vm', 'destroy', vm.id, '--yes']));
    },
  );
});
