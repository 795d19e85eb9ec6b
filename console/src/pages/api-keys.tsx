/** API keys for scripts and CI: create one (its secret shown once), list them, revoke one. */
import { useState } from 'preact/hooks';
import type { paths } from '../../../src/sdk/index.js';
import { api, call } from '../api.js';
import {
  Confirm,
  CopyButton,
  Empty,
  Field,
  Form,
  Loaded,
  Page,
  RowButton,
  Status,
  Submit,
  Table,
  formatTime,
  notify,
  useAsync,
} from '../ui.js';

type ApiKey = paths['/api-keys']['get']['responses'][200]['content']['application/json'][number];
type NewApiKey = paths['/api-keys']['post']['responses'][201]['content']['application/json'];
type Scope = ApiKey['scope'];

const SCOPES: { value: Scope; title: string; text: string }[] = [
  {
    value: 'read_write',
    title: 'Full access',
    text: 'Everything you can do here: launch, stop and destroy VMs, manage keys and reservations.',
  },
  {
    value: 'read_only',
    title: 'Read only',
    text: 'Looks at VMs, SSH keys, reservations, billing and the account; changes nothing.',
  },
  {
    value: 'billing_only',
    title: 'Billing only',
    text: 'Balance, spend, usage and transactions, the account, and pricing a reservation. Nothing about VMs.',
  },
];

/** A date input's YYYY-MM-DD as the end of that day in the user's time zone, in ISO form. */
function endOfDay(day: string): string {
  const [y, m, d] = day.split('-').map(Number);
  return new Date(y!, (m ?? 1) - 1, d ?? 1, 23, 59, 59).toISOString();
}

function today(): string {
  const n = new Date();
  return `${n.getFullYear()}-${String(n.getMonth() + 1).padStart(2, '0')}-${String(n.getDate()).padStart(2, '0')}`;
}

export function ApiKeys() {
  const keys = useAsync(() => call(api.GET('/api-keys', { params: { query: { limit: 100 } } })), []);
  const [name, setName] = useState('');
  const [scope, setScope] = useState<Scope>('read_write');
  const [expires, setExpires] = useState('');
  const [created, setCreated] = useState<NewApiKey | undefined>(undefined);
  const [revoking, setRevoking] = useState<ApiKey | undefined>(undefined);

  return (
    <Page title="API keys">
      <p class="muted">
        API keys let scripts, the CLI and CI call the API as you. Send one as <code>Authorization: Bearer gpc_…</code>.
        Give each program its own key with the smallest scope it needs, so you can revoke it alone.
      </p>

      {created ? (
        <div class="card new-secret" role="region" aria-label="New API key">
          <h2 class="card-heading">Key “{created.name}” created</h2>
          <p class="warning" role="alert">
            Copy this key now and keep it somewhere safe. It will not be shown again: only a hash of it is stored.
          </p>
          <div class="secret">
            <code>{created.key}</code>
            <CopyButton text={created.key} label="Copy key" />
          </div>
          <div class="actions">
            <button type="button" class="btn btn-plain" onClick={() => setCreated(undefined)}>
              I have saved it
            </button>
          </div>
        </div>
      ) : null}

      <div class="card spaced">
        <h2 class="card-heading">Create a key</h2>
        <Form
          aria-label="Create an API key"
          onSubmit={async () => {
            const k = await call(
              api.POST('/api-keys', {
                body: { name: name.trim(), scope, ...(expires ? { expires_at: endOfDay(expires) } : {}) },
              }),
            );
            setCreated(k);
            setName('');
            setExpires('');
            notify(`API key "${k.name}" created. Copy it now.`);
            await keys.reload();
          }}
        >
          <Field
            label="Name"
            value={name}
            onInput={(e) => setName(e.currentTarget.value)}
            maxLength={64}
            placeholder="e.g. ci"
            autoComplete="off"
            required
            hint="For you: what uses this key."
          />
          <fieldset class="scope-choices">
            <legend>Scope</legend>
            <div class="choices">
              {SCOPES.map((s) => (
                <label key={s.value} class="choice scope-choice">
                  <input
                    type="radio"
                    name="scope"
                    value={s.value}
                    checked={scope === s.value}
                    onChange={() => setScope(s.value)}
                  />
                  <span>
                    <strong>{s.title}</strong> <code>{s.value}</code>
                    <br />
                    <small class="muted">{s.text}</small>
                  </span>
                </label>
              ))}
            </div>
          </fieldset>
          <Field
            label="Expires"
            type="date"
            value={expires}
            min={today()}
            onInput={(e) => setExpires(e.currentTarget.value)}
            hint="Optional. The key stops working at the end of this day (your time). Leave empty for a key that does not expire."
          />
          <div class="actions">
            <Submit>Create key</Submit>
          </div>
        </Form>
      </div>

      <h2>Your keys</h2>
      <p class="muted">Revoking a key stops it at once, and also revokes every key that was created with it.</p>
      <Loaded value={keys}>
        {(list) =>
          list.length === 0 ? (
            <Empty>No API key yet.</Empty>
          ) : (
            <Table
              head={
                <>
                  <th>Name</th>
                  <th>Scope</th>
                  <th>Key</th>
                  <th>Created</th>
                  <th>Expires</th>
                  <th>Last used</th>
                  <th aria-label="Actions" />
                </>
              }
            >
              {list.map((k) => {
                const expired = k.expires_at !== null && new Date(k.expires_at).getTime() <= Date.now();
                return (
                  <tr key={k.id}>
                    <td>{k.name}</td>
                    <td>
                      <code>{k.scope}</code>
                    </td>
                    <td>
                      <code>{k.prefix}…</code>
                    </td>
                    <td>{formatTime(k.created_at)}</td>
                    <td>
                      {expired ? (
                        <Status status="expired" />
                      ) : k.expires_at ? (
                        formatTime(k.expires_at)
                      ) : (
                        <span class="muted">never</span>
                      )}
                    </td>
                    <td>{k.last_used_at ? formatTime(k.last_used_at) : <span class="muted">never</span>}</td>
                    <td class="num">
                      <RowButton onClick={() => setRevoking(k)}>Revoke</RowButton>
                    </td>
                  </tr>
                );
              })}
            </Table>
          )
        }
      </Loaded>

      {revoking ? (
        <Confirm
          title="Revoke this API key?"
          confirmLabel="Revoke key"
          danger
          onClose={() => setRevoking(undefined)}
          onConfirm={async () => {
            await call(api.DELETE('/api-keys/{key_id}', { params: { path: { key_id: revoking.id } } }));
            if (created?.id === revoking.id) setCreated(undefined);
            notify(`API key "${revoking.name}" revoked.`);
            await keys.reload();
          }}
        >
          <p>
            <strong>{revoking.name}</strong> <code>{revoking.prefix}…</code> ({revoking.scope})
          </p>
          <p>
            Programs using it are refused at once. Every key that was created with this key is revoked too. This cannot
            be undone.
          </p>
        </Confirm>
      ) : null}
    </Page>
  );
}
