/**
 * The launch form's price step (launch.tsx): the GPUs' and the disk's hourly
 * price for the shape chosen, the reservation quote from the API when
 * reserved, and the balance (with a warning when it does not cover the
 * deposit).
 */
import type { Offer, operations } from '../../../src/sdk/index.js';
import { ErrorText, Link, Money, formatMoney, type Async } from '../ui.js';
import { RENTAL_LABELS, sumMoney, unitPrice, type RentalType } from './offers.js';

export type Quote = operations['calculateReservation']['responses'][200]['content']['application/json'];

export function PriceStep({
  offer,
  rental,
  months,
  gpuCount,
  discount,
  diskGb,
  diskOk,
  minDisk,
  quote,
  balance,
}: {
  offer: Offer;
  rental: RentalType;
  months: number;
  gpuCount: number;
  /** The reservation's discount in percent for `months`. */
  discount: number;
  diskGb: number;
  diskOk: boolean;
  minDisk: number;
  quote: Async<Quote | null>;
  balance: Async<{ balance: number; currency: string }>;
}) {
  const unit = unitPrice(offer, rental);
  const gpuHourly =
    rental === 'reserved' ? sumMoney(gpuCount * unit * (1 - discount / 100)) : sumMoney(gpuCount * unit);
  const diskHourly = diskOk ? sumMoney(diskGb * offer.storage_price_hourly) : 0;
  // The quote on screen must be for the shape chosen now, not the one before the last click.
  const q =
    rental === 'reserved' &&
    quote.data &&
    quote.data.gpu_count === gpuCount &&
    quote.data.storage_gb === diskGb &&
    quote.data.reservation_months === months
      ? quote.data
      : null;
  const perHour = q ? q.hourly_rate_after_discount : sumMoney(gpuHourly, diskHourly);
  return (
    <fieldset class="launch-step">
      <legend>6. Price</legend>
      <div class="launch-price" aria-live="polite">
        <dl class="props">
          <dt>GPUs</dt>
          <dd>
            {gpuCount} × {formatMoney(unit, 'USD', true)}/h{rental === 'reserved' ? ` − ${discount}%` : ''} ={' '}
            <Money value={gpuHourly} precise perHour />
          </dd>
          <dt>Disk</dt>
          <dd>
            {diskOk ? (
              <>
                {diskGb} GB × {formatMoney(offer.storage_price_hourly, 'USD', true)}/h ={' '}
                <Money value={diskHourly} precise perHour />
              </>
            ) : (
              <span class="muted">
                enter a disk size from {minDisk} to {offer.max_storage_gb} GB
              </span>
            )}
          </dd>
          <dt>Per hour</dt>
          <dd>
            <strong data-testid="price-per-hour">
              <Money value={perHour} precise perHour />
            </strong>{' '}
            <span class="muted">({RENTAL_LABELS[rental].toLowerCase()})</span>
          </dd>
          {rental === 'reserved' ? <ReservationQuote quote={q} error={quote.error} diskOk={diskOk} /> : null}
          {q && balance.data && balance.data.balance < q.deposit_required ? (
            <dd class="warning launch-short" role="note">
              Your balance of {formatMoney(balance.data.balance, balance.data.currency)} does not cover this deposit.{' '}
              <Link href="/billing">Add credit</Link> first, or choose a shorter reservation or fewer GPUs.
            </dd>
          ) : null}
          <dt>Balance</dt>
          <dd>
            {balance.data ? <Money value={balance.data.balance} currency={balance.data.currency} /> : '…'}{' '}
            <span class="muted">
              {rental === 'reserved'
                ? '(the deposit is charged at launch)'
                : '(launching needs an hour of this VM plus an hour of your other VMs in credit)'}
            </span>{' '}
            <Link href="/billing">Add credit</Link>
          </dd>
        </dl>
      </div>
    </fieldset>
  );
}

export function ReservationQuote({
  quote: q,
  error,
  diskOk,
}: {
  quote: Quote | null;
  error: string | undefined;
  diskOk: boolean;
}) {
  if (!diskOk) return null;
  if (error) {
    return (
      <>
        <dt>Reservation</dt>
        <dd>
          <ErrorText error={error} />
        </dd>
      </>
    );
  }
  if (!q) {
    return (
      <>
        <dt>Reservation</dt>
        <dd class="muted" role="status">
          <span class="spinner" aria-hidden="true" /> Pricing the reservation…
        </dd>
      </>
    );
  }
  return (
    <>
      <dt>Discount</dt>
      <dd>
        {q.discount_percent}% for {q.reservation_months} {q.reservation_months === 1 ? 'month' : 'months'}
      </dd>
      <dt>Per month</dt>
      <dd>
        <Money value={q.monthly_cost} />
      </dd>
      <dt>Deposit</dt>
      <dd>
        <strong>
          <Money value={q.deposit_required} />
        </strong>{' '}
        <span class="muted">prepaid now, the whole commitment</span>
      </dd>
      <dt>Cancellation fee</dt>
      <dd>
        <Money value={q.cancellation_fee_25_percent} /> <span class="muted">(25% of the deposit)</span>
      </dd>
    </>
  );
}
