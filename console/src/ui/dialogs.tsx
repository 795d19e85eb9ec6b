/**
 * Modal dialogs: Confirm (one button that runs the action) and FormDialog (a
 * form whose success closes it). Escape and Cancel close both.
 */
import type { ComponentChildren } from 'preact';
import { useEffect, useRef } from 'preact/hooks';
import { Action, Form, Submit } from './forms.js';

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
