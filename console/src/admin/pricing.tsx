/**
 * Operator page: the prices per GPU type. Every row is editable in place;
 * Save sends only the fields that changed (the API keeps the others). New
 * prices apply to VMs created afterwards: a VM's rate is fixed at creation.
 */
import { useState } from 'preact/hooks';
import type { paths } from '../../../src/sdk/index.js';
import { api, call, errorMessage } from '../api.js';
import { Empty, Loaded, Money, Page, RowButton, Table, formatTime, notify, useAsync } from '../ui.js';

type Price = paths['/admin/pricing']['get']['responses'][200]['content']['application/json'][number];
type PriceBody = NonNullable<paths['/admin/pricing/{gpu_type}']['put']['requestBody']>['content']['application/json'];
type Key =
  | 'gpu_price_hourly'
  | 'interruptible_rate'
  | 'storage_price_gb_hourly'
  | 'reserved_discount_1mo'
  | 'reserved_discount_3mo'
  | 'reserved_discount_6mo';

/** The editable columns: what the header says, the input's accessible name, and its unit. */
const COLUMNS: { key: Key; head: string; label: (gpu: string) => string; kind: 'money' | 'percent' }[] = [
  { key: 'gpu_price_hourly', head: 'On-demand, per GPU-hour', label: (g) => `${g} price per GPU-hour`, kind: 'money' },
  {
    key: 'interruptible_rate',
    head: 'Interruptible, per GPU-hour',
    label: (g) => `${g} interruptible rate per GPU-hour`,
    kind: 'money',
  },
  {
    key: 'storage_price_gb_hourly',
    head: 'Storage, per GB-hour',
    label: (g) => `${g} storage price per GB-hour`,
    kind: 'money',
  },
  {
    key: 'reserved_discount_1mo',
    head: 'Reserved 1 month',
    label: (g) => `${g} reserved 1 month discount (%)`,
    kind: 'percent',
  },
  {
    key: 'reserved_discount_3mo',
    head: 'Reserved 3 months',
    label: (g) => `${g} reserved 3 months discount (%)`,
    kind: 'percent',
  },
  {
    key: 'reserved_discount_6mo',
    head: 'Reserved 6 months',
    label: (g) => `${g} reserved 6 months discount (%)`,
    kind: 'percent',
  },
];

const DECIMAL = /^(\d+(\.\d*)?|\.\d+)$/;

export function Pricing(_props: Record<string, unknown>) {
  const prices = useAsync(() => call(api.GET('/admin/pricing')), []);
  return (
    <Page title="Pricing">
      <p class="muted">
        Prices in USD. On-demand and interruptible prices are per GPU-hour, storage per GB-hour; reserved rentals take
        the on-demand price less their discount. <strong>New prices apply to new VMs only</strong>: a VM keeps the rate
        it was created with.
      </p>
      <Loaded value={prices}>
        {(rows) =>
          rows.length === 0 ? (
            <Empty>No GPU type has prices yet.</Empty>
          ) : (
            <Table
              class="adm-price-table"
              head={
                <>
                  <th>GPU type</th>
                  {COLUMNS.map((c) => (
                    <th key={c.key} class={c.kind === 'money' ? 'num' : undefined}>
                      {c.head}
                      {c.kind === 'percent' ? <span class="muted"> (% off)</span> : null}
                    </th>
                  ))}
                  <th>Changed</th>
                  <th>
                    <span class="adm-sr">Save</span>
                  </th>
                </>
              }
            >
              {rows.map((p) => (
                // Keyed by its version: after a save the reloaded row starts from the stored prices.
                <PriceRow key={`${p.gpu_type}@${p.updated_at}`} price={p} onSaved={prices.reload} />
              ))}
            </Table>
          )
        }
      </Loaded>
    </Page>
  );
}

function PriceRow({ price, onSaved }: { price: Price; onSaved: () => Promise<void> }) {
  const initial = Object.fromEntries(COLUMNS.map((c) => [c.key, String(price[c.key])])) as Record<Key, string>;
  const [values, setValues] = useState(initial);
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | undefined>(undefined);
  const [invalid, setInvalid] = useState<Key | undefined>(undefined);
  const changed = COLUMNS.filter((c) => values[c.key].trim() !== initial[c.key]);
  const gpu = price.gpu_type;
  const errorId = `price-error-${gpu}`;

  const save = async () => {
    if (busy) return;
    setError(undefined);
    setInvalid(undefined);
    const body: PriceBody = {};
    for (const c of COLUMNS) {
      const raw = values[c.key].trim();
      if (raw === initial[c.key]) continue;
      if (!DECIMAL.test(raw)) {
        setError(`${c.head}: enter a number${c.kind === 'percent' ? ' from 0 to 100' : ' (USD, e.g. 0.49)'}.`);
        setInvalid(c.key);
        return;
      }
      const n = Number(raw);
      if (n !== price[c.key]) body[c.key] = n;
    }
    if (Object.keys(body).length === 0) {
      notify(`Nothing to save for ${gpu}.`, 'info');
      return;
    }
    setBusy(true);
    try {
      await call(api.PUT('/admin/pricing/{gpu_type}', { params: { path: { gpu_type: gpu } }, body }));
      notify(`Prices of ${gpu} saved. They apply to new VMs only.`);
      await onSaved();
    } catch (e) {
      const message = errorMessage(e);
      setError(message);
      setInvalid(COLUMNS.find((c) => message.includes(c.key))?.key);
    } finally {
      setBusy(false);
    }
  };

  return (
    <>
      <tr class={changed.length ? 'adm-row-changed' : undefined} aria-busy={busy}>
        <th scope="row">
          {gpu}
          <div class="muted adm-small">{Math.round(price.gpu_ram_mb / 1024)} GB</div>
        </th>
        {COLUMNS.map((c) => {
          const raw = values[c.key].trim();
          const n = Number(raw);
          const discounted = c.kind === 'percent' && DECIMAL.test(raw) && DECIMAL.test(values.gpu_price_hourly.trim());
          return (
            <td key={c.key} class={c.kind === 'money' ? 'num' : undefined}>
              <span class="adm-price-input">
                {c.kind === 'money' ? (
                  <span class="muted" aria-hidden="true">
                    $
                  </span>
                ) : null}
                <input
                  type="text"
                  inputMode="decimal"
                  class={c.kind === 'money' ? 'adm-num-input' : 'adm-pct-input'}
                  aria-label={c.label(gpu)}
                  aria-invalid={invalid === c.key ? 'true' : undefined}
                  aria-describedby={error ? errorId : undefined}
                  value={values[c.key]}
                  disabled={busy}
                  onInput={(e) => setValues({ ...values, [c.key]: (e.target as HTMLInputElement).value })}
                  onKeyDown={(e) => {
                    if (e.key === 'Enter') {
                      e.preventDefault();
                      void save();
                    }
                  }}
                />
                {c.kind === 'percent' ? (
                  <span class="muted" aria-hidden="true">
                    %
                  </span>
                ) : null}
              </span>
              {discounted ? (
                <div class="muted adm-small">
                  <Money value={Number(values.gpu_price_hourly) * (1 - n / 100)} precise perHour />
                </div>
              ) : null}
            </td>
          );
        })}
        <td class="muted">{formatTime(price.updated_at)}</td>
        <td>
          <div class="actions adm-row-actions">
            <button
              type="button"
              class="btn btn-primary btn-small"
              disabled={busy}
              aria-busy={busy}
              onClick={() => void save()}
            >
              {busy ? <span class="spinner" aria-hidden="true" /> : null}
              Save
            </button>
            {changed.length && !busy ? (
              <RowButton
                onClick={() => {
                  setValues(initial);
                  setError(undefined);
                  setInvalid(undefined);
                }}
              >
                Undo
              </RowButton>
            ) : null}
          </div>
        </td>
      </tr>
      {error ? (
        <tr>
          <td colSpan={COLUMNS.length + 3}>
            <p class="error" role="alert" id={errorId}>
              {gpu}: {error}
            </p>
          </td>
        </tr>
      ) : null}
    </>
  );
}
