/**
 * One statement on the embedded database in a single call into PGlite: Parse,
 * Bind, Describe, Execute and Sync go in as one buffer, and the answer is read
 * here. PGlite's own `query()` makes five calls for the same statement (one a
 * message, after a sixth that asks for the parameters' types) and copies each
 * value it reads into a buffer of its own; this costs about 100 µs less a
 * statement, a sizeable part of a small request.
 *
 * Parameters are prepared by node-postgres's `prepareValue` and values are
 * parsed by its type parsers, so both databases take and give the same
 * values: the server infers a parameter's type from the statement, as it does
 * for node-postgres.
 */
import type { PGlite } from '@electric-sql/pglite';
import { protocol } from '@electric-sql/pglite';
import pgUtils from 'pg/lib/utils.js';

const { serialize } = protocol;
const TAIL = Buffer.concat([serialize.describe({ type: 'P' }), serialize.execute({}), serialize.sync()]);

/** A value's parser by type oid (node-postgres's text parsers). */
export type ParserOf = (oid: number) => (text: string) => unknown;

/** An error the database answered with: `code` is PostgreSQL's SQLSTATE, as node-postgres's errors carry it. */
export class DatabaseError extends Error {
  code?: string;
  detail?: string;
  constraint?: string;
  severity?: string;
}

const FIELDS: Record<string, 'code' | 'detail' | 'constraint' | 'severity'> = {
  C: 'code',
  D: 'detail',
  n: 'constraint',
  V: 'severity',
};

/**
 * A statement prepared by name in PGlite's one session: parsed and planned once, then only bound and executed.
 * `parsed` turns true once PGlite has answered its Parse (docs/configuration.md#prepared-statements).
 */
export interface Prepared {
  readonly name: string;
  parsed: boolean;
}

/** Runs one statement (named if `prepared` is given); the caller holds PGlite's query lock. */
export function runStatement(
  pglite: PGlite,
  sql: string,
  params: readonly unknown[],
  parserOf: ParserOf,
  prepared?: Prepared,
): { rows: Record<string, unknown>[]; rowCount: number } {
  const values = params.map((v) => pgUtils.prepareValue(v) ?? null);
  const bind = serialize.bind({ values, statement: prepared?.name ?? '' });
  const out = pglite.execProtocolRawSync(
    prepared?.parsed
      ? Buffer.concat([bind, TAIL])
      : Buffer.concat([serialize.parse({ text: sql, name: prepared?.name ?? '' }), bind, TAIL]),
  );
  const buf = Buffer.from(out.buffer, out.byteOffset, out.byteLength);
  // Once the Parse worked the name exists, whatever the Execute then did.
  if (prepared && !prepared.parsed) prepared.parsed = parseCompleted(buf);
  return readAnswer(buf, parserOf);
}

/** Whether the answer holds a ParseComplete: it comes before any row, and an error ends the answer before it. */
function parseCompleted(buf: Buffer): boolean {
  for (let at = 0; at + 5 <= buf.length; at += 1 + buf.readUInt32BE(at + 1)) {
    const type = buf[at]!;
    if (type === 0x31) return true;
    if (type === 0x45 || type === 0x44) return false;
  }
  return false;
}

/** Reads the backend messages of one statement's answer: its rows, the count its command tag gives, or its error. */
export function readAnswer(buf: Buffer, parserOf: ParserOf): { rows: Record<string, unknown>[]; rowCount: number } {
  const rows: Record<string, unknown>[] = [];
  let names: string[] = [];
  let parsers: ((text: string) => unknown)[] = [];
  let rowCount = 0;
  let error: DatabaseError | undefined;
  let at = 0;
  while (at + 5 <= buf.length) {
    const type = buf[at]!;
    const end = at + 1 + buf.readUInt32BE(at + 1);
    let p = at + 5;
    if (type === 0x44) {
      // DataRow: a count, then each value's length (-1: NULL) and text.
      const n = buf.readUInt16BE(p);
      p += 2;
      const row: Record<string, unknown> = {};
      for (let i = 0; i < n; i++) {
        const len = buf.readInt32BE(p);
        p += 4;
        if (len < 0) row[names[i]!] = null;
        else {
          row[names[i]!] = parsers[i]!(buf.toString('utf8', p, p + len));
          p += len;
        }
      }
      rows.push(row);
    } else if (type === 0x54) {
      // RowDescription: each column's name, table, attribute, type oid, size, modifier and format.
      const n = buf.readUInt16BE(p);
      p += 2;
      names = [];
      parsers = [];
      for (let i = 0; i < n; i++) {
        const zero = buf.indexOf(0, p);
        names.push(buf.toString('utf8', p, zero));
        parsers.push(parserOf(buf.readUInt32BE(zero + 7)));
        p = zero + 19;
      }
    } else if (type === 0x43) {
      // CommandComplete: "SELECT 5", "INSERT 0 1", "UPDATE 3"... the count is the last word.
      const tag = buf.toString('utf8', p, end - 1);
      const count = /\s(\d+)$/.exec(tag);
      rowCount = count ? Number(count[1]) : 0;
    } else if (type === 0x45) {
      // ErrorResponse: fields of a one-letter name and a text, until a zero.
      const fields: Record<string, string> = {};
      while (buf[p] !== 0 && p < end) {
        const zero = buf.indexOf(0, p + 1);
        fields[String.fromCharCode(buf[p]!)] = buf.toString('utf8', p + 1, zero);
        p = zero + 1;
      }
      error = new DatabaseError(fields.M ?? 'database error');
      for (const [k, name] of Object.entries(FIELDS)) if (fields[k] !== undefined) error[name] = fields[k];
    }
    // Anything else (ParseComplete, BindComplete, NoData, notices, ReadyForQuery) says nothing we keep.
    at = end;
  }
  if (error) throw error;
  return { rows, rowCount };
}
