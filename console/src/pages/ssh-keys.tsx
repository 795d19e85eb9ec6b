/** SSH keys: add a public key, see each key's SHA256 fingerprint, delete one. */
import { useState } from 'preact/hooks';
import type { paths } from '../../../src/sdk/index.js';
import { api, call } from '../api.js';
import {
  Confirm,
  Empty,
  Field,
  Form,
  Loaded,
  Page,
  RowButton,
  Submit,
  Table,
  formatTime,
  notify,
  useAsync,
} from '../ui.js';

type SshKey = paths['/ssh-keys']['get']['responses'][200]['content']['application/json'][number];

/** The API keeps at most this many keys per account (POST /ssh-keys answers 400 limit_exceeded above). */
const MAX_KEYS = 5;

export function SshKeys() {
  const keys = useAsync(() => call(api.GET('/ssh-keys', { params: { query: { limit: 100 } } })), []);
  const [publicKey, setPublicKey] = useState('');
  const [label, setLabel] = useState('');
  const [deleting, setDeleting] = useState<SshKey | undefined>(undefined);

  // POST /vms: ssh_key_id "defaults to your oldest SSH key". The list is newest first (in the order the
  // keys were added, which created_at cannot break when two share a time), so the oldest is the last.
  const oldest = keys.data?.[keys.data.length - 1];

  return (
    <Page title="SSH keys">
      <p class="muted">
        New VMs get the SSH key you pick at launch; if you do not pick one, they get your oldest key (marked default
        below). Deleting a key does not remove it from VMs that already have it.
      </p>
      <div class="card">
        <h2 class="card-heading">Add a key</h2>
        <Form
          aria-label="Add an SSH key"
          onSubmit={async () => {
            const l = label.trim();
            const k = await call(
              api.POST('/ssh-keys', { body: { ssh_public_key: publicKey.trim(), ...(l ? { label: l } : {}) } }),
            );
            setPublicKey('');
            setLabel('');
            notify(`SSH key "${k.label}" added.`);
            await keys.reload();
          }}
        >
          <Field
            label="Public key"
            multiline
            value={publicKey}
            onInput={(e) => setPublicKey(e.currentTarget.value)}
            placeholder="ssh-ed25519 AAAAC3Nza… you@laptop"
            spellcheck={false}
            autoComplete="off"
            required
            hint={
              <>
                The one line from your <code>.pub</code> file, e.g. <code>cat ~/.ssh/id_ed25519.pub</code>: ssh-ed25519,
                ssh-rsa (2048 bits or more) or ecdsa. Never paste the private key.
              </>
            }
          />
          <Field
            label="Label"
            value={label}
            onInput={(e) => setLabel(e.currentTarget.value)}
            maxLength={64}
            placeholder="e.g. laptop"
            hint="Optional. Defaults to the key's comment."
          />
          <div class="actions">
            <Submit>Add key</Submit>
          </div>
        </Form>
      </div>

      <h2>
        Your keys
        {keys.data ? (
          <span class="muted">
            {' '}
            ({keys.data.length} of {MAX_KEYS})
          </span>
        ) : null}
      </h2>
      <Loaded value={keys}>
        {(list) =>
          list.length === 0 ? (
            <Empty>No SSH key yet. Add one above: a VM that signs in with a key needs one.</Empty>
          ) : (
            <Table
              head={
                <>
                  <th>Label</th>
                  <th>Type</th>
                  <th>Fingerprint</th>
                  <th>Added</th>
                  <th aria-label="Actions" />
                </>
              }
            >
              {list.map((k) => (
                <tr key={k.id}>
                  <td>
                    {k.label}
                    {oldest?.id === k.id ? (
                      <>
                        {' '}
                        <span class="status" title="Used for new VMs when no key is chosen">
                          default
                        </span>
                      </>
                    ) : null}
                  </td>
                  <td>{k.key_type}</td>
                  <td>
                    <code class="fingerprint">{k.fingerprint}</code>
                  </td>
                  <td>{formatTime(k.created_at)}</td>
                  <td class="num">
                    <RowButton onClick={() => setDeleting(k)}>Delete</RowButton>
                  </td>
                </tr>
              ))}
            </Table>
          )
        }
      </Loaded>

      {deleting ? (
        <Confirm
          title="Delete this SSH key?"
          confirmLabel="Delete key"
          danger
          onClose={() => setDeleting(undefined)}
          onConfirm={async () => {
            await call(api.DELETE('/ssh-keys/{key_id}', { params: { path: { key_id: deleting.id } } }));
            notify(`Key "${deleting.label}" deleted.`);
            await keys.reload();
          }}
        >
          <p>
            <strong>{deleting.label}</strong> ({deleting.key_type}, added {formatTime(deleting.created_at)})
          </p>
          <p class="muted">New VMs will not get it. VMs created with it keep it until you remove it from them.</p>
        </Confirm>
      ) : null}
    </Page>
  );
}
