/**
 * The console's small component kit: links, forms that cannot double-submit,
 * buttons that show their work, tables, money, status badges, a confirm
 * dialog, copy buttons and notices. Plain elements with their native roles,
 * so everything is reachable by keyboard and named for screen readers.
 */
import type { ComponentChildren, InputHTMLAttributes, TextareaHTMLAttributes } from 'preact';
import { useCallback, useEffect, useRef, useState } from 'preact/hooks';
import { BASE, navigate } from './router.js';
import { errorMessage } from './api.js';

// ---------------------------------------------------------------------------
// Navigation

export function Link(props: {
  href: string;
  children: ComponentChildren;
  class?: string;
  title?: string;
  'aria-current'?: 'page' | undefined;
}) {
  const { href, children, ...rest } = props;
  return (
    <a
      {...rest}
      href={BASE + href}
      onClick={(e) => {
        if (e.defaultPrevented || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
        e.preventDefault();
        navigate(href);
      }}
    >
      {children}
    </a>
  );
}

// ---------------------------------------------------------------------------
// Data loading

export interface Async<T> {
  data: T | undefined;
  error: string | undefined;
  loading: boolean;
  reload: () => Promise<void>;
}

/**
 * Runs `load` now and whenever `deps` change; with `pollMs`, again every
 * pollMs while the page is visible (live status without reloading).
 */
export function useAsync<T>(load: () => Promise<T>, deps: unknown[] = [], pollMs?: number): Async<T> {
  const [data, setData] = useState<T | undefined>(undefined);
  const [error, setError] = useState<string | undefined>(undefined);
  const [loading, setLoading] = useState(true);
  const seq = useRef(0);
  const loadRef = useRef(load);
  loadRef.current = load;
  const reload = useCallback(async () => {
    const mine = ++seq.current;
    try {
      const v = await loadRef.current();
      if (mine !== seq.current) return;
      setData(v);
      setError(undefined);
    } catch (e) {
      if (mine !== seq.current) return;
      setError(errorMessage(e));
    } finally {
      if (mine === seq.current) setLoading(false);
    }
  }, []);
  useEffect(() => {
    setLoading(true);
    void reload();
    if (!pollMs) return;
    const t = setInterval(() => {
      if (document.visibilityState === 'visible') void reload();
    }, pollMs);
    return () => clearInterval(t);
    // Runs again only when the listed values change, not on every value it reads.
  }, deps);
  return { data, error, loading, reload };
}

// ---------------------------------------------------------------------------
// Notices

type NoticeKind = 'ok' | 'error' | 'info';
interface Notice {
  id: number;
  kind: NoticeKind;
  text: string;
}
const noticeListeners = new Set<(n: Notice[]) => void>();
let notices: Notice[] = [];
let noticeSeq = 0;

/** Shows a short message at the top of the page (errors stay until dismissed). */
export function notify(text: string, kind: NoticeKind = 'ok'): void {
  const n = { id: ++noticeSeq, kind, text };
  notices = [...notices.slice(-3), n];
  noticeListeners.forEach((f) => f(notices));
  if (kind !== 'error') setTimeout(() => dismiss(n.id), 5000);
}

function dismiss(id: number): void {
  notices = notices.filter((n) => n.id !== id);
  noticeListeners.forEach((f) => f(notices));
}

export function Notices() {
  const [list, setList] = useState<Notice[]>(notices);
  useEffect(() => {
    noticeListeners.add(setList);
    return () => noticeListeners.delete(setList);
  }, []);
  return (
    <div class="notices" aria-live="polite">
      {list.map((n) => (
        <div key={n.id} class={`notice notice-${n.kind}`} role={n.kind === 'error' ? 'alert' : 'status'}>
          <span>
            <WithTimes text={n.text} />
          </span>
          <button type="button" class="link" aria-label="Dismiss" onClick={() => dismiss(n.id)}>
            ×
          </button>
        </div>
      ))}
    </div>
  );
}

export function ErrorText({ error }: { error: string | undefined }) {
  if (!error) return null;
  return (
    <p class="error" role="alert">
      <WithTimes text={error} />
    </p>
  );
}

// ---------------------------------------------------------------------------
// Forms and buttons

/**
 * A form whose submit runs once at a time: a second click or Enter while the
 * first request runs does nothing. Shows the API's message on failure.
 */
export function Form(props: {
  onSubmit: () => Promise<void>;
  children: ComponentChildren;
  class?: string;
  'aria-label'?: string;
}) {
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | undefined>(undefined);
  const running = useRef(false);
  return (
    <form
      class={props.class}
      aria-label={props['aria-label']}
      aria-busy={busy}
      // The API checks every field and says what is wrong: let it, so its message is the one shown.
      noValidate
      onSubmit={async (e) => {
        e.preventDefault();
        if (running.current) return;
        running.current = true;
        setBusy(true);
        setError(undefined);
        try {
          await props.onSubmit();
        } catch (err) {
          setError(errorMessage(err));
        } finally {
          running.current = false;
          setBusy(false);
        }
      }}
    >
      <fieldset disabled={busy}>{props.children}</fieldset>
      <ErrorText error={error} />
    </form>
  );
}

/** A submit button that shows a spinner while its form works. */
export function Submit({
  children,
  variant = 'primary',
}: {
  children: ComponentChildren;
  variant?: 'primary' | 'danger' | 'plain';
}) {
  return (
    <button type="submit" class={`btn btn-${variant}`}>
      {children}
    </button>
  );
}

/**
 * A button for one action (stop, start, revoke...). Runs once at a time,
 * shows a spinner, and reports a failure as a notice with the API's message.
 */
export function Action(props: {
  onClick: () => Promise<unknown>;
  children: ComponentChildren;
  variant?: 'primary' | 'danger' | 'plain';
  /** The compact size for buttons in table rows. */
  small?: boolean;
  disabled?: boolean;
  title?: string;
  'aria-label'?: string;
}) {
  const [busy, setBusy] = useState(false);
  const running = useRef(false);
  return (
    <button
      type="button"
      class={`btn btn-${props.variant ?? 'plain'}${props.small ? ' btn-small' : ''}`}
      disabled={props.disabled || busy}
      aria-busy={busy}
      title={props.title}
      aria-label={props['aria-label']}
      onClick={async () => {
        if (running.current) return;
        running.current = true;
        setBusy(true);
        try {
          await props.onClick();
        } catch (e) {
          notify(errorMessage(e), 'error');
        } finally {
          running.current = false;
          setBusy(false);
        }
      }}
    >
      {busy ? <span class="spinner" aria-hidden="true" /> : null}
      {props.children}
    </button>
  );
}

let fieldSeq = 0;

/** A labelled input; the label names it for `getByLabel` and screen readers. */
export function Field(
  props: { label: string; hint?: ComponentChildren; multiline?: boolean } & Omit<
    InputHTMLAttributes<HTMLInputElement>,
    'label'
  >,
) {
  const { label, hint, multiline, ...input } = props;
  const id = useRef(`f${++fieldSeq}`).current;
  return (
    <div class="field">
      <label for={id}>{label}</label>
      {multiline ? (
        <textarea id={id} {...(input as unknown as TextareaHTMLAttributes<HTMLTextAreaElement>)} />
      ) : (
        <input id={id} {...input} />
      )}
      {hint ? (
        <small class="hint" id={`${id}-hint`}>
          {hint}
        </small>
      ) : null}
    </div>
  );
}

export function Select(props: {
  label: string;
  value: string;
  onChange: (v: string) => void;
  options: { value: string; label: string }[];
  hint?: string;
}) {
  const id = useRef(`s${++fieldSeq}`).current;
  return (
    <div class="field">
      <label for={id}>{props.label}</label>
      <select id={id} value={props.value} onChange={(e) => props.onChange((e.target as HTMLSelectElement).value)}>
        {props.options.map((o) => (
          <option key={o.value} value={o.value}>
            {o.label}
          </option>
        ))}
      </select>
      {props.hint ? <small class="hint">{props.hint}</small> : null}
    </div>
  );
}

// ---------------------------------------------------------------------------
// Dialogs

/** A ref for a <dialog> that opens as a modal when it mounts (Escape and Cancel close it). */
function useModal() {
  const ref = useRef<HTMLDialogElement>(null);
  useEffect(() => {
    const d = ref.current;
    if (d && !d.open) d.showModal();
  }, []);
  return ref;
}

/**
 * A modal confirmation. The confirming button carries `confirmLabel`; while
 * the dialog is open the caller should not render another button with the
 * same name.
 */
export function Confirm(props: {
  title: string;
  children: ComponentChildren;
  confirmLabel: string;
  onConfirm: () => Promise<unknown>;
  onClose: () => void;
  danger?: boolean;
}) {
  const ref = useModal();
  return (
    <dialog ref={ref} class="dialog" aria-label={props.title} onClose={props.onClose} onCancel={props.onClose}>
      <h2>{props.title}</h2>
      <div class="dialog-body">{props.children}</div>
      <div class="actions">
        <button type="button" class="btn btn-plain" onClick={() => ref.current?.close()}>
          Cancel
        </button>
        <Action
          variant={props.danger ? 'danger' : 'primary'}
          onClick={async () => {
            await props.onConfirm();
            ref.current?.close();
          }}
        >
          {props.confirmLabel}
        </Action>
      </div>
    </dialog>
  );
}

// ---------------------------------------------------------------------------
// Display

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

export function Page(props: { title: string; actions?: ComponentChildren; children: ComponentChildren }) {
  useEffect(() => {
    document.title = `${props.title} · gpucloud`;
  }, [props.title]);
  return (
    <section class="page">
      <header class="page-header">
        <h1>{props.title}</h1>
        {props.actions ? <div class="actions">{props.actions}</div> : null}
      </header>
      {props.children}
    </section>
  );
}

/** Loading, error or the content of an async value. */
export function Loaded<T>({ value, children }: { value: Async<T>; children: (data: T) => ComponentChildren }) {
  if (value.data === undefined) {
    if (value.error) return <ErrorText error={value.error} />;
    return (
      <p class="muted" role="status">
        <span class="spinner" aria-hidden="true" /> Loading…
      </p>
    );
  }
  return (
    <>
      {value.error ? <ErrorText error={value.error} /> : null}
      {children(value.data)}
    </>
  );
}

export function Empty({ children }: { children: ComponentChildren }) {
  return <p class="empty">{children}</p>;
}

/** "1–50 of 123" with Previous / Next; nothing when everything fits on one page. */
export function Pager(props: {
  offset: number;
  limit: number;
  total: number;
  shown: number;
  onOffset: (o: number) => void;
  noun: string;
}) {
  const { offset, limit, total, shown, onOffset, noun } = props;
  if (total <= limit && offset === 0) return null;
  return (
    <nav class="actions adm-pager" aria-label={`Pages of ${noun}`}>
      <span class="muted">
        {shown === 0 ? `${total} ${noun} in all` : `${offset + 1}–${offset + shown} of ${total} ${noun}`}
      </span>
      <button
        type="button"
        class="btn btn-plain btn-small"
        disabled={offset === 0}
        onClick={() => onOffset(Math.max(0, offset - limit))}
      >
        Previous
      </button>
      <button
        type="button"
        class="btn btn-plain btn-small"
        disabled={offset + limit >= total}
        onClick={() => onOffset(offset + limit)}
      >
        Next
      </button>
    </nav>
  );
}

/**
 * A modal dialog holding a form: the submit runs once at a time, the API's
 * message shows under the form, and a success closes the dialog.
 */
export function FormDialog(props: {
  title: string;
  submitLabel: string;
  onSubmit: () => Promise<unknown>;
  onClose: () => void;
  children: ComponentChildren;
  danger?: boolean;
}) {
  const ref = useModal();
  return (
    <dialog ref={ref} class="dialog" aria-label={props.title} onClose={props.onClose} onCancel={props.onClose}>
      <h2>{props.title}</h2>
      <Form
        aria-label={props.title}
        onSubmit={async () => {
          await props.onSubmit();
          ref.current?.close();
        }}
      >
        {props.children}
        <div class="actions adm-dialog-actions">
          <button type="button" class="btn btn-plain" onClick={() => ref.current?.close()}>
            Cancel
          </button>
          <Submit variant={props.danger ? 'danger' : 'primary'}>{props.submitLabel}</Submit>
        </div>
      </Form>
    </dialog>
  );
}

/** An integer from a form field; undefined for blank, NaN for anything else that is not a whole number. */
export function parseIntField(v: string): number | undefined {
  const t = v.trim();
  if (t === '') return undefined;
  return /^-?\d+$/.test(t) ? Number(t) : NaN;
}

/** Debounces a changing value (search boxes). */
export function useDebounced<T>(value: T, ms: number): T {
  const [v, setV] = useState(value);
  useEffect(() => {
    const t = setTimeout(() => setV(value), ms);
    return () => clearTimeout(t);
  }, [value, ms]);
  return v;
}
