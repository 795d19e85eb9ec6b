/**
 * The records of VMs as they were at a row version, for lists (see docs/architecture.md#lists-of-vms).
 *
 * A list asks the database for its page as ids and row versions, every time, and reads in full only the
 * rows whose version this process has not turned into a record yet. A record is only ever given for the
 * version it was made from, so a list shows every change the database has committed, from any instance, on
 * the next request: nothing here expires or needs to be told of a change.
 */
import type { VmRecord } from './records.js';

interface Entry {
  version: string;
  record: VmRecord;
}

export class VmRecordCache {
  private readonly entries = new Map<string, Entry>();

  /** `max`: how many VMs' records are kept; past it, the least recently listed go. */
  constructor(private readonly max = 10_000) {}

  /** The record of VM `id` at `version`, if this process has it. */
  get(id: string, version: string): VmRecord | undefined {
    const e = this.entries.get(id);
    if (e === undefined || e.version !== version) return undefined;
    // Most recently used last: Map keeps insertion order, so the first entry is the one to drop.
    this.entries.delete(id);
    this.entries.set(id, e);
    return e.record;
  }

  set(id: string, version: string, record: VmRecord): void {
    this.entries.delete(id);
    this.entries.set(id, { version, record: Object.freeze(record) });
    if (this.entries.size > this.max) this.entries.delete(this.entries.keys().next().value!);
  }

  get size(): number {
    return this.entries.size;
  }
}
