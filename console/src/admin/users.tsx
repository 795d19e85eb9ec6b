/**
 * Operator pages: users. Search by email, page through every account, and per
 * user: credit or debit, suspend or unsuspend, promote or demote, and the VM
 * and GPU limits.
 */
import { useRef, useState } from 'preact/hooks';
import type { paths } from '../../../src/sdk/index.js';
import { api, call, callWithTotal, GpuCloudError, randomKey } from '../api.js';
import {
  Action,
  Confirm,
  Field,
  FormDialog,
  Money,
  Page,
  PagedTable,
  RowButton,
  formatMoney,
  formatTime,
  notify,
  parseIntField,
  useAsync,
  useDebounced,
  usePaged,
} from '../ui.js';

type AdminUser = paths['/admin/users']['get']['responses'][200]['content']['application/json'][number];

/** Default per-user limits the API applies when max_vms / max_gpus are null. */
const DEFAULT_MAX_VMS = 10;
const DEFAULT_MAX_GPUS = 16;
const PAGE = 50;

// ---------------------------------------------------------------------------
// The page

type Dialog = { kind: 'credit' | 'limits' | 'suspend'; user: AdminUser } | undefined;

export function Users(_props: Record<string, unknown>) {
  const [search, setSearch] = useState('');
  const email = useDebounced(search.trim(), 300);
  const [dialog, setDialog] = useState<Dialog>(undefined);

  const me = useAsync(() => call(api.GET('/account')), []);
  const users = usePaged(
    (page) => callWithTotal(api.GET('/admin/users', { params: { query: { ...page, ...(email ? { email } : {}) } } })),
    { limit: PAGE, filters: [email], pollMs: 10000 },
  );

  const patch = async (
    u: AdminUser,
    body: NonNullable<paths['/admin/users/{user_id}']['patch']['requestBody']>['content']['application/json'],
  ) => {
    const updated = await call(api.PATCH('/admin/users/{user_id}', { params: { path: { user_id: u.id } }, body }));
    await users.reload();
    return updated;
  };

  return (
    <Page title="Users">
      {/* While a dialog is open the page behind it is inert: hide it from assistive technology too. */}
      <div aria-hidden={dialog ? 'true' : undefined}>
        <form class="inline adm-toolbar" role="search" aria-label="Search users" onSubmit={(e) => e.preventDefault()}>
          <fieldset>
            <Field
              label="Search by email"
              type="search"
              value={search}
              placeholder="part of an email address"
              autoComplete="off"
              onInput={(e) => setSearch((e.target as HTMLInputElement).value)}
            />
          </fieldset>
        </form>
        <PagedTable
          list={users}
          noun="users"
          pagerWhenEmpty
          empty={
            users.offset > 0
              ? 'Nothing on this page.'
              : email
                ? `No user's email contains "${email}".`
                : 'No users yet.'
          }
          caption="Users"
          head={
            <>
              <th>Email</th>
              <th>Role</th>
              <th class="num">Balance</th>
              <th>State</th>
              <th>Limits</th>
              <th>Created</th>
              <th>
                <span class="adm-sr">Actions</span>
              </th>
            </>
          }
          row={(u) => {
            const self = me.data?.id === u.id;
            return (
              <tr key={u.id}>
                <td>
                  <strong>{u.email}</strong>
                  {self ? <span class="muted"> (you)</span> : null}
                  <div class="muted adm-small">
                    #{u.id}
                    {u.name ? ` · ${u.name}` : ''}
                    {u.two_factor_enabled ? ' · 2FA' : ''}
                  </div>
                </td>
                <td>{u.role === 'admin' ? <strong>admin</strong> : 'user'}</td>
                <td class="num">
                  <Money value={u.balance} />
                </td>
                <td>
                  {u.suspended ? (
                    <span class="status status-failed">suspended</span>
                  ) : (
                    <span class="status status-active">active</span>
                  )}
                </td>
                <td>
                  <Limit value={u.max_vms} fallback={DEFAULT_MAX_VMS} unit="VMs" />
                  <br />
                  <Limit value={u.max_gpus} fallback={DEFAULT_MAX_GPUS} unit="GPUs" />
                </td>
                <td>{formatTime(u.created_at)}</td>
                <td>
                  <div class="actions adm-row-actions adm-wrap">
                    <RowButton onClick={() => setDialog({ kind: 'credit', user: u })}>Add credit</RowButton>
                    {u.suspended ? (
                      <Action
                        small
                        onClick={async () => {
                          await patch(u, { suspended: false });
                          notify(`${u.email} can use the service again.`);
                        }}
                      >
                        Unsuspend
                      </Action>
                    ) : (
                      <RowButton onClick={() => setDialog({ kind: 'suspend', user: u })}>Suspend</RowButton>
                    )}
                    {u.role === 'admin' ? (
                      <Action
                        small
                        onClick={async () => {
                          await patch(u, { role: 'user' });
                          notify(`${u.email} is no longer an administrator.`);
                        }}
                      >
                        Make user
                      </Action>
                    ) : (
                      <Action
                        small
                        onClick={async () => {
                          await patch(u, { role: 'admin' });
                          notify(`${u.email} is now an administrator.`);
                        }}
                      >
                        Make admin
                      </Action>
                    )}
                    <RowButton onClick={() => setDialog({ kind: 'limits', user: u })}>Limits</RowButton>
                  </div>
                </td>
              </tr>
            );
          }}
        />
      </div>

      {dialog?.kind === 'credit' ? (
        <CreditDialog user={dialog.user} onClose={() => setDialog(undefined)} onDone={() => users.reload()} />
      ) : null}
      {dialog?.kind === 'limits' ? (
        <LimitsDialog
          user={dialog.user}
          onClose={() => setDialog(undefined)}
          onSave={(body) => patch(dialog.user, body)}
        />
      ) : null}
      {dialog?.kind === 'suspend' ? (
        <Confirm
          title={`Suspend ${dialog.user.email}?`}
          confirmLabel="Suspend user"
          danger
          onClose={() => setDialog(undefined)}
          onConfirm={async () => {
            await patch(dialog.user, { suspended: true });
            notify(`${dialog.user.email} is suspended; their running VMs are being stopped.`);
          }}
        >
          <p>
            The user gets <strong>403</strong> on every call and their <strong>running VMs are stopped</strong>. Nothing
            is deleted: unsuspending lets them start their VMs again.
          </p>
        </Confirm>
      ) : null}
    </Page>
  );
}

function Limit({ value, fallback, unit }: { value: number | null; fallback: number; unit: string }) {
  return value === null ? (
    <span title="The default limit">
      {fallback} {unit} <span class="muted">(default)</span>
    </span>
  ) : (
    <span>
      <strong>{value}</strong> {unit}
    </span>
  );
}

/** Amount with at most 6 decimals, optionally signed. */
const AMOUNT = /^[-+]?(\d+(\.\d{0,6})?|\.\d{1,6})$/;

function CreditDialog({
  user,
  onClose,
  onDone,
}: {
  user: AdminUser;
  onClose: () => void;
  onDone: () => Promise<void>;
}) {
  const [amount, setAmount] = useState('');
  const [description, setDescription] = useState('');
  // One key per opening of this form: a double submit, or the SDK's retry after a lost answer,
  // replays the first answer instead of crediting twice.
  const key = useRef(randomKey());
  const n = Number(amount.trim());
  const valid = AMOUNT.test(amount.trim()) && n !== 0;
  return (
    <FormDialog
      title={`Add credit to ${user.email}`}
      submitLabel={valid && n < 0 ? 'Debit' : 'Add credit'}
      onClose={onClose}
      onSubmit={async () => {
        if (!valid) throw new Error('Enter a non-zero amount with at most 6 decimals, e.g. 25 or -10.50.');
        try {
          const tx = await call(
            api.POST('/admin/users/{user_id}/credits', {
              params: { path: { user_id: user.id } },
              body: { amount: n, ...(description.trim() ? { description: description.trim() } : {}) },
              headers: { 'Idempotency-Key': key.current },
            }),
          );
          notify(
            `${n > 0 ? 'Credited' : 'Debited'} ${user.email}: new balance ${formatMoney(tx.balance_after, 'USD', true)}.`,
          );
        } catch (e) {
          // A definitive refusal did nothing: the corrected form may go out under a fresh key.
          // A lost answer (network error, 5xx, still in progress) keeps the key so a retry cannot credit twice.
          if (e instanceof GpuCloudError && e.status >= 400 && e.status < 500 && e.status !== 409)
            key.current = randomKey();
          throw e;
        }
        await onDone();
      }}
    >
      <p class="muted">
        Balance now: <Money value={user.balance} precise />. A positive amount adds a credit; a negative one debits the
        account (an adjustment).
      </p>
      <Field
        label="Amount (USD)"
        inputMode="decimal"
        required
        autoFocus
        placeholder="e.g. 50 or -10"
        value={amount}
        onInput={(e) => setAmount((e.target as HTMLInputElement).value)}
        hint={
          valid
            ? `Balance after: ${formatMoney(Math.round((user.balance + n) * 1e6) / 1e6, 'USD', true)}`
            : 'Negative to debit; at most 6 decimals.'
        }
      />
      <Field
        label="Description"
        maxLength={500}
        placeholder="e.g. Welcome credit"
        value={description}
        onInput={(e) => setDescription((e.target as HTMLInputElement).value)}
        hint="Shown to the user in their transactions."
      />
    </FormDialog>
  );
}

function LimitsDialog({
  user,
  onClose,
  onSave,
}: {
  user: AdminUser;
  onClose: () => void;
  onSave: (body: { max_vms?: number | null; max_gpus?: number | null }) => Promise<unknown>;
}) {
  const [vms, setVms] = useState(user.max_vms === null ? '' : String(user.max_vms));
  const [gpus, setGpus] = useState(user.max_gpus === null ? '' : String(user.max_gpus));
  return (
    <FormDialog
      title={`Limits of ${user.email}`}
      submitLabel="Save limits"
      onClose={onClose}
      onSubmit={async () => {
        const v = parseIntField(vms);
        const g = parseIntField(gpus);
        if (Number.isNaN(v) || Number.isNaN(g))
          throw new Error('Limits are whole numbers; leave a field empty for the default.');
        const body: { max_vms?: number | null; max_gpus?: number | null } = {};
        if ((v ?? null) !== user.max_vms) body.max_vms = v ?? null;
        if ((g ?? null) !== user.max_gpus) body.max_gpus = g ?? null;
        if (Object.keys(body).length === 0) {
          notify('Nothing changed.', 'info');
          return;
        }
        await onSave(body);
        notify(`Limits of ${user.email} saved.`);
      }}
    >
      <Field
        label="Max VMs"
        inputMode="numeric"
        placeholder={`default (${DEFAULT_MAX_VMS})`}
        value={vms}
        onInput={(e) => setVms((e.target as HTMLInputElement).value)}
        hint={`Empty for the default (${DEFAULT_MAX_VMS}).`}
      />
      <Field
        label="Max GPUs"
        inputMode="numeric"
        placeholder={`default (${DEFAULT_MAX_GPUS})`}
        value={gpus}
        onInput={(e) => setGpus((e.target as HTMLInputElement).value)}
        hint={`Empty for the default (${DEFAULT_MAX_GPUS}).`}
      />
    </FormDialog>
  );
}
