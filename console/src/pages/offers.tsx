/**
 * GPU offers (GET /search): one row per node with GPUs rentable now, filtered
 * by GPU type, GPU count, price per GPU-hour, rental type and location, and
 * refreshed every 10 s so the counts stay current. `Rent` opens the launch
 * form for the node.
 */
import { useEffect, useState } from 'preact/hooks';
import type { Offer, operations } from '../../../src/sdk/index.js';
import { api, call } from '../api.js';
import { navigate } from '../router.js';
import { Empty, Field, Link, Loaded, Money, Page, RowButton, Select, Table, useAsync, useDebounced } from '../ui.js';

export type RentalType = 'on_demand' | 'interruptible' | 'reserved';
export type GpuType = Offer['gpu_type'];
type SearchQuery = NonNullable<operations['searchOffers']['parameters']['query']>;

export const RENTAL_LABELS: Record<RentalType, string> = {
  on_demand: 'On-demand',
  interruptible: 'Interruptible',
  reserved: 'Reserved',
};
export const GPU_TYPES: GpuType[] = ['5090', '4090', 'pro6000'];
const POLL_MS = 10_000;
/**
 * The disk size the console assumes unless told otherwise: the launch form's default and the disk in
 * the offers' totals. It is the smallest disk a VM can have, the one the API's total_price_hourly
 * includes and the CLI's --disk defaults to, so all three quote the same VM.
 */
export const DEFAULT_DISK_GB = 50;

export function isRentalType(v: string | null | undefined): v is RentalType {
  return v === 'on_demand' || v === 'interruptible' || v === 'reserved';
}

/** Price per GPU-hour for a rental type (reserved is quoted before its discount, as the API filters it). */
export function unitPrice(o: Offer, rental: RentalType): number {
  return rental === 'interruptible' ? o.interruptible_rate : o.gpu_price_hourly;
}

/** Sums money amounts in micro-units so that 0.1 + 0.2 stays 0.3. */
export function sumMoney(...parts: number[]): number {
  return parts.reduce((s, p) => s + Math.round(p * 1e6), 0) / 1e6;
}

export function formatRam(mb: number): string {
  const gb = mb / 1024;
  return `${Number.isInteger(gb) ? gb : gb.toFixed(1)} GB`;
}

interface Filters {
  gpu_type: string;
  min_gpus: string;
  max_price: string;
  rental_type: string;
  location: string;
}
const NO_FILTERS: Filters = { gpu_type: '', min_gpus: '', max_price: '', rental_type: '', location: '' };

/** The filters live in the address (?gpu_type=4090...), so a reload or Back keeps them. */
function filtersFromUrl(): Filters {
  const q = new URLSearchParams(location.search);
  const f = { ...NO_FILTERS };
  for (const k of Object.keys(f) as (keyof Filters)[]) f[k] = q.get(k) ?? '';
  if (!GPU_TYPES.includes(f.gpu_type as GpuType)) f.gpu_type = '';
  if (!isRentalType(f.rental_type)) f.rental_type = '';
  return f;
}

/** The filters as a query; `image` (launching one of your images, see images.tsx) is kept along. */
function filtersToQuery(f: Filters, image?: string | null): string {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(f)) if (v.trim() !== '') q.set(k, v.trim());
  if (image) q.set('image', image);
  const s = q.toString();
  return s ? `?${s}` : '';
}

export function Offers(_props: Record<string, unknown>) {
  const [filters, setFilters] = useState<Filters>(filtersFromUrl);
  const [image] = useState(() => new URLSearchParams(location.search).get('image'));
  // Typed filters apply once the typing pauses; the selects at once.
  const typed = JSON.parse(
    useDebounced(JSON.stringify([filters.min_gpus, filters.max_price, filters.location]), 350),
  ) as string[];
  const applied: Filters = {
    ...filters,
    min_gpus: typed[0] ?? '',
    max_price: typed[1] ?? '',
    location: typed[2] ?? '',
  };
  const key = JSON.stringify(applied);
  const rental: RentalType = isRentalType(applied.rental_type) ? applied.rental_type : 'on_demand';

  useEffect(() => {
    history.replaceState(history.state, '', `${location.pathname}${filtersToQuery(applied, image)}`);
    // Runs again only when the listed values change, not on every value it reads.
  }, [key]);

  const minGpus = Number(applied.min_gpus);
  const maxPrice = Number(applied.max_price);
  const badMinGpus = applied.min_gpus.trim() !== '' && !(Number.isInteger(minGpus) && minGpus >= 1);
  const badMaxPrice = applied.max_price.trim() !== '' && !(Number.isFinite(maxPrice) && maxPrice >= 0);

  const offers = useAsync(
    async () => {
      const query: SearchQuery = {
        limit: 100,
        ...(applied.gpu_type ? { gpu_type: applied.gpu_type as GpuType } : {}),
        ...(applied.min_gpus.trim() && !badMinGpus ? { min_gpus: minGpus } : {}),
        ...(applied.max_price.trim() && !badMaxPrice ? { max_price: maxPrice } : {}),
        ...(applied.rental_type ? { rental_type: rental } : {}),
        ...(applied.location.trim() ? { location: applied.location.trim() } : {}),
      };
      return call(api.GET('/search', { params: { query } }));
    },
    [key],
    POLL_MS,
  );

  // Locations seen so far, offered as suggestions for the location filter.
  const [locations, setLocations] = useState<string[]>([]);
  useEffect(() => {
    const seen = offers.data?.map((o) => o.location) ?? [];
    if (seen.some((l) => !locations.includes(l))) setLocations([...new Set([...locations, ...seen])].sort());
  }, [offers.data, locations]);

  const set = (k: keyof Filters) => (v: string) => setFilters((f) => ({ ...f, [k]: v }));
  const filtered = Object.values(filters).some((v) => v.trim() !== '');

  return (
    <Page title="GPU offers">
      {image ? (
        <p class="card image-saved" role="note">
          Launching one of your images: rent any offer, the node downloads the image.{' '}
          <Link href="/images">Back to My images</Link>
        </p>
      ) : null}
      <form
        class="card inline offer-filters"
        role="search"
        aria-label="Filter offers"
        onSubmit={(e) => e.preventDefault()}
      >
        <fieldset>
          <Select
            label="GPU type"
            value={filters.gpu_type}
            onChange={set('gpu_type')}
            options={[{ value: '', label: 'Any GPU' }, ...GPU_TYPES.map((g) => ({ value: g, label: g }))]}
          />
          <Select
            label="Rental type"
            value={filters.rental_type}
            onChange={set('rental_type')}
            options={[
              { value: '', label: 'On-demand (default)' },
              { value: 'on_demand', label: RENTAL_LABELS.on_demand },
              { value: 'interruptible', label: RENTAL_LABELS.interruptible },
              { value: 'reserved', label: RENTAL_LABELS.reserved },
            ]}
          />
          <Field
            label="Min GPUs"
            type="number"
            min={1}
            step={1}
            inputMode="numeric"
            value={filters.min_gpus}
            onInput={(e) => set('min_gpus')(e.currentTarget.value)}
            aria-invalid={badMinGpus || undefined}
          />
          <Field
            label="Max price per GPU-hour"
            type="number"
            min={0}
            step="0.01"
            inputMode="decimal"
            value={filters.max_price}
            onInput={(e) => set('max_price')(e.currentTarget.value)}
            aria-invalid={badMaxPrice || undefined}
          />
          <Field
            label="Location"
            value={filters.location}
            onInput={(e) => set('location')(e.currentTarget.value)}
            list="offer-locations"
            autoComplete="off"
            placeholder="Any"
          />
          <datalist id="offer-locations">
            {locations.map((l) => (
              <option key={l} value={l} />
            ))}
          </datalist>
          {filtered ? (
            <button type="button" class="btn btn-plain" onClick={() => setFilters(NO_FILTERS)}>
              Clear filters
            </button>
          ) : null}
        </fieldset>
      </form>
      {badMinGpus || badMaxPrice ? (
        <p class="muted" role="status">
          {badMinGpus ? 'Min GPUs must be a whole number of 1 or more; it is ignored until then. ' : ''}
          {badMaxPrice ? 'Max price must be a number of 0 or more; it is ignored until then.' : ''}
        </p>
      ) : null}
      <p class="muted">
        {RENTAL_LABELS[rental]} prices
        {rental === 'reserved' ? ' before the reservation discount (1, 3 or 6 months)' : ''}. The total per hour is for
        every GPU listed plus a {DEFAULT_DISK_GB} GB disk. Updated every {POLL_MS / 1000} s.
      </p>
      <Loaded value={offers}>
        {(list) =>
          list.length === 0 ? (
            <Empty>
              {filtered
                ? 'No GPUs match these filters right now. Try fewer filters, or check back soon.'
                : 'No GPUs are free right now. Check back soon.'}
            </Empty>
          ) : (
            <OfferTable offers={list} rental={rental} rentalSet={applied.rental_type !== ''} image={image} />
          )
        }
      </Loaded>
    </Page>
  );
}

function OfferTable({
  offers,
  rental,
  rentalSet,
  image,
}: {
  offers: Offer[];
  rental: RentalType;
  rentalSet: boolean;
  image: string | null;
}) {
  return (
    <Table
      class="offer-table"
      head={
        <>
          <th scope="col">Node</th>
          <th scope="col">GPU</th>
          <th scope="col" class="num">
            GPUs free
          </th>
          <th scope="col" class="num">
            GPU RAM
          </th>
          <th scope="col">CPU / RAM</th>
          <th scope="col">Location</th>
          <th scope="col" class="num">
            Per GPU-hour
          </th>
          <th scope="col" class="num">
            Total per hour
          </th>
          <th scope="col" aria-label="Actions" />
        </>
      }
    >
      {offers.map((o) => {
        const unit = unitPrice(o, rental);
        // The API's total is the on-demand one; for the other rental types it is worked out the same way.
        const total =
          rental === 'on_demand'
            ? o.total_price_hourly
            : sumMoney(o.gpu_count * unit, DEFAULT_DISK_GB * o.storage_price_hourly);
        return (
          <tr key={o.node}>
            <td>
              <strong>{o.node}</strong>
              {o.cluster_name ? <span class="cell-sub">{o.cluster_name}</span> : null}
            </td>
            <td>{o.gpu_type}</td>
            <td class="num">{o.gpu_count}</td>
            <td class="num">
              {formatRam(o.gpu_ram_mb)}
              <span class="cell-sub">{formatRam(o.total_gpu_ram_mb)} in all</span>
            </td>
            <td>
              {o.cpu_cores} cores / {o.ram_gb} GB
              <span class="cell-sub">
                {o.cpu_model}
                {o.pcie_gen ? ` · PCIe ${o.pcie_gen}` : ''}
              </span>
            </td>
            <td>{o.location}</td>
            <td class="num">
              <Money value={unit} precise perHour />
              {rental === 'reserved' ? (
                <span class="cell-sub">
                  −{o.reserved_discount_1mo}% to −{o.reserved_discount_6mo}% reserved
                </span>
              ) : null}
            </td>
            <td class="num">
              <Money value={total} precise perHour />
            </td>
            <td>
              <RowButton
                variant="primary"
                onClick={() =>
                  navigate(
                    `/offers/${encodeURIComponent(o.node)}/launch${filtersToQuery({ ...NO_FILTERS, ...(rentalSet ? { rental_type: rental } : {}) }, image)}`,
                  )
                }
              >
                Rent
              </RowButton>
            </td>
          </tr>
        );
      })}
    </Table>
  );
}
