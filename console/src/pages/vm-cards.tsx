/**
 * The smaller cards of a VM's page: its label, auto-restart of an
 * interruptible VM, and its interruption history.
 */
import { useState } from 'preact/hooks';
import type { Vm } from '../../../src/sdk/index.js';
import { api, call, errorMessage } from '../api.js';
import {
  Action,
  Empty,
  ErrorText,
  Field,
  Form,
  Loaded,
  Status,
  Submit,
  Table,
  formatDuration,
  formatTime,
  notify,
  useAsync,
} from '../ui.js';

export function LabelCard({ vm, reload }: { vm: Vm; reload: () => Promise<void> }) {
  const [value, setValue] = useState(vm.instance_label ?? '');
  const save = async (label: string | null) => {
    const r = await call(
      api.POST('/vms/{vm_id}/set-label', { params: { path: { vm_id: vm.id } }, body: { instance_label: label } }),
    );
    notify(r.message);
    await reload();
  };
  return (
    <section class="card">
      <h2>Label</h2>
      <Form class="inline" onSubmit={() => save(value.trim() === '' ? null : value.trim())}>
        <Field
          label="Label"
          value={value}
          maxLength={32}
          placeholder="e.g. training-run-3"
          onInput={(e) => setValue(e.currentTarget.value)}
        />
        <Submit>Save label</Submit>
        {vm.instance_label ? (
          <Action
            onClick={async () => {
              setValue('');
              await save(null);
            }}
          >
            Clear label
          </Action>
        ) : null}
      </Form>
      <small class="muted">Up to 32 printable characters; leave empty and save to clear.</small>
    </section>
  );
}

export function AutoRestartCard({ vm, reload }: { vm: Vm; reload: () => Promise<void> }) {
  const [pending, setPending] = useState<boolean | undefined>(undefined);
  const [error, setError] = useState<string | undefined>(undefined);
  const checked = pending ?? vm.auto_restart === true;
  return (
    <section class="card">
      <h2>Auto-restart</h2>
      <label class="vm-toggle">
        <input
          type="checkbox"
          checked={checked}
          disabled={pending !== undefined}
          aria-busy={pending !== undefined}
          onChange={async (e) => {
            const on = e.currentTarget.checked;
            setPending(on);
            setError(undefined);
            try {
              const r = await call(
                api.POST('/vms/{vm_id}/set-auto-restart', {
                  params: { path: { vm_id: vm.id } },
                  body: { auto_restart: on },
                }),
              );
              notify(r.message);
              await reload();
            } catch (err) {
              const msg = errorMessage(err);
              setError(msg);
              notify(msg, 'error');
            } finally {
              setPending(undefined);
            }
          }}
        />{' '}
        Auto-restart after an interruption
      </label>
      <p class="muted">When on, an interrupted VM starts again by itself as soon as its node has the GPUs free.</p>
      <ErrorText error={error} />
    </section>
  );
}

export function Interruptions({ vm }: { vm: Vm }) {
  const history = useAsync(
    () =>
      call(api.GET('/vms/{vm_id}/interruption-history', { params: { path: { vm_id: vm.id }, query: { limit: 100 } } })),
    [vm.id, vm.status],
    30_000,
  );
  return (
    <section>
      <h2>Interruption history</h2>
      <Loaded value={history}>
        {(list) =>
          list.length === 0 ? (
            <Empty>No interruptions so far.</Empty>
          ) : (
            <Table
              head={
                <>
                  <th scope="col">Interrupted</th>
                  <th scope="col">Status</th>
                  <th scope="col">Restored</th>
                  <th scope="col" class="num">
                    Downtime
                  </th>
                  <th scope="col">Taken by VM</th>
                </>
              }
            >
              {list.map((i) => (
                <tr key={i.id}>
                  <td>{formatTime(i.preempted_at)}</td>
                  <td>
                    <Status status={i.status} />
                  </td>
                  <td>{formatTime(i.restored_at)}</td>
                  <td class="num">
                    {i.status === 'interrupted' ? (
                      <span class="muted">ongoing</span>
                    ) : (
                      formatDuration(i.downtime_seconds)
                    )}
                  </td>
                  <td>
                    <code>{i.preempted_by_vm_id}</code>
                  </td>
                </tr>
              ))}
            </Table>
          )
        }
      </Loaded>
    </section>
  );
}
