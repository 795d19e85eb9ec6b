/**
 * What a VM's API record reads (records.ts): one VM's, a page of a list's, and a page as ids and row
 * versions (docs/architecture.md#lists-of-vms). The rest of the VMs' SQL is repository.ts.
 */
import type { Db } from '../../db/db.js';
import { byRef, type VmRow } from './repository.js';
import type { VmStatus } from './lifecycle.js';

/** The columns a VM's API record is made of (records.ts), and what a list also shows the operator. */
export const LISTED_COLUMNS = [
  'id',
  'vmid',
  'user_id',
  'node',
  'instance_label',
  'gpu_type',
  'gpu_count',
  'storage_gb',
  'ram_gb',
  'cpu_cores',
  'ip_address',
  'status',
  'created_at',
  'started_at',
  'stopped_at',
  'rental_type',
  'reservation_id',
  'auto_restart',
  'gpu_hourly_rate_micros',
  'storage_hourly_rate_micros',
  'cpu_percent',
  'ram_percent',
  'cpu_model',
  'pcie_gen',
  'template_vmid',
  'destroyed_at',
  'gpu_devices',
  'last_error',
  'http_ports',
  'image_id',
] as const satisfies readonly (keyof VmRow)[];

/** A VM as a list reads it: only what its record shows (a list of wide rows spent most of its time parsing them). */
export type ListedVmRow = Pick<VmRow, (typeof LISTED_COLUMNS)[number]>;
const LISTED = LISTED_COLUMNS.join(', ');

/**
 * On the embedded database a page of VMs comes back as one JSON object per row: PGlite spends about 2 µs on
 * each value it sends, whatever its type, so 50 VMs of 28 columns took 2.3 ms as columns and 0.8 ms as 50
 * JSON values. PostgreSQL sends values cheaply and building the JSON costs it more, so it sends columns.
 * JSON carries timestamps as text, which fromJson makes Dates again; every other listed column's JSON value
 * is already the value a row holds (int8 amounts are numbers, as the row types read them).
 */
const LISTED_JSON = `json_build_object(${LISTED_COLUMNS.map((c) => `'${c}', p.${c}`).join(', ')})`;
type Listed = (typeof LISTED_COLUMNS)[number];
/** The listed columns that hold a timestamp, as the row types say. */
type ListedTimestamp = { [K in Listed]: Extract<ListedVmRow[K], Date> extends never ? never : K }[Listed];
type ListedVmJson = Omit<ListedVmRow, ListedTimestamp> & {
  [K in ListedTimestamp]: ListedVmRow[K] extends Date ? string : string | null;
};

/** The row a JSON object is: every timestamp a Date again (a timestamp left out here fails to compile). */
function fromJson(v: ListedVmJson): ListedVmRow {
  return {
    ...v,
    created_at: new Date(v.created_at),
    started_at: v.started_at === null ? null : new Date(v.started_at),
    stopped_at: v.stopped_at === null ? null : new Date(v.stopped_at),
    destroyed_at: v.destroyed_at === null ? null : new Date(v.destroyed_at),
  };
}

/** Rows of `sql`, a query of vms that selects the listed columns (as JSON objects on the embedded database). */
async function readListed(db: Pick<Db, 'kind' | 'query'>, sql: string, params: unknown[]): Promise<ListedVmRow[]> {
  if (db.kind === 'pglite') {
    return (await db.query<{ v: ListedVmJson }>(`SELECT ${LISTED_JSON} AS v FROM (${sql}) p`, params)).rows.map((x) =>
      fromJson(x.v),
    );
  }
  return (await db.query<ListedVmRow>(sql, params)).rows;
}

/** Rows of `sql`, which selects the listed columns and then `total`, and the total the first row carries. */
async function readCountedPage(
  db: Pick<Db, 'kind' | 'query'>,
  sql: string,
  params: unknown[],
): Promise<{ rows: ListedVmRow[]; total: number | undefined }> {
  if (db.kind === 'pglite') {
    const r = await db.query<{ v: ListedVmJson; total: number }>(
      `SELECT ${LISTED_JSON} AS v, total FROM (${sql}) p`,
      params,
    );
    return { rows: r.rows.map((x) => fromJson(x.v)), total: r.rows[0]?.total };
  }
  const r = await db.query<ListedVmRow & { total: number }>(sql, params);
  return { rows: r.rows.map(({ total: _, ...v }) => v), total: r.rows[0]?.total };
}

/** What a VM's record shows, by uuid or by vmid, of `userId` (null: anyone's). */
export async function findListedVm(
  db: Pick<Db, 'kind' | 'query'>,
  ref: { id?: string; vmid?: number },
  userId: number | null,
): Promise<ListedVmRow | undefined> {
  const { where, params } = byRef(ref, userId);
  return (await readListed(db, `SELECT ${LISTED} FROM vms WHERE ${where}`, params))[0];
}

export interface VmFilter {
  userId?: number;
  includeDestroyed: boolean;
  status?: VmStatus;
  node?: string;
  limit: number;
  offset: number;
}

/** The WHERE of a list and its parameters. */
function listWhere(f: VmFilter): { w: string; params: unknown[] } {
  const where: string[] = [];
  const params: unknown[] = [];
  const add = (sql: string, v: unknown) => {
    params.push(v);
    where.push(sql.replace('?', `$${params.length}`));
  };
  if (f.userId !== undefined) add('user_id = ?', f.userId);
  if (f.status) add('status = ?', f.status);
  else if (!f.includeDestroyed) where.push(`status <> 'destroyed'`);
  if (f.node) add('node = ?', f.node);
  return { w: where.length ? `WHERE ${where.join(' AND ')}` : '', params };
}

/** The page's ORDER BY, LIMIT and OFFSET after a WHERE of `n` parameters, and all its parameters. */
function listPage(f: VmFilter, params: unknown[]): { page: string; pageParams: unknown[] } {
  const n = params.length;
  return { page: `ORDER BY seq DESC LIMIT $${n + 1} OFFSET $${n + 2}`, pageParams: [...params, f.limit, f.offset] };
}

async function countListed(db: Pick<Db, 'query'>, w: string, params: unknown[]): Promise<number> {
  return (await db.query<{ n: number }>(`SELECT count(*)::int8 AS n FROM vms ${w}`, params)).rows[0]!.n;
}

/**
 * The total of a user's page read with `count(*) OVER ()`: the count its rows carry. A page past the end has no
 * row to carry it, and the count is then asked for alone.
 */
async function pageTotal(
  db: Pick<Db, 'query'>,
  f: VmFilter,
  where: { w: string; params: unknown[] },
  rows: number,
  carried: number | undefined,
): Promise<number> {
  if (rows > 0 || f.offset === 0) return carried ?? 0;
  return countListed(db, where.w, where.params);
}

export async function listVms(
  db: Pick<Db, 'kind' | 'query'>,
  f: VmFilter,
): Promise<{ rows: ListedVmRow[]; total: number }> {
  const where = listWhere(f);
  const { w, params } = where;
  const { page, pageParams } = listPage(f, params);
  if (f.userId !== undefined) {
    // One user's VMs are few: the page and their count come in one query (one round trip, one connection).
    const sql = `SELECT ${LISTED}, count(*) OVER ()::int8 AS total FROM vms ${w} ${page}`;
    const { rows, total } = await readCountedPage(db, sql, pageParams);
    return { rows, total: await pageTotal(db, f, where, rows.length, total) };
  }
  // The whole fleet (an operator's list): the page and the count at once (on a pool, two connections;
  // the embedded database runs them in turn), so the page stops at its last row.
  const [rows, total] = await Promise.all([
    readListed(db, `SELECT ${LISTED} FROM vms ${w} ${page}`, pageParams),
    countListed(db, w, params),
  ]);
  return { rows, total };
}

/**
 * A VM row's version: its `xmin`, the transaction that wrote the row as it now stands. Every write of a row
 * (an UPDATE, even of one column to the value it had) makes a new row with the writing transaction's id, so
 * two reads of a row that give the same version gave the same values. Transaction ids are 32 bits and come
 * round after about four billion transactions; a row would have to be written again by exactly the
 * transaction whose id is the one it was last written by, four billion transactions later, to look unchanged.
 */
const VERSION = 'xmin::text';

export interface VmVersion {
  id: string;
  version: string;
}

/**
 * A user's page of VMs as ids and row versions, newest first, and the number of VMs the filter matches. The
 * embedded database sends the page as one text value (`id version,id version,...`): it spends about as much
 * on each value it sends as on the query, and a page of 50 is 150 values as columns.
 */
export async function listVmVersions(
  db: Pick<Db, 'kind' | 'query'>,
  f: VmFilter & { userId: number },
): Promise<{ refs: VmVersion[]; total: number }> {
  const where = listWhere(f);
  const { w, params } = where;
  const { page, pageParams } = listPage(f, params);
  const sql = (cols: string) =>
    `SELECT ${cols}, ${VERSION} AS version, count(*) OVER ()::int8 AS total FROM vms ${w} ${page}`;
  let refs: VmVersion[];
  let total: number | undefined;
  if (db.kind === 'pglite') {
    const r = await db.query<{ refs: string | null; total: number | null }>(
      `SELECT string_agg(id::text || ' ' || version, ',' ORDER BY seq DESC) AS refs, max(total) AS total FROM (${sql('id, seq')}) p`,
      pageParams,
    );
    const row = r.rows[0]!;
    refs = (row.refs?.split(',') ?? []).map((x) => {
      const space = x.indexOf(' ');
      return { id: x.slice(0, space), version: x.slice(space + 1) };
    });
    total = row.total ?? undefined;
  } else {
    const r = await db.query<VmVersion & { total: number }>(sql('id'), pageParams);
    refs = r.rows.map(({ id, version }) => ({ id, version }));
    total = r.rows[0]?.total;
  }
  return { refs, total: await pageTotal(db, f, where, refs.length, total) };
}

/** What the records of these VMs show, each with its row version, in no particular order. */
export async function listedVmsByIds(
  db: Pick<Db, 'kind' | 'query'>,
  ids: readonly string[],
): Promise<(ListedVmRow & { version: string })[]> {
  const sql = `SELECT ${LISTED}, ${VERSION} AS version FROM vms WHERE id = ANY($1::uuid[])`;
  if (db.kind === 'pglite') {
    return (
      await db.query<{ v: ListedVmJson; version: string }>(`SELECT ${LISTED_JSON} AS v, version FROM (${sql}) p`, [ids])
    ).rows.map((x) => ({ ...fromJson(x.v), version: x.version }));
  }
  return (await db.query<ListedVmRow & { version: string }>(sql, [ids])).rows;
}
