/**
 * A progress line on stderr for the CLI's long work over bytes (checksumming and uploading an image): on a
 * terminal one line redrawn in place with the percent, the amount and the speed; elsewhere (a log, a pipe) a
 * line at each tenth of the way, so a log shows it moving without a line per chunk.
 */
import type { Ctx } from './command.js';

/** 12345678 -> "11.8 MiB". */
export function bytesText(n: number): string {
  if (n < 1024) return `${n} bytes`;
  const units = ['KiB', 'MiB', 'GiB', 'TiB'];
  let v = n / 1024;
  let u = 0;
  while (v >= 1024 && u < units.length - 1) {
    v /= 1024;
    u++;
  }
  return `${v.toFixed(1)} ${units[u]}`;
}

export class Progress {
  private readonly tty = !!process.stderr.isTTY;
  private readonly started = Date.now();
  private lastDraw = 0;
  private lastTenth = -1;
  private drawn = false;
  /** Bytes done when this run started (a resumed upload's earlier bytes do not count for the speed). */
  private readonly base: number;

  constructor(
    private readonly ctx: Ctx,
    private readonly label: string,
    private readonly total: number,
    base = 0,
  ) {
    this.base = base;
  }

  private line(done: number): string {
    const pct = this.total > 0 ? Math.floor((done * 100) / this.total) : 100;
    const s = (Date.now() - this.started) / 1000;
    const speed = s > 0 ? (done - this.base) / 1e6 / s : 0;
    return `${this.label}: ${pct}% (${bytesText(done)} of ${bytesText(this.total)}, ${speed.toFixed(1)} MB/s)`;
  }

  /** `done` bytes of the total are done. */
  update(done: number): void {
    if (this.tty) {
      const now = Date.now();
      if (now - this.lastDraw < 200 && done < this.total) return;
      this.lastDraw = now;
      this.drawn = true;
      process.stderr.write(`\r\x1b[K${this.line(done)}`);
      return;
    }
    const tenth = this.total > 0 ? Math.floor((done * 10) / this.total) : 10;
    if (tenth === this.lastTenth) return;
    this.lastTenth = tenth;
    this.ctx.err(this.line(done));
  }

  /** A note (a retry) on a line of its own, the progress line going on below it. */
  note(text: string): void {
    if (this.tty && this.drawn) process.stderr.write('\r\x1b[K');
    this.ctx.err(text);
    this.lastDraw = 0;
  }

  /** Ends the line (on a terminal). */
  end(done?: number): void {
    if (done !== undefined) this.update(done);
    if (this.tty && this.drawn) process.stderr.write('\n');
    this.drawn = false;
  }
}
