/**
 * Forms that cannot double-submit, labelled fields, and buttons: Submit for a
 * form, Action for a button that runs one request and shows its work,
 * RowButton for a compact button in a table row that opens a dialog.
 */
import type { ComponentChildren, InputHTMLAttributes, TextareaHTMLAttributes } from 'preact';
import { useEffect, useRef, useState } from 'preact/hooks';
import { errorMessage } from '../api.js';
import { ErrorText, notify } from './base.js';

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

/** A compact button in a table row that only opens something (a dialog, a page): it sends no request itself. */
export function RowButton(props: {
  onClick: () => void;
  children: ComponentChildren;
  variant?: 'primary' | 'danger' | 'plain';
  title?: string;
  'aria-label'?: string;
}) {
  return (
    <button
      type="button"
      class={`btn btn-${props.variant ?? 'plain'} btn-small`}
      title={props.title}
      aria-label={props['aria-label']}
      onClick={props.onClick}
    >
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
