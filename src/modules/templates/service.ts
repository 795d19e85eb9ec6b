/**
 * The template catalogue (docs/templates.md): templates are rows an operator
 * manages, each with an optional disk image in the image store; the host
 * agents download the images their nodes must hold and report what they hold,
 * and a VM is built only on a node where its template is ready.
 */
import type { Db, Queryable } from '../../db/db.js';
import type { Clock } from '../../clock.js';
import { AppError, notFound, validation } from '../../errors.js';
import type { AgentDesiredTemplate, AgentTemplateState } from '../../host-agent/api.js';
import { afterCommit } from '../../db/commit-hook.js';
import * as repo from './repository.js';
import type { CatalogueRow, TemplateFields } from './repository.js';
import type { NodeTemplateState, TemplateRecord } from './schemas.js';

/** The range of template ids an operator may use (the VM ids of customers' VMs start above it). */
export const TEMPLATE_VMID_MIN = 100;
export const TEMPLATE_VMID_MAX = 999_999;

/** What a template lets the access portal reach. */
export interface TemplateWeb {
  webui?: number;
  jupyter?: number;
}

export type TemplateInput = Partial<{
  name: string;
  description: string;
  os: string;
  default_user: string;
  webui_port: number | null;
  jupyter_port: number | null;
  min_disk_gb: number;
  gpu_types: string[] | null;
  image_sha256: string | null;
}>;

/** A node as the catalogue needs it: which GPU type, whether an agent runs it, whether it is rentable. */
export interface CatalogueNode {
  node: string;
  gpu_type: string;
  status: string;
  agent_url: string | null;
}

/** How long the catalogue read for the portal and the access links is kept: a change shows within it. */
const CACHE_MS = 1000;

const STATES = new Set(['queued', 'downloading', 'ready', 'failed']);

export class TemplateService {
  private cache: { at: number; rows: Promise<CatalogueRow[]> } | undefined;

  constructor(
    private readonly db: Db,
    private readonly clock: Clock,
    /** The base URL agents download images from (the service's public URL). */
    private publicUrl: string,
    /** Called once a change that alters offers has committed (which nodes a template is ready on). */
    private readonly offersChanged: () => void = () => {},
  ) {}

  /** Agents download from this URL from now on (a server that learnt the port it listens on). */
  useBaseUrl(url: string): void {
    this.publicUrl = url;
  }

  private rows(): Promise<CatalogueRow[]> {
    const now = performance.now();
    if (!this.cache || now - this.cache.at > CACHE_MS) {
      const rows = repo.listTemplates(this.db);
      this.cache = { at: now, rows };
      rows.catch(() => (this.cache = undefined));
    }
    return this.cache.rows;
  }

  private changed(tx: Queryable): void {
    afterCommit(tx, () => {
      this.cache = undefined;
      this.offersChanged();
    });
  }

  async exists(vmid: number): Promise<boolean> {
    return inRange(vmid) && (await repo.getTemplate(this.db, vmid)) !== undefined;
  }

  /** Makes an image a template's (a completed upload that named the template). */
  async setImage(tx: Queryable, vmid: number, sha256: string): Promise<void> {
    const t = await repo.lockTemplate(tx, vmid);
    if (!t) return;
    await repo.updateTemplate(tx, vmid, { ...t, image_sha256: sha256 }, this.clock.now());
    this.changed(tx);
  }

  /** The web services of a template (none for an unknown one). */
  async webOf(vmid: number): Promise<TemplateWeb> {
    const t = (await this.rows()).find((r) => r.template_vmid === vmid);
    return webOfRow(t);
  }

  /** The template's login user, or undefined for a template the catalogue does not know. */
  async userOf(vmid: number): Promise<string | undefined> {
    return (await this.rows()).find((r) => r.template_vmid === vmid)?.default_user;
  }

  /** Every template, with where it is ready. */
  async list(nodes: readonly CatalogueNode[]): Promise<TemplateRecord[]> {
    const [rows, ready] = await Promise.all([repo.listTemplates(this.db), repo.readyOnAgentNodes(this.db)]);
    return rows.map((t) => toRecord(t, nodes, ready));
  }

  async get(vmid: number, nodes: readonly CatalogueNode[]): Promise<TemplateRecord> {
    const t = inRange(vmid) ? await repo.getTemplate(this.db, vmid) : undefined;
    if (!t) throw notFound('Template');
    return toRecord(t, nodes, await repo.readyOnAgentNodes(this.db));
  }

  async create(vmid: number, input: TemplateInput, nodes: readonly CatalogueNode[]): Promise<TemplateRecord> {
    const fields = complete(input);
    await this.db.transaction(async (tx) => {
      await this.checkFields(tx, fields, vmid);
      const row = await repo.insertTemplate(tx, vmid, fields, this.clock.now());
      if (!row) throw new AppError('conflict', `Template ${vmid} exists already`);
      this.changed(tx);
    });
    return this.get(vmid, nodes);
  }

  async update(vmid: number, input: TemplateInput, nodes: readonly CatalogueNode[]): Promise<TemplateRecord> {
    if (!inRange(vmid)) throw notFound('Template');
    await this.db.transaction(async (tx) => {
      const before = await repo.lockTemplate(tx, vmid);
      if (!before) throw notFound('Template');
      const fields: TemplateFields = { ...before, ...definedOf(input) };
      await this.checkFields(tx, fields, vmid);
      await repo.updateTemplate(tx, vmid, fields, this.clock.now());
      this.changed(tx);
    });
    return this.get(vmid, nodes);
  }

  /** Deletes a template no VM (other than destroyed ones) was built from. */
  async delete(vmid: number): Promise<void> {
    if (!inRange(vmid)) throw notFound('Template');
    await this.db.transaction(async (tx) => {
      if (!(await repo.lockTemplate(tx, vmid, 'delete'))) throw notFound('Template');
      const using = await repo.vmsUsing(tx, vmid);
      if (using > 0)
        throw new AppError(
          'conflict',
          `Template ${vmid} is in use by ${using} VM(s) that are not destroyed; destroy them first`,
        );
      // A VM started from a customer image has the image's template: its login user and web services.
      const images = await repo.imagesUsing(tx, vmid);
      if (images > 0)
        throw new AppError(
          'conflict',
          `Template ${vmid} is the template of ${images} customer image(s) (snapshots); VMs started from them need it`,
        );
      await repo.deleteTemplate(tx, vmid);
      this.changed(tx);
    });
  }

  private async checkFields(tx: Queryable, f: TemplateFields, vmid: number): Promise<void> {
    const other = await repo.templateByName(tx, f.name);
    if (other && other.template_vmid !== vmid)
      throw new AppError('conflict', `The name ${f.name} belongs to template ${other.template_vmid}`);
    if (f.image_sha256 && !(await repo.imageExists(tx, f.image_sha256)))
      throw validation(
        'body.image_sha256',
        'is no image in the image store (upload it first: gpucloud admin images push)',
      );
    if (f.webui_port !== null && f.webui_port === f.jupyter_port)
      throw validation('body.jupyter_port', 'must differ from webui_port');
  }

  /**
   * A VM's template, checked for a create (inside the create's transaction, held against a delete until it commits):
   * 422 for an unknown template or a disk under its minimum.
   */
  async forCreate(tx: Queryable, vmid: number, storageGb: number): Promise<CatalogueRow> {
    const t = await repo.getTemplate(tx, vmid, true);
    if (!t) throw validation('body.template_vmid', `there is no template ${vmid} (GET /templates lists them)`);
    if (storageGb < t.min_disk_gb)
      throw validation('body.storage_gb', `template ${vmid} needs a disk of at least ${t.min_disk_gb} GB`);
    return t;
  }

  /** 400 `template_unavailable` unless the node's host holds the template ready. */
  async checkReady(tx: Queryable, t: CatalogueRow, node: string): Promise<void> {
    if (!(await repo.readyOn(tx, node, t.template_vmid)))
      throw new AppError(
        'template_unavailable',
        `Template ${t.template_vmid} (${t.name}) is not ready on node ${node}; GET /search?template_vmid=${t.template_vmid} lists the nodes that hold it`,
      );
  }

  /** Where a node's host downloads the image `sha256` from the store (with its own token). */
  imageUrl(node: string, sha256: string): string {
    return `${this.publicUrl.replace(/\/+$/, '')}/agent/v1/nodes/${encodeURIComponent(node)}/images/${sha256}`;
  }

  /** The templates a node's host must hold: those with an image, for the node's GPU type. */
  /** Every (node, template) pair that is ready, as "node:template_vmid": what offers are made of. */
  readyPairs(): Promise<Set<string>> {
    return repo.readyPairs(this.db);
  }

  async desiredFor(node: CatalogueNode): Promise<AgentDesiredTemplate[]> {
    return (await this.rows())
      .filter((t) => t.image_sha256 && t.image_format && forGpuType(t, node.gpu_type))
      .map((t) => ({
        vmid: t.template_vmid,
        user: t.default_user,
        sha256: t.image_sha256!,
        size_bytes: t.image_size_bytes!,
        format: t.image_format!,
        url: this.imageUrl(node.node, t.image_sha256!),
      }));
  }

  /** Records what a node's agent said it holds; offers change when a template became ready or stopped being. */
  async recordStates(node: string, states: readonly AgentTemplateState[]): Promise<void> {
    const rows = sanitize(states);
    await this.db.transaction(async (tx) => {
      const before = await repo.nodeTemplates(tx, node);
      const readyBefore = before.filter((r) => r.state === 'ready').map((r) => r.template_vmid);
      const readyAfter = rows.filter((r) => r.state === 'ready').map((r) => r.template_vmid);
      await repo.replaceNodeTemplates(tx, node, rows, this.clock.now());
      if (readyBefore.sort().join() !== readyAfter.sort().join()) this.changed(tx);
    });
  }

  /** Each template's state on a node's host, the templates it should hold first, then local ones. */
  async nodeStates(node: CatalogueNode): Promise<NodeTemplateState[]> {
    const [rows, held] = await Promise.all([repo.listTemplates(this.db), repo.nodeTemplates(this.db, node.node)]);
    const byVmid = new Map(held.map((h) => [h.template_vmid, h]));
    const names = new Map(rows.map((r) => [r.template_vmid, r.name]));
    const out: NodeTemplateState[] = [];
    const seen = new Set<number>();
    const wanted = rows.filter((t) => forGpuType(t, node.gpu_type));
    for (const t of wanted) {
      seen.add(t.template_vmid);
      const h = byVmid.get(t.template_vmid);
      if (!node.agent_url) out.push({ ...stateOf(undefined, t.template_vmid, t.name), state: 'ready' });
      else out.push(stateOf(h, t.template_vmid, t.name));
    }
    for (const h of held) {
      if (!seen.has(h.template_vmid)) out.push(stateOf(h, h.template_vmid, names.get(h.template_vmid) ?? null));
    }
    return out;
  }
}

/** Ids outside the catalogue's range name no template (404 without asking the database). */
function inRange(vmid: number): boolean {
  return Number.isInteger(vmid) && vmid >= TEMPLATE_VMID_MIN && vmid <= TEMPLATE_VMID_MAX;
}

function stateOf(h: repo.NodeTemplateRow | undefined, vmid: number, name: string | null): NodeTemplateState {
  return {
    template_vmid: vmid,
    name,
    state: h?.state ?? 'missing',
    source: h?.source ?? null,
    sha256: h?.sha256 ?? null,
    bytes_done: h?.bytes_done ?? 0,
    size_bytes: h?.size_bytes ?? 0,
    progress: h && h.size_bytes > 0 ? Math.min(100, Math.floor((h.bytes_done * 100) / h.size_bytes)) : null,
    reason: h?.reason ?? null,
    updated_at: h ? h.updated_at.toISOString() : null,
  };
}

function forGpuType(t: { gpu_types: string[] | null }, gpuType: string): boolean {
  return t.gpu_types === null || t.gpu_types.includes(gpuType);
}

function webOfRow(t: Pick<CatalogueRow, 'webui_port' | 'jupyter_port'> | undefined): TemplateWeb {
  const web: TemplateWeb = {};
  if (t?.webui_port) web.webui = t.webui_port;
  if (t?.jupyter_port) web.jupyter = t.jupyter_port;
  return web;
}

function definedOf(input: TemplateInput): Partial<TemplateFields> {
  return Object.fromEntries(Object.entries(input).filter(([, v]) => v !== undefined)) as Partial<TemplateFields>;
}

function complete(input: TemplateInput): TemplateFields {
  for (const f of ['name', 'description', 'os', 'default_user'] as const)
    if (input[f] === undefined) throw validation(`body.${f}`, 'is required');
  return {
    name: input.name!,
    description: input.description!,
    os: input.os!,
    default_user: input.default_user!,
    webui_port: input.webui_port ?? null,
    jupyter_port: input.jupyter_port ?? null,
    min_disk_gb: input.min_disk_gb ?? 50,
    gpu_types: input.gpu_types ?? null,
    image_sha256: input.image_sha256 ?? null,
  };
}

/** An agent's report, bounded and checked: anything malformed is left out rather than trusted. */
function sanitize(states: readonly AgentTemplateState[]): Omit<repo.NodeTemplateRow, 'node' | 'updated_at'>[] {
  const out = new Map<number, Omit<repo.NodeTemplateRow, 'node' | 'updated_at'>>();
  for (const s of (Array.isArray(states) ? states : []).slice(0, 1000)) {
    if (!Number.isInteger(s?.vmid) || s.vmid < 1 || s.vmid > 999_999_999) continue;
    const count = (n: unknown) => (Number.isSafeInteger(n) && (n as number) >= 0 ? (n as number) : 0);
    out.set(s.vmid, {
      template_vmid: s.vmid,
      // An agent that reports no state (before 1.2) holds only local templates, ready.
      state: s.state && STATES.has(s.state) ? s.state : 'ready',
      source: s.source === 'pulled' ? 'pulled' : 'local',
      sha256: typeof s.sha256 === 'string' && /^[0-9a-f]{64}$/.test(s.sha256) ? s.sha256 : null,
      bytes_done: count(s.bytes_done),
      size_bytes: count(s.size_bytes),
      reason: typeof s.reason === 'string' ? s.reason.slice(0, 500) : null,
    });
  }
  return [...out.values()];
}

function toRecord(
  t: CatalogueRow,
  nodes: readonly CatalogueNode[],
  ready: readonly { node: string; template_vmid: number }[],
): TemplateRecord {
  const readyAgentNodes = new Set(ready.filter((r) => r.template_vmid === t.template_vmid).map((r) => r.node));
  const on = nodes.filter(
    (n) => n.status === 'active' && (n.agent_url ? readyAgentNodes.has(n.node) : forGpuType(t, n.gpu_type)),
  );
  return {
    template_vmid: t.template_vmid,
    name: t.name,
    description: t.description,
    os: t.os,
    default_user: t.default_user,
    access: { ssh: true, webui_port: t.webui_port, jupyter_port: t.jupyter_port },
    min_disk_gb: t.min_disk_gb,
    gpu_types: t.gpu_types,
    image: t.image_sha256 ? { sha256: t.image_sha256, format: t.image_format!, size_bytes: t.image_size_bytes! } : null,
    ready_on: {
      nodes: on.map((n) => n.node).sort(),
      gpu_types: [...new Set(on.map((n) => n.gpu_type))].sort(),
    },
    created_at: t.created_at.toISOString(),
    updated_at: t.updated_at.toISOString(),
  };
}
