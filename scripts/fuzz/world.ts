/**
 * What the fuzzer knows of the server's objects: pools of real ids (filled by
 * setup and by successful calls), the run's own fixtures that destructive
 * calls must not remove, and the identities' tokens.
 */
import type { IdentityName } from './plan.js';
import type { PoolKind, Ref } from './values.js';

export const PROTECTED_SWAP_UUID = '00000000-0000-4000-8000-00000000f00d';

interface PoolEntry {
  [field: string]: unknown;
}

export class World {
  readonly pools: Record<PoolKind, PoolEntry[]> = {
    vm: [],
    sshkey: [],
    apikey: [],
    user: [],
    credential: [],
    node: [],
    reservation: [],
    refresh: [],
  };
  readonly protectedIds = {
    apikey: new Set<string>(),
    sshkey: new Set<string>(),
    user: new Set<string>(),
    node: new Set<string>(),
  };
  readonly tokens = new Map<IdentityName, string>();
  victimUser = 0;
  victimNode = '';

  add(kind: PoolKind, entry: PoolEntry): void {
    const pool = this.pools[kind];
    if (pool.length < 400) pool.push(entry);
  }

  lookup(r: Ref): unknown {
    const pool = this.pools[r.kind];
    if (!pool.length) return r.field === 'vmid' ? 999_999 : r.kind === 'user' ? 999_999 : PROTECTED_SWAP_UUID;
    return pool[r.index % pool.length]![r.field];
  }
}
