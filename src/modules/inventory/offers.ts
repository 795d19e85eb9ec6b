/**
 * Offers and the public price list (docs/offers.md#search), made only from the offers snapshot: the
 * prices, the nodes, the GPUs in use and the templates ready, read once and shared by every search.
 */
import { performance } from 'node:perf_hooks';
import type { Db, Queryable } from '../../db/db.js';
import { afterCommit } from '../../db/commit-hook.js';
import { bpToPercent, toAmount } from '../../money.js';
import * as repo from './repository.js';
import type { GpuType, GpuUsage, NodeRow, PricingRow } from './repository.js';
import { CURRENCY, toPricingRecord } from './pricing.js';
import type { Offer, PublicPricing } from './schemas.js';

/** An offer's total price is for the whole node offer with the minimum disk a VM may have. */
export const MIN_STORAGE_GB = 50;

/** The longest an offers snapshot is served: a change made elsewhere shows within this. */
export const OFFERS_MAX_AGE_MS = 1000;

export type RentalKind = 'on_demand' | 'reserved' | 'interruptible';

export interface SearchFilters {
  gpu_type?: GpuType;
  min_gpus?: number;
  max_price?: number;
  rental_type?: RentalKind;
  location?: string;
  /** Only nodes whose host holds this template ready. */
  template_vmid?: number;
  limit: number;
  offset: number;
}

/**
 * What offers and the public price list are made of. One object per read: while nothing
 * changes every search gets the same one, so its identity names the version of the offers.
 */
export interface OfferInputs {
  prices: PricingRow[];
  nodes: NodeRow[];
  usage: Map<string, GpuUsage>;
  /** "node:template_vmid" of every template ready on a node. */
  ready: Set<string>;
}

/** GPUs of a node that no VM holds. */
export const freeGpus = (n: NodeRow, u: GpuUsage | undefined) => Math.max(0, n.gpu_count - (u?.held ?? 0));

/**
 * Offers and the public price list are made of three things that change
 * only when an operator changes prices or nodes, or VMs take or free GPUs:
 * they are read once into a snapshot that every search shares. A change
 * through this instance replaces it as soon as its transaction commits
 * (`changesIn`); a change through another instance or a worker shows
 * within OFFERS_MAX_AGE_MS, the snapshot's longest life. Placement never
 * reads it: creating a VM counts GPUs under the node's row lock.
 */
export class OffersSnapshot {
  private snapshot: { loadedAt: number; epoch: number; inputs: Promise<OfferInputs>; loaded?: OfferInputs } | undefined;
  private epoch = 0;

  /** `readyTemplates`: the ready (node, template) pairs, as "node:template_vmid" (the templates module's rule). */
  constructor(
    private readonly db: Db,
    private readonly readyTemplates: () => Promise<Set<string>>,
  ) {}

  /** The current snapshot (read again when it changed or is older than OFFERS_MAX_AGE_MS). */
  inputs(): Promise<OfferInputs> {
    const now = performance.now();
    const s = this.snapshot;
    if (s && s.epoch === this.epoch && now - s.loadedAt < OFFERS_MAX_AGE_MS) return s.inputs;
    const inputs = Promise.all([
      repo.listPricing(this.db),
      repo.listNodes(this.db),
      repo.gpuUsage(this.db),
      this.readyTemplates(),
    ]).then(([prices, nodes, usage, ready]) => ({ prices, nodes, usage, ready }));
    const mine: NonNullable<typeof this.snapshot> = { loadedAt: now, epoch: this.epoch, inputs };
    this.snapshot = mine;
    inputs.then(
      (loaded) => {
        mine.loaded = loaded;
      },
      () => {
        if (this.snapshot === mine) this.snapshot = undefined; // a failed read is not kept
      },
    );
    return inputs;
  }

  /**
   * The current snapshot if it is loaded and still current, without
   * waiting; undefined when `inputs` would read it again or is reading it.
   */
  now(): OfferInputs | undefined {
    const s = this.snapshot;
    const current = s?.loaded && s.epoch === this.epoch && performance.now() - s.loadedAt < OFFERS_MAX_AGE_MS;
    return current ? s.loaded : undefined;
  }

  /** What offers are made of has changed (call once the change has committed). */
  changed(): void {
    this.epoch++;
  }

  /** Marks the transaction `tx` as changing offers: the snapshot is replaced after it commits. */
  changesIn(tx: Queryable): void {
    afterCommit(tx, () => this.changed());
  }
}

/** GET /pricing without the image storage price: public prices with GPU totals and free GPUs on active nodes. */
export function publicPricing(
  { prices, nodes, usage }: OfferInputs,
  nowMs: () => number,
): Omit<PublicPricing, 'image_storage_gb_hourly'> {
  const updated = prices.reduce((m, p) => Math.max(m, p.updated_at.getTime()), 0);
  return {
    currency: CURRENCY,
    updated_at: new Date(updated || nowMs()).toISOString(),
    gpu_types: prices.map((p) => {
      const active = nodes.filter((n) => n.gpu_type === p.gpu_type && n.status === 'active');
      const { updated_at: _u, ...rec } = toPricingRecord(p);
      return {
        ...rec,
        total_gpus: active.reduce((s, n) => s + n.gpu_count, 0),
        available_gpus: active.reduce((s, n) => s + freeGpus(n, usage.get(n.node)), 0),
      };
    }),
  };
}

/** GET /search (docs/offers.md#search): one offer per active node with GPUs rentable for the rental type. */
export function searchOffers(
  f: SearchFilters,
  { prices, nodes, usage, ready }: OfferInputs,
): {
  items: Offer[];
  total: number;
} {
  const rental = f.rental_type ?? 'on_demand';
  const priceOf = new Map(prices.map((p) => [p.gpu_type, p]));
  const offers: Offer[] = [];
  for (const n of nodes) {
    const p = priceOf.get(n.gpu_type);
    if (!p || n.status !== 'active') continue;
    if (f.gpu_type && n.gpu_type !== f.gpu_type) continue;
    if (f.location && n.location.toLowerCase() !== f.location.toLowerCase()) continue;
    if (f.template_vmid !== undefined && !ready.has(`${n.node}:${f.template_vmid}`)) continue;
    const u = usage.get(n.node);
    const freeNow = freeGpus(n, u);
    const forOnDemand = freeNow + (u?.preemptible ?? 0);
    const rentable = rental === 'interruptible' ? freeNow : forOnDemand;
    if (rentable < 1) continue;
    if (f.min_gpus !== undefined && rentable < f.min_gpus) continue;
    const unitPrice = rental === 'interruptible' ? p.interruptible_rate_micros : p.gpu_price_hourly_micros;
    // Both sides are decimal numbers of the major unit: compared by value.
    if (f.max_price !== undefined && toAmount(unitPrice) > f.max_price) continue;
    offers.push({
      node: n.node,
      gpu_type: n.gpu_type,
      gpu_count: rentable,
      gpu_ram_mb: n.gpu_ram_mb,
      total_gpu_ram_mb: n.gpu_ram_mb * rentable,
      ram_gb: n.ram_gb,
      cpu_cores: n.cpu_cores,
      cpu_model: n.cpu_model,
      pcie_gen: n.pcie_gen,
      max_storage_gb: n.max_storage_gb,
      gpu_price_hourly: toAmount(p.gpu_price_hourly_micros),
      interruptible_rate: toAmount(p.interruptible_rate_micros),
      storage_price_hourly: toAmount(p.storage_price_gb_hourly_micros),
      total_price_hourly: toAmount(
        rentable * p.gpu_price_hourly_micros + MIN_STORAGE_GB * p.storage_price_gb_hourly_micros,
      ),
      reserved_discount_1mo: bpToPercent(p.reserved_discount_1mo_bp),
      reserved_discount_3mo: bpToPercent(p.reserved_discount_3mo_bp),
      reserved_discount_6mo: bpToPercent(p.reserved_discount_6mo_bp),
      available_ondemand: forOnDemand >= 1,
      available_interruptible: freeNow >= 1,
      available_reserved: forOnDemand >= 1,
      location: n.location,
      cluster_name: n.cluster_name,
    });
  }
  offers.sort((a, b) => a.gpu_price_hourly - b.gpu_price_hourly || (a.node < b.node ? -1 : a.node > b.node ? 1 : 0));
  return { items: offers.slice(f.offset, f.offset + f.limit), total: offers.length };
}
