/** The only SQL of the access portal: a VM as the portal needs it, and the launch tokens already used. */
import type { Queryable } from '../../db/db.js';
import type { Row } from '../../db/rows.js';

export type PortalVm = Pick<
  Row<'vms'>,
  'id' | 'vmid' | 'user_id' | 'status' | 'started_at' | 'node' | 'template_vmid' | 'http_ports'
>;

export async function vmByVmid(q: Queryable, vmid: number): Promise<PortalVm | undefined> {
  const r = await q.query<PortalVm>(
    'SELECT id, vmid, user_id, status, started_at, node, template_vmid, http_ports FROM vms WHERE vmid = $1',
    [vmid],
  );
  return r.rows[0];
}

/** Records a launch token's use; false when it was used already (by any instance). */
export async function useLaunchToken(q: Queryable, jti: string, expiresAt: Date): Promise<boolean> {
  const r = await q.query('INSERT INTO launch_token_uses (jti, expires_at) VALUES ($1, $2) ON CONFLICT DO NOTHING', [
    jti,
    expiresAt,
  ]);
  return (r.rowCount ?? 0) === 1;
}

/** Forgets the uses of tokens that have expired: those tokens no longer verify. */
export async function purgeLaunchTokenUses(q: Queryable, now: Date): Promise<number> {
  const r = await q.query('DELETE FROM launch_token_uses WHERE expires_at < $1', [now]);
  return r.rowCount ?? 0;
}
