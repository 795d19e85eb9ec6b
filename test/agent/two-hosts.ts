/**
 * Two real hosts under one control plane, for the end-to-end tests that need
 * two (templates reaching hosts, moves): a test app on one database, listening
 * so that hosts download from the API's own address, an admin, an SSH key
 * pair, and two `gpucloud agent` processes (data directories `a` and `b`,
 * each with its own port, token and SSH port range; TCG, one stand-in GPU).
 *
 *   const env = new TwoHosts();
 *   before(() => env.start(kind, 'tag'));
 *   after(() => env.close());
 *
 * close() cleans up whatever start() got to, even when it failed half-way.
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync, rmSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { buildTestApp, type TestApp } from '../helpers/app.js';
import { api, type RequestBody } from '../helpers/api.js';
import type { DbKind } from '../helpers/db.js';
import { createNode, createUser, credit, type TestUser } from '../helpers/factories.js';
import { qemu, qemuImg, genisoimage } from './qemu-helpers.js';
import { freePort, kill, qemuPidsUnder, startAgentProcess, workDir, type AgentProcess } from './real-vms.js';

/** What the two-host tests need: QEMU, qemu-img and genisoimage. */
export const twoHostsSkip = qemu.skip || qemuImg.skip || genisoimage.skip;

export interface Host {
  /** The node's name once registered (register()). */
  name: string;
  dataDir: string;
  /** The agent's command line, to start it again. */
  args: string[];
  token: string;
  agent: AgentProcess;
}

export class TwoHosts {
  t!: TestApp;
  dir = '';
  /** The private key of the pair every customer() registers; the public one is `${keyFile}.pub`. */
  keyFile = '';
  admin!: TestUser;
  readonly hosts: Host[] = [];

  /**
   * Starts the control plane (heartbeats every second, stops hard after 20 s) and the two agents; `prepare`
   * runs before each agent starts (e.g. to add a local template to its data directory).
   */
  async start(kind: DbKind, tag: string, prepare?: (name: 'a' | 'b', dataDir: string) => void): Promise<void> {
    for (const tool of [qemu, qemuImg, genisoimage]) tool.ensure();
    this.dir = workDir(tag);
    this.keyFile = join(this.dir, 'id');
    execFileSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-C', tag, '-f', this.keyFile]);
    this.t = await buildTestApp(kind, {
      env: { GPUCLOUD_AGENT_HEARTBEAT_S: '1', GPUCLOUD_AGENT_STOP_TIMEOUT_S: '20' },
    });
    const t = this.t;
    // Hosts download images from the API's own address.
    await t.app.listen({ port: 0, host: '127.0.0.1' });
    t.services.templates.useBaseUrl(`http://127.0.0.1:${(t.app.server.address() as AddressInfo).port}`);
    this.admin = await createUser(t, { admin: true });
    for (const name of ['a', 'b'] as const) {
      const token = `${tag}-${name}-`.padEnd(48, name);
      t.forbidSecret(token);
      const sshFrom = 20000 + Math.floor(Math.random() * 4000) * 10;
      const dataDir = join(this.dir, name);
      const args = [
        '--listen',
        `127.0.0.1:${await freePort()}`,
        '--data-dir',
        dataDir,
        '--token',
        token,
        '--accel',
        'tcg',
        '--fake-gpus',
        '1',
        '--ssh-ports',
        `${sshFrom}-${sshFrom + 9}`,
      ];
      prepare?.(name, dataDir);
      this.hosts.push({ name: '', dataDir, args, token, agent: await startAgentProcess(args) });
    }
  }

  /** A customer with 100 of credit and the test's SSH key. */
  async customer(): Promise<TestUser> {
    const user = await createUser(this.t);
    await credit(this.t, this.admin.token, user.id, 100);
    const key = await api(this.t, user.token).post('/ssh-keys', {
      body: { ssh_public_key: readFileSync(`${this.keyFile}.pub`, 'utf8') },
    });
    assert.equal(key.status, 201, key.text);
    return user;
  }

  /** Registers the host as a node of one GPU, 1 GB of RAM and 2 cores (with `over`); sets its name. */
  async register(h: Host, over: Partial<RequestBody<'/admin/nodes', 'post'>> = {}): Promise<void> {
    const n = await createNode(this.t, this.admin.token, {
      agent_url: h.agent.url,
      agent_token: h.token,
      gpu_count: 1,
      ram_gb: 1,
      cpu_cores: 2,
      ...over,
    });
    h.name = n.node;
  }

  async close(): Promise<void> {
    for (const h of this.hosts) await kill(h.agent.child);
    if (this.dir) for (const pid of qemuPidsUnder(this.dir)) process.kill(pid, 'SIGKILL');
    await this.t?.close();
    if (this.dir) rmSync(this.dir, { recursive: true, force: true });
  }
}
