/**
 * Operator page: every user's VMs, filtered by owner, node and status, with
 * the ledger check above them (every balance, transaction, reservation and
 * usage charge adds up, or the problems it found).
 */
import { useState } from 'preact/hooks';
import type { paths } from '../../../src/sdk/index.js';
import { VM_STATUSES } from '../../../src/sdk/schema.js';
import { api, call, callWithTotal } from '../api.js';
import {
  Action,
  ErrorText,
  Field,
  Loaded,
  Money,
  Page,
  PagedTable,
  Select,
  Status,
  formatTime,
  parseIntField,
  useAsync,
  useDebounced,
  usePaged,
  vmName,
} from '../ui.js';

type AdminVm = paths['/admin/vms']['get']['responses'][200]['content']['application/json'][number];
type VmStatus = NonNullable<NonNullable<paths['/admin/vms']['get']['parameters']['query']>['status']>;

const RENTAL: Record<AdminVm['rental_type'], string> = {
  on_demand: 'on-demand',
  reserved: 'reserved',
  interruptible: 'interruptible',
};
const PAGE = 50;

/** Emails by user id, kept for the session: the VM list names owners by id only. */
const emails = new Map<number, string>();

async function ownerEmails(vms: AdminVm[]): Promise<void> {
  const missing = [...new Set(vms.map((v) => v.user_id))].filter((id) => !emails.has(id));
  await Promise.all(
    missing.map(async (id) => {
      try {
        const u = await call(api.GET('/admin/users/{user_id}', { params: { path: { user_id: id } } }));
        emails.set(id, u.email);
      } catch {
        // A deleted or unreadable account: the id alone is shown.
      }
    }),
  );
}

export function AllVms(_props: Record<string, unknown>) {
  const [userText, setUserText] = useState('');
  const [nodeText, setNodeText] = useState('');
  const [status, setStatus] = useState<'' | VmStatus>('');
  const [destroyed, setDestroyed] = useState(false);
  const userId = parseIntField(useDebounced(userText, 300));
  const node = useDebounced(nodeText.trim(), 300);
  const badUser = userId !== undefined && (Number.isNaN(userId) || userId < 1);

  const nodes = useAsync(() => call(api.GET('/admin/nodes', { params: { query: { limit: 100 } } })), []);
  const vms = usePaged(
    async (page) => {
      const query = {
        ...page,
        ...(userId !== undefined && !badUser ? { user_id: userId } : {}),
        ...(node ? { node } : {}),
        ...(status ? { status } : {}),
        ...(destroyed ? { include_destroyed: true } : {}),
      };
      const list = await callWithTotal(api.GET('/admin/vms', { params: { query } }));
      await ownerEmails(list.items);
      return list;
    },
    { limit: PAGE, filters: [userId, node, status, destroyed], pollMs: 5000 },
  );

  return (
    <Page title="Every VM">
      <LedgerCheck />
      <h2>Every user's VMs</h2>
      <form class="inline adm-toolbar" aria-label="Filter VMs" onSubmit={(e) => e.preventDefault()}>
        <fieldset>
          <Field
            label="User id"
            inputMode="numeric"
            autoComplete="off"
            placeholder="any"
            value={userText}
            onInput={(e) => setUserText((e.target as HTMLInputElement).value)}
            aria-invalid={badUser ? 'true' : undefined}
          />
          {nodes.data && nodes.data.length > 0 ? (
            <Select
              label="Node"
              value={nodeText}
              onChange={setNodeText}
              options={[{ value: '', label: 'Any node' }, ...nodes.data.map((n) => ({ value: n.node, label: n.node }))]}
            />
          ) : (
            <Field
              label="Node"
              autoComplete="off"
              placeholder="any"
              value={nodeText}
              onInput={(e) => setNodeText((e.target as HTMLInputElement).value)}
            />
          )}
          <Select
            label="Status"
            value={status}
            onChange={(s) => setStatus(s as '' | VmStatus)}
            options={[{ value: '', label: 'Any status' }, ...VM_STATUSES.map((s) => ({ value: s, label: s }))]}
          />
          <label class="adm-check">
            <input
              type="checkbox"
              checked={destroyed}
              onChange={(e) => setDestroyed((e.target as HTMLInputElement).checked)}
            />
            Include destroyed
          </label>
          {userText || nodeText || status || destroyed ? (
            <button
              type="button"
              class="btn btn-plain"
              onClick={() => {
                setUserText('');
                setNodeText('');
                setStatus('');
                setDestroyed(false);
              }}
            >
              Clear filters
            </button>
          ) : null}
        </fieldset>
      </form>
      {badUser ? <ErrorText error="A user id is a whole number from 1 up." /> : null}
      <PagedTable
        list={vms}
        noun="VMs"
        pagerWhenEmpty
        empty={
          vms.offset > 0
            ? 'Nothing on this page.'
            : userId || node || status || destroyed
              ? 'No VM matches these filters.'
              : 'No VMs yet.'
        }
        head={
          <>
            <th>VM</th>
            <th>Owner</th>
            <th>Node</th>
            <th>GPUs</th>
            <th>Status</th>
            <th>Rental</th>
            <th class="num">Rate</th>
            <th>Created</th>
          </>
        }
        row={(v) => (
          <tr key={v.id}>
            <td>
              {vmName(v)}
              <div class="muted adm-small">
                <code title={v.id}>{v.id.slice(0, 8)}</code> · #{v.vmid}
              </div>
            </td>
            <td>
              <button
                type="button"
                class="adm-link"
                title="Show only this user's VMs"
                onClick={() => setUserText(String(v.user_id))}
              >
                {emails.get(v.user_id) ?? `user ${v.user_id}`}
              </button>
              {emails.has(v.user_id) ? <div class="muted adm-small">#{v.user_id}</div> : null}
            </td>
            <td>
              <button
                type="button"
                class="adm-link"
                title="Show only this node's VMs"
                onClick={() => setNodeText(v.node)}
              >
                {v.node}
              </button>
            </td>
            <td>
              {v.gpu_count} × {v.gpu_type}
              <div class="muted adm-small">
                {v.ram_gb} GB · {v.cpu_cores} cores · {v.storage_gb} GB disk
              </div>
            </td>
            <td>
              <Status status={v.status} />
              {v.last_error ? (
                <div class="muted adm-small adm-truncate" title={v.last_error}>
                  {v.last_error}
                </div>
              ) : null}
            </td>
            <td>{RENTAL[v.rental_type]}</td>
            <td class="num">
              <Money value={v.hourly_rate} precise perHour />
            </td>
            <td>{formatTime(v.created_at)}</td>
          </tr>
        )}
      />
    </Page>
  );
}

/** GET /admin/ledger-check: "Ledger sound" with its time, or every problem it found. */
function LedgerCheck() {
  const check = useAsync(() => call(api.GET('/admin/ledger-check')), []);
  return (
    <section class="adm-ledger" aria-labelledby="ledger-title">
      <div class="adm-ledger-head">
        <h2 id="ledger-title">Ledger check</h2>
        <Action onClick={() => check.reload()}>Check again</Action>
      </div>
      <Loaded value={check}>
        {(r) =>
          r.ok ? (
            <p class="adm-ledger-ok" role="status">
              <span class="status status-active">Ledger sound</span>{' '}
              <span class="muted">checked {formatTime(r.checked_at)}</span>
            </p>
          ) : (
            <div class="warning" role="alert">
              <strong>
                The ledger check found {r.problems.length} problem{r.problems.length === 1 ? '' : 's'}
              </strong>{' '}
              <span>(checked {formatTime(r.checked_at)}):</span>
              <ul>
                {r.problems.map((p, i) => (
                  <li key={i}>
                    <strong>{p.kind}</strong> · {p.email} (user {p.user_id}): {p.detail}
                  </li>
                ))}
              </ul>
            </div>
          )
        }
      </Loaded>
    </section>
  );
}
