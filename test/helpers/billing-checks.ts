/**
 * The SQL behind "each period of a VM is charged exactly once", shared by the
 * tests that prove it under random operations and under crashes: the rows it
 * returns are the usage periods that break it (a gap, an overlap, a period
 * before the first start, after the destroy, or of a VM that failed).
 * `$1`, when `forUsers` is set, is the array of user ids to look at.
 */
export function usageGapsSql(forUsers: boolean): string {
  return `SELECT l.vm_id, l.period_start, l.prev_end, l.period_end, v.first_started_at, v.destroyed_at, v.status
            FROM (SELECT vm_id, period_start, period_end, LAG(period_end) OVER (PARTITION BY vm_id ORDER BY period_start) AS prev_end
                    FROM usage_logs${forUsers ? ' WHERE user_id = ANY($1)' : ''}) l
            JOIN vms v ON v.id = l.vm_id
           WHERE l.period_end <= l.period_start
              OR (l.prev_end IS NULL AND (v.first_started_at IS NULL OR l.period_start <> v.first_started_at))
              OR (l.prev_end IS NOT NULL AND l.period_start <> l.prev_end)
              OR (v.destroyed_at IS NOT NULL AND l.period_end > v.destroyed_at)
              OR v.status = 'failed'`;
}
