/**
 * Which service instances are alive, as the database sees them: a request that holds something for a while (a
 * pending Idempotency-Key) names its instance, and another instance that finds it held can tell a live holder,
 * which it waits for, from a crashed one, whose hold it takes over at once (docs/errors.md#idempotency-keys).
 *
 * On PostgreSQL an instance holds a session advisory lock on a connection of its own for as long as it lives. The
 * lock goes when the connection does, which is when the process dies (or its connection is cut), so another
 * instance sees it in pg_locks or not. The embedded database belongs to one process: any instance but this one is
 * gone.
 */
import pg from 'pg';
import { randomInt } from 'node:crypto';

export interface Presence {
  /** This instance's id, as other instances check it; may change if its database connection was lost. */
  id(): Promise<string>;
  /** True only when the instance `id` is certainly not alive; false when alive or unknown. */
  gone(id: string): Promise<boolean>;
  close(): Promise<void>;
}

/** The first key of the advisory locks that mark instances alive (the second is the instance's number). */
const LOCK_SPACE = 0x67707563; // "gpuc"
const INSTANCE_ID = /^\d{1,10}$/;

/** One process on its own database: every other instance is gone. */
export class SoleProcessPresence implements Presence {
  private readonly own = String(randomInt(1, 2 ** 31));
  async id(): Promise<string> {
    return this.own;
  }
  async gone(id: string): Promise<boolean> {
    return INSTANCE_ID.test(id) && id !== this.own;
  }
  async close(): Promise<void> {}
}

/** Presence through an advisory lock held on a connection of its own, opened when first needed. */
export class AdvisoryLockPresence implements Presence {
  private current: Promise<{ id: string; client: pg.Client }> | undefined;
  private closed = false;

  /**
   * `connect` opens the connection the lock is held on; `query` runs a statement on any other connection
   * (the pool's).
   */
  constructor(
    private readonly connect: () => pg.Client,
    private readonly query: (sql: string, params: unknown[]) => Promise<{ rows: { alive: boolean }[] }>,
  ) {}

  id(): Promise<string> {
    if (this.closed) return Promise.reject(new Error('the database is closed'));
    if (!this.current) {
      // Forgotten when it fails or its connection goes, unless a newer one has taken its place already.
      const forget = () => {
        if (this.current === attempt) this.current = undefined;
      };
      const attempt = this.lock(forget).catch((err: unknown) => {
        forget();
        throw err;
      });
      this.current = attempt;
    }
    return this.current.then((c) => c.id);
  }

  /** Connects and takes a lock under a number no live instance holds; `lost` runs if the connection goes. */
  private async lock(lost: () => void): Promise<{ id: string; client: pg.Client }> {
    const client = this.connect();
    // The connection gone, the lock is gone: the next id() takes a new one under another number.
    client.on('error', lost);
    client.on('end', lost);
    await client.connect();
    try {
      for (;;) {
        const n = randomInt(1, 2 ** 31);
        const r = await client.query<{ ok: boolean }>('SELECT pg_try_advisory_lock($1, $2) AS ok', [LOCK_SPACE, n]);
        if (r.rows[0]?.ok) return { id: String(n), client };
      }
    } catch (err) {
      await client.end().catch(() => {});
      throw err;
    }
  }

  async gone(id: string): Promise<boolean> {
    if (!INSTANCE_ID.test(id) || Number(id) >= 2 ** 31) return false;
    const r = await this.query(
      `SELECT EXISTS (
         SELECT 1 FROM pg_locks
          WHERE locktype = 'advisory' AND granted AND objsubid = 2
            AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
            AND classid = $1::int8::oid AND objid = $2::int8::oid
       ) AS alive`,
      [LOCK_SPACE, Number(id)],
    );
    return r.rows[0]?.alive === false;
  }

  async close(): Promise<void> {
    this.closed = true;
    const current = this.current;
    this.current = undefined;
    if (current) await current.then((c) => c.client.end()).catch(() => {});
  }
}
