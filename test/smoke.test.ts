import { test } from 'node:test';
import assert from 'node:assert/strict';
import { describeEachDb } from './helpers/app.js';
import { createUser } from './helpers/factories.js';
import { api } from './helpers/api.js';

describeEachDb('smoke', (t) => {
  test('register, login, account', async () => {
    const u = await createUser(t());
    const me = await api(t(), u.token).get('/account');
    assert.equal(me.status, 200);
    assert.equal(me.body.email, u.email);
    // /openapi.json is not in the OpenAPI document itself: untyped, read through a local shape.
    const doc = await t().req('GET', '/openapi.json');
    assert.equal(doc.status, 200);
    assert.equal((doc.body as { openapi?: unknown }).openapi, '3.1.0');
  });
});
