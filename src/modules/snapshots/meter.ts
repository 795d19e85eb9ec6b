/**
 * Storage billing of customer images (docs/images.md#billing): a ready image is charged per GB-hour
 * from the moment it was ready until it is deleted, in periods that close at every multiple of the
 * billing interval (as VMs' do) and at the delete. Each period writes one image usage log and one
 * `charge` transaction; the unique key (image, period_end) makes a period chargeable once. Amount:
 * size in GB (10^9 bytes) x price per GB-hour x hours, in micro-units, rounded half-up. A charge that
 * takes the balance to zero or below stops the user's running VMs, like any other charge; images
 * themselves are never deleted for it.
 */
import type { Db, Queryable } from '../../db/db.js';
import { newOrderedId } from '../../ids.js';
import { formatAmount, storageCost, toAmount } from '../../money.js';
import * as ledger from '../billing/ledger.js';
import * as repo from './repository.js';
import type { UserImageRow } from './repository.js';

const BYTES_PER_GB = 1_000_000_000;
/** Images one close transaction charges. */
const BATCH = 500;

export class ImageMeter {
  constructor(
    private readonly db: Db,
    private readonly opts: { intervalS: number; priceGbHourMicros: number },
  ) {}

  get priceGbHourMicros(): number {
    return this.opts.priceGbHourMicros;
  }

  private get intervalMs(): number {
    return this.opts.intervalS * 1000;
  }

  /** The interval job: closes every boundary that has passed for every ready image. Returns periods written. */
  async closeDue(now: Date): Promise<number> {
    const lastBoundary = new Date(Math.floor(now.getTime() / this.intervalMs) * this.intervalMs);
    let written = 0;
    for (;;) {
      const n = await this.db.transaction(async (tx) => {
        const due = await repo.claimDueBilling(tx, lastBoundary, BATCH);
        let w = 0;
        for (const img of due) w += await this.closeUpTo(tx, img, lastBoundary.getTime(), false);
        return due.length === 0 ? -1 : w;
      });
      if (n < 0) return written;
      written += n;
    }
  }

  /**
   * Closes the image's periods up to `endMs`: one ending at every interval boundary in between, and
   * with `closeAtEnd` one ending at `endMs` itself (a delete). The image row must be locked.
   */
  async closeUpTo(tx: Queryable, img: UserImageRow, endMs: number, closeAtEnd: boolean): Promise<number> {
    if (!img.billed_until || img.size_bytes === null) return 0;
    const fromMs = img.billed_until.getTime();
    const ends: number[] = [];
    for (
      let b = Math.floor(fromMs / this.intervalMs) * this.intervalMs + this.intervalMs;
      b <= endMs;
      b += this.intervalMs
    )
      ends.push(b);
    if (closeAtEnd && endMs > fromMs && ends[ends.length - 1] !== endMs) ends.push(endMs);
    let startMs = fromMs;
    let written = 0;
    for (const periodEnd of ends) {
      if (await this.charge(tx, img, startMs, periodEnd)) written++;
      startMs = periodEnd;
    }
    if (ends.length > 0) await repo.updateImage(tx, img.id, { billed_until: new Date(startMs) });
    return written;
  }

  /** One period: its usage log and, when it costs anything, its charge. False when it was charged already. */
  private async charge(tx: Queryable, img: UserImageRow, startMs: number, endMs: number): Promise<boolean> {
    const size = img.size_bytes!;
    const price = this.opts.priceGbHourMicros;
    const cost = storageCost(size, price, endMs - startMs);
    const transactionId = cost > 0 ? newOrderedId() : null;
    const logged = await repo.insertUsageLog(tx, {
      id: newOrderedId(),
      image_id: img.id,
      user_id: img.user_id,
      period_start: new Date(startMs),
      period_end: new Date(endMs),
      size_bytes: size,
      price_gb_hourly_micros: price,
      cost_micros: cost,
      transaction_id: transactionId,
    });
    if (!logged || cost === 0) return logged;
    const gb = Math.round((size / BYTES_PER_GB) * 1000) / 1000;
    const t = await ledger.post(tx, {
      id: transactionId!,
      userId: img.user_id,
      type: 'charge',
      amountMicros: -cost,
      description: `Image storage: "${img.name}", ${gb} GB, ${new Date(startMs).toISOString().slice(0, 16).replace('T', ' ')} to ${new Date(endMs).toISOString().slice(11, 16)} UTC at ${formatAmount(price)}/GB-hour`,
      breakdown: {
        image_id: img.id,
        image_name: img.name,
        size_bytes: size,
        period_start: new Date(startMs).toISOString(),
        period_end: new Date(endMs).toISOString(),
        price_gb_hourly: toAmount(price),
        storage_cost: toAmount(cost),
      },
      now: new Date(endMs),
    });
    if (t.balance_after_micros <= 0) await ledger.markLowBalance(tx, img.user_id);
    return true;
  }
}
