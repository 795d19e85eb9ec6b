/**
 * The deployment files in deploy/ (docs/operations.md#deployment-files) work as shipped:
 *
 * - every systemd unit passes `systemd-analyze verify` (the template through an instance, gpucloud-api@8080),
 *   and the units of the service's own user stay hardened (`systemd-analyze security`, exposure 2.0 at most);
 * - each unit runs the role it is named for, the agent's with KillMode=process, and gives a stopping instance
 *   more than GPUCLOUD_SHUTDOWN_TIMEOUT_S before SIGKILL;
 * - the example environment files are accepted by the service's and the agent's own checks once their
 *   CHANGE-ME placeholders are replaced, and refused as shipped;
 * - deploy/nginx.conf passes `nginx -t` and deploy/Caddyfile `caddy validate`, with throwaway certificates.
 *
 * A check that needs a program this machine lacks (systemd-analyze: the Debian package systemd; nginx-light;
 * caddy; openssl) is skipped, unless GPUCLOUD_REQUIRE_DEPLOY_TOOLS=1 (CI): then it fails.
 */
import { after, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import {
  accessSync,
  constants,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  readdirSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { delimiter, join } from 'node:path';
import { loadConfig } from '../src/config.js';
import { parseAgentOptions } from '../src/host-agent/options.js';

const ROOT = join(import.meta.dirname, '..');
const DEPLOY = join(ROOT, 'deploy');
const required = process.env.GPUCLOUD_REQUIRE_DEPLOY_TOOLS === '1';
const work = mkdtempSync(join(tmpdir(), 'gpucloud-deploy-'));
after(() => rmSync(work, { recursive: true, force: true }));

/** Where `binary` is (PATH, then the sbin directories a non-root PATH may lack), or undefined. */
function which(binary: string): string | undefined {
  const dirs = [...(process.env.PATH ?? '').split(delimiter), '/usr/sbin', '/sbin', '/usr/local/sbin'];
  for (const dir of dirs.filter(Boolean)) {
    try {
      accessSync(join(dir, binary), constants.X_OK);
      return join(dir, binary);
    } catch {
      // not here
    }
  }
  return undefined;
}

/** The binary's path, or a reason to skip (false when it is there or required: then `need` throws). */
function tool(binary: string, debianPackage: string): { path: string | undefined; skip: string | false } {
  const path = which(binary);
  const missing = `${binary} not found: apt-get install ${debianPackage}`;
  return { path, skip: path || required ? false : missing };
}

function need(t: { path: string | undefined }, binary: string): string {
  if (!t.path) throw new Error(`GPUCLOUD_REQUIRE_DEPLOY_TOOLS=1 but ${binary} is not installed`);
  return t.path;
}

function run(cmd: string, args: string[], env: NodeJS.ProcessEnv = process.env) {
  const r = spawnSync(cmd, args, { cwd: work, env, encoding: 'utf8', timeout: 60_000 });
  return { status: r.status, out: `${r.stdout}${r.stderr}`, stderr: r.stderr };
}

const UNITS = readdirSync(DEPLOY).filter((f) => f.endsWith('.service'));
/** What each unit is verified as: a template through one instance. */
const verifiedName = (unit: string) => unit.replace('@.service', '@8080.service');
const read = (f: string) => readFileSync(join(DEPLOY, f), 'utf8');

/** A unit's settings: each key's values in order (comments and section headers dropped). */
function settings(unit: string): Map<string, string[]> {
  const m = new Map<string, string[]>();
  for (const line of read(unit).split('\n')) {
    const kv = /^([A-Za-z]+)=(.*)$/.exec(line);
    if (kv) m.set(kv[1]!, [...(m.get(kv[1]!) ?? []), kv[2]!]);
  }
  return m;
}
const one = (s: Map<string, string[]>, key: string) => s.get(key)?.at(-1);

/** NAME=value lines of an environment file. */
function envFile(f: string): Record<string, string> {
  const env: Record<string, string> = {};
  for (const line of read(f).split('\n')) {
    const kv = /^([A-Z_][A-Z0-9_]*)=(.*)$/.exec(line);
    if (kv) env[kv[1]!] = kv[2]!;
  }
  return env;
}
/** The file's variables with each CHANGE-ME secret replaced by a real-looking one. */
const filled = (env: Record<string, string>) =>
  Object.fromEntries(Object.entries(env).map(([k, v]) => [k, v === 'CHANGE-ME' ? randomBytes(32).toString('hex') : v]));

describe('systemd units', () => {
  test('there is one for each role, the API as a template too, and the agent', () => {
    assert.deepEqual(UNITS.sort(), [
      'gpucloud-agent.service',
      'gpucloud-api.service',
      'gpucloud-api@.service',
      'gpucloud-portal.service',
      'gpucloud-worker.service',
    ]);
  });

  test('each runs the built command with its role, restarts on failure and outlasts the shutdown timeout', () => {
    const bin = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')).bin.gpucloud as string;
    const shutdownS = loadConfig({}).shutdownTimeoutS;
    for (const unit of UNITS) {
      const s = settings(unit);
      const exec = one(s, 'ExecStart')!;
      assert.ok(exec.includes(`/usr/bin/node --v8-pool-size=1 /opt/gpucloud/${bin} `), `${unit}: ${exec}`);
      const role = /gpucloud-(api|worker|portal|agent)/.exec(unit)![1]!;
      assert.ok(
        exec.endsWith(role === 'agent' ? ' agent --data-dir /var/lib/gpucloud-agent' : ` serve --role ${role}`),
      );
      assert.ok(Number(one(s, 'TimeoutStopSec')) > shutdownS, `${unit}: TimeoutStopSec above ${shutdownS} s`);
      assert.match(one(s, 'Restart')!, /^(on-failure|always)$/);
      assert.equal(one(s, 'RestartPreventExitStatus'), '2', `${unit}: a configuration error is not retried`);
      for (const [key, value] of [
        ['NoNewPrivileges', 'yes'],
        ['ProtectSystem', 'strict'],
        ['ProtectHome', 'yes'],
      ]) {
        assert.equal(one(s, key!), value, `${unit}: ${key}`);
      }
      if (role === 'agent') {
        assert.equal(one(s, 'KillMode'), 'process', 'stopping the agent must not stop its VMs');
        assert.equal(one(s, 'EnvironmentFile'), '/etc/gpucloud/agent.env');
        assert.deepEqual(s.get('ReadWritePaths'), ['/var/lib/gpucloud-agent']);
      } else {
        assert.equal(one(s, 'User'), 'gpucloud');
        assert.equal(one(s, 'PrivateTmp'), 'yes');
        assert.equal(one(s, 'EnvironmentFile'), '/etc/gpucloud/gpucloud.env');
        assert.deepEqual(s.get('ReadWritePaths'), ['/var/lib/gpucloud']);
        assert.equal(s.get('KillMode'), undefined, `${unit}: the whole service stops`);
      }
    }
    // The template's port is its instance name, whatever the environment file says; the portal has its own.
    assert.match(one(settings('gpucloud-api@.service'), 'ExecStart')!, /^\/usr\/bin\/env PORT=%i /);
    assert.match(one(settings('gpucloud-portal.service'), 'ExecStart')!, /^\/usr\/bin\/env PORT=8090 /);
  });

  const analyze = tool('systemd-analyze', 'systemd');
  /** The units copied where systemd-analyze reads them, with node where this machine has it. */
  const unitDir = join(work, 'units');
  function copyUnits(): void {
    mkdirSync(unitDir, { recursive: true });
    const node = which('node') === '/usr/bin/node' || !which('node') ? '/usr/bin/node' : process.execPath;
    for (const unit of UNITS) writeFileSync(join(unitDir, unit), read(unit).replaceAll('/usr/bin/node', node));
  }

  test('systemd-analyze verify accepts every unit, without a warning', { skip: analyze.skip }, () => {
    const bin = need(analyze, 'systemd-analyze');
    copyUnits();
    for (const unit of UNITS) {
      const r = run(bin, ['verify', '--man=no', join(unitDir, verifiedName(unit))]);
      // On a machine running systemd, verify also reports on the system's own units: only ours count.
      const ours = r.stderr.split('\n').filter((l) => l.includes('gpucloud'));
      assert.equal(r.status, 0, `${unit}:\n${r.out}`);
      assert.deepEqual(ours, [], `${unit}: systemd-analyze verify warned`);
    }
  });

  test('systemd-analyze security: the service user units expose 2.0 at most', { skip: analyze.skip }, () => {
    const bin = need(analyze, 'systemd-analyze');
    copyUnits();
    for (const unit of UNITS.filter((u) => !u.includes('agent'))) {
      const r = run(bin, [
        'security',
        '--offline=yes',
        '--threshold=20',
        '--no-pager',
        join(unitDir, verifiedName(unit)),
      ]);
      assert.equal(r.status, 0, `${unit}:\n${r.out.split('\n').slice(-3).join('\n')}`);
    }
  });
});

describe('environment files', () => {
  test('gpucloud.env.example passes the service configuration checks once its secrets are set', () => {
    const env = envFile('gpucloud.env.example');
    assert.throws(() => loadConfig(env), /GPUCLOUD_(JWT_SECRET|METRICS_TOKEN)/, 'CHANGE-ME must not start');
    const config = loadConfig(filled(env));
    assert.equal(config.port, 8080);
    assert.ok(config.shutdownTimeoutS < Number(one(settings('gpucloud-api.service'), 'TimeoutStopSec')));
  });

  test('agent.env.example passes the agent option checks once its token is set', () => {
    const env = envFile('agent.env.example');
    const args = ['--data-dir', '/var/lib/gpucloud-agent'];
    assert.throws(() => parseAgentOptions(args, env), /GPUCLOUD_AGENT_TOKEN/);
    const options = parseAgentOptions(args, filled(env));
    assert.equal(options.network, 'bridge');
  });
});

describe('reverse proxy examples', () => {
  const openssl = tool('openssl', 'openssl');
  let certs: { cert: string; key: string } | undefined;
  /** A throwaway self-signed certificate for the examples' certificate paths. */
  function certificate(): { cert: string; key: string } {
    if (certs) return certs;
    const bin = need(openssl, 'openssl');
    const cert = join(work, 'cert.pem');
    const key = join(work, 'cert.key');
    const r = run(bin, [
      'req',
      '-x509',
      '-newkey',
      'ec',
      '-pkeyopt',
      'ec_paramgen_curve:prime256v1',
      '-nodes',
      '-days',
      '1',
      '-subj',
      '/CN=api.example.com',
      '-keyout',
      key,
      '-out',
      cert,
    ]);
    assert.equal(r.status, 0, r.out);
    certs = { cert, key };
    return certs;
  }

  const nginx = tool('nginx', 'nginx-light');
  test('nginx -t accepts deploy/nginx.conf', { skip: nginx.skip || openssl.skip }, () => {
    const bin = need(nginx, 'nginx');
    const { cert, key } = certificate();
    const site = read('nginx.conf')
      .replace(/(ssl_certificate)\s+[^;]+;/g, `$1 ${cert};`)
      .replace(/(ssl_certificate_key)\s+[^;]+;/g, `$1 ${key};`);
    assert.ok(!site.includes('/etc/ssl/'), 'every certificate path replaced');
    const dir = join(work, 'nginx');
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, 'gpucloud.conf'), site);
    // The site goes in the http block, as /etc/nginx/conf.d/ files do.
    writeFileSync(
      join(dir, 'nginx.conf'),
      [
        `pid ${join(dir, 'nginx.pid')};`,
        'error_log stderr;',
        'events {}',
        'http {',
        `  client_body_temp_path ${join(dir, 'body')};`,
        `  proxy_temp_path ${join(dir, 'proxy')};`,
        `  include ${join(dir, 'gpucloud.conf')};`,
        '}',
        '',
      ].join('\n'),
    );
    const r = run(bin, ['-t', '-p', dir, '-c', join(dir, 'nginx.conf'), '-e', 'stderr']);
    assert.equal(r.status, 0, r.out);
    assert.doesNotMatch(r.out, /\[emerg\]/);
  });

  const caddy = tool('caddy', 'caddy');
  test('caddy validate accepts deploy/Caddyfile', { skip: caddy.skip || openssl.skip }, () => {
    const bin = need(caddy, 'caddy');
    const { cert, key } = certificate();
    const text = read('Caddyfile').replace(/^(\s*tls) \/\S+ \/\S+$/gm, `$1 ${cert} ${key}`);
    assert.ok(!text.includes('/etc/ssl/'), 'every certificate path replaced');
    const dir = join(work, 'caddy');
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, 'Caddyfile'), text);
    // Caddy keeps its state under HOME and the XDG directories: a throwaway one.
    const env = { ...process.env, HOME: dir, XDG_DATA_HOME: dir, XDG_CONFIG_HOME: dir };
    const r = run(bin, ['validate', '--config', join(dir, 'Caddyfile'), '--adapter', 'caddyfile'], env);
    assert.equal(r.status, 0, r.out);
    assert.doesNotMatch(r.out, /not formatted/, 'deploy/Caddyfile is as `caddy fmt` writes it');
  });
});
