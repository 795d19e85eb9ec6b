import { test } from 'node:test';
import assert from 'node:assert/strict';
import { describeEachDb } from './helpers/app.js';
import { createUser } from './helpers/factories.js';

describeEachDb('smoke', (t) => {
  test('register, login, account', async () => {
    const u = await createUser(t());
    const me = await t().req('GET', '/account', { token: u.token });
    assert.equal(me.status, 200);
    assert.equal(me.body.email, u.email);
    const doc = await t().req('GET', '/openapi.json');
    assert.equal(doc.status, 200);
    assert.equal(doc.body.openapi, '3.1.0');
  });
});
