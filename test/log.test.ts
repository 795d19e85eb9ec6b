/**
 * One log for every process (src/log.ts): JSON lines when the output is not a
 * terminal, readable lines when it is (or when GPUCLOUD_LOG_FORMAT says so),
 * and one line per request, at info, when it is answered.
 */
import { after, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { prettyLine } from '../src/log.js';
import { cleanEnv, startInstance, type Instance } from './reliability/instances-cluster.js';

describe('logs', () => {
  const dirs: string[] = [];
  const instances: Instance[] = [];
  after(async () => {
    for (const i of instances) await i.stop();
    for (const d of dirs) rmSync(d, { recursive: true, force: true });
  });

  const serve = async (extra: Record<string, string>) => {
    const dir = mkdtempSync(join(tmpdir(), 'gpucloud-log-'));
    dirs.push(dir);
    const i = await startInstance(
      'log',
      'all',
      cleanEnv({ GPUCLOUD_DATA_DIR: dir, PORT: '0', LOG_LEVEL: 'info', GPUCLOUD_DEMO: '0', ...extra }),
    );
    instances.push(i);
    return i;
  };
  const settle = () => new Promise((r) => setTimeout(r, 300));

  test('a readable line: local time, level, message, key=value pairs (quoted when they need it)', () => {
    const line = prettyLine(
      JSON.stringify({
        level: 30,
        time: Date.UTC(2026, 0, 1, 12, 0, 0, 5),
        pid: 1,
        hostname: 'h',
        msg: 'GET / 200',
        user: 7,
        note: 'two words',
      }),
    );
    assert.match(line, /^\d\d:\d\d:\d\d\.005 INFO {2}GET \/ 200 {2}user=7 note="two words"\n$/);
    assert.match(
      prettyLine(
        JSON.stringify({ level: 50, time: 0, msg: 'boom', err: { message: 'x', stack: 'Error: x\n    at y' } }),
      ),
      /ERROR boom .*\nError: x\n {4}at y\n$/,
    );
    assert.equal(prettyLine('not json'), 'not json\n');
  });

  test('JSON when the output is not a terminal: one line per request, at info, and no other per request', async () => {
    const i = await serve({});
    for (const path of ['/pricing', '/pricing?x=1', '/no/such/route']) await fetch(`${i.url}${path}`);
    await settle();
    const lines = i
      .output()
      .split('\n')
      .filter((l) => l.startsWith('{'))
      .map((l) => JSON.parse(l) as { level: number; msg: string; status?: number; url?: string; reqId?: string });
    const requests = lines.filter((l) => /^GET \//.test(l.msg));
    assert.deepEqual(
      requests.map((l) => [l.msg.replace(/ [\d.]+ ms$/, ''), l.level, l.status]),
      [
        ['GET /pricing 200', 30, 200],
        ['GET /pricing 200', 30, 200],
        ['GET /no/such/route 404', 30, 404],
      ],
    );
    assert.equal(requests[1]!.url, '/pricing?x=1');
    assert.ok(requests.every((l) => typeof l.reqId === 'string'));
    assert.ok(!lines.some((l) => /incoming request|request completed/.test(l.msg)), 'one line, not two');
  });

  test('GPUCLOUD_LOG_FORMAT=pretty: readable lines', async () => {
    const i = await serve({ GPUCLOUD_LOG_FORMAT: 'pretty' });
    await fetch(`${i.url}/pricing`);
    await settle();
    assert.match(i.output(), /^\d\d:\d\d:\d\d\.\d{3} INFO {2}GET \/pricing 200 [\d.]+ ms {2}.*reqId=/m);
    assert.ok(
      !i
        .output()
        .split('\n')
        .some((l) => l.startsWith('{"level"')),
    );
  });
});
