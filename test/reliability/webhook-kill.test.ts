/**
 * A worker SIGKILLed in the middle of a webhook delivery (processes,
 * PostgreSQL, the system clock): the receiver holds the first request
 * unanswered while the worker that sent it is killed; another worker,
 * started afterwards, makes the attempt again once the dead one's claim has
 * run out. The event arrives again with the same webhook-id (at least once),
 * the receiver answers 2xx exactly once, and the endpoint's history shows
 * exactly one attempt, succeeded: the one whose answer was written down.
 *
 * Skipped unless DATABASE_URL is set.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import {
  cleanEnv,
  createDatabase,
  Http,
  sleep,
  startInstance,
  type FreshDatabase,
  type Instance,
} from './instances-cluster.js';
import { startReceiver, type Receiver } from '../helpers/receiver.js';
import { within } from '../helpers/wait.js';
import { stringField } from '../helpers/json.js';

const skip = process.env.DATABASE_URL ? false : 'needs DATABASE_URL';

let fresh: FreshDatabase;
let env: NodeJS.ProcessEnv;
let rec: Receiver;
const running: Instance[] = [];

before(async () => {
  if (skip) return;
  fresh = await createDatabase(process.env.DATABASE_URL!);
  rec = await startReceiver();
  env = cleanEnv({
    DATABASE_URL: fresh.url,
    GPUCLOUD_JWT_SECRET: randomBytes(24).toString('hex'),
    GPUCLOUD_CLOCK: 'system',
    GPUCLOUD_DEMO: '0',
    GPUCLOUD_WEBHOOK_ALLOW_PRIVATE: '1',
    // A short deadline keeps the dead worker's claim short (the deadline plus 5 s).
    GPUCLOUD_WEBHOOK_TIMEOUT_S: '3',
    LOG_LEVEL: 'warn',
    PORT: '0',
  });
});

after(async () => {
  if (skip) return;
  await Promise.all(running.map((i) => i.stop(5_000)));
  await rec.close();
  await fresh.drop();
});

test(
  'a delivery cut short by a killed worker is made again by another, and recorded once',
  { skip, timeout: 180_000 },
  async () => {
    const [api, w1] = await Promise.all([startInstance('api', 'api', env), startInstance('worker-1', 'worker', env)]);
    running.push(api, w1);
    const http = new Http([api]);
    const email = `hook-${randomBytes(4).toString('hex')}@example.com`;
    await http.must([201], 'POST', '/auth/register', { body: { email, password: 'a-long-password-1234' } });
    const login = await http.must([200], 'POST', '/auth/login', { body: { email, password: 'a-long-password-1234' } });
    const token = stringField(login.body, 'access_token');
    const made = await http.must([201], 'POST', '/webhooks', { token, body: { url: `${rec.url}/hook` } });
    const hook = { id: stringField(made.body, 'id'), secret: stringField(made.body, 'secret') };

    let answered2xx = 0;
    rec.answer = (_r, n) => {
      if (n === 0) return 'hang'; // the first request is never answered: its worker dies holding it
      answered2xx++;
      return 200;
    };
    const sent = stringField((await http.must([202], 'POST', `/webhooks/${hook.id}/test`, { token })).body, 'event_id');
    await within(15_000, async () => rec.received.length === 1, 'the first attempt reaches the receiver');

    w1.child.kill('SIGKILL');
    await new Promise<void>((resolve) => (w1.exited ? resolve() : w1.child.once('exit', () => resolve())));

    const w2 = await startInstance('worker-2', 'worker', env);
    running.push(w2);
    await within(
      60_000,
      async () => rec.received.length >= 2,
      'another worker makes the attempt again after the claim ran out',
    );
    const recorded = async () => {
      await sleep(250); // polled gently: the rate limit counts these too
      const deliveries = (await http.must([200], 'GET', `/webhooks/${hook.id}/deliveries`, { token })).body;
      return Array.isArray(deliveries) && deliveries.length === 1;
    };
    await within(15_000, recorded, 'the attempt is recorded');
    await sleep(2_000); // nothing more comes

    assert.equal(rec.received.length, 2, "sent twice: once to the dead worker's request, once again");
    assert.deepEqual(
      rec.received.map((r) => r.headers['webhook-id']),
      [sent, sent],
      'the same webhook-id both times, so a receiver can tell',
    );
    for (const r of rec.received) assert.equal(rec.verify(r, hook.secret).type, 'webhook.test');
    assert.equal(answered2xx, 1);
    const attempts = (await http.must([200], 'GET', `/webhooks/${hook.id}/deliveries`, { token })).body as Array<{
      event_id: string;
      attempt: number;
      status_code: number;
      outcome: string;
    }>;
    assert.deepEqual(
      attempts.map((a) => [a.event_id, a.attempt, a.status_code, a.outcome]),
      [[sent, 1, 200, 'succeeded']],
      'exactly one attempt written down per successful answer',
    );
  },
);
