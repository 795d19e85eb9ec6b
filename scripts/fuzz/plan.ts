/**
 * The request plan: from the operations of the document, a deterministic
 * (for a seed) list of requests, each valid or broken in one place, sent as
 * one of the identities. Real ids are `Ref`s, looked up when sent.
 */
import { createHash } from 'node:crypto';
import fc from 'fast-check';
import type { Arb } from './arbitraries.js';
import type { Operation } from './openapi.js';
import { makeOverride } from './overrides.js';
import { invalidParts, validBody, validHeaders, validPath, validQuery } from './parts.js';
import { type AuthSpec, IDENTITIES, type IdentityName, type Parts, type Planned } from './planned.js';

export { IDENTITIES };
export type { AuthSpec, BodySpec, IdentityName, Planned, QuerySpec } from './planned.js';

// ---------------------------------------------------------------- identities

const BOGUS_HEADERS: [string, string][] = [
  ['Bearer', 'scheme without a token'],
  ['Bearer ', 'empty token'],
  ['Bearer gpc_', 'empty API key'],
  ['Bearer gpc_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA', 'unknown API key'],
  ['Bearer a.b.c', 'three-part garbage JWT'],
  [
    `Bearer ${b64u('{"alg":"none","typ":"JWT"}')}.${b64u('{"sub":"1","role":"admin","type":"access"}')}.`,
    'unsigned alg=none JWT',
  ],
  [
    `Bearer ${b64u('{"alg":"HS256","typ":"JWT"}')}.${b64u('{"sub":"1","role":"admin","exp":99999999999}')}.c2lnbmF0dXJl`,
    'JWT with a forged signature',
  ],
  ['Basic ZnV6ejpmdXp6', 'Basic credentials'],
  ['Token abc', 'unknown scheme'],
  [`Bearer ${'x'.repeat(5000)}`, '5000-char token'],
  ['Bearer \u00ff\u00fe', 'latin-1 token'],
];

function b64u(s: string): string {
  return Buffer.from(s).toString('base64url');
}

function authArb(op: Operation): Arb<AuthSpec> {
  const as = (who: IdentityName, weight: number) => ({ weight, arbitrary: fc.constant<AuthSpec>({ kind: 'as', who }) });
  const none = (weight: number) => ({ weight, arbitrary: fc.constant<AuthSpec>({ kind: 'none' }) });
  const bogus = (weight: number) => ({
    weight,
    arbitrary: fc.oneof(
      fc.constantFrom(...BOGUS_HEADERS).map(([header, note]): AuthSpec => ({ kind: 'raw', header, note })),
      fc
        .string({ unit: 'grapheme-ascii', maxLength: 40 })
        .map((t): AuthSpec => ({ kind: 'raw', header: `Bearer ${t}`, note: 'random token' })),
      fc
        .tuple(
          fc.constantFrom(...IDENTITIES),
          fc.constantFrom(
            'lowercase-scheme',
            'append',
            'truncate',
            'double-space',
            'no-scheme',
            'basic',
            'two-tokens',
          ) as Arb<Extract<AuthSpec, { kind: 'tamper' }>['how']>,
        )
        .map(([who, how]): AuthSpec => ({ kind: 'tamper', who, how })),
    ),
  });
  if (op.public) return fc.oneof(none(6), as('user', 1), as('admin', 1), bogus(1));
  if (op.path.startsWith('/admin'))
    return fc.oneof(as('admin', 10), as('user', 1), as('key_rw', 1), as('key_ro', 1), none(1), bogus(1));
  return fc.oneof(
    as('user', 6),
    as('key_rw', 2),
    as('key_ro', 2),
    as('key_billing', 1),
    as('other', 1),
    as('admin', 1),
    none(1),
    bogus(1),
  );
}

// ---------------------------------------------------------------- the plan

function opWeight(op: Operation): number {
  if (['/metrics', '/healthz', '/readyz', '/pricing', '/admin/clock', '/admin/clock/advance'].includes(op.path))
    return 1;
  if (op.id === 'POST /vms') return 6;
  if (op.path.startsWith('/vms') || op.path.startsWith('/reservations')) return 4;
  if (op.path.startsWith('/auth')) return 2;
  return 3;
}

export function planArbitrary(ops: Operation[]): Arb<Omit<Planned, 'seq'>> {
  const perOp = ops.map((op, index) => {
    const ov = makeOverride(op);
    const valid: Arb<Parts> = fc.record({
      path: validPath(op, ov),
      query: validQuery(op, ov),
      body: validBody(op, ov),
      headers: validHeaders(op),
    });
    const auth = authArb(op);
    const validReq = fc
      .tuple(auth, valid)
      .map(([a, p]): Omit<Planned, 'seq'> => ({ op: index, auth: a, mode: 'valid', note: '', ...p }));
    const invalidReq = fc
      .tuple(auth, invalidParts(op, ov, valid))
      .map(([a, { parts, note }]): Omit<Planned, 'seq'> => ({ op: index, auth: a, mode: 'invalid', note, ...parts }));
    return {
      weight: opWeight(op),
      arbitrary: fc.oneof({ weight: 13, arbitrary: validReq }, { weight: 7, arbitrary: invalidReq }),
    };
  });
  return fc.oneof(...perOp);
}

/** `count` planned requests for a seed: the same list for the same seed and document. */
export function makePlan(ops: Operation[], seed: number, count: number): Planned[] {
  if (count <= 0) return [];
  const values = fc.sample(planArbitrary(ops), { seed, numRuns: count });
  return values.map((v, seq) => ({ seq, ...v }));
}

/** A short fingerprint of the operations, so a replay can tell it runs against another document. */
export function docFingerprint(ops: Operation[]): string {
  return createHash('sha256')
    .update(JSON.stringify(ops.map((o) => [o.id, o.pathParams, o.queryParams, o.body?.schema ?? null])))
    .digest('hex')
    .slice(0, 12);
}
