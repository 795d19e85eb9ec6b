/**
 * Operator page: the GPU nodes. Live capacity and status per node, the host
 * agent's health and report for nodes that run one, each template's state on
 * the node's host, status changes (drain, offline, activate), edits, removal,
 * and registering a new node (the forms: node-forms.tsx).
 */
import { useState } from 'preact/hooks';
import { api, call, callWithTotal } from '../api.js';
import { EditNode, NEW_NODE, RegisterNode, STATUS_MEANING, type NodeRecord, type NodeStatus } from './node-forms.js';
import { NodeTemplates } from './node-templates.js';
import {
  Action,
  Confirm,
  Empty,
  Loaded,
  Page,
  Pager,
  RowButton,
  Status,
  Table,
  formatTime,
  notify,
  usePaged,
} from '../ui.js';

const PAGE = 100;

type Dialog = { kind: 'edit' | 'remove'; node: NodeRecord } | undefined;

export function Nodes(_props: Record<string, unknown>) {
  const [dialog, setDialog] = useState<Dialog>(undefined);
  // The register form's input lives here: the form steps aside while the edit dialog (same field names) is open.
  const [draft, setDraft] = useState(NEW_NODE);
  const nodes = usePaged((page) => callWithTotal(api.GET('/admin/nodes', { params: { query: page } })), {
    limit: PAGE,
    pollMs: 5000,
  });

  const setStatus = async (n: NodeRecord, status: NodeStatus) => {
    await call(api.PATCH('/admin/nodes/{node}', { params: { path: { node: n.node } }, body: { status } }));
    notify(`${n.node} is ${status}${status === 'active' ? '' : `: ${STATUS_MEANING[status]}`}.`);
    await nodes.reload();
  };

  return (
    <Page title="Nodes">
      <div aria-hidden={dialog ? 'true' : undefined}>
        <Loaded value={nodes}>
          {({ items, total }) => {
            const gpus = items.reduce((s, n) => s + n.gpu_count, 0);
            const used = items.reduce((s, n) => s + n.gpus_allocated, 0);
            const count = (st: NodeStatus) => items.filter((n) => n.status === st).length;
            const agentsDown = items.filter((n) => n.agent_url && n.agent_status !== 'online');
            return (
              <>
                {agentsDown.length ? (
                  <div class="warning" role="alert">
                    Host agent not answering on {agentsDown.map((n) => n.node).join(', ')}: the VMs of such a node are
                    offline until it answers again.
                  </div>
                ) : null}
                <div class="cards">
                  <div class="card stat">
                    <span class="label">Nodes</span>
                    <strong class="value">{total}</strong>
                    <span class="muted">
                      {count('active')} active · {count('draining')} draining · {count('offline')} offline
                    </span>
                  </div>
                  <div class="card stat">
                    <span class="label">GPUs in use</span>
                    <strong class="value">
                      {used} / {gpus}
                    </strong>
                    <span class="muted">
                      {gpus - used} free{total > items.length ? ' (this page)' : ''}
                    </span>
                  </div>
                </div>
                <h2>Fleet</h2>
                {items.length === 0 ? (
                  <Empty>No node yet. Register one below.</Empty>
                ) : (
                  <Table
                    class="adm-nodes"
                    head={
                      <>
                        <th>Node</th>
                        <th>Status</th>
                        <th>GPUs</th>
                        <th>In use</th>
                        <th>RAM · CPU · storage</th>
                        <th>Location</th>
                        <th>Host agent</th>
                        <th>
                          <span class="adm-sr">Actions</span>
                        </th>
                      </>
                    }
                  >
                    {items.map((n) => (
                      <NodeRow
                        key={n.node}
                        n={n}
                        setStatus={setStatus}
                        onEdit={() => setDialog({ kind: 'edit', node: n })}
                        onRemove={() => setDialog({ kind: 'remove', node: n })}
                      />
                    ))}
                  </Table>
                )}
                <Pager
                  offset={nodes.offset}
                  limit={PAGE}
                  total={total}
                  shown={items.length}
                  onOffset={nodes.setOffset}
                  noun="nodes"
                />
                <p class="muted adm-small">
                  Statuses: <strong>active</strong> {STATUS_MEANING.active}; <strong>draining</strong>{' '}
                  {STATUS_MEANING.draining}; <strong>offline</strong> {STATUS_MEANING.offline} (activating brings them
                  back as they were).
                </p>
              </>
            );
          }}
        </Loaded>
        {dialog?.kind === 'edit' ? null : <RegisterNode v={draft} setV={setDraft} onDone={nodes.reload} />}
      </div>

      {dialog?.kind === 'remove' ? (
        <Confirm
          title={`Remove node ${dialog.node.node}?`}
          confirmLabel="Remove node"
          danger
          onClose={() => setDialog(undefined)}
          onConfirm={async () => {
            await call(api.DELETE('/admin/nodes/{node}', { params: { path: { node: dialog.node.node } } }));
            notify(`Node ${dialog.node.node} removed.`);
            await nodes.reload();
          }}
        >
          <p>
            The node leaves the fleet and its offers disappear. The API refuses while VMs that are not destroyed or
            failed live on it
            {dialog.node.gpus_allocated > 0 ? ` (it holds ${dialog.node.gpus_allocated} GPUs now)` : ''}: drain it and
            let them go first.
          </p>
        </Confirm>
      ) : null}
      {dialog?.kind === 'edit' ? (
        <EditNode node={dialog.node} onClose={() => setDialog(undefined)} onDone={nodes.reload} />
      ) : null}
    </Page>
  );
}

function NodeRow(props: {
  n: NodeRecord;
  setStatus: (n: NodeRecord, s: NodeStatus) => Promise<void>;
  onEdit: () => void;
  onRemove: () => void;
}) {
  const { n, setStatus } = props;
  const pct = n.gpu_count > 0 ? Math.min(100, Math.round((n.gpus_allocated / n.gpu_count) * 100)) : 0;
  return (
    <tr>
      <td>
        <strong>{n.node}</strong>
        <NodeTemplates node={n.node} />
      </td>
      <td>
        <Status status={n.status} />
      </td>
      <td>
        {n.gpu_count} × {n.gpu_type}
        <div class="muted adm-small">
          {Math.round(n.gpu_ram_mb / 1024)} GB each · PCIe {n.pcie_gen}
        </div>
      </td>
      <td>
        {n.gpus_allocated} / {n.gpu_count} in use
        <div class="adm-capacity">
          <progress
            max={n.gpu_count}
            value={n.gpus_allocated}
            aria-label={`GPUs in use on ${n.node}`}
            title={`${pct}% in use`}
          />
          <span class="muted adm-small">{n.gpus_free} free</span>
        </div>
      </td>
      <td>
        {n.ram_gb.toLocaleString()} GB RAM · {n.cpu_cores} cores
        <div class="muted adm-small adm-truncate" title={n.cpu_model}>
          {n.cpu_model}
        </div>
        <div class="muted adm-small" title="The largest disk a VM on this node can have">
          {n.max_storage_gb.toLocaleString()} GB storage
        </div>
      </td>
      <td>
        {n.location}
        <div class="muted adm-small">{n.cluster_name}</div>
      </td>
      <td>
        <AgentCell n={n} />
      </td>
      <td>
        <div class="actions adm-row-actions adm-wrap">
          {n.status !== 'draining' ? (
            <Action
              small
              onClick={() => setStatus(n, 'draining')}
              title="Stop new VMs landing here; VMs on it keep running"
            >
              Drain
            </Action>
          ) : null}
          {n.status !== 'offline' ? (
            <Action small onClick={() => setStatus(n, 'offline')} title="Take the node and its VMs offline">
              Offline
            </Action>
          ) : null}
          {n.status !== 'active' ? (
            <Action small onClick={() => setStatus(n, 'active')} title="Make the node rentable again">
              Activate
            </Action>
          ) : null}
          <RowButton onClick={props.onEdit}>Edit</RowButton>
          <RowButton variant="danger" onClick={props.onRemove}>
            Remove
          </RowButton>
        </div>
      </td>
    </tr>
  );
}

/** The host agent's status and report; "simulated" for nodes without an agent. */
function AgentCell({ n }: { n: NodeRecord }) {
  if (!n.agent_url) return <span class="muted">simulated</span>;
  // Until the agent has answered once there is no host report to judge.
  const reported = n.agent_seen_at !== null;
  const vfio = reported ? n.host_gpus?.filter((g) => g.vfio).length : undefined;
  return (
    <div>
      {n.agent_status ? <Status status={n.agent_status} /> : <span class="muted">unknown</span>}
      {n.accel ? <span class="muted adm-small"> {n.accel}</span> : null}
      <div class="muted adm-small">seen {formatTime(n.agent_seen_at)}</div>
      {vfio !== undefined && vfio < n.gpu_count ? (
        <div class="adm-small adm-warn">
          {vfio} of {n.gpu_count} GPUs on vfio-pci
        </div>
      ) : null}
      <details class="adm-host">
        <summary>Host report</summary>
        <dl class="props adm-small">
          <dt>Agent URL</dt>
          <dd>
            <code>{n.agent_url}</code>
          </dd>
          <dt>Token</dt>
          <dd>{n.agent_token_set ? 'set' : 'missing'}</dd>
          <dt>Version</dt>
          <dd>{n.agent_version ?? '—'}</dd>
          <dt>Acceleration</dt>
          <dd>{n.accel ?? '—'}</dd>
          <dt>Host CPU</dt>
          <dd>{n.host_cpu_model ?? '—'}</dd>
          <dt>Host GPUs</dt>
          <dd>
            {!reported || n.host_gpus === null ? (
              'no report yet'
            ) : n.host_gpus.length === 0 ? (
              'none found'
            ) : (
              <ul class="adm-list">
                {n.host_gpus.map((g) => (
                  <li key={g.pci_address}>
                    <code>{g.pci_address}</code> {g.model} · {g.vfio ? 'vfio-pci' : <strong>not on vfio-pci</strong>}
                    {g.iommu_group !== null ? ` · IOMMU group ${g.iommu_group}` : ''}
                  </li>
                ))}
              </ul>
            )}
          </dd>
        </dl>
      </details>
    </div>
  );
}
