/** The one query of the driver registry: which driver a node names. */
import type { Queryable } from '../db/db.js';

/**
 * The driver a node names, or, when it names none, `agent` for a node with a host agent (its URL and
 * token) and `simulator` for any other, or a node that does not exist (the rule is node_driver() in
 * the migrations).
 */
export async function driverNameOf(q: Queryable, node: string): Promise<string> {
  const r = await q.query<{ driver: string }>('SELECT node_driver(n) AS driver FROM nodes n WHERE n.node = $1', [node]);
  return r.rows[0]?.driver ?? 'simulator';
}
