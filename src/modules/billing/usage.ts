/** Usage reports and current spend (docs/billing.md#usage-and-current-spend), read from usage logs and VM rates. */
import type { Db } from '../../db/db.js';
import type { Clock } from '../../clock.js';
import { validation } from '../../errors.js';
import { storageCost, toAmount } from '../../money.js';
import * as repo from './repository.js';

const DAY_MS = 86_400_000;

/** 'YYYY-MM-DD' -> UTC midnight in ms, or null when it is not a real calendar date. */
export function parseDate(s: string): number | null {
  const m = /^(\d{4})-(\d{2})-(\d{2})$/.exec(s);
  if (!m) return null;
  const ms = Date.UTC(Number(m[1]), Number(m[2]) - 1, Number(m[3]));
  return new Date(ms).toISOString().slice(0, 10) === s ? ms : null;
}

const day = (ms: number) => new Date(ms).toISOString().slice(0, 10);

export class UsageService {
  constructor(
    private readonly db: Db,
    private readonly clock: Clock,
    /** Customer images' storage per GB-hour (docs/images.md#billing). */
    private readonly imagePriceGbHourMicros = 0,
  ) {}

  /** start_date and end_date inclusive (UTC days); default the last 30 days. */
  async report(userId: number, q: { start_date?: string; end_date?: string }) {
    const today = Math.floor(this.clock.nowMs() / DAY_MS) * DAY_MS;
    const end = q.end_date === undefined ? today : parseDate(q.end_date);
    if (end === null) throw validation('query.end_date', 'must be a date YYYY-MM-DD');
    const start = q.start_date === undefined ? end - 29 * DAY_MS : parseDate(q.start_date);
    if (start === null) throw validation('query.start_date', 'must be a date YYYY-MM-DD');
    if (start > end) throw validation('query.start_date', 'must not be after end_date');
    const rows = await repo.usageLogsOfUser(this.db, userId, new Date(start), new Date(end + DAY_MS));
    const imageRows = await repo.imageUsageLogsOfUser(this.db, userId, new Date(start), new Date(end + DAY_MS));
    let totalCost = imageRows.reduce((sum, r) => sum + r.cost_micros, 0);
    let totalMs = 0;
    const byVm = new Map<string, { vm_id: string; vmid: number; gpu_model: string; ms: number; cost: number }>();
    for (const r of rows) {
      totalCost += r.total_cost_micros;
      totalMs += r.gpu_ms;
      const b = byVm.get(r.vm_id) ?? { vm_id: r.vm_id, vmid: r.vmid, gpu_model: r.gpu_type, ms: 0, cost: 0 };
      b.ms += r.gpu_ms;
      b.cost += r.total_cost_micros;
      byVm.set(r.vm_id, b);
    }
    return {
      logs: rows.map((r) => ({
        id: r.id,
        vm_id: r.vm_id,
        timestamp: r.period_end.toISOString(),
        gpu_seconds: (r.gpu_ms * r.gpu_count) / 1000,
        storage_gb: r.storage_gb,
        network_bytes: r.network_bytes,
        gpu_cost: toAmount(r.gpu_cost_micros),
        storage_cost: toAmount(r.storage_cost_micros),
        network_cost: toAmount(r.network_cost_micros),
        total_cost: toAmount(r.total_cost_micros),
      })),
      image_logs: imageRows.map((r) => ({
        id: r.id,
        image_id: r.image_id,
        name: r.name,
        timestamp: r.period_end.toISOString(),
        size_gb: r.size_bytes / 1e9,
        hours: (r.period_end.getTime() - r.period_start.getTime()) / 3_600_000,
        cost: toAmount(r.cost_micros),
      })),
      total_cost: toAmount(totalCost),
      total_hours: Math.round((totalMs / 3_600_000) * 1e6) / 1e6,
      period_start: day(start),
      period_end: day(end),
      vm_breakdown: [...byVm.values()].map((b) => ({
        vm_id: b.vm_id,
        vmid: b.vmid,
        gpu_model: b.gpu_model,
        hours: Math.round((b.ms / 3_600_000) * 1e6) / 1e6,
        cost: toAmount(b.cost),
      })),
    };
  }

  /** What accrues now: running VMs' full rate, the storage rate of every other VM that has run and is not destroyed. */
  async currentSpend(userId: number) {
    const vms = await repo.accruingVmsOfUser(this.db, userId);
    let total = 0;
    const list = vms.map((v) => {
      const gpu = v.status === 'running' ? v.gpu_hourly_rate_micros : 0;
      const sum = gpu + v.storage_hourly_rate_micros;
      total += sum;
      return {
        vm_id: v.id,
        vmid: v.vmid,
        gpu_type: v.gpu_type,
        gpu_count: v.gpu_count,
        storage_gb: v.storage_gb,
        gpu_cost_per_hour: toAmount(gpu),
        storage_cost_per_hour: toAmount(v.storage_hourly_rate_micros),
        network_cost_per_hour: 0,
        total_cost_per_hour: toAmount(sum),
      };
    });
    const images = (await repo.readyImagesOfUser(this.db, userId)).map((i) => {
      const perHour = storageCost(i.size_bytes ?? 0, this.imagePriceGbHourMicros);
      total += perHour;
      return {
        image_id: i.id,
        name: i.name,
        size_gb: (i.size_bytes ?? 0) / 1e9,
        cost_per_hour: toAmount(perHour),
      };
    });
    return {
      total_per_hour: toAmount(total),
      total_per_day: toAmount(total * 24),
      total_per_month: toAmount(total * 730),
      hourly_rate: toAmount(total),
      running_vms: vms.filter((v) => v.status === 'running').length,
      vms: list,
      images,
      last_updated: this.clock.now().toISOString(),
    };
  }
}
