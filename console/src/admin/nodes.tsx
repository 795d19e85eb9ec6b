/**
 * Operator page: the GPU nodes. Live capacity and status per node, the host
 * agent's health and report for nodes that run one, status changes (drain,
 * offline, activate), edits, removal, and registering a new node.
 */
import { useState } from 'preact/hooks';
import type { paths } from '../../../src/sdk/index.js';
import { api, call, callWithTotal } from '../api.js';
import {
  Action,
  Confirm,
  Empty,
  Field,
  Form,
  FormDialog,
  Loaded,
  Page,
  Pager,
  Select,
  Status,
  Submit,
  formatTime,
  notify,
  parseIntField,
  useAsync,
} from '../ui.js';

type NodeRecord = paths['/admin/nodes']['get']['responses'][200]['content']['application/json'][number];
type NodeStatus = NodeRecord['status'];
type GpuType = NodeRecord['gpu_type'];
type CreateBody = paths['/admin/nodes']['post']['requestBody']['content']['application/json'];
type PatchBody = paths['/admin/nodes/{node}']['patch']['requestBody']['content']['application/json'];

const GPU_TYPES: GpuType[] = ['5090', '4090', 'pro6000'];
const STATUS_MEANING: Record<NodeStatus, string> = {
  active: 'rentable',
  draining: 'no new VMs; the VMs on it keep running',
  offline: 'its VMs are offline too',
};
const PAGE = 100;

type Dialog = { kind: 'edit' | 'remove'; node: NodeRecord } | undefined;

export function Nodes(_props: Record<string, unknown>) {
  const [offset, setOffset] = useState(0);
  const [dialog, setDialog] = useState<Dialog>(undefined);
  // The register form's input lives here: the form steps aside while the edit dialog (same field names) is open.
  const [draft, setDraft] = useState(NEW_NODE);
  const nodes = useAsync(
    () => callWithTotal(api.GET('/admin/nodes', { params: { query: { limit: PAGE, offset } } })),
    [offset],
    5000,
  );

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
                  <div class="table-wrap">
                    <table class="adm-nodes">
                      <thead>
                        <tr>
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
                        </tr>
                      </thead>
                      <tbody>
                        {items.map((n) => (
                          <NodeRow
                            key={n.node}
                            n={n}
                            setStatus={setStatus}
                            onEdit={() => setDialog({ kind: 'edit', node: n })}
                            onRemove={() => setDialog({ kind: 'remove', node: n })}
                          />
                        ))}
                      </tbody>
                    </table>
                  </div>
                )}
                <Pager
                  offset={offset}
                  limit={PAGE}
                  total={total}
                  shown={items.length}
                  onOffset={setOffset}
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
          <button type="button" class="btn btn-plain btn-small" onClick={props.onEdit}>
            Edit
          </button>
          <button type="button" class="btn btn-danger btn-small" onClick={props.onRemove}>
            Remove
          </button>
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

// ---------------------------------------------------------------------------
// Register and edit

interface Hardware {
  gpu_type: GpuType;
  gpu_count: string;
  gpu_ram_mb: string;
  ram_gb: string;
  cpu_cores: string;
  cpu_model: string;
  pcie_gen: string;
  max_storage_gb: string;
  location: string;
  cluster_name: string;
  agent_url: string;
  agent_token: string;
}

const INT_FIELDS = ['gpu_count', 'gpu_ram_mb', 'ram_gb', 'cpu_cores', 'max_storage_gb'] as const;
const TEXT_FIELDS = ['cpu_model', 'pcie_gen', 'location', 'cluster_name'] as const;
const LABELS: Record<(typeof INT_FIELDS)[number] | (typeof TEXT_FIELDS)[number], string> = {
  gpu_count: 'GPU count',
  gpu_ram_mb: 'GPU memory (MB)',
  ram_gb: 'RAM (GB)',
  cpu_cores: 'CPU cores',
  max_storage_gb: 'Max storage (GB)',
  cpu_model: 'CPU model',
  pcie_gen: 'PCIe generation',
  location: 'Location',
  cluster_name: 'Cluster',
};

/** The hardware fields shared by the register and edit forms. */
function HardwareFields({
  v,
  set,
  gpuRamHint,
}: {
  v: Hardware;
  set: (patch: Partial<Hardware>) => void;
  gpuRamHint: string;
}) {
  const input = (k: keyof Hardware) => (e: Event) => set({ [k]: (e.target as HTMLInputElement).value });
  return (
    <>
      <div class="adm-grid3">
        <Select
          label="GPU type"
          value={v.gpu_type}
          onChange={(x) => set({ gpu_type: x as GpuType })}
          options={GPU_TYPES.map((g) => ({ value: g, label: g }))}
        />
        <Field label="GPU count" inputMode="numeric" required value={v.gpu_count} onInput={input('gpu_count')} />
        <Field
          label="GPU memory (MB)"
          inputMode="numeric"
          placeholder="the GPU type's"
          value={v.gpu_ram_mb}
          onInput={input('gpu_ram_mb')}
          hint={gpuRamHint}
        />
        <Field label="RAM (GB)" inputMode="numeric" required value={v.ram_gb} onInput={input('ram_gb')} />
        <Field label="CPU cores" inputMode="numeric" required value={v.cpu_cores} onInput={input('cpu_cores')} />
        <Field label="CPU model" required value={v.cpu_model} onInput={input('cpu_model')} />
        <Field label="PCIe generation" required value={v.pcie_gen} onInput={input('pcie_gen')} />
        <Field
          label="Max storage (GB)"
          inputMode="numeric"
          required
          value={v.max_storage_gb}
          onInput={input('max_storage_gb')}
          hint="The largest disk a VM here can have; at least 50."
        />
        <Field label="Location" required value={v.location} onInput={input('location')} />
        <Field label="Cluster" required value={v.cluster_name} onInput={input('cluster_name')} />
      </div>
    </>
  );
}

/** Integers from the form; throws a message naming the first field that is not one. */
function ints(v: Hardware): Record<(typeof INT_FIELDS)[number], number | undefined> {
  const out = {} as Record<(typeof INT_FIELDS)[number], number | undefined>;
  for (const k of INT_FIELDS) {
    const n = parseIntField(v[k]);
    if (Number.isNaN(n)) throw new Error(`${LABELS[k]} must be a whole number.`);
    out[k] = n;
  }
  return out;
}

const NEW_NODE: Hardware & { node: string; status: NodeStatus } = {
  node: '',
  status: 'active',
  gpu_type: '4090',
  gpu_count: '8',
  gpu_ram_mb: '',
  ram_gb: '512',
  cpu_cores: '128',
  cpu_model: 'AMD EPYC 9554',
  pcie_gen: '4.0',
  max_storage_gb: '4000',
  location: 'eu-central',
  cluster_name: 'fra-1',
  agent_url: '',
  agent_token: '',
};

type Draft = typeof NEW_NODE;

function RegisterNode({ v, setV, onDone }: { v: Draft; setV: (d: Draft) => void; onDone: () => Promise<void> }) {
  const set = (p: Partial<Draft>) => setV({ ...v, ...p });
  return (
    <section class="card adm-register" aria-labelledby="register-node-title">
      <h2 id="register-node-title">Register a node</h2>
      <p class="muted">
        Without an agent URL the node is <strong>simulated</strong>: its VMs run on the built-in simulator, which is
        what demos and tests use. With the URL and token of a host running <code>gpucloud agent</code>, its VMs are
        real; the agent is asked about its host at once (a node whose agent does not answer is still registered, shown
        offline).
      </p>
      <Form
        aria-label="Register a node"
        onSubmit={async () => {
          const node = v.node.trim();
          if (!node) throw new Error('Enter a node id, e.g. vm07.');
          const n = ints(v);
          for (const k of ['gpu_count', 'ram_gb', 'cpu_cores', 'max_storage_gb'] as const)
            if (n[k] === undefined) throw new Error(`Enter the ${LABELS[k]}.`);
          const url = v.agent_url.trim();
          const token = v.agent_token.trim();
          if (token && !url) throw new Error('An agent token needs the agent URL too.');
          const body: CreateBody = {
            node,
            gpu_type: v.gpu_type,
            gpu_count: n.gpu_count!,
            ram_gb: n.ram_gb!,
            cpu_cores: n.cpu_cores!,
            max_storage_gb: n.max_storage_gb!,
            cpu_model: v.cpu_model.trim(),
            pcie_gen: v.pcie_gen.trim(),
            location: v.location.trim(),
            cluster_name: v.cluster_name.trim(),
            status: v.status,
            ...(n.gpu_ram_mb !== undefined ? { gpu_ram_mb: n.gpu_ram_mb } : {}),
            ...(url ? { agent_url: url } : {}),
            ...(token ? { agent_token: token } : {}),
          };
          const created = await call(api.POST('/admin/nodes', { body }));
          notify(
            created.agent_url
              ? `Node ${created.node} registered; its agent is ${created.agent_status ?? 'not answering yet'}.`
              : `Node ${created.node} registered (simulated).`,
          );
          setV({ ...v, node: '', agent_token: '' });
          await onDone();
        }}
      >
        <div class="adm-grid3">
          <Field
            label="Node id"
            required
            autoComplete="off"
            placeholder="e.g. vm07"
            value={v.node}
            onInput={(e) => set({ node: (e.target as HTMLInputElement).value })}
            hint="Lowercase letters, digits and dashes."
          />
          <Select
            label="Initial status"
            value={v.status}
            onChange={(x) => set({ status: x as NodeStatus })}
            options={(['active', 'draining', 'offline'] as const).map((s) => ({
              value: s,
              label: `${s}: ${STATUS_MEANING[s]}`,
            }))}
          />
        </div>
        <HardwareFields v={v} set={set} gpuRamHint="Empty for the GPU type's own." />
        <div class="grid2">
          <Field
            label="Agent URL"
            type="url"
            autoComplete="off"
            placeholder="optional, e.g. https://vm07.internal:8443"
            value={v.agent_url}
            onInput={(e) => set({ agent_url: (e.target as HTMLInputElement).value })}
            hint="Where gpucloud agent listens. Empty: a simulated node."
          />
          <Field
            label="Agent token"
            type="password"
            autoComplete="new-password"
            placeholder="optional, the agent's --token"
            value={v.agent_token}
            onInput={(e) => set({ agent_token: (e.target as HTMLInputElement).value })}
            hint="At least 32 characters; never shown again."
          />
        </div>
        <div class="actions">
          <Submit>Register node</Submit>
        </div>
      </Form>
    </section>
  );
}

function EditNode({ node, onClose, onDone }: { node: NodeRecord; onClose: () => void; onDone: () => Promise<void> }) {
  const initial: Hardware = {
    gpu_type: node.gpu_type,
    gpu_count: String(node.gpu_count),
    gpu_ram_mb: String(node.gpu_ram_mb),
    ram_gb: String(node.ram_gb),
    cpu_cores: String(node.cpu_cores),
    cpu_model: node.cpu_model,
    pcie_gen: node.pcie_gen,
    max_storage_gb: String(node.max_storage_gb),
    location: node.location,
    cluster_name: node.cluster_name,
    agent_url: node.agent_url ?? '',
    agent_token: '',
  };
  const [v, setV] = useState(initial);
  const set = (p: Partial<Hardware>) => setV({ ...v, ...p });
  return (
    <FormDialog
      title={`Edit node ${node.node}`}
      submitLabel="Save node"
      onClose={onClose}
      onSubmit={async () => {
        const n = ints(v);
        const body: PatchBody = {};
        if (v.gpu_type !== node.gpu_type) body.gpu_type = v.gpu_type;
        for (const k of INT_FIELDS) {
          const x = n[k];
          if (x === undefined) {
            if (k !== 'gpu_ram_mb') throw new Error(`Enter the ${LABELS[k]}.`);
            continue; // empty GPU memory: the API picks the type's when the type changes
          }
          if (x !== node[k]) body[k] = x;
        }
        for (const k of TEXT_FIELDS) if (v[k].trim() !== node[k]) body[k] = v[k].trim();
        const url = v.agent_url.trim();
        if (url !== (node.agent_url ?? '')) body.agent_url = url === '' ? null : url;
        if (v.agent_token.trim()) body.agent_token = v.agent_token.trim();
        if (Object.keys(body).length === 0) {
          notify('Nothing changed.', 'info');
          return;
        }
        await call(api.PATCH('/admin/nodes/{node}', { params: { path: { node: node.node } }, body }));
        notify(`Node ${node.node} saved.`);
        await onDone();
      }}
    >
      <p class="muted adm-small">
        GPU count cannot go below the GPUs in use ({node.gpus_allocated}); the GPU type cannot change, nor the agent
        come or go, while the node has VMs. Status changes are the row's Drain / Offline / Activate.
      </p>
      <HardwareFields
        v={v}
        set={(p) => set(p.gpu_type && p.gpu_type !== node.gpu_type ? { ...p, gpu_ram_mb: '' } : p)}
        gpuRamHint="Empty with a new GPU type: that type's own."
      />
      <Field
        label="Agent URL"
        type="url"
        autoComplete="off"
        placeholder="empty: simulated node"
        value={v.agent_url}
        onInput={(e) => set({ agent_url: (e.target as HTMLInputElement).value })}
        hint={
          node.agent_url
            ? 'Clear it to make this a simulated node.'
            : 'Set it (with a token) to run VMs on a real host agent.'
        }
      />
      <Field
        label="Agent token"
        type="password"
        autoComplete="new-password"
        placeholder={node.agent_token_set ? 'unchanged' : "the agent's --token"}
        value={v.agent_token}
        onInput={(e) => set({ agent_token: (e.target as HTMLInputElement).value })}
        hint={
          node.agent_token_set
            ? 'A new token alone rotates it; empty keeps the current one.'
            : 'At least 32 characters.'
        }
      />
    </FormDialog>
  );
}
