/** Billing: balance, what accrues now, usage by day for the last 30 days, and the transactions. */
import { Fragment } from 'preact';
import { useState } from 'preact/hooks';
import type { paths } from '../../../src/sdk/index.js';
import { api, call, callWithTotal } from '../api.js';
import { gbText } from './images.js';
import { UsageSection } from './billing-usage.js';
import {
  Empty,
  Link,
  Loaded,
  Money,
  Page,
  Table,
  WithTimes,
  formatMoney,
  formatTime,
  useAsync,
  vmName,
} from '../ui.js';

type Transaction = paths['/billing/transactions']['get']['responses'][200]['content']['application/json'][number];

const PAGE_SIZE = 20;

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
              <Table
                head={
                  <>
                    <th>VM</th>
                    <th>GPUs</th>
                    <th class="num">Disk</th>
                    <th class="num">GPU</th>
                    <th class="num">Storage</th>
                    <th class="num">Network</th>
                    <th class="num">Total</th>
                  </>
                }
              >
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
              </Table>
            )}
            {spend.images.length > 0 ? (
              <Table
                wrapClass="spaced"
                caption={
                  <>
                    Your images’ storage (<Link href="/images">My images</Link>)
                  </>
                }
                captionClass="muted"
                head={
                  <>
                    <th>Image</th>
                    <th class="num">Size</th>
                    <th class="num">Storage</th>
                  </>
                }
              >
                {spend.images.map((i) => (
                  <tr key={i.image_id} data-image={i.image_id}>
                    <td>{i.name}</td>
                    <td class="num">{gbText(i.size_gb)}</td>
                    <td class="num">
                      <Money value={i.cost_per_hour} currency={currency} precise perHour />
                    </td>
                  </tr>
                ))}
              </Table>
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
            <Table
              head={
                <>
                  <th>Date</th>
                  <th>Type</th>
                  <th>Description</th>
                  <th class="num">Amount</th>
                  <th class="num">Balance after</th>
                </>
              }
            >
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
            </Table>
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
