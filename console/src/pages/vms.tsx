/**
 * Your VMs: the list (live status, every 3 s) and one VM's page: its
 * properties, live status, Stop / Start / Restart / Destroy, the label,
 * auto-restart of an interruptible VM, how to reach it while it runs (SSH
 * command; WebUI, Jupyter and HTTP ports opened through the access portal)
 * and its interruption history.
 */
import { useEffect, useRef, useState } from 'preact/hooks';
import type { operations, Vm } from '../../../src/sdk/index.js';
import { api, call, callWithTotal, client, errorMessage } from '../api.js';
import { navigate } from '../router.js';
import { useLiveEvents, VM_EVENTS } from '../live.js';
import {
  Action,
  Confirm,
  CopyButton,
  Empty,
  ErrorText,
  Field,
  Form,
  Link,
  Loaded,
  Money,
  Page,
  Status,
  Submit,
  WithTimes,
  formatDuration,
  formatInstants,
  formatTime,
  notify,
  useAsync,
  vmName,
} from '../ui.js';
import { RENTAL_LABELS } from './offers.js';
import { TEMPLATES } from './launch.js';

const PAGE_SIZE = 50;
/** The templates whose image serves a WebUI and Jupyter (access-info links them). */
const WEB_TEMPLATES = new Set([102, 103, 104]);
const WAIT_MS = 10 * 60_000;

const TRANSITIONAL: Partial<Record<Vm['status'], string>> = {
  creating: 'The VM is being created; this page updates by itself.',
  starting: 'The VM is starting; this page updates by itself.',
  stopping: 'The VM is stopping; this page updates by itself.',
  interrupted:
    'The VM was interrupted: its GPUs went to an on-demand or reserved VM. Start it again when GPUs are free (or let auto-restart do it).',
  offline: 'The VM’s node is offline; the VM comes back when the node does.',
  failed: 'The VM failed. Destroy it to release it; its charges have stopped.',
};

function templateName(vmid: number): string {
  return TEMPLATES.find((t) => t.vmid === vmid)?.name ?? `template ${vmid}`;
}

// ---------------------------------------------------------------------------
// The list

export function Vms(_props: Record<string, unknown>) {
  const [showDestroyed, setShowDestroyed] = useState(false);
  const [page, setPage] = useState(0);
  const list = useAsync(async () => {
    return callWithTotal(
      api.GET('/vms', {
        params: { query: { include_destroyed: showDestroyed, limit: PAGE_SIZE, offset: page * PAGE_SIZE } },
      }),
    );
  }, [showDestroyed, page]);
  useLiveEvents(VM_EVENTS, () => void list.reload());

  return (
    <Page
      title="VMs"
      actions={
        <Link href="/offers" class="btn btn-primary">
          Rent a GPU
        </Link>
      }
    >
      <div class="actions vm-list-controls">
        <label class="vm-toggle">
          <input
            type="checkbox"
            checked={showDestroyed}
            onChange={(e) => {
              setShowDestroyed(e.currentTarget.checked);
              setPage(0);
            }}
          />{' '}
          Show destroyed VMs
        </label>
        <span class="muted">Status updates live.</span>
      </div>
      <Loaded value={list}>
        {({ items, total }) =>
          items.length === 0 ? (
            <Empty>
              {page > 0 ? (
                'No more VMs.'
              ) : (
                <>
                  {showDestroyed ? 'You have no VMs.' : 'You have no VMs right now.'}{' '}
                  <Link href="/offers">Find a GPU</Link> to launch one.
                </>
              )}
            </Empty>
          ) : (
            <>
              <div class="table-wrap">
                <table>
                  <thead>
                    <tr>
                      <th scope="col">VM</th>
                      <th scope="col">Status</th>
                      <th scope="col">GPUs</th>
                      <th scope="col">Node</th>
                      <th scope="col">Rental</th>
                      <th scope="col" class="num">
                        Rate
                      </th>
                      <th scope="col">Created</th>
                    </tr>
                  </thead>
                  <tbody>
                    {items.map((v) => (
                      <tr
                        key={v.id}
                        class="clickable"
                        onClick={(e) => {
                          // The name is a real link (keyboard, new tab); a click anywhere else on the row opens it too.
                          if ((e.target as HTMLElement).closest('a, button, input, label')) return;
                          if (getSelection()?.toString()) return;
                          navigate(`/vms/${v.id}`);
                        }}
                      >
                        <td>
                          <Link href={`/vms/${v.id}`} title={`ID ${v.id}`}>
                            {vmName(v)}
                          </Link>
                        </td>
                        <td>
                          <Status status={v.status} />
                          {v.failure_reason ? (
                            <span class="cell-sub vm-failure-hint" title={formatInstants(v.failure_reason)}>
                              <WithTimes text={v.failure_reason} />
                            </span>
                          ) : null}
                        </td>
                        <td>
                          {v.gpu_count} × {v.gpu_type}
                        </td>
                        <td>{v.node}</td>
                        <td>{RENTAL_LABELS[v.rental_type]}</td>
                        <td class="num">
                          <Money value={v.hourly_rate} precise perHour />
                        </td>
                        <td>{formatTime(v.created_at)}</td>
                      </tr>
                    ))}
                  </tbody>
                </table>
              </div>
              {total > PAGE_SIZE ? (
                <div class="actions vm-pager">
                  <button type="button" class="btn btn-plain" disabled={page === 0} onClick={() => setPage(page - 1)}>
                    Newer
                  </button>
                  <span class="muted">
                    {page * PAGE_SIZE + 1}–{page * PAGE_SIZE + items.length} of {total}
                  </span>
                  <button
                    type="button"
                    class="btn btn-plain"
                    disabled={(page + 1) * PAGE_SIZE >= total}
                    onClick={() => setPage(page + 1)}
                  >
                    Older
                  </button>
                </div>
              ) : null}
            </>
          )
        }
      </Loaded>
    </Page>
  );
}

// ---------------------------------------------------------------------------
// One VM

export function VmDetail({ id }: { id: string }) {
  const vm = useAsync(() => call(api.GET('/vms/{vm_id}', { params: { path: { vm_id: id } } })), [id]);
  useLiveEvents(VM_EVENTS, () => void vm.reload(), { vmId: vm.data?.id ?? id });
  const [confirming, setConfirming] = useState(false);
  const [progress, setProgress] = useState<string | undefined>(undefined);
  const mounted = useRef(true);
  useEffect(
    () => () => {
      mounted.current = false;
    },
    [],
  );
  const say = (text: string | undefined) => {
    if (mounted.current) setProgress(text);
  };

  // While Stop or Start runs, the other status buttons stay away (a click meant for one never lands on another).
  const [pending, setPending] = useState<'stop' | 'start' | undefined>(undefined);
  const path = { params: { path: { vm_id: id } } };
  const stop = async () => {
    setPending('stop');
    try {
      const r = await call(api.POST('/vms/{vm_id}/stop', path));
      notify(r.message);
      await vm.reload();
    } finally {
      if (mounted.current) setPending(undefined);
    }
  };
  const start = async () => {
    setPending('start');
    try {
      const r = await call(api.POST('/vms/{vm_id}/start', path));
      notify(r.message);
      await vm.reload();
    } finally {
      if (mounted.current) setPending(undefined);
    }
  };
  const restart = async () => {
    try {
      say('Restart: stopping the VM…');
      await call(api.POST('/vms/{vm_id}/stop', path));
      await vm.reload();
      await client.waitForVm(id, ['stopped', 'interrupted'], {
        timeoutMs: WAIT_MS,
        onStatus: (v) => say(`Restart: waiting for the VM to stop (now ${v.status})…`),
      });
      say('Restart: stopped; starting it again…');
      await call(api.POST('/vms/{vm_id}/start', path));
      await vm.reload();
      await client.waitForVm(id, 'running', {
        timeoutMs: WAIT_MS,
        onStatus: (v) => say(`Restart: waiting for the VM to run (now ${v.status})…`),
      });
      notify('VM restarted.');
    } finally {
      say(undefined);
      await vm.reload();
    }
  };
  const destroy = async () => {
    const r = await call(api.DELETE('/vms/{vm_id}', path));
    notify(r.message);
    await vm.reload();
  };

  const v = vm.data;
  const restarting = progress !== undefined;
  const title = v ? vmName(v) : 'VM';

  return (
    <Page
      title={title}
      actions={
        <>
          <Link href="/vms" class="btn btn-plain">
            Back
          </Link>
          {v && v.status === 'running' && !restarting && pending !== 'start' ? (
            <Action onClick={stop} title="GPU billing pauses; the disk is kept (and billed)">
              Stop
            </Action>
          ) : null}
          {v && (v.status === 'stopped' || v.status === 'interrupted') && !restarting && pending !== 'stop' ? (
            <Action variant="primary" onClick={start}>
              Start
            </Action>
          ) : null}
          {v && ((v.status === 'running' && !pending) || restarting) ? (
            <Action onClick={restart} disabled={restarting} title="Stop, wait until stopped, then start again">
              Restart
            </Action>
          ) : null}
          {v && v.status !== 'destroyed' && !confirming ? (
            <button type="button" class="btn btn-danger" onClick={() => setConfirming(true)}>
              Destroy
            </button>
          ) : null}
        </>
      }
    >
      <Loaded value={vm}>{(v) => <VmBody vm={v} progress={progress} reload={vm.reload} />}</Loaded>
      {confirming && v ? (
        <Confirm
          title="Destroy this VM?"
          confirmLabel="Destroy"
          danger
          onConfirm={destroy}
          onClose={() => setConfirming(false)}
        >
          <p>
            <strong>{vmName(v)}</strong> ({v.gpu_count} × {v.gpu_type} on {v.node}) and everything on its disk are
            deleted for good. Billing ends now.
          </p>
          {v.rental_type === 'reserved' ? (
            <p class="warning">
              This VM is reserved. Destroying it does not cancel the reservation;{' '}
              <Link href="/reservations">cancel the reservation</Link> for that (75 % of what remains is refunded).
            </p>
          ) : null}
        </Confirm>
      ) : null}
    </Page>
  );
}

function VmBody({ vm, progress, reload }: { vm: Vm; progress: string | undefined; reload: () => Promise<void> }) {
  const note = TRANSITIONAL[vm.status];
  const running = vm.status === 'running';
  return (
    <div class="vm-detail">
      <div class="vm-status">
        <Status status={vm.status} />
        <span role="status" aria-live="polite" class="muted">
          {progress ? (
            <>
              <span class="spinner" aria-hidden="true" /> {progress}
            </>
          ) : (
            (note ?? '')
          )}
        </span>
      </div>

      {vm.status === 'failed' ? (
        <div class="error vm-failure" role="alert">
          <strong>Why it failed:</strong> <WithTimes text={vm.failure_reason ?? 'no reason was recorded.'} />
        </div>
      ) : null}

      {running ? <AccessCard vm={vm} /> : null}

      <div class="grid2">
        <section class="card">
          <h2>Details</h2>
          <dl class="props">
            <dt>ID</dt>
            <dd>
              <code>{vm.id}</code> <CopyButton text={vm.id} label="Copy ID" />
            </dd>
            <dt>VM number</dt>
            <dd>{vm.vmid}</dd>
            <dt>Label</dt>
            <dd>{vm.instance_label ?? <span class="muted">none</span>}</dd>
            <dt>Node</dt>
            <dd>{vm.node}</dd>
            <dt>GPUs</dt>
            <dd>
              {vm.gpu_count} × {vm.gpu_type}
              {vm.pcie_gen ? <span class="muted"> · PCIe {vm.pcie_gen}</span> : null}
            </dd>
            <dt>CPU</dt>
            <dd>
              {vm.cpu_cores} cores{vm.cpu_model ? ` (${vm.cpu_model})` : ''}
              {running ? <span class="muted"> · {vm.cpu_percent}% used</span> : null}
            </dd>
            <dt>RAM</dt>
            <dd>
              {vm.ram_gb} GB{running ? <span class="muted"> · {vm.ram_percent}% used</span> : null}
            </dd>
            <dt>Disk</dt>
            <dd>{vm.storage_gb} GB</dd>
            <dt>IP address</dt>
            <dd>{vm.ip_address ? <code>{vm.ip_address}</code> : <span class="muted">—</span>}</dd>
            <dt>Template</dt>
            <dd>
              {templateName(vm.template_vmid)} <span class="muted">({vm.template_vmid})</span>
            </dd>
            <dt>HTTP ports</dt>
            <dd>{vm.http_ports.length ? vm.http_ports.join(', ') : <span class="muted">none</span>}</dd>
            <dt>Rental type</dt>
            <dd>
              {RENTAL_LABELS[vm.rental_type]} <span class="muted">({vm.rental_type})</span>
            </dd>
            {vm.reservation_id ? (
              <>
                <dt>Reservation</dt>
                <dd>
                  <Link href="/reservations">
                    <code>{vm.reservation_id}</code>
                  </Link>
                </dd>
              </>
            ) : null}
            {vm.rental_type === 'interruptible' ? (
              <>
                <dt>Auto-restart</dt>
                <dd>{vm.auto_restart ? 'on' : 'off'}</dd>
              </>
            ) : null}
            <dt>Rate</dt>
            <dd>
              <Money value={vm.hourly_rate} precise perHour />{' '}
              <span class="muted">
                (GPUs <Money value={vm.gpu_hourly_rate} precise perHour />, disk{' '}
                <Money value={vm.storage_hourly_rate} precise perHour />; while stopped only the disk)
              </span>
            </dd>
            <dt>Created</dt>
            <dd>{formatTime(vm.created_at)}</dd>
            <dt>Started</dt>
            <dd>{formatTime(vm.started_at)}</dd>
            <dt>Stopped</dt>
            <dd>{formatTime(vm.stopped_at)}</dd>
            {vm.destroyed_at ? (
              <>
                <dt>Destroyed</dt>
                <dd>{formatTime(vm.destroyed_at)}</dd>
              </>
            ) : null}
          </dl>
        </section>

        <div class="vm-stack">
          {running ? null : (
            <section class="card">
              <h2>Access</h2>
              <p class="muted">
                {vm.status === 'destroyed'
                  ? 'The VM is destroyed.'
                  : 'The SSH command and web links appear here while the VM is running.'}
              </p>
            </section>
          )}
          {vm.status !== 'destroyed' ? <LabelCard key={vm.instance_label ?? ''} vm={vm} reload={reload} /> : null}
          {vm.rental_type === 'interruptible' && vm.status !== 'destroyed' ? (
            <AutoRestartCard vm={vm} reload={reload} />
          ) : null}
        </div>
      </div>

      {vm.rental_type === 'interruptible' ? <Interruptions vm={vm} /> : null}
    </div>
  );
}

type AccessInfo = operations['getVmAccessInfo']['responses'][200]['content']['application/json'];

/** A web service of a VM the access portal opens: its template's WebUI or Jupyter, or one of its HTTP ports. */
type Service = { kind: 'webui' } | { kind: 'jupyter' } | { kind: 'port'; port: number };

function serviceLabel(s: Service): string {
  return s.kind === 'webui' ? 'the WebUI' : s.kind === 'jupyter' ? 'Jupyter' : `port ${s.port}`;
}

/** Why a service has no link although the VM serves it: links are interactive access to the VM. */
const NO_LINK = 'links are given to a signed-in session or a read_write API key only, and this one got none';

/** The service's link in a fresh access-info, or an error saying why there is none. */
function linkOf(vm: Vm, info: AccessInfo, s: Service): string {
  if (s.kind === 'port') {
    const p = info.ports.find((x) => x.port === s.port);
    if (!p) throw new Error(`VM ${vm.vmid} has no HTTP port ${s.port}.`);
    if (!p.url) throw new Error(`No link for port ${s.port}: ${NO_LINK}.`);
    return p.url;
  }
  const link = s.kind === 'webui' ? info.web_ui : info.jupyter;
  if (!link) {
    throw new Error(
      WEB_TEMPLATES.has(vm.template_vmid)
        ? `No link for ${serviceLabel(s)}: ${NO_LINK}.`
        : `VM ${vm.vmid} has no ${serviceLabel(s)}: only templates 102 to 104 serve one.`,
    );
  }
  return link.url;
}

/**
 * Opens a web service of the VM in a new tab, through the access portal.
 *
 * A portal link signs in once and lives 5 minutes, so it is fetched when the
 * user clicks, never kept on the page. Popup blockers let a page open a window
 * only while it handles the click, and the link arrives after a request: so
 * the tab is opened blank at once, synchronously in the click's handler, and
 * sent to the link when it comes. `noopener` cannot be asked of window.open
 * here (it would return no handle to send the tab on with); the same
 * protection is had by cutting the tab's `opener` before it leaves this
 * origin, so the VM's app (customer code, on an origin of its own) cannot
 * reach back to the console through window.opener. The link's token rides in
 * its fragment and the console sends no referrer to other origins, so it
 * reaches no server but the portal. When the browser blocks even that tab,
 * `onBlocked` gets the link to show as a plain link instead.
 */
function openService(vm: Vm, s: Service, onBlocked: (url: string) => void): Promise<void> {
  const tab = window.open('', '_blank');
  if (tab) {
    tab.opener = null;
    // A word in the blank tab while the link is fetched; text only (no markup is ever written into it).
    tab.document.title = 'Opening…';
    if (tab.document.body) tab.document.body.textContent = `Opening ${serviceLabel(s)} of VM ${vm.vmid}…`;
  }
  return (async () => {
    try {
      const info = await call(api.GET('/vms/{vm_id}/access-info', { params: { path: { vm_id: vm.id } } }));
      const url = linkOf(vm, info, s);
      if (tab && !tab.closed) tab.location.replace(url);
      else onBlocked(url);
    } catch (e) {
      tab?.close();
      throw e;
    }
  })();
}

function AccessCard({ vm }: { vm: Vm }) {
  // The SSH command and which services have links; the links themselves are fetched again on each click.
  const info = useAsync(
    () => call(api.GET('/vms/{vm_id}/access-info', { params: { path: { vm_id: vm.id } } })),
    [vm.id, vm.started_at, vm.ip_address],
  );
  const [blocked, setBlocked] = useState<{ label: string; url: string } | undefined>(undefined);
  const open = (s: Service) => () => {
    setBlocked(undefined);
    return openService(vm, s, (url) => setBlocked({ label: serviceLabel(s), url }));
  };
  return (
    <section class="card vm-access">
      <h2>Access</h2>
      <Loaded value={info}>
        {(a) => {
          const services: { service: Service; name: string; primary?: boolean }[] = [
            ...(a.web_ui ? [{ service: { kind: 'webui' } as Service, name: 'Open WebUI', primary: true }] : []),
            ...(a.jupyter ? [{ service: { kind: 'jupyter' } as Service, name: 'Open Jupyter' }] : []),
            ...a.ports
              .filter((p) => p.url !== null)
              .map((p) => ({ service: { kind: 'port', port: p.port } as Service, name: `Open port ${p.port}` })),
          ];
          const unlinked = [
            ...(WEB_TEMPLATES.has(vm.template_vmid) && !a.web_ui ? ['the WebUI and Jupyter'] : []),
            ...a.ports.filter((p) => p.url === null).map((p) => `port ${p.port}`),
          ];
          return (
            <>
              <div class="secret">
                <code data-testid="ssh-command">{a.ssh.command}</code>
                <CopyButton text={a.ssh.command} label="Copy SSH command" />
              </div>
              <p class="muted">
                User <code>{a.ssh.username}</code> on <code>{a.ssh.host}</code>, port {a.ssh.port}.
              </p>
              {a.notice ? (
                <p class="warning vm-access-notice" role="note">
                  <WithTimes text={a.notice} />
                </p>
              ) : null}
              {services.length ? (
                <div class="actions vm-services">
                  {services.map((x) => (
                    <Action
                      key={x.name}
                      variant={x.primary ? 'primary' : 'plain'}
                      onClick={open(x.service)}
                      title={`Opens ${serviceLabel(x.service)} in a new tab, signed in`}
                    >
                      {x.name}
                    </Action>
                  ))}
                  <span class="muted">Opens in a new tab, signed in by a link made for that click.</span>
                </div>
              ) : null}
              {unlinked.length ? (
                <p class="muted" role="note">
                  No link for {unlinked.join(', ')}: {NO_LINK}.
                </p>
              ) : null}
              {blocked ? (
                <p class="warning" role="alert">
                  Your browser blocked the new tab.{' '}
                  <a href={blocked.url} target="_blank" rel="noopener noreferrer">
                    Open {blocked.label}
                  </a>{' '}
                  (the link works once, within 5 minutes).
                </p>
              ) : null}
            </>
          );
        }}
      </Loaded>
    </section>
  );
}

function LabelCard({ vm, reload }: { vm: Vm; reload: () => Promise<void> }) {
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

function AutoRestartCard({ vm, reload }: { vm: Vm; reload: () => Promise<void> }) {
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

function Interruptions({ vm }: { vm: Vm }) {
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
            <div class="table-wrap">
              <table>
                <thead>
                  <tr>
                    <th scope="col">Interrupted</th>
                    <th scope="col">Status</th>
                    <th scope="col">Restored</th>
                    <th scope="col" class="num">
                      Downtime
                    </th>
                    <th scope="col">Taken by VM</th>
                  </tr>
                </thead>
                <tbody>
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
                </tbody>
              </table>
            </div>
          )
        }
      </Loaded>
    </section>
  );
}
