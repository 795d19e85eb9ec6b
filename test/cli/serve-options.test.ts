/**
 * `gpucloud serve --local-agent` takes the agent's own options, by the names
 * `gpucloud agent` takes (all but --token, which each start makes): parsed
 * by the agent's parser, a flag winning over its GPUCLOUD_AGENT_* variable,
 * the data directory DATA_DIR/agent unless given. Without a local agent
 * they are refused with a message saying so, and a bad value stops the
 * start before anything listens, naming the option. A real start with QEMU
 * and these flags is in test/agent/local-agent.test.ts.
 */
import { after, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { AGENT_OPTION_SPEC, AgentOptionError } from '../../src/host-agent/options.js';
import { LOCAL_AGENT_FLAGS, LocalUsageError, parseServeArgs, requireLocalAgent } from '../../src/local-commands.js';
import { localAgentOptions } from '../../src/local-host-agent.js';
import { gpucloudMain } from '../helpers/entry.js';

const TOKEN = 't'.repeat(32);
const dirs: string[] = [];
after(() => dirs.forEach((d) => rmSync(d, { recursive: true, force: true })));

describe('serve --local-agent options', () => {
  test("serve takes every option of the agent but --token, and hands them to the agent's parser", () => {
    assert.deepEqual(
      LOCAL_AGENT_FLAGS,
      Object.keys(AGENT_OPTION_SPEC).filter((f) => f !== 'token'),
    );
    const args = [
      '--local-agent',
      '--fake-gpus',
      '2',
      '--accel',
      'tcg',
      '--data-dir',
      '/srv/agent',
      '--ssh-ports',
      '30000-30009',
      '--network',
      'user',
      '--public-host',
      'gpu.example.com',
      '--listen',
      '127.0.0.1:7171',
      '--role',
      'api',
    ];
    const parsed = parseServeArgs(args);
    assert.equal(parsed.role, 'api');
    assert.equal(parsed.localAgent, true);
    const o = localAgentOptions({ dataDir: '/srv/data', localAgentArgs: parsed.agentArgs }, {}, TOKEN);
    assert.deepEqual(
      [o.fakeGpus, o.accel, o.dataDir, o.sshPorts, o.network, o.publicHost, o.listenHost, o.listenPort, o.token],
      [2, 'tcg', '/srv/agent', { from: 30000, to: 30009 }, 'user', 'gpu.example.com', '127.0.0.1', 7171, TOKEN],
    );
  });

  test('a flag wins over its variable; the data directory defaults to DATA_DIR/agent', () => {
    const env = { GPUCLOUD_AGENT_FAKE_GPUS: '4', GPUCLOUD_AGENT_ACCEL: 'kvm', GPUCLOUD_AGENT_TOKEN: 'u'.repeat(40) };
    const byEnv = localAgentOptions({ dataDir: 'data' }, env, TOKEN);
    assert.deepEqual(
      [byEnv.fakeGpus, byEnv.accel, byEnv.dataDir, byEnv.token],
      [4, 'kvm', resolve('data', 'agent'), TOKEN],
      "the variables, this start's token, DATA_DIR/agent",
    );
    const { agentArgs } = parseServeArgs(['--local-agent', '--fake-gpus', '1']);
    const byFlag = localAgentOptions({ dataDir: 'data', localAgentArgs: agentArgs }, env, TOKEN);
    assert.deepEqual([byFlag.fakeGpus, byFlag.accel], [1, 'kvm']);
    assert.equal(
      localAgentOptions({ dataDir: 'data' }, { GPUCLOUD_AGENT_DATA_DIR: '/var/agent' }, TOKEN).dataDir,
      '/var/agent',
    );
  });

  test('refused: agent options without a local agent, a token, a bad role; a bad value names the option', () => {
    const refused = (args: string[], message: RegExp, localAgent = false) =>
      assert.throws(
        () => requireLocalAgent(parseServeArgs(args), localAgent || parseServeArgs(args).localAgent),
        (err: unknown) => err instanceof LocalUsageError && err.path === 'serve' && message.test(err.message),
        args.join(' '),
      );
    refused(['--fake-gpus', '2'], /^--fake-gpus is an option of the local agent: add --local-agent/);
    refused(['--fake-gpus', '2', '--accel', 'tcg'], /^--fake-gpus, --accel are options of the local agent/);
    refused(['--data-dir', 'x'], /server's own data directory is the variable GPUCLOUD_DATA_DIR/);
    refused(['--local-agent', '--token', TOKEN], /--token: the local agent gets a new token at each start/);
    refused(['--role', 'agent'], /--role must be api, worker, portal or all/);
    // GPUCLOUD_LOCAL_AGENT=1 stands for --local-agent.
    requireLocalAgent(parseServeArgs(['--fake-gpus', '2']), true);
    assert.throws(
      () => localAgentOptions({ dataDir: 'd', localAgentArgs: ['--fake-gpus', 'lots'] }, {}, TOKEN),
      (err: unknown) => err instanceof AgentOptionError && err.option === '--fake-gpus',
    );
  });

  test('the command: exit 2 before anything starts, with the message and serve’s help', () => {
    const data = mkdtempSync(join(tmpdir(), 'gpucloud-serve-options-'));
    dirs.push(data);
    const env: NodeJS.ProcessEnv = { ...process.env, GPUCLOUD_DATA_DIR: join(data, 'data'), PORT: '0' };
    for (const k of ['DATABASE_URL', 'GPUCLOUD_REDIS_URL', 'GPUCLOUD_LOCAL_AGENT', 'GPUCLOUD_CLOCK', 'NODE_OPTIONS'])
      delete env[k];
    for (const [args, message] of [
      [
        ['serve', '--fake-gpus', '2', '--accel', 'tcg'],
        /^gpucloud serve: --fake-gpus, --accel are options of the local agent: add --local-agent/,
      ],
      [
        ['serve', '--local-agent', '--fake-gpus', 'lots'],
        /^gpucloud serve: --fake-gpus: must be a number of GPUs from 0 to 64, got "lots"/,
      ],
      [['serve', '--local-agent', '--accel', 'fast'], /^gpucloud serve: --accel: must be kvm, tcg or auto/],
      [['serve', '--local-agent', '--token', TOKEN], /^gpucloud serve: --token: /],
    ] as [string[], RegExp][]) {
      const r = spawnSync(process.execPath, [gpucloudMain(), ...args], { env, encoding: 'utf8', timeout: 60_000 });
      const what = `${args.join(' ')}: exit ${r.status}\n${r.stdout}\n${r.stderr}`;
      assert.equal(r.status, 2, what);
      assert.match(r.stderr, message, what);
      assert.match(r.stderr, /\n\nUsage: gpucloud serve /, what);
      assert.equal(r.stdout, '', what);
    }
    // A bad variable is a configuration error naming it.
    const bad = spawnSync(process.execPath, [gpucloudMain(), 'serve', '--local-agent'], {
      env: { ...env, GPUCLOUD_AGENT_ACCEL: 'fast' },
      encoding: 'utf8',
      timeout: 60_000,
    });
    assert.equal(bad.status, 2, bad.stderr);
    assert.match(bad.stderr, /^Configuration error: GPUCLOUD_AGENT_ACCEL: must be kvm, tcg or auto/);
    assert.equal(existsSync(join(data, 'data')), false, 'no database was opened');
  });
});
