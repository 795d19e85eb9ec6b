/**
 * The credentials of connections that outlive their request (an event
 * stream). A request's credential is checked when it arrives; a connection
 * that stays open is checked again on every `check()`, and ends when its
 * credential no longer gives what it gave at the start: the key was revoked,
 * the session ended, the access token or key expired (by the service clock),
 * the account was suspended, or its role changed.
 *
 * A check is one `Recheck` for every credential watched in this process (one
 * query per kind of credential, not one per connection), read from the
 * database rather than from the one-second credential cache, so a change made
 * through any instance is seen at the next check.
 */
import type { Identified, Recheck } from './authenticate.js';
import type { Principal } from './principal.js';

/** Why a watched connection was ended (docs/events.md#following-them-live-get-eventsstream). */
export type CredentialLapse = 'credential_revoked' | 'credential_expired' | 'account_suspended' | 'role_changed';

interface Watched {
  credential: string;
  principal: Principal;
  end(why: CredentialLapse): void;
}

export class CredentialWatch {
  private readonly watched = new Set<Watched>();

  constructor(private readonly recheck: Recheck) {}

  /**
   * Watches `credential`, which named `principal` when the connection opened:
   * `end` is called once, at the check that finds it lapsed. The returned
   * function stops watching.
   */
  watch(credential: string, principal: Principal, end: (why: CredentialLapse) => void): () => void {
    const w: Watched = { credential, principal, end };
    this.watched.add(w);
    return () => this.watched.delete(w);
  }

  /** Checks every watched credential once; ends (before it returns) each connection whose credential lapsed. */
  async check(): Promise<void> {
    if (this.watched.size === 0) return;
    // Only those watched when the check started are judged by its answers.
    const checked = [...this.watched];
    const now = await this.recheck([...new Set(checked.map((w) => w.credential))]);
    for (const w of checked) {
      if (!this.watched.has(w)) continue;
      const why = lapse(w.principal, now.get(w.credential));
      if (why === null) continue;
      this.watched.delete(w);
      w.end(why);
    }
  }
}

function lapse(then: Principal, now: Identified | 'revoked' | 'expired' | undefined): CredentialLapse | null {
  if (now === undefined || now === 'revoked') return 'credential_revoked';
  if (now === 'expired') return 'credential_expired';
  if (now.userId !== then.userId) return 'credential_revoked';
  if (now.suspended) return 'account_suspended';
  // What a connection shows may depend on the role (an administrator's stream carries the nodes'
  // events): a connection opened under another role ends, and the client reconnects under the new one.
  if (now.role !== then.role) return 'role_changed';
  return null;
}
