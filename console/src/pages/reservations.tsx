/**
 * Reservations: price a 1, 3 or 6-month commitment, start one through the
 * launch flow (a VM with rental_type reserved), and see or cancel the ones
 * you have.
 */
import { useState } from 'preact/hooks';
import type { paths } from '../../../src/sdk/index.js';
import { api, call } from '../api.js';
import { navigate } from '../router.js';
import { RESERVATION_EVENTS, useLiveEvents } from '../live.js';
import {
  Confirm,
  Empty,
  Field,
  Form,
  Link,
  Loaded,
  Money,
  Page,
  RowButton,
  Select,
  Status,
  Submit,
  Table,
  formatMoney,
  formatTime,
  notify,
  useAsync,
} from '../ui.js';

type QuoteRequest = paths['/reservations/calculate']['post']['requestBody']['content']['application/json'];
type Quote = paths['/reservations/calculate']['post']['responses'][200]['content']['application/json'];
type Reservation = paths['/reservations']['get']['responses'][200]['content']['application/json'][number];
type GpuType = QuoteRequest['gpu_type'];
type GpuCount = QuoteRequest['gpu_count'];
type Months = NonNullable<QuoteRequest['reservation_months']>;

const GPU_TYPES: { value: GpuType; label: string }[] = [
  { value: '5090', label: 'RTX 5090' },
  { value: '4090', label: 'RTX 4090' },
  { value: 'pro6000', label: 'RTX PRO 6000' },
];
const GPU_COUNTS: GpuCount[] = [1, 2, 4, 8];
const TERMS: Months[] = [1, 3, 6];

/** DELETE /reservations/{id}: "25 % of the remaining balance is kept as a fee, 75 % is refunded". */
const FEE_PERCENT = 25;

/** The fee and refund the API will compute, in micro-units with half-up rounding as it does. */
function cancellationOutcome(remaining: number): { fee: number; refund: number } {
  const micros = Math.round(remaining * 1_000_000);
  const fee = Math.floor((micros * FEE_PERCENT + 50) / 100);
  return { fee: fee / 1_000_000, refund: (micros - fee) / 1_000_000 };
}

export function Reservations() {
  const [gpuType, setGpuType] = useState<GpuType>('4090');
  const [gpuCount, setGpuCount] = useState<GpuCount>(1);
  const [storage, setStorage] = useState('100');
  const [months, setMonths] = useState<Months>(3);
  const [quote, setQuote] = useState<Quote | undefined>(undefined);
  const [cancelling, setCancelling] = useState<string | undefined>(undefined);
  // Status changes arrive as events; the prepaid balance an hour's usage draws down is read once a minute.
  const list = useAsync(() => call(api.GET('/reservations', { params: { query: { limit: 100 } } })), [], 60_000);
  useLiveEvents(RESERVATION_EVENTS, () => void list.reload());
  const balance = useAsync(() => call(api.GET('/billing/balance')), [], 30_000);
  const currency = balance.data?.currency ?? 'USD';

  // A change to the shape makes the quote shown stale: hide it until asked again.
  const change =
    <T,>(set: (v: T) => void) =>
    (v: T) => {
      set(v);
      setQuote(undefined);
    };

  const reserve = (q: Quote) => {
    const qs = new URLSearchParams({
      gpu_type: q.gpu_type,
      rental_type: 'reserved',
      min_gpus: String(q.gpu_count),
      gpu_count: String(q.gpu_count),
      storage_gb: String(q.storage_gb),
      reservation_months: String(q.reservation_months),
    });
    navigate(`/offers?${qs.toString()}`);
  };

  const target = cancelling ? list.data?.find((r) => r.id === cancelling) : undefined;

  return (
    <Page title="Reservations">
      <p class="muted">
        Reserve a GPU VM for 1, 3 or 6 months at a discount. The whole term is prepaid as a deposit when the VM is
        created, and the VM's usage is drawn from it. At the end of the term the VM goes on as on-demand.
      </p>
      <div class="grid2">
        <div class="card">
          <h2 class="card-heading">Price a reservation</h2>
          <Form
            aria-label="Price a reservation"
            onSubmit={async () => {
              setQuote(
                await call(
                  api.POST('/reservations/calculate', {
                    body: {
                      gpu_type: gpuType,
                      gpu_count: gpuCount,
                      storage_gb: Number(storage),
                      reservation_months: months,
                    },
                  }),
                ),
              );
            }}
          >
            <Select
              label="GPU type"
              value={gpuType}
              onChange={(v) => change(setGpuType)(v as GpuType)}
              options={GPU_TYPES.map((g) => ({ value: g.value, label: g.label }))}
            />
            <Select
              label="GPUs"
              value={String(gpuCount)}
              onChange={(v) => change(setGpuCount)(Number(v) as GpuCount)}
              options={GPU_COUNTS.map((n) => ({ value: String(n), label: String(n) }))}
            />
            <Field
              label="Storage (GB)"
              type="number"
              min={50}
              step={1}
              inputMode="numeric"
              value={storage}
              onInput={(e) => change(setStorage)(e.currentTarget.value)}
              hint="At least 50 GB."
            />
            <fieldset class="term-choices">
              <legend>Term</legend>
              <div class="choices">
                {TERMS.map((m) => (
                  <label key={m} class="choice">
                    <input
                      type="radio"
                      name="reservation_months"
                      value={m}
                      checked={months === m}
                      onChange={() => change(setMonths)(m)}
                    />
                    {m} month{m === 1 ? '' : 's'}
                  </label>
                ))}
              </div>
            </fieldset>
            <div class="actions">
              <Submit variant={quote ? 'plain' : 'primary'}>Get quote</Submit>
            </div>
          </Form>
        </div>

        <div class="card" aria-live="polite">
          <h2 class="card-heading">Quote</h2>
          {quote ? (
            <>
              <dl class="props">
                <dt>Shape</dt>
                <dd>
                  {quote.gpu_count} × {quote.gpu_type}, {quote.storage_gb} GB, {quote.reservation_months} month
                  {quote.reservation_months === 1 ? '' : 's'}
                </dd>
                <dt>Discount</dt>
                <dd>{quote.discount_percent}%</dd>
                <dt>Hourly rate after discount</dt>
                <dd>
                  <Money value={quote.hourly_rate_after_discount} currency={currency} precise perHour />
                </dd>
                <dt>Monthly cost</dt>
                <dd>
                  <Money value={quote.monthly_cost} currency={currency} />
                </dd>
                <dt>Deposit required</dt>
                <dd>
                  <strong>
                    <Money value={quote.deposit_required} currency={currency} />
                  </strong>
                </dd>
                <dt>Cancellation fee</dt>
                <dd>
                  <Money value={quote.cancellation_fee_25_percent} currency={currency} />{' '}
                  <span class="muted">if cancelled at once</span>
                </dd>
              </dl>
              <p class="muted">
                The deposit is the whole term ({quote.reservation_months} × 730 hours), taken from your balance when the
                VM is created. If you cancel, 25% of what is left of it is kept as a fee and 75% is refunded.
              </p>
              {balance.data && balance.data.balance < quote.deposit_required ? (
                <p class="warning" role="alert">
                  Your balance (<Money value={balance.data.balance} currency={currency} />) is below this deposit: ask
                  an operator to add credit before you launch the VM.
                </p>
              ) : null}
              <div class="actions">
                <button type="button" class="btn btn-primary" onClick={() => reserve(quote)}>
                  Create reservation
                </button>
              </div>
              <p class="muted">Next, pick a node with free {quote.gpu_type} GPUs and launch the VM as reserved.</p>
            </>
          ) : (
            <p class="muted">
              Choose a shape and a term, then get a quote to see the discount, the monthly cost and the deposit.
            </p>
          )}
        </div>
      </div>

      <h2>Your reservations</h2>
      <Loaded value={list}>
        {(rs) =>
          rs.length === 0 ? (
            <Empty>No reservation yet.</Empty>
          ) : (
            <Table
              head={
                <>
                  <th>GPUs</th>
                  <th>Status</th>
                  <th>Term</th>
                  <th class="num">Deposit</th>
                  <th class="num">Remaining</th>
                  <th>Ends</th>
                  <th>VM</th>
                  <th aria-label="Actions" />
                </>
              }
            >
              {rs.map((r) => (
                <tr key={r.id}>
                  <td>
                    {r.gpu_count} × {r.gpu_type}
                    <br />
                    <small class="muted">{r.storage_gb} GB</small>
                  </td>
                  <td>
                    <Status status={r.status} />
                    {r.status === 'cancelled' ? (
                      <>
                        <br />
                        <small class="muted">
                          fee <Money value={r.cancellation_fee} currency={currency} />, refund{' '}
                          <Money value={r.refund_amount} currency={currency} />
                        </small>
                      </>
                    ) : null}
                  </td>
                  <td>
                    {r.reservation_months} month{r.reservation_months === 1 ? '' : 's'}
                    <br />
                    <small class="muted">{r.discount_percent}% off</small>
                  </td>
                  <td class="num">
                    <Money value={r.deposit_amount} currency={currency} />
                  </td>
                  <td class="num">
                    <Money value={r.remaining_balance} currency={currency} />
                  </td>
                  <td>
                    {r.status === 'cancelled' ? <>cancelled {formatTime(r.cancelled_at)}</> : formatTime(r.end_at)}
                  </td>
                  <td>
                    <Link href={`/vms/${r.vm_id}`}>View VM</Link>
                  </td>
                  <td class="num">
                    {r.status === 'active' ? (
                      <RowButton onClick={() => setCancelling(r.id)}>Cancel reservation</RowButton>
                    ) : null}
                  </td>
                </tr>
              ))}
            </Table>
          )
        }
      </Loaded>

      {target ? (
        <CancelDialog r={target} currency={currency} onClose={() => setCancelling(undefined)} onDone={list.reload} />
      ) : null}
    </Page>
  );
}

function CancelDialog({
  r,
  currency,
  onClose,
  onDone,
}: {
  r: Reservation;
  currency: string;
  onClose: () => void;
  onDone: () => Promise<void>;
}) {
  const { fee, refund } = cancellationOutcome(r.remaining_balance);
  return (
    <Confirm
      title="Cancel this reservation?"
      confirmLabel="Confirm cancellation"
      danger
      onClose={onClose}
      onConfirm={async () => {
        const done = await call(
          api.DELETE('/reservations/{reservation_id}', { params: { path: { reservation_id: r.id } } }),
        );
        notify(
          `Reservation cancelled: fee ${formatMoney(done.cancellation_fee, currency)}, ${formatMoney(done.refund_amount, currency)} refunded to your balance.`,
        );
        await onDone();
      }}
    >
      <p>
        {r.gpu_count} × {r.gpu_type}, {r.reservation_months}-month term ending {formatTime(r.end_at)}.
      </p>
      <dl class="props">
        <dt>Remaining balance</dt>
        <dd>
          <Money value={r.remaining_balance} currency={currency} />
        </dd>
        <dt>Cancellation fee (25%)</dt>
        <dd>
          <Money value={fee} currency={currency} />
        </dd>
        <dt>Refund to your balance (75%)</dt>
        <dd>
          <strong>
            <Money value={refund} currency={currency} />
          </strong>
        </dd>
      </dl>
      <p class="muted">
        Usage up to the moment you confirm is drawn from the reservation first, so the figures may be slightly lower.
        The VM, if it still exists, goes on as on-demand at on-demand prices. This cannot be undone.
      </p>
    </Confirm>
  );
}
