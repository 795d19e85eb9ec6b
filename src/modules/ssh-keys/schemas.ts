/**
 * The JSON of SSH keys: the TypeBox schema is the one definition of a key's shape, the OpenAPI
 * document's and SshKeyService's type alike (docs/authentication.md#ssh-keys). Only metadata.
 */
import { Type, type Static } from 'typebox';
import { DateTime } from '../../http/schemas.js';

export const SshKeySchema = Type.Object(
  {
    id: Type.String({ format: 'uuid' }),
    label: Type.String(),
    key_type: Type.String({ description: 'The key algorithm, e.g. ssh-ed25519' }),
    fingerprint: Type.String({ description: 'SHA256:<base64>, as `ssh-keygen -l -E sha256` prints it' }),
    created_at: DateTime(),
  },
  {
    description: 'An SSH public key (metadata only)',
    examples: [
      {
        id: '5c1d2e3f-4a5b-4c6d-8e7f-9a0b1c2d3e4f',
        label: 'laptop',
        key_type: 'ssh-ed25519',
        fingerprint: 'SHA256:uNiVztksCsDhcc0u9e8BujQXVUpKZIDTMczCvj3tD2s',
        created_at: '2026-11-22T10:00:00.000Z',
      },
    ],
  },
);
export type SshKeyRecord = Static<typeof SshKeySchema>;
