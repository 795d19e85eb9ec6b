/**
 * How values read on screen: money, points in time (also inside the API's
 * texts), durations, VM names, status badges, and copy buttons.
 */
import type { ComponentChildren } from 'preact';
import { useState } from 'preact/hooks';

const moneyFormats = new Map<string, Intl.NumberFormat>();

/** An amount in the major unit, as money: `$42.50`; `precise` keeps up to 6 decimals (hourly rates). */
export function formatMoney(value: number, currency = 'USD', precise = false): string {
  const key = `${currency}:${precise}`;
  let f = moneyFormats.get(key);
  if (!f) {
    f = new Intl.NumberFormat(undefined, {
      style: 'currency',
      currency,
      minimumFractionDigits: 2,
      maximumFractionDigits: precise ? 6 : 2,
    });
    moneyFormats.set(key, f);
  }
  return f.format(value);
}

export function Money({
  value,
  currency = 'USD',
  precise = false,
  perHour = false,
}: {
  value: number;
  currency?: string;
  precise?: boolean;
  perHour?: boolean;
}) {
  return (
    <span class="money">
      {formatMoney(value, currency, precise)}
      {perHour ? <span class="unit">/h</span> : null}
    </span>
  );
}

/**
 * How the console shows every point in time: in the browser's language and time zone, to the second,
 * with the zone named (the API's own texts and the usage chart speak UTC), e.g. "Nov 29, 2026,
 * 12:27:46 AM UTC". Whatever is not a time is shown as it came.
 */
const timeFormat = new Intl.DateTimeFormat(undefined, {
  year: 'numeric',
  month: 'short',
  day: 'numeric',
  hour: 'numeric',
  minute: '2-digit',
  second: '2-digit',
  timeZoneName: 'short',
});

export function formatTime(iso: string | null | undefined): string {
  if (!iso) return '—';
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? iso : timeFormat.format(d);
}

/** An ISO 8601 instant as the API writes them in its texts: a date, a time and a zone (Z or an offset). */
const ISO_INSTANT = /\b\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(?::\d{2}(?:\.\d{1,9})?)?(?:Z|[+-]\d{2}:?\d{2})/g;

/** A text with each ISO instant in it replaced by formatTime's reading (for a title or other plain text). */
export function formatInstants(text: string): string {
  return text.replace(ISO_INSTANT, (m) => formatTime(m));
}

/**
 * A text from the API (a transaction's description, a message) with its ISO instants shown as
 * formatTime does, each in a <time> that keeps the exact instant in its datetime and title.
 */
export function WithTimes({ text }: { text: string }) {
  const parts: ComponentChildren[] = [];
  let last = 0;
  for (const m of text.matchAll(ISO_INSTANT)) {
    const at = m.index ?? 0;
    if (at > last) parts.push(text.slice(last, at));
    const readable = formatTime(m[0]);
    parts.push(
      readable === m[0] ? (
        m[0]
      ) : (
        <time key={at} dateTime={m[0]} title={m[0]}>
          {readable}
        </time>
      ),
    );
    last = at + m[0].length;
  }
  if (last === 0) return <>{text}</>;
  if (last < text.length) parts.push(text.slice(last));
  return <>{parts}</>;
}

/**
 * A length of time, to the second under a minute, to the minute under an hour, then in hours and
 * minutes: "36 s", "12 min", "3 h 5 min". One rounding for every duration shown, so a total and
 * its parts read alike.
 */
export function formatDuration(seconds: number | null): string {
  if (seconds === null || !Number.isFinite(seconds)) return '—';
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s} s`;
  const m = Math.round(s / 60);
  if (m < 60) return `${m} min`;
  const h = Math.floor(m / 60);
  return m % 60 ? `${h} h ${m % 60} min` : `${h} h`;
}

/** How a VM is named to people, as the CLI and the API's messages name it: its vmid, and its label if it has one. */
export function vmName(vm: { vmid: number; instance_label?: string | null }): string {
  return vm.instance_label ? `VM ${vm.vmid} · ${vm.instance_label}` : `VM ${vm.vmid}`;
}

/** A VM, node or reservation status, spelled exactly as the API does. */
export function Status({ status }: { status: string }) {
  return <span class={`status status-${status}`}>{status}</span>;
}

export function CopyButton({ text, label = 'Copy' }: { text: string; label?: string }) {
  const [done, setDone] = useState(false);
  return (
    <button
      type="button"
      class="btn btn-plain btn-small"
      onClick={async () => {
        try {
          await navigator.clipboard.writeText(text);
        } catch {
          // Without the async clipboard (a plain-HTTP origin), copy through a selection.
          const t = document.createElement('textarea');
          t.value = text;
          document.body.appendChild(t);
          t.select();
          document.execCommand('copy');
          t.remove();
        }
        setDone(true);
        setTimeout(() => setDone(false), 1500);
      }}
    >
      {done ? 'Copied' : label}
    </button>
  );
}
