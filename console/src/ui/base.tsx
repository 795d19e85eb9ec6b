/**
 * The frame of every page: links that route inside the console, data that
 * loads (and reloads) with its loading and error states, the page header,
 * and notices.
 */
import type { ComponentChildren } from 'preact';
import { useCallback, useEffect, useRef, useState } from 'preact/hooks';
import { BASE, navigate } from '../router.js';
import { errorMessage } from '../api.js';
import { WithTimes } from './display.js';

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
