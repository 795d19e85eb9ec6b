/**
 * Live events for GET /events/stream. One poller per process reads the
 * events every instance writes (the table is the bus, so an event written
 * through any instance reaches every stream within a poll) and hands each to
 * the streams whose reader and filters it matches. It runs only while a
 * stream is open.
 *
 * Events are numbered (`seq`) when they are inserted but become visible when
 * their transaction commits, which is not always in number order. So the
 * poller does not simply read past the highest number it saw: it keeps a
 * floor below which every number is settled (seen, or a gap older than
 * GRACE_MS: a rolled-back insert never fills its gap) and re-reads above it,
 * handing on each event once.
 *
 * Every poll also re-checks the open streams' credentials (`beforeDeliver`)
 * between reading the new events and handing them on.
 */
import type { FastifyBaseLogger } from 'fastify';
import type { Db } from '../../db/db.js';
import { Loop } from '../../background/loop.js';
import { eventsAfter, newestPositions, type EventReader, type EventRow } from './repository.js';

/** How often the poller reads new events. */
const POLL_MS = 500;
/** How long a missing number may still turn up (a transaction that had not committed yet). */
const GRACE_MS = 10_000;
/** Events read in one query; a full page is followed at once by the next. */
const PAGE = 1000;
/** When the poller starts, the numbers just below the newest are watched, in case some were not committed yet. */
const REWIND = 100;

export interface EventFilter {
  reader: EventReader;
  types: ReadonlySet<string> | null;
  vmId: string | null;
}

function matches(f: EventFilter, e: Pick<EventRow, 'type' | 'user_id' | 'vm_id'>): boolean {
  const mine = e.user_id === null ? f.reader.operator : Number(e.user_id) === f.reader.userId;
  return mine && (f.types === null || f.types.has(e.type)) && (f.vmId === null || e.vm_id === f.vmId);
}

interface Subscription extends EventFilter {
  deliver(e: EventRow): void;
}

export class EventHub {
  private readonly subs = new Set<Subscription>();
  /** Every event numbered at or below it has been handed on (or never will be). */
  private floor: number | null = null;
  /** Numbers above the floor: those seen, and those missing (since when). */
  private readonly seen = new Set<number>();
  private readonly missingSince = new Map<number, number>();
  private loop: Loop | undefined;
  private running: Promise<void> | undefined;

  constructor(
    private readonly db: Db,
    private readonly opts: {
      pollMs?: number;
      graceMs?: number;
      log?: FastifyBaseLogger;
      /**
       * Runs after each read of new events (at least once a poll) and before
       * they are handed on. A stream it unsubscribes gets none of them: the
       * streams' credentials are checked here, so that a stream never hands
       * on an event committed after its credential stopped working (what was
       * read had committed before the check began).
       */
      beforeDeliver?: () => Promise<void>;
    } = {},
  ) {}

  /**
   * Hands every event that matches `filter` and commits from now on to
   * `deliver` until the returned function is called. (Events already there
   * are the caller's to read, e.g. from a cursor: one may then come both
   * ways, once each.)
   */
  async subscribe(filter: EventFilter, deliver: (e: EventRow) => void): Promise<() => void> {
    // What is there now: the newest number, and which of the few below it are committed. Those
    // that are not may still commit, and are new when they do.
    const { newest: max, low, present } = await newestPositions(this.db, REWIND);
    if (this.floor === null) {
      this.floor = low;
      for (const seq of present) this.seen.add(seq);
      this.settle(max);
    }
    const isNew = (seq: number) => seq > max || (seq > low && !present.has(seq));
    const sub: Subscription = {
      ...filter,
      deliver: (e) => {
        if (isNew(Number(e.seq))) deliver(e);
      },
    };
    this.subs.add(sub);
    if (!this.loop) {
      this.loop = new Loop('event-streams', this.opts.pollMs ?? POLL_MS, () => this.tick(), this.opts.log);
      this.loop.start();
    }
    return () => {
      this.subs.delete(sub);
      if (this.subs.size === 0 && this.loop) {
        void this.loop.stop();
        this.loop = undefined;
        // Started afresh (from the newest events) by the next stream.
        this.floor = null;
        this.seen.clear();
        this.missingSince.clear();
      }
    };
  }

  /** One poll (skipped while the last still runs); exposed for tests. */
  async tick(): Promise<void> {
    if (this.running) return this.running;
    this.running = this.poll().finally(() => (this.running = undefined));
    return this.running;
  }

  private async poll(): Promise<void> {
    if (this.floor === null || this.subs.size === 0) return;
    const floor = this.floor;
    let cursor = floor;
    for (let first = true; ; first = false) {
      const rows = await eventsAfter(this.db, cursor, PAGE);
      if (first || rows.length) await this.opts.beforeDeliver?.();
      if (this.floor !== floor) return; // started afresh meanwhile (every stream closed)
      for (const e of rows) {
        const seq = Number(e.seq);
        if (this.seen.has(seq)) continue;
        this.seen.add(seq);
        this.missingSince.delete(seq);
        for (const s of this.subs) if (matches(s, e)) s.deliver(e);
      }
      if (rows.length) cursor = Number(rows[rows.length - 1]!.seq);
      if (rows.length < PAGE) break;
    }
    this.settle(cursor);
  }

  /** Moves the floor up over every number seen or given up on. */
  private settle(highest: number): void {
    const now = performance.now();
    const grace = this.opts.graceMs ?? GRACE_MS;
    let floor = this.floor!;
    for (let n = floor + 1; n <= highest; n++) {
      if (!this.seen.has(n) && !this.missingSince.has(n)) this.missingSince.set(n, now);
    }
    for (;;) {
      const next = floor + 1;
      if (this.seen.delete(next)) {
        floor = next;
        continue;
      }
      const since = this.missingSince.get(next);
      if (since !== undefined && now - since >= grace) {
        this.missingSince.delete(next);
        floor = next;
        continue;
      }
      break;
    }
    this.floor = floor;
  }
}
