/**
 * Billing's usage of the last 30 days: the total, a bar per UTC day, and the
 * cost by VM and by image.
 */
import type { paths } from '../../../src/sdk/index.js';
import { gbText } from './images.js';
import { Link, Money, Table, formatDuration, formatMoney, vmName } from '../ui.js';

type Usage = paths['/billing/usage']['get']['responses'][200]['content']['application/json'];

const DAY_MS = 86_400_000;

/** VM time in the usage report (the API gives hours): the total and each VM's share read the same way. */
function vmTime(hours: number): string {
  return formatDuration(hours * 3600);
}

/** YYYY-MM-DD of a UTC day, from a time in ms. */
function utcDay(ms: number): string {
  return new Date(ms).toISOString().slice(0, 10);
}

/** Every UTC day from start to end (YYYY-MM-DD, inclusive). */
function daysBetween(start: string, end: string): string[] {
  const out: string[] = [];
  const a = Date.parse(`${start}T00:00:00Z`);
  const b = Date.parse(`${end}T00:00:00Z`);
  if (Number.isNaN(a) || Number.isNaN(b)) return out;
  for (let t = a; t <= b && out.length < 400; t += DAY_MS) out.push(utcDay(t));
  return out;
}

export function UsageSection({ usage, currency }: { usage: Usage; currency: string }) {
  // Group the logs by the UTC day of their timestamp.
  const byDay = new Map<string, number>();
  for (const l of usage.logs) {
    const day = l.timestamp.slice(0, 10);
    byDay.set(day, (byDay.get(day) ?? 0) + l.total_cost);
  }
  // The images' storage, by day as the VMs' usage, and by image for the table (its cost summed in micro-units).
  const byImage = new Map<string, { name: string; size_gb: number; hours: number; micros: number }>();
  for (const l of usage.image_logs) {
    const day = l.timestamp.slice(0, 10);
    byDay.set(day, (byDay.get(day) ?? 0) + l.cost);
    const a = byImage.get(l.image_id) ?? { name: l.name, size_gb: l.size_gb, hours: 0, micros: 0 };
    byImage.set(l.image_id, { ...a, hours: a.hours + l.hours, micros: a.micros + Math.round(l.cost * 1e6) });
  }
  const days = daysBetween(usage.period_start, usage.period_end).map((d) => ({ day: d, cost: byDay.get(d) ?? 0 }));
  return (
    <>
      <p class="muted">
        {usage.period_start} to {usage.period_end} (UTC): <Money value={usage.total_cost} currency={currency} /> for{' '}
        <span data-testid="usage-total-time">{usage.total_hours > 0 ? vmTime(usage.total_hours) : 'no'}</span> of VM
        time.
      </p>
      <div class="card chart-wrap">
        <UsageChart
          days={days}
          total={usage.total_cost}
          currency={currency}
          start={usage.period_start}
          end={usage.period_end}
        />
      </div>
      {usage.vm_breakdown.length > 0 ? (
        <Table
          wrapClass="usage-vms"
          caption="By VM, over the same 30 days"
          captionClass="muted"
          head={
            <>
              <th>VM</th>
              <th>GPU</th>
              <th class="num">VM time</th>
              <th class="num">Cost</th>
            </>
          }
        >
          {usage.vm_breakdown.map((v) => (
            <tr key={v.vm_id}>
              <td>
                <Link href={`/vms/${v.vm_id}`}>{vmName(v)}</Link>
              </td>
              <td>{v.gpu_model}</td>
              <td class="num">{vmTime(v.hours)}</td>
              <td class="num">
                <Money value={v.cost} currency={currency} />
              </td>
            </tr>
          ))}
        </Table>
      ) : null}
      {byImage.size > 0 ? (
        <Table
          wrapClass="usage-images"
          caption="Image storage, over the same 30 days"
          captionClass="muted"
          head={
            <>
              <th>Image</th>
              <th class="num">Size</th>
              <th class="num">Stored</th>
              <th class="num">Cost</th>
            </>
          }
        >
          {[...byImage].map(([id, i]) => (
            <tr key={id} data-image={id}>
              <td>{i.name}</td>
              <td class="num">{gbText(i.size_gb)}</td>
              <td class="num">{vmTime(i.hours)}</td>
              <td class="num">
                <Money value={i.micros / 1e6} currency={currency} precise />
              </td>
            </tr>
          ))}
        </Table>
      ) : null}
    </>
  );
}

/** Bars per UTC day, drawn as plain SVG. */
function UsageChart(props: {
  days: { day: string; cost: number }[];
  total: number;
  currency: string;
  start: string;
  end: string;
}) {
  const { days, currency } = props;
  const slot = 24;
  const top = 16;
  const plot = 120;
  const labelH = 28;
  const width = Math.max(1, days.length) * slot;
  const height = top + plot + labelH;
  const max = Math.max(0, ...days.map((d) => d.cost));
  const summary = `Usage by day from ${props.start} to ${props.end}: ${formatMoney(props.total, currency)} in total${
    max > 0 ? `, highest day ${formatMoney(max, currency)}` : ''
  }`;
  return (
    <svg
      class="chart"
      viewBox={`0 0 ${width} ${height}`}
      role="img"
      aria-label={summary}
      preserveAspectRatio="xMidYMid meet"
    >
      <title>{summary}</title>
      <line x1={0} x2={width} y1={top + plot} y2={top + plot} class="axis" />
      {days.map((d, i) => {
        const h = max > 0 ? Math.max(d.cost > 0 ? 1 : 0, (d.cost / max) * plot) : 0;
        const x = i * slot;
        const date = new Date(`${d.day}T00:00:00Z`);
        const dom = date.getUTCDate();
        const showMonth = i === 0 || dom === 1;
        return (
          <g key={d.day}>
            <rect class="bar" x={x + 3} y={top + plot - h} width={slot - 6} height={h} rx={2}>
              <title>{`${d.day}: ${formatMoney(d.cost, currency, true)}`}</title>
            </rect>
            <text x={x + slot / 2} y={top + plot + 12} text-anchor="middle">
              {dom}
            </text>
            {showMonth ? (
              <text x={x + slot / 2} y={top + plot + 24} text-anchor="middle">
                {date.toLocaleString(undefined, { month: 'short', timeZone: 'UTC' })}
              </text>
            ) : null}
          </g>
        );
      })}
      {max > 0 ? (
        <text x={2} y={10}>
          {`max ${formatMoney(max, currency)}`}
        </text>
      ) : (
        <text x={width / 2} y={top + plot / 2} text-anchor="middle">
          No usage in this period
        </text>
      )}
    </svg>
  );
}
