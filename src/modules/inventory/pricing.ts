/** Prices per GPU type (docs/offers.md#prices): the shipped defaults and the operator's changes. */
import type { Db, Queryable } from '../../db/db.js';
import type { Clock } from '../../clock.js';
import { AppError, notFound, validation } from '../../errors.js';
import { bpToPercent, percentToBp, toAmount, toMicros } from '../../money.js';
import * as repo from './repository.js';
import type { GpuType, PricingRow } from './repository.js';
import type { PricingRecord } from './schemas.js';

export const CURRENCY = 'USD';

/** Default prices shipped with the service. */
export const DEFAULT_PRICING: Omit<PricingRow, 'updated_at'>[] = [
  {
    gpu_type: '5090',
    gpu_ram_mb: 32_768,
    gpu_price_hourly_micros: 690_000,
    interruptible_rate_micros: 350_000,
    storage_price_gb_hourly_micros: 200,
    reserved_discount_1mo_bp: 1000,
    reserved_discount_3mo_bp: 2000,
    reserved_discount_6mo_bp: 3000,
  },
  {
    gpu_type: '4090',
    gpu_ram_mb: 24_576,
    gpu_price_hourly_micros: 440_000,
    interruptible_rate_micros: 220_000,
    storage_price_gb_hourly_micros: 200,
    reserved_discount_1mo_bp: 1000,
    reserved_discount_3mo_bp: 2000,
    reserved_discount_6mo_bp: 3000,
  },
  {
    gpu_type: 'pro6000',
    gpu_ram_mb: 98_304,
    gpu_price_hourly_micros: 1_690_000,
    interruptible_rate_micros: 850_000,
    storage_price_gb_hourly_micros: 200,
    reserved_discount_1mo_bp: 1000,
    reserved_discount_3mo_bp: 2000,
    reserved_discount_6mo_bp: 3000,
  },
];

export interface PricingUpdate {
  gpu_ram_mb?: number;
  gpu_price_hourly?: number;
  interruptible_rate?: number;
  storage_price_gb_hourly?: number;
  reserved_discount_1mo?: number;
  reserved_discount_3mo?: number;
  reserved_discount_6mo?: number;
}

export const toPricingRecord = (p: PricingRow): PricingRecord => ({
  gpu_type: p.gpu_type,
  gpu_ram_mb: p.gpu_ram_mb,
  gpu_price_hourly: toAmount(p.gpu_price_hourly_micros),
  interruptible_rate: toAmount(p.interruptible_rate_micros),
  storage_price_gb_hourly: toAmount(p.storage_price_gb_hourly_micros),
  reserved_discount_1mo: bpToPercent(p.reserved_discount_1mo_bp),
  reserved_discount_3mo: bpToPercent(p.reserved_discount_3mo_bp),
  reserved_discount_6mo: bpToPercent(p.reserved_discount_6mo_bp),
  updated_at: p.updated_at.toISOString(),
});

/** The answer to a create or start for a GPU type that has no price (pricingFor, or a price read earlier). */
export function noPrice(gpuType: string): AppError {
  return new AppError('gpu_unavailable', `No price is set for GPU type ${gpuType}`);
}

function moneyField(field: string, v: number | undefined, fallback: number): number {
  if (v === undefined) return fallback;
  const m = toMicros(v);
  if (m === null || m < 0) throw validation(`body.${field}`, 'must be a non-negative amount with at most 6 decimals');
  return m;
}

function percentField(field: string, v: number | undefined, fallback: number): number {
  if (v === undefined) return fallback;
  const bp = percentToBp(v);
  if (bp === null) throw validation(`body.${field}`, 'must be a percentage from 0 to 100 with at most 2 decimals');
  return bp;
}

/** The prices table. `changesOffers` marks a transaction that changes what offers are made of. */
export class Prices {
  constructor(
    private readonly db: Db,
    private readonly clock: Clock,
    private readonly changesOffers: (tx: Queryable) => void,
  ) {}

  /** Ships the default prices once; never overwrites an operator's prices. */
  async ensureDefaults(): Promise<void> {
    const now = this.clock.now();
    for (const p of DEFAULT_PRICING) {
      await repo.insertPricingIfMissing(this.db, p, now);
    }
  }

  /** The price of a GPU type, if one is set. */
  async find(q: Queryable, gpuType: string): Promise<PricingRow | undefined> {
    return repo.getPricing(q, gpuType);
  }

  async adminList(): Promise<PricingRecord[]> {
    return (await repo.listPricing(this.db)).map(toPricingRecord);
  }

  /** Fields not sent keep their value; read and written under a row lock so concurrent partial updates all land. */
  async put(gpuType: string, u: PricingUpdate): Promise<PricingRecord> {
    if (!(repo.GPU_TYPES as readonly string[]).includes(gpuType)) throw notFound(`GPU type ${gpuType}`);
    const row = await this.db.transaction(async (tx) => {
      this.changesOffers(tx);
      const current =
        (await repo.getPricing(tx, gpuType, true)) ?? DEFAULT_PRICING.find((p) => p.gpu_type === gpuType)!;
      return repo.upsertPricing(
        tx,
        {
          gpu_type: gpuType as GpuType,
          gpu_ram_mb: u.gpu_ram_mb ?? current.gpu_ram_mb,
          gpu_price_hourly_micros: moneyField('gpu_price_hourly', u.gpu_price_hourly, current.gpu_price_hourly_micros),
          interruptible_rate_micros: moneyField(
            'interruptible_rate',
            u.interruptible_rate,
            current.interruptible_rate_micros,
          ),
          storage_price_gb_hourly_micros: moneyField(
            'storage_price_gb_hourly',
            u.storage_price_gb_hourly,
            current.storage_price_gb_hourly_micros,
          ),
          reserved_discount_1mo_bp: percentField(
            'reserved_discount_1mo',
            u.reserved_discount_1mo,
            current.reserved_discount_1mo_bp,
          ),
          reserved_discount_3mo_bp: percentField(
            'reserved_discount_3mo',
            u.reserved_discount_3mo,
            current.reserved_discount_3mo_bp,
          ),
          reserved_discount_6mo_bp: percentField(
            'reserved_discount_6mo',
            u.reserved_discount_6mo,
            current.reserved_discount_6mo_bp,
          ),
        },
        this.clock.now(),
      );
    });
    return toPricingRecord(row);
  }
}
