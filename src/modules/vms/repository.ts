/** The only SQL of VMs and interruption records. */
import type { Db, Queryable } from '../../db/db.js';
import type { Row } from '../../db/rows.js';
import type { VmStatus } from './lifecycle.js';

export type VmRow = Omit<Row<'vms'>, 'network_bytes_total' | 'offline_from' | 'gpu_devices'> & {
  offline_from: VmStatus | null;
  gpu_devices: string[] | null;
};

export type InterruptionRow = Omit<Row<'interruptions'>, 'seq'>;

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
type ListedTimestamp = 'created_at' | 'started_at' | 'stopped_at' | 'destroyed_at';
type Listed = (typeof LISTED_COLUMNS)[number];
/** Every listed column that holds a timestamp is a ListedTimestamp (this fails to compile otherwise). */
type TimestampsMissing = Exclude<
  { [K in Listed]: Extract<ListedVmRow[K], Date> extends never ? never : K }[Listed],
  ListedTimestamp
>;
const everyTimestampListed: [TimestampsMissing] extends [never] ? true : TimestampsMissing = true;
void everyTimestampListed;
type ListedVmJson = Omit<ListedVmRow, ListedTimestamp> & {
  [K in ListedTimestamp]: ListedVmRow[K] extends Date ? string : string | null;
};

function fromJson(v: ListedVmJson): ListedVmRow {
  return {
    ...v,
    created_at: new Date(v.created_at),
    started_at: v.started_at === null ? null : new Date(v.started_at),
    stopped_at: v.stopped_at === null ? null : new Date(v.stopped_at),
    destroyed_at: v.destroyed_at === null ? null : new Date(v.destroyed_at),
  };
}

export type NewVm = Pick<
  VmRow,
  | 'id'
  | 'user_id'
  | 'node'
  | 'instance_label'
  | 'http_ports'
  | 'gpu_type'
  | 'gpu_count'
  | 'storage_gb'
  | 'ram_gb'
  | 'cpu_cores'
  | 'cpu_model'
  | 'pcie_gen'
  | 'template_vmid'
  | 'status'
  | 'holds_gpus'
  | 'rental_type'
  | 'reservation_id'
  | 'auto_restart'
  | 'gpu_hourly_rate_micros'
  | 'storage_hourly_rate_micros'
  | 'auth_method'
  | 'ssh_key_id'
  | 'ssh_public_key'
  | 'provision_secret'
  | 'created_at'
  | 'next_action_at'
  | 'hv_action'
  | 'image_id'
>;

export async function insertVm(q: Queryable, v: NewVm): Promise<VmRow> {
  const cols = Object.keys(v) as (keyof NewVm)[];
  const r = await q.query<VmRow>(
    `INSERT INTO vms (${cols.join(', ')}) VALUES (${cols.map((_, i) => `$${i + 1}`).join(', ')}) RETURNING *`,
    cols.map((c) => v[c]),
  );
  return r.rows[0]!;
}

/** The WHERE of a VM named by uuid or by vmid, of `userId` (null: anyone's), and its parameters. */
function byRef(ref: { id?: string; vmid?: number }, userId: number | null): { where: string; params: unknown[] } {
  const params: unknown[] = [ref.id ?? ref.vmid];
  const where = ref.id !== undefined ? 'id = $1' : 'vmid = $1';
  if (userId === null) return { where, params };
  params.push(userId);
  return { where: `${where} AND user_id = $2`, params };
}

/** By uuid or by vmid; `userId` null for admins and jobs. */
export async function findVm(
  q: Queryable,
  ref: { id?: string; vmid?: number },
  userId: number | null,
  forUpdate = false,
): Promise<VmRow | undefined> {
  const { where, params } = byRef(ref, userId);
  return (await q.query<VmRow>(`SELECT * FROM vms WHERE ${where}${forUpdate ? ' FOR NO KEY UPDATE' : ''}`, params))
    .rows[0];
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

/** Writes the columns a transition or an action result changed. */
export async function updateVm(
  q: Queryable,
  id: string,
  patch: Partial<Omit<VmRow, 'id' | 'vmid' | 'seq'>>,
): Promise<VmRow> {
  const cols = Object.keys(patch).filter((k) => (patch as Record<string, unknown>)[k] !== undefined);
  const r = await q.query<VmRow>(
    `UPDATE vms SET ${cols.map((c, i) => `${c} = $${i + 2}`).join(', ')} WHERE id = $1 RETURNING *`,
    [
      id,
      ...cols.map((c) =>
        c === 'gpu_devices'
          ? JSON.stringify((patch as Record<string, unknown>)[c])
          : (patch as Record<string, unknown>)[c],
      ),
    ],
  );
  return r.rows[0]!;
}

/** Running VMs of a node that no action is working on (what the node's agent reports is compared with these). */
export async function idleRunningOnNode(q: Queryable, node: string): Promise<VmRow[]> {
  return (
    await q.query<VmRow>(
      `SELECT * FROM vms WHERE node = $1 AND status = 'running' AND hv_action IS NULL AND claim_token IS NULL`,
      [node],
    )
  ).rows;
}

/** Traffic counters only grow: a lower reading (a restarted counter) never lowers what was seen. */
export async function raiseTraffic(q: Queryable, id: string, bytes: number): Promise<void> {
  await q.query('UPDATE vms SET network_bytes_total = GREATEST(network_bytes_total, $2) WHERE id = $1', [id, bytes]);
}

/** The user's VMs that count toward limits and committed spend (all but destroyed and failed). */
/** A user's own VM and GPU limits (null: the default). */
export async function userLimits(
  q: Queryable,
  userId: number,
): Promise<{ max_vms: number | null; max_gpus: number | null } | undefined> {
  return (
    await q.query<Pick<Row<'users'>, 'max_vms' | 'max_gpus'>>('SELECT max_vms, max_gpus FROM users WHERE id = $1', [
      userId,
    ])
  ).rows[0];
}

/** What the account limits and the hourly commitment read of each of a user's VMs. */
export type CountedVm = Pick<
  VmRow,
  'id' | 'status' | 'rental_type' | 'holds_gpus' | 'gpu_count' | 'gpu_hourly_rate_micros' | 'storage_hourly_rate_micros'
>;

/** The user's VMs that count toward the limits: only the columns that count (a user may have many VMs). */
export async function userVmsForLimits(q: Queryable, userId: number): Promise<CountedVm[]> {
  return (
    await q.query<CountedVm>(
      `SELECT id, status, rental_type, holds_gpus, gpu_count, gpu_hourly_rate_micros, storage_hourly_rate_micros
         FROM vms WHERE user_id = $1 AND status NOT IN ('destroyed', 'failed')`,
      [userId],
    )
  ).rows;
}

/** Interruptible VMs on a node that hold GPUs an on-demand VM may take: the most recently started first. */
export async function preemptionCandidates(q: Queryable, node: string, statuses: readonly string[]): Promise<VmRow[]> {
  return (
    await q.query<VmRow>(
      `SELECT * FROM vms WHERE node = $1 AND rental_type = 'interruptible' AND holds_gpus AND status = ANY($2::text[])
        ORDER BY COALESCE(started_at, created_at) DESC, seq DESC FOR NO KEY UPDATE`,
      [node, statuses],
    )
  ).rows;
}

export async function vmsOnNode(q: Queryable, node: string, statuses: readonly string[]): Promise<VmRow[]> {
  return (
    await q.query<VmRow>(
      'SELECT * FROM vms WHERE node = $1 AND status = ANY($2::text[]) ORDER BY seq FOR NO KEY UPDATE',
      [node, statuses],
    )
  ).rows;
}

/**
 * Of the VMs a node's agent holds, those that live on another node now, run by another agent, and are
 * not moving away from this one: copies left behind by a move (docs/vms.md#start-on-another-host).
 * Two nodes one agent serves share its VMs: none of them is a leftover of the other.
 */
export async function leftCopies(q: Queryable, node: string, ids: readonly string[]): Promise<string[]> {
  if (ids.length === 0) return [];
  const r = await q.query<{ id: string }>(
    `SELECT v.id FROM vms v JOIN nodes here ON here.node = $2 JOIN nodes there ON there.node = v.node
      WHERE v.id = ANY($1::uuid[]) AND v.node <> $2 AND there.agent_url IS DISTINCT FROM here.agent_url
        AND NOT (v.status = 'moving' AND v.move_from IS NOT DISTINCT FROM $2)`,
    [ids, node],
  );
  return r.rows.map((row) => row.id);
}

/** Whether a snapshot of the VM is being taken (docs/images.md): it must not start meanwhile. */
export async function snapshotInProgress(q: Queryable, vmId: string): Promise<boolean> {
  const r = await q.query(`SELECT 1 FROM user_images WHERE source_vm_id = $1 AND state = 'creating' LIMIT 1`, [vmId]);
  return r.rows.length > 0;
}

/** Whether the VM's owner is suspended (their VMs must not come up). */
export async function ownerSuspended(q: Queryable, userId: number): Promise<boolean> {
  return (
    (await q.query<Pick<Row<'users'>, 'suspended'>>('SELECT suspended FROM users WHERE id = $1', [userId])).rows[0]
      ?.suspended ?? false
  );
}

export async function runningVmsOfUser(q: Queryable, userId: number): Promise<VmRow[]> {
  return (
    await q.query<VmRow>(`SELECT * FROM vms WHERE user_id = $1 AND status = 'running' ORDER BY seq FOR NO KEY UPDATE`, [
      userId,
    ])
  ).rows;
}

// ---- reconciler claims ----

/**
 * Claims due hypervisor work; FOR NO KEY UPDATE SKIP LOCKED so several instances
 * never take the same VM. `now` (service time) decides what is due; the
 * lease runs on real time (`realNow`, `leaseUntil`), so a claim of a dead
 * instance expires however the service clock moves.
 */
export async function claimDue(
  q: Queryable,
  now: Date,
  realNow: Date,
  leaseUntil: Date,
  token: string,
  limit: number,
): Promise<VmRow[]> {
  return (
    await q.query<VmRow>(
      `UPDATE vms SET claim_token = $3, claimed_until = $2
        WHERE id IN (
          SELECT id FROM vms
           WHERE hv_action IS NOT NULL AND next_action_at <= $1 AND status <> 'offline'
             AND (claimed_until IS NULL OR claimed_until <= $5)
           ORDER BY next_action_at, seq
           LIMIT $4
           FOR NO KEY UPDATE SKIP LOCKED)
        RETURNING *`,
      [now, leaseUntil, token, limit, realNow],
    )
  ).rows;
}

/** The VM again, locked, if this claim still holds it. */
export async function reclaim(q: Queryable, id: string, token: string): Promise<VmRow | undefined> {
  return (await q.query<VmRow>('SELECT * FROM vms WHERE id = $1 AND claim_token = $2 FOR NO KEY UPDATE', [id, token]))
    .rows[0];
}

/** Interrupted VMs waiting to restart by themselves, oldest interruption first (never a suspended user's). */
export async function autoRestartCandidates(q: Queryable, limit: number): Promise<VmRow[]> {
  return (
    await q.query<VmRow>(
      `SELECT v.* FROM vms v
         JOIN nodes n ON n.node = v.node AND n.status = 'active'
         JOIN users u ON u.id = v.user_id AND NOT u.suspended
        WHERE v.status = 'interrupted' AND v.auto_restart
          AND NOT EXISTS (SELECT 1 FROM user_images i WHERE i.source_vm_id = v.id AND i.state = 'creating')
        ORDER BY v.stopped_at NULLS FIRST, v.seq LIMIT $1`,
      [limit],
    )
  ).rows;
}

// ---- interruptions ----

export async function insertInterruption(
  q: Queryable,
  i: Omit<InterruptionRow, 'restored_at' | 'downtime_seconds' | 'status'>,
): Promise<void> {
  await q.query(
    `INSERT INTO interruptions (id, interruptible_vm_id, preempted_by_vm_id, preempted_at, status) VALUES ($1, $2, $3, $4, 'interrupted')`,
    [i.id, i.interruptible_vm_id, i.preempted_by_vm_id, i.preempted_at],
  );
}

export async function closeInterruptions(
  q: Queryable,
  vmId: string,
  status: 'restored' | 'abandoned',
  now: Date,
): Promise<void> {
  await q.query(
    `UPDATE interruptions
        SET status = $2,
            restored_at = CASE WHEN $2 = 'restored' THEN $3::timestamptz ELSE NULL END,
            downtime_seconds = CASE WHEN $2 = 'restored' THEN floor(extract(epoch FROM ($3::timestamptz - preempted_at)))::int8 ELSE NULL END
      WHERE interruptible_vm_id = $1 AND status = 'interrupted'`,
    [vmId, status, now],
  );
}

export async function listInterruptions(q: Queryable, vmId: string, limit: number, offset: number) {
  const rows = await q.query<InterruptionRow>(
    'SELECT * FROM interruptions WHERE interruptible_vm_id = $1 ORDER BY seq DESC LIMIT $2 OFFSET $3',
    [vmId, limit, offset],
  );
  const total = await q.query<{ n: number }>(
    'SELECT count(*)::int8 AS n FROM interruptions WHERE interruptible_vm_id = $1',
    [vmId],
  );
  return { rows: rows.rows, total: total.rows[0]!.n };
}

/** When the earliest pending hypervisor action is due (VMs of offline nodes wait for their node), or null. */
export async function nextActionAt(q: Queryable): Promise<Date | null> {
  const r = await q.query<{ at: Date | null }>(
    `SELECT min(next_action_at) AS at FROM vms WHERE hv_action IS NOT NULL AND status <> 'offline'`,
  );
  return r.rows[0]!.at;
}
