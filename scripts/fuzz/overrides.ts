/**
 * Real ids and sensible values for a planned request: the override that
 * swaps them into values generated from the schemas, and the touches across
 * the fields of a valid body.
 */
import fc from 'fast-check';
import { type Arb, type Ctx, type Override, dateTimeArb, emailArb, validArb } from './arbitraries.js';
import type { Operation, Schema } from './openapi.js';
import { type PoolKind, Ref, isPlainObject } from './values.js';

const ref = (kind: PoolKind, field = 'id'): Arb<Ref> => fc.nat({ max: 9999 }).map((i) => new Ref(kind, i, field));

function mix(main: Arb<unknown>, weight: number, fallback: Arb<unknown>): Arb<unknown> {
  return fc.oneof({ weight, arbitrary: main }, { weight: 1, arbitrary: fallback });
}

/** base64 of an OpenSSH ed25519 public key blob made of these 32 bytes. */
export function ed25519Line(key: Uint8Array, comment: string): string {
  const type = Buffer.from('ssh-ed25519');
  const blob = Buffer.alloc(4 + type.length + 4 + 32);
  blob.writeUInt32BE(type.length, 0);
  type.copy(blob, 4);
  blob.writeUInt32BE(32, 4 + type.length);
  Buffer.from(key).copy(blob, 8 + type.length);
  return `ssh-ed25519 ${blob.toString('base64')}${comment ? ` ${comment}` : ''}`;
}

const sshKeyLine: Arb<string> = fc
  .tuple(fc.uint8Array({ minLength: 32, maxLength: 32 }), fc.string({ unit: 'grapheme-ascii', maxLength: 20 }))
  .map(([k, c]) => ed25519Line(k, c.trim()));

const dateOnly = fc
  .date({ min: new Date('2025-12-01T00:00:00Z'), max: new Date('2026-04-01T00:00:00Z'), noInvalidDate: true })
  .map((d) => d.toISOString().slice(0, 10));

/** Swaps in real ids and values that get past the handlers' own checks, most of the time. */
export function makeOverride(op: Operation): Override {
  const fromSchema = (s: Schema, ctx: Ctx) => validArb(s, ctx, () => undefined);
  return (s, ctx) => {
    const name = ctx.path[ctx.path.length - 1] ?? '';
    const top = ctx.path.length === 1;
    if (ctx.where === 'path') {
      switch (name) {
        case 'vm_id':
          return fc.oneof(
            { weight: 6, arbitrary: ref('vm') },
            { weight: 1, arbitrary: ref('vm', 'vmid').map((r) => r) },
            { weight: 1, arbitrary: fc.uuid() },
            { weight: 1, arbitrary: fromSchema(s, ctx) },
          );
        case 'key_id':
          return mix(
            ref(op.path.startsWith('/api-keys') ? 'apikey' : 'sshkey'),
            5,
            fc.oneof(fc.uuid(), fromSchema(s, ctx)),
          );
        case 'user_id':
          return mix(ref('user'), 5, fromSchema(s, ctx));
        case 'node':
          return mix(ref('node', 'node'), 5, fromSchema(s, ctx));
        case 'gpu_type':
          return mix(fc.constantFrom('5090', '4090', 'pro6000'), 5, fromSchema(s, ctx));
        case 'reservation_id':
          return mix(ref('reservation'), 5, fc.oneof(fc.uuid(), fromSchema(s, ctx)));
      }
      return undefined;
    }
    if (ctx.where === 'query' && top) {
      switch (name) {
        case 'user_id':
          return mix(ref('user'), 3, fromSchema(s, ctx));
        case 'node':
          return mix(ref('node', 'node'), 3, fromSchema(s, ctx));
        case 'email':
          return mix(
            fc.oneof(ref('user', 'email'), fc.constantFrom('fuzz', '@example.com', 'FUZZ-USER', '%', '_')),
            3,
            fromSchema(s, ctx),
          );
        case 'start_date':
        case 'end_date':
          return mix(dateOnly, 4, fromSchema(s, ctx));
      }
      return undefined;
    }
    if (ctx.where !== 'body' || !top) return undefined;
    switch (name) {
      case 'node':
        return mix(ref('node', 'node'), 4, fromSchema(s, ctx));
      case 'ssh_key_id':
        return mix(ref('sshkey'), 4, fromSchema(s, ctx));
      case 'vm_id':
        return mix(ref('vm'), 4, fromSchema(s, ctx));
      case 'refresh_token':
        return mix(ref('refresh', 'token'), 4, fromSchema(s, ctx));
      case 'ssh_public_key':
        return mix(sshKeyLine, 5, fromSchema(s, ctx));
      case 'storage_gb':
        return mix(fc.integer({ min: 50, max: 500 }), 4, fromSchema(s, ctx));
      case 'seconds':
        // The clock moves a little at a time, so that sessions and balances survive the run.
        return op.path === '/admin/clock/advance' ? fc.integer({ min: 1, max: 600 }) : undefined;
      case 'count':
        return op.path === '/admin/simulator/faults' ? fc.integer({ min: 0, max: 2 }) : undefined;
      case 'amount':
        return fc.oneof(
          { weight: 4, arbitrary: fc.integer({ min: 1, max: 1000 }) },
          { weight: 1, arbitrary: fc.integer({ min: -20, max: -1 }) },
          { weight: 1, arbitrary: fc.integer({ min: 1, max: 100000 }).map((c) => c / 100) },
          { weight: 1, arbitrary: fromSchema(s, ctx) },
        );
      case 'expires_at':
        return fc.oneof({ weight: 4, arbitrary: dateTimeArb }, { weight: 1, arbitrary: fc.constant(null) });
      case 'rental_type':
        return fc.oneof(
          { weight: 3, arbitrary: fc.constant('on_demand') },
          { weight: 2, arbitrary: fc.constant('interruptible') },
          { weight: 1, arbitrary: fc.constant('reserved') },
        );
      case 'email':
        return op.path === '/auth/register' ? mix(emailArb(254), 4, fromSchema(s, ctx)) : undefined;
      case 'instance_label':
      case 'label':
      case 'name':
        // The handlers take printable ASCII only (422 otherwise): mostly that, to get further.
        return mix(
          fc
            .oneof(
              fc.constant(null),
              fc
                .string({ unit: 'grapheme-ascii', minLength: 1, maxLength: 32 })
                .filter((x) => x.trim() === x && x.length > 0),
            )
            .filter((x) => x !== null || acceptsNull(s)),
          3,
          fromSchema(s, ctx),
        );
      case 'agent_url':
        // A port nothing listens on: the agent probe fails at once.
        return mix(fc.constantFrom('http://127.0.0.1:1', 'https://127.0.0.1:1/agent'), 3, fromSchema(s, ctx));
    }
    return undefined;
  };
}

function acceptsNull(s: Schema): boolean {
  const branches = [...(Array.isArray(s.anyOf) ? s.anyOf : []), ...(Array.isArray(s.oneOf) ? s.oneOf : [])] as Schema[];
  return (
    s.type === 'null' || (Array.isArray(s.type) && s.type.includes('null')) || branches.some((b) => b.type === 'null')
  );
}

/** Operation-wide touches on a valid body: linked node + GPU type, known logins. */
export function shapeValidBody(op: Operation, body: Arb<unknown>): Arb<unknown> {
  if (op.id === 'POST /admin/nodes' || op.id === 'PATCH /admin/nodes/{node}') {
    // Mostly simulated nodes: an agent_url sends the node's VMs to an agent that is not there.
    return fc.tuple(body, fc.nat({ max: 9 })).map(([b, roll]) => {
      if (!isPlainObject(b) || roll >= 8) return b;
      const out = { ...b };
      delete out.agent_url;
      delete out.agent_token;
      return Object.keys(out).length ? out : { status: 'active' };
    });
  }
  if (op.id === 'POST /vms') {
    return fc
      .tuple(body, fc.nat({ max: 9999 }), fc.nat({ max: 9 }), fc.constantFrom(1, 3, 6))
      .map(([b, i, roll, months]) => {
        if (!isPlainObject(b) || roll >= 8) return b;
        const out: Record<string, unknown> = {
          ...b,
          node: new Ref('node', i, 'node'),
          gpu_type: new Ref('node', i, 'gpu_type'),
        };
        if (roll < 7) {
          // The rules across fields: months only for reserved, a password only with auth_method password.
          if (out.rental_type === 'reserved') out.reservation_months = months;
          else delete out.reservation_months;
          if (out.auth_method === 'password') {
            delete out.ssh_key_id;
            if (out.password === undefined) out.password = 'fuzz-vm-password-1';
          } else {
            delete out.password;
          }
        }
        return out;
      });
  }
  if (op.id === 'POST /auth/login') {
    return fc
      .tuple(body, fc.nat({ max: 9999 }), fc.nat({ max: 3 }))
      .map(([b, i, roll]) =>
        roll < 3 ? { email: new Ref('credential', i, 'email'), password: new Ref('credential', i, 'password') } : b,
      );
  }
  return body;
}
