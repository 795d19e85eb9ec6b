/** Output for people (aligned tables, key/value lists) and the errors of the client commands. */

export class CliUsageError extends Error {
  constructor(
    message: string,
    /** The command whose help to point to. */
    readonly command?: string,
  ) {
    super(message);
    this.name = 'CliUsageError';
  }
}

/** A refusal that is not the API's (aborted confirmation, ssh failing): exit 1. */
export class CliFailure extends Error {
  constructor(
    message: string,
    readonly exitCode = 1,
  ) {
    super(message);
  }
}

export type Cell = string | number | boolean | null | undefined;

export function fmt(v: Cell): string {
  if (v === null || v === undefined) return '-';
  if (typeof v === 'boolean') return v ? 'yes' : 'no';
  return String(v);
}

export function money(v: number | null | undefined, digits = 2): string {
  if (v === null || v === undefined) return '-';
  return `$${v.toFixed(digits)}`;
}

/** An aligned table; numbers (and money) are right-aligned. */
export function table(headers: string[], rows: Cell[][]): string {
  const cells = rows.map((r) => r.map(fmt));
  // Numbers and money are right-aligned (not names that look like numbers, such as GPU "4090").
  const right = headers.map(
    (_, i) =>
      rows.length > 0 &&
      rows.some((r) => r[i] != null) &&
      rows.every((r) => r[i] == null || typeof r[i] === 'number' || /^-?\$\d/.test(fmt(r[i]))),
  );
  const widths = headers.map((h, i) => Math.max(h.length, ...cells.map((r) => (r[i] ?? '').length)));
  const line = (r: string[]) =>
    r
      .map((c, i) => (right[i] ? c.padStart(widths[i]!) : i === r.length - 1 ? c : c.padEnd(widths[i]!)))
      .join('  ')
      .trimEnd();
  return [line(headers), ...cells.map(line)].join('\n');
}

/** "Key:  value" lines, aligned. */
export function keyValues(pairs: [string, Cell][]): string {
  const w = Math.max(...pairs.map(([k]) => k.length)) + 1;
  return pairs.map(([k, v]) => `${(k + ':').padEnd(w)}  ${fmt(v)}`).join('\n');
}
