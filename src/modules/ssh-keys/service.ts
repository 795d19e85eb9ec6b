/**
 * SSH keys (docs/authentication.md#ssh-keys): parsed and fingerprinted like ssh-keygen, five per
 * account, the same key never twice. Only metadata leaves this module
 * through the API; VMs copy the public key when they are created, so deleting
 * a key does not touch existing VMs.
 */
import type { Db, Queryable } from '../../db/db.js';
import type { Clock } from '../../clock.js';
import { AppError, notFound, validation } from '../../errors.js';
import { newId } from '../../ids.js';
import { parseSshPublicKey, SshKeyParseError } from './fingerprint.js';
import * as repo from './repository.js';
import { recordEvent } from '../events/service.js';
import type { SshKeyRow } from './repository.js';
import type { SshKeyRecord } from './schemas.js';

export const MAX_SSH_KEYS = 5;
export const MAX_LABEL_LENGTH = 64;

const toRecord = (k: SshKeyRow): SshKeyRecord => ({
  id: k.id,
  label: k.label,
  key_type: k.key_type,
  fingerprint: k.fingerprint,
  created_at: k.created_at.toISOString(),
});

/** The key's comment as a label: at most MAX_LABEL_LENGTH characters, never cutting a character in two. */
function commentLabel(comment: string | null): string | undefined {
  const label = Array.from(comment ?? '')
    .slice(0, MAX_LABEL_LENGTH)
    .join('')
    .trim();
  return label || undefined;
}

export class SshKeyService {
  constructor(
    private readonly db: Db,
    private readonly clock: Clock,
  ) {}

  async add(userId: number, input: { ssh_public_key: string; label?: string | null }): Promise<SshKeyRecord> {
    let parsed;
    try {
      parsed = parseSshPublicKey(input.ssh_public_key);
    } catch (err) {
      if (err instanceof SshKeyParseError) {
        throw new AppError('validation_error', `ssh_public_key: ${err.message}`, [
          { field: 'body.ssh_public_key', message: err.message },
        ]);
      }
      throw err;
    }
    // An explicit label is trimmed; one that is blank is an error, not a silent fallback.
    const explicitLabel = input.label == null ? undefined : input.label.trim();
    if (explicitLabel === '') throw validation('body.label', 'must not be blank');
    return this.db.transaction(async (tx) => {
      // Serializes concurrent uploads of one user so the count and duplicate checks hold.
      await repo.lockUser(tx, userId);
      if (await repo.findByFingerprint(tx, userId, parsed.fingerprint)) {
        throw new AppError('conflict', `This key is already on your account (${parsed.fingerprint})`);
      }
      const count = await repo.countKeys(tx, userId);
      if (count >= MAX_SSH_KEYS) {
        throw new AppError('limit_exceeded', `At most ${MAX_SSH_KEYS} SSH keys per account; delete one first`);
      }
      const label = explicitLabel ?? commentLabel(parsed.comment) ?? (await this.defaultLabel(tx, userId, count));
      const row = await repo.insertKey(tx, {
        id: newId(),
        user_id: userId,
        label,
        key_type: parsed.keyType,
        fingerprint: parsed.fingerprint,
        public_key: parsed.publicKey,
        created_at: this.clock.now(),
      });
      await recordEvent(tx, {
        type: 'ssh_key.created',
        userId,
        data: { ssh_key_id: row.id, label: row.label, fingerprint: row.fingerprint },
        at: row.created_at,
      });
      return toRecord(row);
    });
  }

  /** "key-N": N is the number of this key on the account, moved up past any label already taken. */
  private async defaultLabel(tx: Queryable, userId: number, count: number): Promise<string> {
    const taken = new Set(await repo.listLabels(tx, userId));
    let n = count + 1;
    while (taken.has(`key-${n}`)) n++;
    return `key-${n}`;
  }

  async list(userId: number, limit: number, offset: number): Promise<{ items: SshKeyRecord[]; total: number }> {
    const r = await repo.listKeys(this.db, userId, limit, offset);
    return { items: r.rows.map(toRecord), total: r.total };
  }

  async get(userId: number, id: string): Promise<SshKeyRecord> {
    const k = await repo.findKey(this.db, userId, id);
    if (!k) throw notFound('SSH key');
    return toRecord(k);
  }

  async remove(userId: number, id: string): Promise<void> {
    const deleted = await this.db.transaction(async (tx) => {
      const row = await repo.deleteKey(tx, userId, id);
      if (row)
        await recordEvent(tx, {
          type: 'ssh_key.deleted',
          userId,
          data: { ssh_key_id: row.id, label: row.label, fingerprint: row.fingerprint },
          at: this.clock.now(),
        });
      return row !== undefined;
    });
    if (!deleted) throw notFound('SSH key');
  }

  /** For VM creation: the public key text of the caller's key (or oldest key). */
  async publicKeyFor(q: Queryable, userId: number, id?: string): Promise<SshKeyRow | undefined> {
    return id ? repo.findKey(q, userId, id) : repo.findOldestKey(q, userId);
  }
}
