/**
 * The node forms of the operator's Nodes page (nodes.tsx): registering a
 * node and editing one, with the hardware fields they share.
 */
import { useState } from 'preact/hooks';
import type { paths } from '../../../src/sdk/index.js';
import { api, call } from '../api.js';
import { Field, Form, FormDialog, Select, Submit, notify, parseIntField } from '../ui.js';

/** A node as GET /admin/nodes lists it, and what each status means to an operator. */
export type NodeRecord = paths['/admin/nodes']['get']['responses'][200]['content']['application/json'][number];
export type NodeStatus = NodeRecord['status'];

export const STATUS_MEANING: Record<NodeStatus, string> = {
  active: 'rentable',
  draining: 'no new VMs; the VMs on it keep running',
  offline: 'its VMs are offline too',
};

type GpuType = NodeRecord['gpu_type'];
type CreateBody = paths['/admin/nodes']['post']['requestBody']['content']['application/json'];
type PatchBody = paths['/admin/nodes/{node}']['patch']['requestBody']['content']['application/json'];

const GPU_TYPES: GpuType[] = ['5090', '4090', 'pro6000'];

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

export const NEW_NODE: Hardware & { node: string; status: NodeStatus } = {
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

export type Draft = typeof NEW_NODE;

export function RegisterNode({ v, setV, onDone }: { v: Draft; setV: (d: Draft) => void; onDone: () => Promise<void> }) {
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

export function EditNode({
  node,
  onClose,
  onDone,
}: {
  node: NodeRecord;
  onClose: () => void;
  onDone: () => Promise<void>;
}) {
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
