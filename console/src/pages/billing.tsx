/** Billing: balance, what accrues now, usage by day for the last 30 days, and the transactions. */
import { Fragment } from 'preact';
import { useState } from 'preact/hooks';
import type { paths } from '../../../src/sdk/index.js';
import { api, call, callWithTotal } from '../api.js';
import { gbText } from './images.js';
import {
  Empty,
  Link,
  Loaded,
  Money,
  Page,
  WithTimes,
  formatDuration,
  formatMoney,
  formatTime,
  useAsync,
  vmName,
} from '../ui.js';

type Usage = paths['/billing/usage']['get']['responses'][200]['content']['application/json'];
type Transaction = paths['/billing/transactions']['get']['responses'][200]['content']['application/json'][number];

const PAGE_SIZE = 20;
const DAY_MS = 86_400_000;

export function Billing() {
  const summary = useAsync(
    async () => {
      const [balance, spend] = await Promise.all([
        call(api.GET('/billing/balance')),
        call(api.GET('/billing/current-spend')),
      ]);
      return { balance, spend };
    },
    [],
    10_000,
  );
  const usage = useAsync(() => call(api.GET('/billing/usage')), [], 60_000);
  const currency = summary.data?.balance.currency ?? 'USD';

  return (
    <Page title="Billing">
      <Loaded value={summary}>
        {({ balance, spend }) => (
          <>
            {balance.balance <= 0 ? (
              <div class="warning" role="alert">
                Your balance is empty: running VMs are stopped and new ones cannot start until credit is added.
              </div>
            ) : null}
            <div class="cards">
              <div class="card stat">
                <span class="label">Balance</span>
                <strong class="value" title={formatMoney(balance.balance, currency, true)}>
                  <Money value={balance.balance} currency={currency} />
                </strong>
                <span class="muted">
                  {spend.total_per_hour > 0
                    ? `lasts about ${formatHours(Math.max(0, balance.balance) / spend.total_per_hour)} at the current spend`
                    : 'nothing accrues now'}
                </span>
              </div>
              <div class="card stat">
                <span class="label">Spend per hour</span>
                <strong class="value">
                  <Money value={spend.total_per_hour} currency={currency} precise perHour />
                </strong>
                <span class="muted">
                  {spend.running_vms} running VM{spend.running_vms === 1 ? '' : 's'}
                </span>
              </div>
              <div class="card stat">
                <span class="label">Per day</span>
                <strong class="value">
                  <Money value={spend.total_per_day} currency={currency} />
                </strong>
                <span class="muted">at this rate</span>
              </div>
              <div class="card stat">
                <span class="label">Per month</span>
                <strong class="value">
                  <Money value={spend.total_per_month} currency={currency} />
                </strong>
                <span class="muted">730 hours at this rate</span>
              </div>
            </div>

            <div class="card add-credit spaced">
              <h2 class="card-heading">Adding credit</h2>
              <p>
                Credit is added by an operator: there is no self-service payment in this version. Ask your gpucloud
                operator (support) to add credit to your account; it shows up here as a <code>credit</code> transaction
                and is usable at once. Running VMs are charged from the balance every hour and stop when it runs out.
              </p>
            </div>

            <h2>Spending now, by VM</h2>
            {spend.vms.length === 0 ? (
              <Empty>
                No VM accrues anything now. <Link href="/offers">Find a GPU</Link>
              </Empty>
            ) : (
              <div class="table-wrap">
                <table>
                  <thead>
                    <tr>
                      <th>VM</th>
                      <th>GPUs</th>
                      <th class="num">Disk</th>
                      <th class="num">GPU</th>
                      <th class="num">Storage</th>
                      <th class="num">Network</th>
                      <th class="num">Total</th>
                    </tr>
                  </thead>
                  <tbody>
                    {spend.vms.map((v) => (
                      <tr key={v.vm_id}>
                        <td>
                          <Link href={`/vms/${v.vm_id}`}>{vmName(v)}</Link>
                        </td>
                        <td>
                          {v.gpu_count} × {v.gpu_type}
                        </td>
                        <td class="num">{v.storage_gb} GB</td>
                        <td class="num">
                          <Money value={v.gpu_cost_per_hour} currency={currency} precise perHour />
                        </td>
                        <td class="num">
                          <Money value={v.storage_cost_per_hour} currency={currency} precise perHour />
                        </td>
                        <td class="num">
                          <Money value={v.network_cost_per_hour} currency={currency} precise perHour />
                        </td>
                        <td class="num">
                          <strong>
                            <Money value={v.total_cost_per_hour} currency={currency} precise perHour />
                          </strong>
                        </td>
                      </tr>
                    ))}
                  </tbody>
                </table>
              </div>
            )}
            {spend.images.length > 0 ? (
              <div class="table-wrap spaced">
                <table>
                  <caption class="muted">
                    Your images’ storage (<Link href="/images">My images</Link>)
                  </caption>
                  <thead>
                    <tr>
                      <th>Image</th>
                      <th class="num">Size</th>
                      <th class="num">Storage</th>
                    </tr>
                  </thead>
                  <tbody>
                    {spend.images.map((i) => (
                      <tr key={i.image_id} data-image={i.image_id}>
                        <td>{i.name}</td>
                        <td class="num">{gbText(i.size_gb)}</td>
                        <td class="num">
                          <Money value={i.cost_per_hour} currency={currency} precise perHour />
                        </td>
                      </tr>
                    ))}
                  </tbody>
                </table>
              </div>
            ) : null}
            <p class="muted">
              Running VMs accrue at their full rate; stopped VMs that keep a disk accrue its storage rate, and your
              images theirs. Updated {formatTime(spend.last_updated)}.
            </p>
          </>
        )}
      </Loaded>

      <h2>Usage, last 30 days</h2>
      <Loaded value={usage}>{(u) => <UsageSection usage={u} currency={currency} />}</Loaded>

      <h2>Transactions</h2>
      <Transactions currency={currency} />
    </Page>
  );
}

function formatHours(h: number): string {
  if (h >= 48) return `${Math.floor(h / 24)} days`;
  if (h >= 1) return `${Math.floor(h)} hours`;
  return `${Math.max(0, Math.round(h * 60))} minutes`;
}

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

function UsageSection({ usage, currency }: { usage: Usage; currency: string }) {
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
        <div class="table-wrap usage-vms">
          <table>
            <caption class="muted">By VM, over the same 30 days</caption>
            <thead>
              <tr>
                <th>VM</th>
                <th>GPU</th>
                <th class="num">VM time</th>
                <th class="num">Cost</th>
              </tr>
            </thead>
            <tbody>
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
            </tbody>
          </table>
        </div>
      ) : null}
      {byImage.size > 0 ? (
        <div class="table-wrap usage-images">
          <table>
            <caption class="muted">Image storage, over the same 30 days</caption>
            <thead>
              <tr>
                <th>Image</th>
                <th class="num">Size</th>
                <th class="num">Stored</th>
                <th class="num">Cost</th>
              </tr>
            </thead>
            <tbody>
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
            </tbody>
          </table>
        </div>
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

function Transactions({ currency }: { currency: string }) {
  const [offset, setOffset] = useState(0);
  const page = useAsync(
    async () => {
      const { items, total } = await callWithTotal(
        api.GET('/billing/transactions', { params: { query: { limit: PAGE_SIZE, offset } } }),
      );
      return { items, total, offset };
    },
    [offset],
    15_000,
  );
  return (
    <Loaded value={page}>
      {({ items, total, offset: at }) => {
        if (total === 0) return <Empty>No transaction yet. Credit added by an operator shows up here.</Empty>;
        const from = items.length ? at + 1 : 0;
        const to = at + items.length;
        return (
          <>
            <div class="table-wrap">
              <table>
                <thead>
                  <tr>
                    <th>Date</th>
                    <th>Type</th>
                    <th>Description</th>
                    <th class="num">Amount</th>
                    <th class="num">Balance after</th>
                  </tr>
                </thead>
                <tbody>
                  {items.map((t) => (
                    <tr key={t.id}>
                      <td>{formatTime(t.created_at)}</td>
                      <td>
                        <span class={`status tx-${t.type}`}>{t.type}</span>
                      </td>
                      <td class="tx-description">
                        <WithTimes text={t.description} />
                        <Breakdown t={t} />
                      </td>
                      <td class={`num ${t.amount >= 0 ? 'tx-in' : 'tx-out'}`}>
                        {t.amount > 0 ? '+' : ''}
                        <Money value={t.amount} currency={currency} precise />
                      </td>
                      <td class="num">
                        <Money value={t.balance_after} currency={currency} precise />
                      </td>
                    </tr>
                  ))}
                </tbody>
              </table>
            </div>
            <div class="tx-pager actions" role="group" aria-label="Transaction pages">
              <button
                type="button"
                class="btn btn-plain btn-small"
                disabled={at === 0}
                onClick={() => setOffset(Math.max(0, at - PAGE_SIZE))}
              >
                Previous
              </button>
              <span class="muted" aria-live="polite">
                {from}–{to} of {total}
              </span>
              <button
                type="button"
                class="btn btn-plain btn-small"
                disabled={to >= total}
                onClick={() => setOffset(at + PAGE_SIZE)}
              >
                Next
              </button>
            </div>
          </>
        );
      }}
    </Loaded>
  );
}

function Breakdown({ t }: { t: Transaction }) {
  const entries = Object.entries(t.breakdown ?? {});
  if (entries.length === 0) return null;
  return (
    <details class="breakdown">
      <summary>Details</summary>
      <dl class="props">
        {entries.map(([k, v]) => (
          <Fragment key={k}>
            <dt>{k.replace(/_/g, ' ')}</dt>
            <dd>
              <WithTimes text={typeof v === 'object' && v !== null ? JSON.stringify(v) : String(v)} />
            </dd>
          </Fragment>
        ))}
      </dl>
    </details>
  );
}
