/**
 * Route schemas are compiled on first use: an app starts with every validator
 * and serializer pending, a request compiles only what its route needs, and
 * compileAll() compiles every schema of every route, so a schema that cannot
 * compile still fails here rather than on some route's first request.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { buildTestApp, type TestApp } from '../helpers/app.js';
import { api, expectError } from '../helpers/api.js';
import { createUser } from '../helpers/factories.js';
import { LazySchemas } from '../../src/http/lazy-schemas.js';

let t: TestApp;
before(async () => {
  t = await buildTestApp('pglite');
});
after(() => t?.close());

test('a request compiles its route only; compileAll compiles the rest; answers are the same after', async () => {
  const schemas = t.app.schemas;
  const atStart = schemas.pendingCount;
  // Every route has a response schema, most have a request schema too.
  assert.ok(atStart > t.app.printRoutes().split('\n').length, `pending at start: ${atStart}`);

  const pricing = await api(t).get('/pricing');
  assert.equal(pricing.status, 200, pricing.text);
  const afterOne = schemas.pendingCount;
  assert.ok(afterOne < atStart, 'the first request compiled what its route needed');
  assert.ok(atStart - afterOne <= 4, `one route compiled ${atStart - afterOne} schemas`);

  // A validation failure through a stand-in carries Ajv's errors as before.
  const u = await createUser(t);
  const bad = await api(t, u.token).post('/ssh-keys', { rawBody: { name: 'k' } });
  expectError(bad, 422, 'validation_error');
  assert.ok(
    bad.body.errors?.some((e) => e.field === 'body.ssh_public_key'),
    `errors name the missing field: ${JSON.stringify(bad.body)}`,
  );

  schemas.compileAll();
  assert.equal(schemas.pendingCount, 0);
  const again = await api(t).get('/pricing');
  assert.equal(again.text, pricing.text, 'the same body once compiled ahead');
  const badAgain = await api(t, u.token).post('/ssh-keys', { rawBody: { name: 'k' } });
  expectError(badAgain, 422, 'validation_error');
  assert.deepEqual(badAgain.body.errors, bad.body.errors);
});

test('a schema that cannot compile fails compileAll and its first use, not the start', () => {
  const schemas = new LazySchemas();
  const broken = schemas.validator(() => {
    throw new Error('schema is invalid: unknown format "nope"');
  });
  const validate = broken({ schema: {}, method: 'POST', url: '/x', httpPart: 'body' });
  assert.equal(schemas.pendingCount, 1);
  assert.throws(() => schemas.compileAll(), /unknown format "nope"/);
  assert.throws(() => validate({}), /unknown format "nope"/);

  const serialize = schemas.serializerFactory()({}, {})({
    schema: { type: 'object', properties: { n: { type: 'integer' } } },
    method: 'GET',
    url: '/y',
    httpStatus: '200',
  });
  assert.equal(schemas.pendingCount, 2);
  assert.equal(serialize({ n: 3, hidden: 'x' }), '{"n":3}');
  assert.equal(schemas.pendingCount, 1, 'compiled on first use');
});
