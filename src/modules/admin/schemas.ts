/**
 * The JSON of an account as an operator sees it: the TypeBox schema is the one definition of its
 * shape, the OpenAPI document's and AdminUserService's type alike. It is auth's user record and more.
 */
import { Type, type Static } from 'typebox';
import { DateTime, Nullable } from '../../http/schemas.js';
import { UserRecordSchema } from '../auth/schemas.js';

export const AdminUserSchema = Type.Object(
  {
    ...UserRecordSchema.properties,
    balance: Type.Number({ description: 'Credit balance in the major unit (at most 6 decimals)' }),
    suspended: Type.Boolean(),
    max_vms: Nullable(Type.Integer({ description: 'Per-user VM limit; null means the default (10)' })),
    max_gpus: Nullable(Type.Integer({ description: 'Per-user GPU limit; null means the default (16)' })),
    updated_at: DateTime(),
  },
  { description: 'A user account as an administrator sees it' },
);
export type AdminUserRecord = Static<typeof AdminUserSchema>;
