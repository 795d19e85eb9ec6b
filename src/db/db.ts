/**
 * One database interface over PostgreSQL (pg) and the embedded PGlite
 * (used when DATABASE_URL is unset). Both speak the same SQL dialect and run the
 * same migrations; repositories only see Db.
 */
import pg from 'pg';
import { PGlite } from '@electric-sql/pglite';
import { existsSync, mkdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { collectAfterCommit, runBeforeCommit } from './commit-hook.js';
import { runStatement, type ParserOf, type Prepared } from './pglite-statement.js';
import { AdvisoryLockPresence, SoleProcessPresence, type Presence } from './presence.js';
import type { Queryable, QueryResult, Row } from './queryable.js';

export type { QueryResult, Queryable, Row } from './queryable.js';

/** A transaction in progress: queries, and scripts of several statements (migrations). */
export interface Transaction extends Queryable {
  exec(sql: string): Promise<void>;
}

export interface Db extends Queryable {
  readonly kind: 'pglite' | 'postgres';
  /** Runs fn in one transaction; retried on serialization failures and deadlocks. */
  transaction<T>(fn: (tx: Transaction) => Promise<T>): Promise<T>;
  /** Runs a multi-statement script (migrations). */
  exec(sql: string): Promise<void>;
  /** Which service instances are alive (this one's id, and whether another's is gone). */
  readonly presence: Presence;
  close(): Promise<void>;
}

const INT8 = 20;
const parseInt8 = (v: string) => Number(v);

/** PostgreSQL error codes we react to. */
export const PG = {
  uniqueViolation: '23505',
  foreignKeyViolation: '23503',
  serializationFailure: '40001',
  deadlock: '40P01',
  featureNotSupported: '0A000',
} as const;

export function pgErrorCode(err: unknown): string | undefined {
  return typeof err === 'object' && err !== null && 'code' in err ? String((err as { code: unknown }).code) : undefined;
}

const RETRYABLE = new Set<string>([PG.serializationFailure, PG.deadlock]);

const MAX_PREPARED = 1000;

/**
 * Statements with parameters, by text, as each runs prepared: under a name of its own, so that a connection parses
 * and plans it once and then only binds and executes it (docs/configuration.md#prepared-statements). At most
 * MAX_PREPARED texts are prepared; beyond them (SQL of a varying shape) statements run unnamed.
 */
class PreparedStatements<T> {
  private readonly byText = new Map<string, T>();
  private namesGiven = 0;

  /** `make`: what a statement is prepared as, from the name it is given. */
  constructor(private readonly make: (name: string) => T) {}

  /** What `sql` runs as; undefined: unnamed (no parameters, or past the bound). */
  for(sql: string, params: readonly unknown[]): T | undefined {
    if (params.length === 0) return undefined;
    let p = this.byText.get(sql);
    if (p === undefined && this.byText.size < MAX_PREPARED) {
      p = this.make(`gpucloud_${++this.namesGiven}`);
      this.byText.set(sql, p);
    }
    return p;
  }

  /**
   * A prepared statement whose result columns changed under it (a migration changed a table it reads with `*`):
   * the database refuses to run it. The statement gets a new name, so that it is prepared afresh, and the caller
   * runs it again.
   */
  replannedAfter(err: unknown, sql: string): boolean {
    if (pgErrorCode(err) !== PG.featureNotSupported || !/cached plan must not change result type/.test(String(err)))
      return false;
    this.byText.delete(sql);
    return true;
  }
}

/** Statement text -> its name, the same on every connection of the process. */
const prepared = new PreparedStatements((name) => name);

/** A statement as node-postgres runs it: named when it has parameters. */
function statement(sql: string, params: readonly unknown[]): pg.QueryConfig {
  if (params.length === 0) return { text: sql };
  const name = prepared.for(sql, params);
  const values = params as unknown[];
  return name === undefined ? { text: sql, values } : { name, text: sql, values };
}

export class PostgresDb implements Db {
  readonly kind = 'postgres' as const;
  /** Transactions run again after a deadlock (none while every transaction keeps the lock order). */
  deadlocksRetried = 0;
  readonly pool: pg.Pool;
  readonly presence: Presence;

  constructor(connectionString: string, opts: { searchPath?: string; max?: number } = {}) {
    // JIT compiling pays off only for long analytic queries: for this service's statements it costs more
    // than it saves (about 0.1 s compiling a close's charge statement that runs in less).
    const options = ['-c jit=off', ...(opts.searchPath ? [`-c search_path=${opts.searchPath}`] : [])].join(' ');
    this.presence = new AdvisoryLockPresence(
      () => new pg.Client({ connectionString, options }),
      (sql, params) => this.pool.query(sql, params),
    );
    this.pool = new pg.Pool({
      connectionString,
      max: opts.max ?? 10,
      options,
      types: {
        getTypeParser: ((oid: number, format?: string) =>
          oid === INT8 ? parseInt8 : pg.types.getTypeParser(oid, format as 'text')) as typeof pg.types.getTypeParser,
      },
    });
    // An idle client losing its connection must not crash the process.
    this.pool.on('error', () => {});
  }

  async query<T = Row>(sql: string, params: readonly unknown[] = []): Promise<QueryResult<T>> {
    let r: pg.QueryResult;
    try {
      r = await this.pool.query(statement(sql, params));
    } catch (err) {
      if (!prepared.replannedAfter(err, sql)) throw err;
      r = await this.pool.query(statement(sql, params));
    }
    return { rows: r.rows as T[], rowCount: r.rowCount ?? 0 };
  }

  async exec(sql: string): Promise<void> {
    await this.pool.query(sql);
  }

  async transaction<T>(fn: (tx: Transaction) => Promise<T>): Promise<T> {
    for (let attempt = 1; ; attempt++) {
      const client = await this.pool.connect();
      let replanned = false;
      try {
        await client.query('BEGIN');
        const tx: Transaction = {
          query: async <R = Row>(sql: string, params: readonly unknown[] = []) => {
            try {
              const r = await client.query(statement(sql, params));
              return { rows: r.rows as R[], rowCount: r.rowCount ?? 0 };
            } catch (err) {
              // The transaction is aborted: it runs again from the start, with the statement prepared afresh.
              if (prepared.replannedAfter(err, sql)) replanned = true;
              throw err;
            }
          },
          // Without parameters pg uses the simple query protocol, which runs several statements.
          exec: async (sql: string) => {
            await client.query(sql);
          },
        };
        const callbacks = collectAfterCommit(tx);
        const result = await fn(tx);
        const committed = await runBeforeCommit(tx, result);
        await client.query('COMMIT');
        committed();
        for (const f of callbacks) f();
        return result;
      } catch (err) {
        await client.query('ROLLBACK').catch(() => {});
        const code = pgErrorCode(err) ?? '';
        if (code === PG.deadlock) this.deadlocksRetried++;
        if (attempt < 5 && (RETRYABLE.has(code) || replanned)) continue;
        throw err;
      } finally {
        client.release();
      }
    }
  }

  async close(): Promise<void> {
    await this.presence.close();
    await this.pool.end();
  }
}

/**
 * PostgreSQL's default shared_buffers (128 MB) lives in PGlite's WebAssembly
 * heap, which never shrinks: with it an idle embedded service holds about
 * 340 MB. 16 MB holds the working set of the databases the embedded mode is
 * for (demos, one operator's small fleet; the files below it stay in the
 * kernel's page cache) at the same query speed, and the service idles near
 * 160 MB.
 */
const EMBEDDED_CONF = 'shared_buffers=16MB';

/**
 * PGlite has a single connection: its transaction() holds an exclusive lock,
 * so transactions are serialized and FOR UPDATE SKIP LOCKED claims are trivially exclusive.
 */
export class PgliteDb implements Db {
  readonly kind = 'pglite' as const;
  readonly presence: Presence = new SoleProcessPresence();
  private readonly parsers = new Map<number, (text: string) => unknown>();
  /** Values are parsed as node-postgres parses them (int8 as a number), so both databases give the same rows. */
  private readonly parserOf: ParserOf = (oid) => {
    let parse = this.parsers.get(oid);
    if (!parse) {
      parse = oid === INT8 ? parseInt8 : (pg.types.getTypeParser(oid, 'text') as (text: string) => unknown);
      this.parsers.set(oid, parse);
    }
    return parse;
  };
  /** Statement text -> its prepared statement in PGlite's one session, as on PostgreSQL. */
  private readonly prepared = new PreparedStatements<Prepared>((name) => ({ name, parsed: false }));
  private constructor(readonly pg: PGlite) {}

  private run(sql: string, params: readonly unknown[]) {
    return runStatement(this.pg, sql, params, this.parserOf, this.prepared.for(sql, params));
  }

  /** `snapshot`: a dumped data dir to start from (tests load a migrated one). */
  static async open(dataDir?: string, snapshot?: Blob): Promise<PgliteDb> {
    if (dataDir) mkdirSync(dataDir, { recursive: true });
    const options = { dataDir, loadDataDir: snapshot, postgresqlconf: EMBEDDED_CONF };
    const fresh = dataDir !== undefined && !existsSync(join(dataDir, 'PG_VERSION'));
    let db = await PGlite.create(options);
    if (fresh) {
      // Creating the cluster (initdb) grows the WebAssembly heap by hundreds of MB, and a heap never
      // shrinks: start over on the files written, so a new service idles smaller.
      await db.close();
      db = await PGlite.create({ ...options, loadDataDir: undefined });
    }
    return new PgliteDb(db);
  }

  /** One statement outside a transaction: it waits for any transaction in progress, as PGlite's query() does. */
  async query<T = Row>(sql: string, params: readonly unknown[] = []): Promise<QueryResult<T>> {
    const pglite = this.pg;
    await pglite._checkReady();
    const r = await pglite._runExclusiveTransaction(() =>
      pglite.runExclusive(async () => {
        try {
          return this.run(sql, params);
        } catch (err) {
          // A table changed shape under the prepared statement: it is prepared afresh under a new name.
          if (!this.prepared.replannedAfter(err, sql)) throw err;
          return this.run(sql, params);
        }
      }),
    );
    await pglite.syncToFs();
    return r as QueryResult<T>;
  }

  async exec(sql: string): Promise<void> {
    await this.pg.exec(sql);
  }

  async transaction<T>(fn: (tx: Transaction) => Promise<T>): Promise<T> {
    for (let attempt = 1; ; attempt++) {
      let replanned = false;
      try {
        return await this.transactionOnce(fn, () => (replanned = true));
      } catch (err) {
        // The transaction is rolled back: it runs again from the start, with the statement prepared afresh.
        if (replanned && attempt < 5) continue;
        throw err;
      }
    }
  }

  private async transactionOnce<T>(fn: (tx: Transaction) => Promise<T>, replanned: () => void): Promise<T> {
    let committed: () => void = () => {};
    let callbacks: (() => void)[] = [];
    const pglite = this.pg;
    const result = await pglite.transaction(async (t) => {
      let open = true;
      const tx: Transaction = {
        query: async <R = Row>(sql: string, params: readonly unknown[] = []) => {
          if (!open) throw new Error('the transaction is over');
          try {
            return (await pglite.runExclusive(async () => this.run(sql, params))) as QueryResult<R>;
          } catch (err) {
            if (this.prepared.replannedAfter(err, sql)) replanned();
            throw err;
          }
        },
        exec: async (sql: string) => {
          await t.exec(sql);
        },
      };
      try {
        callbacks = collectAfterCommit(tx);
        const value = await fn(tx);
        committed = await runBeforeCommit(tx, value);
        return value;
      } finally {
        open = false;
      }
    });
    committed();
    for (const f of callbacks) f();
    return result;
  }

  /**
   * The data directory as a tar archive, consistent: taken between transactions, holding the lock every
   * transaction and statement takes first (so none is open and none starts meanwhile), after a CHECKPOINT has
   * written every committed change into the data files. Other queries wait only for this section.
   */
  async dumpBetweenTransactions(): Promise<Uint8Array> {
    const pglite = this.pg;
    await pglite._checkReady();
    return pglite._runExclusiveTransaction(async () => {
      await pglite.runExclusive(async () => this.run('CHECKPOINT', []));
      const dump = await pglite.dumpDataDir('none');
      return new Uint8Array(await dump.arrayBuffer());
    });
  }

  async close(): Promise<void> {
    if (!this.pg.closed) await this.pg.close();
  }
}

/**
 * `template`: writes a new embedded data directory from a packed, migrated one and says whether it did (called only
 * when the directory is new; db/template.ts).
 */
export async function openDb(opts: {
  databaseUrl?: string;
  dataDir?: string;
  template?: (dataDir: string) => boolean;
}): Promise<Db> {
  if (opts.databaseUrl) return new PostgresDb(opts.databaseUrl);
  const { dataDir } = opts;
  if (dataDir && !existsSync(join(dataDir, 'PG_VERSION')) && opts.template?.(dataDir)) {
    try {
      return await PgliteDb.open(dataDir);
    } catch {
      // A template this PGlite cannot open: its files go, and initdb makes the directory.
      rmSync(dataDir, { recursive: true, force: true });
    }
  }
  return PgliteDb.open(dataDir);
}
