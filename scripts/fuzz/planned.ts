/**
 * The shape of a planned request: which operation, sent as which identity,
 * valid or broken in one place. Real ids are `Ref`s, looked up when sent.
 */

export const IDENTITIES = ['admin', 'user', 'other', 'key_rw', 'key_ro', 'key_billing'] as const;
export type IdentityName = (typeof IDENTITIES)[number];

export type AuthSpec =
  | { kind: 'none' }
  | { kind: 'as'; who: IdentityName }
  /** A real credential sent wrongly. */
  | {
      kind: 'tamper';
      who: IdentityName;
      how: 'lowercase-scheme' | 'append' | 'truncate' | 'double-space' | 'no-scheme' | 'basic' | 'two-tokens';
    }
  | { kind: 'raw'; header: string; note: string };

export type BodySpec =
  | { kind: 'none' }
  /**
   * JSON of `value` (Refs resolved when sent), optionally with a key written twice or invalid UTF-8 bytes in its
   * first string.
   */
  | { kind: 'json'; value: unknown; contentType: string | null; duplicateKey?: string; injectBytes?: number[] }
  | { kind: 'raw'; text: string; bytes?: number[]; contentType: string | null };

export type QuerySpec = { kind: 'params'; entries: [string, unknown][] } | { kind: 'raw'; text: string };

export interface Planned {
  seq: number;
  op: number;
  auth: AuthSpec;
  mode: 'valid' | 'invalid';
  /** What was made invalid (empty for valid requests). */
  note: string;
  path: Record<string, unknown>;
  query: QuerySpec;
  body: BodySpec;
  headers: [string, string][];
}

/** The parts of a request that the plan fills in (valid, or one of them broken). */
export interface Parts {
  path: Record<string, unknown>;
  query: QuerySpec;
  body: BodySpec;
  headers: [string, string][];
}
