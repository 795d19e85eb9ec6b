/**
 * Nodes, prices and offers (docs/offers.md). GPU availability always comes
 * from repository.gpuUsage, the one place GPUs are counted.
 */
import type { CatalogueNode } from '../templates/service.js';
import type { Db, Queryable } from '../../db/db.js';
import type { Clock } from '../../clock.js';
import { AppError, invalidState, notFound, validation } from '../../errors.js';
import { bpToPercent, percentToBp, toAmount, toMicros } from '../../money.js';
import * as repo from './repository.js';
import type { AgentInfo, FullNodeRow, GpuType, GpuUsage, NodeRow, NodeStatus, PricingRow } from './repository.js';
import { deriveKey, open, seal } from '../../crypto.js';
import { performance } from 'node:perf_hooks';
import { afterCommit } from '../../db/commit-hook.js';
import { recordEvent } from '../events/service.js';

export const CURRENCY = 'USD';
/** An offer's total price is for the whole node offer with the minimum disk a VM may have. */
export const MIN_STORAGE_GB = 50;

/** Default prices shipped with the service. */
export const DEFAULT_PRICING: Omit<PricingRow, 'updated_at'>[] = [
  {
    gpu_type: '5090',
    gpu_ram_mb: 32_768,
    gpu_price_hourly_micros: 690_000,
    interruptible_rate_micros: 350_000,
    storage_price_gb_hourly_micros: 200,
    reserved_discount_1mo_bp: 1000,
    reserved_discount_3mo_bp: 2000,
    reserved_discount_6mo_bp: 3000,
  },
  {
    gpu_type: '4090',
    gpu_ram_mb: 24_576,
    gpu_price_hourly_micros: 440_000,
    interruptible_rate_micros: 220_000,
    storage_price_gb_hourly_micros: 200,
    reserved_discount_1mo_bp: 1000,
    reserved_discount_3mo_bp: 2000,
    reserved_discount_6mo_bp: 3000,
  },
  {
    gpu_type: 'pro6000',
    gpu_ram_mb: 98_304,
    gpu_price_hourly_micros: 1_690_000,
    interruptible_rate_micros: 850_000,
    storage_price_gb_hourly_micros: 200,
    reserved_discount_1mo_bp: 1000,
    reserved_discount_3mo_bp: 2000,
    reserved_discount_6mo_bp: 3000,
  },
];

export interface PricingRecord {
  gpu_type: GpuType;
  gpu_ram_mb: number;
  gpu_price_hourly: number;
  interruptible_rate: number;
  storage_price_gb_hourly: number;
  reserved_discount_1mo: number;
  reserved_discount_3mo: number;
  reserved_discount_6mo: number;
  updated_at: string;
}

export interface NodeRecord extends Omit<NodeRow, 'created_at' | 'updated_at'> {
  gpus_allocated: number;
  gpus_free: number;
  created_at: string;
  updated_at: string;
  agent_url: string | null;
  agent_token_set: boolean;
  agent_status: 'online' | 'offline' | null;
  agent_seen_at: string | null;
  agent_version: string | null;
  accel: string | null;
  host_cpu_model: string | null;
  host_gpus: AgentInfo['host_gpus'] | null;
}

/** A node's agent, as the control plane calls it. */
export interface AgentEndpoint {
  url: string;
  token: string;
}

/** After this many unanswered heartbeats in a row a node's agent is offline, and so are its VMs. */
export const AGENT_MAX_MISSES = 3;

export interface Offer {
  node: string;
  gpu_type: GpuType;
  gpu_count: number;
  gpu_ram_mb: number;
  total_gpu_ram_mb: number;
  ram_gb: number;
  cpu_cores: number;
  cpu_model: string;
  pcie_gen: string;
  max_storage_gb: number;
  gpu_price_hourly: number;
  interruptible_rate: number;
  storage_price_hourly: number;
  total_price_hourly: number;
  reserved_discount_1mo: number;
  reserved_discount_3mo: number;
  reserved_discount_6mo: number;
  available_ondemand: boolean;
  available_interruptible: boolean;
  available_reserved: boolean;
  location: string;
  cluster_name: string;
}

export type RentalKind = 'on_demand' | 'reserved' | 'interruptible';

export interface SearchFilters {
  gpu_type?: GpuType;
  min_gpus?: number;
  max_price?: number;
  rental_type?: RentalKind;
  location?: string;
  /** Only nodes whose host holds this template ready. */
  template_vmid?: number;
  limit: number;
  offset: number;
}

export interface PricingUpdate {
  gpu_ram_mb?: number;
  gpu_price_hourly?: number;
  interruptible_rate?: number;
  storage_price_gb_hourly?: number;
  reserved_discount_1mo?: number;
  reserved_discount_3mo?: number;
  reserved_discount_6mo?: number;
}

export type NodeInput = Omit<NodeRow, 'created_at' | 'updated_at' | 'gpu_ram_mb' | 'status'> & {
  gpu_ram_mb?: number;
  status?: NodeStatus;
  agent_url?: string | null;
  agent_token?: string;
};

/** Called in the same transaction when a node's status changes (the VM module moves VMs offline and back). */
export type NodeStatusHook = (
  tx: Queryable,
  node: string,
  from: NodeStatus,
  to: NodeStatus,
  now: Date,
) => Promise<void>;

export const toPricingRecord = (p: PricingRow): PricingRecord => ({
  gpu_type: p.gpu_type,
  gpu_ram_mb: p.gpu_ram_mb,
  gpu_price_hourly: toAmount(p.gpu_price_hourly_micros),
  interruptible_rate: toAmount(p.interruptible_rate_micros),
  storage_price_gb_hourly: toAmount(p.storage_price_gb_hourly_micros),
  reserved_discount_1mo: bpToPercent(p.reserved_discount_1mo_bp),
  reserved_discount_3mo: bpToPercent(p.reserved_discount_3mo_bp),
  reserved_discount_6mo: bpToPercent(p.reserved_discount_6mo_bp),
  updated_at: p.updated_at.toISOString(),
});

const free = (n: NodeRow, u: GpuUsage | undefined) => Math.max(0, n.gpu_count - (u?.held ?? 0));

function toNodeRecord(n: FullNodeRow, u: GpuUsage | undefined): NodeRecord {
  const info = n.agent_url ? n.agent_info : null;
  return {
    node: n.node,
    gpu_type: n.gpu_type,
    gpu_count: n.gpu_count,
    gpu_ram_mb: n.gpu_ram_mb,
    ram_gb: n.ram_gb,
    cpu_cores: n.cpu_cores,
    cpu_model: n.cpu_model,
    pcie_gen: n.pcie_gen,
    max_storage_gb: n.max_storage_gb,
    location: n.location,
    cluster_name: n.cluster_name,
    status: n.status,
    gpus_allocated: u?.held ?? 0,
    gpus_free: free(n, u),
    created_at: n.created_at.toISOString(),
    updated_at: n.updated_at.toISOString(),
    agent_url: n.agent_url,
    agent_token_set: n.agent_token_sealed !== null,
    agent_status: n.agent_url ? (n.agent_status ?? 'offline') : null,
    agent_seen_at: n.agent_url && n.agent_seen_at ? n.agent_seen_at.toISOString() : null,
    agent_version: info?.agent_version ?? null,
    accel: info?.accel ?? null,
    host_cpu_model: info?.host_cpu_model ?? null,
    host_gpus: info?.host_gpus ?? (n.agent_url ? [] : null),
  };
}

/**
 * An agent URL: http or https, a host, no credentials, query or fragment (the
 * token travels in a header). Returned without a trailing slash.
 */
export function agentUrl(raw: string, field = 'body.agent_url'): string {
  let u: URL;
  try {
    u = new URL(raw);
  } catch {
    throw validation(field, 'must be a URL like http://10.0.0.7:7070');
  }
  if (u.protocol !== 'http:' && u.protocol !== 'https:') throw validation(field, 'must use http or https');
  if (!u.hostname) throw validation(field, 'must name a host');
  if (u.username || u.password) throw validation(field, 'must not carry credentials: send the token as agent_token');
  if (u.search || u.hash) throw validation(field, 'must not have a query or fragment');
  return u.toString().replace(/\/+$/, '');
}

function moneyField(field: string, v: number | undefined, fallback: number): number {
  if (v === undefined) return fallback;
  const m = toMicros(v);
  if (m === null || m < 0) throw validation(`body.${field}`, 'must be a non-negative amount with at most 6 decimals');
  return m;
}

function percentField(field: string, v: number | undefined, fallback: number): number {
  if (v === undefined) return fallback;
  const bp = percentToBp(v);
  if (bp === null) throw validation(`body.${field}`, 'must be a percentage from 0 to 100 with at most 2 decimals');
  return bp;
}

/**
 * What offers and the public price list are made of. One object per read: while nothing
 * changes every search gets the same one, so its identity names the version of the offers.
 */
export interface OfferInputs {
  prices: PricingRow[];
  nodes: NodeRow[];
  usage: Map<string, GpuUsage>;
  /** "node:template_vmid" of every template ready on a node. */
  ready: Set<string>;
}

/** The longest an offers snapshot is served: a change made elsewhere shows within this. */
export const OFFERS_MAX_AGE_MS = 1000;

function catalogueNodeOf(n: FullNodeRow): CatalogueNode {
  return { node: n.node, gpu_type: n.gpu_type, status: n.status, agent_url: n.agent_url };
}

/** The answer to a create or start for a GPU type that has no price (pricingFor, or a price read earlier). */
export function noPrice(gpuType: string): AppError {
  return new AppError('gpu_unavailable', `No price is set for GPU type ${gpuType}`);
}

export class InventoryService {
  private readonly contactHooks: ((node: string) => Promise<void>)[] = [];
  private readonly statusHooks: NodeStatusHook[] = [];

  private readonly tokenKey: Buffer;

  constructor(
    private readonly db: Db,
    private readonly clock: Clock,
    /** The service secret: agent tokens are sealed with a key derived from it. */
    secret: string = 'unset-secret'.padEnd(32, '-'),
    /** Asks an agent about its host (null when it does not answer); used at registration. */
    private readonly probeAgent: (endpoint: AgentEndpoint) => Promise<AgentInfo | null> = async () => null,
  ) {
    this.tokenKey = deriveKey(secret, 'agent-token');
  }

  onNodeStatusChange(hook: NodeStatusHook): void {
    this.statusHooks.push(hook);
  }

  /** A node's status changed (in `tx`): the operator's node.offline / node.online event, then the hooks. */
  private async statusChanged(
    tx: Queryable,
    node: string,
    from: NodeStatus,
    to: NodeStatus,
    now: Date,
    reason: 'admin' | 'agent_unreachable' | 'agent_back',
  ): Promise<void> {
    if (to === 'offline' || from === 'offline') {
      await recordEvent(tx, {
        type: to === 'offline' ? 'node.offline' : 'node.online',
        userId: null,
        data: { node, from, to, reason },
        at: now,
      });
    }
    for (const hook of this.statusHooks) await hook(tx, node, from, to, now);
  }

  // ---- the offers snapshot ----

  /**
   * Offers and the public price list are made of three things that change
   * only when an operator changes prices or nodes, or VMs take or free GPUs:
   * they are read once into a snapshot that every search shares. A change
   * through this instance replaces it as soon as its transaction commits
   * (`offersChanged`); a change through another instance or a worker shows
   * within OFFERS_MAX_AGE_MS, the snapshot's longest life. Placement never
   * reads it: creating a VM counts GPUs under the node's row lock.
   */
  private offersSnapshot:
    { loadedAt: number; epoch: number; inputs: Promise<OfferInputs>; loaded?: OfferInputs } | undefined;
  private offersEpoch = 0;

  /** The current offers snapshot (read again when it changed or is older than OFFERS_MAX_AGE_MS). */
  offerInputs(): Promise<OfferInputs> {
    const now = performance.now();
    const s = this.offersSnapshot;
    if (s && s.epoch === this.offersEpoch && now - s.loadedAt < OFFERS_MAX_AGE_MS) return s.inputs;
    const inputs = Promise.all([
      repo.listPricing(this.db),
      repo.listNodes(this.db),
      repo.gpuUsage(this.db),
      repo.readyTemplates(this.db),
    ]).then(([prices, nodes, usage, ready]) => ({ prices, nodes, usage, ready }));
    const mine: NonNullable<typeof this.offersSnapshot> = { loadedAt: now, epoch: this.offersEpoch, inputs };
    this.offersSnapshot = mine;
    inputs.then(
      (loaded) => {
        mine.loaded = loaded;
      },
      () => {
        if (this.offersSnapshot === mine) this.offersSnapshot = undefined; // a failed read is not kept
      },
    );
    return inputs;
  }

  /**
   * The current offers snapshot if it is loaded and still current, without
   * waiting; undefined when `offerInputs` would read it again or is reading it.
   */
  offersNow(): OfferInputs | undefined {
    const s = this.offersSnapshot;
    const current = s?.loaded && s.epoch === this.offersEpoch && performance.now() - s.loadedAt < OFFERS_MAX_AGE_MS;
    return current ? s.loaded : undefined;
  }

  /** What offers are made of has changed (call once the change has committed). */
  offersChanged(): void {
    this.offersEpoch++;
  }

  /** Marks the current transaction as changing offers: the snapshot is replaced after it commits. */
  private changesOffers(tx: Queryable): void {
    afterCommit(tx, () => this.offersChanged());
  }

  /** Ships the default prices once; never overwrites an operator's prices. */
  async ensureDefaultPricing(): Promise<void> {
    const now = this.clock.now();
    for (const p of DEFAULT_PRICING) {
      await repo.insertPricingIfMissing(this.db, p, now);
    }
    this.offersChanged();
  }

  // ---- prices (docs/offers.md#prices) ----

  async pricingRows(q: Queryable = this.db): Promise<PricingRow[]> {
    return repo.listPricing(q);
  }

  /** The price of a GPU type, if one is set. */
  async findPricing(q: Queryable, gpuType: string): Promise<PricingRow | undefined> {
    return repo.getPricing(q, gpuType);
  }

  async pricingFor(q: Queryable, gpuType: string): Promise<PricingRow> {
    const p = await this.findPricing(q, gpuType);
    if (!p) throw noPrice(gpuType);
    return p;
  }

  async adminPricing(): Promise<PricingRecord[]> {
    return (await repo.listPricing(this.db)).map(toPricingRecord);
  }

  /** Fields not sent keep their value; read and written under a row lock so concurrent partial updates all land. */
  async putPricing(gpuType: string, u: PricingUpdate): Promise<PricingRecord> {
    if (!(repo.GPU_TYPES as readonly string[]).includes(gpuType)) throw notFound(`GPU type ${gpuType}`);
    const row = await this.db.transaction(async (tx) => {
      this.changesOffers(tx);
      const current =
        (await repo.getPricing(tx, gpuType, true)) ?? DEFAULT_PRICING.find((p) => p.gpu_type === gpuType)!;
      return repo.upsertPricing(
        tx,
        {
          gpu_type: gpuType as GpuType,
          gpu_ram_mb: u.gpu_ram_mb ?? current.gpu_ram_mb,
          gpu_price_hourly_micros: moneyField('gpu_price_hourly', u.gpu_price_hourly, current.gpu_price_hourly_micros),
          interruptible_rate_micros: moneyField(
            'interruptible_rate',
            u.interruptible_rate,
            current.interruptible_rate_micros,
          ),
          storage_price_gb_hourly_micros: moneyField(
            'storage_price_gb_hourly',
            u.storage_price_gb_hourly,
            current.storage_price_gb_hourly_micros,
          ),
          reserved_discount_1mo_bp: percentField(
            'reserved_discount_1mo',
            u.reserved_discount_1mo,
            current.reserved_discount_1mo_bp,
          ),
          reserved_discount_3mo_bp: percentField(
            'reserved_discount_3mo',
            u.reserved_discount_3mo,
            current.reserved_discount_3mo_bp,
          ),
          reserved_discount_6mo_bp: percentField(
            'reserved_discount_6mo',
            u.reserved_discount_6mo,
            current.reserved_discount_6mo_bp,
          ),
        },
        this.clock.now(),
      );
    });
    return toPricingRecord(row);
  }

  /** GET /pricing: public prices with GPU totals and free GPUs on active nodes. */
  async publicPricing(inputs?: OfferInputs) {
    const { prices, nodes, usage } = inputs ?? (await this.offerInputs());
    const updated = prices.reduce((m, p) => Math.max(m, p.updated_at.getTime()), 0);
    return {
      currency: CURRENCY,
      updated_at: new Date(updated || this.clock.nowMs()).toISOString(),
      gpu_types: prices.map((p) => {
        const active = nodes.filter((n) => n.gpu_type === p.gpu_type && n.status === 'active');
        const { updated_at: _u, ...rec } = toPricingRecord(p);
        return {
          ...rec,
          total_gpus: active.reduce((s, n) => s + n.gpu_count, 0),
          available_gpus: active.reduce((s, n) => s + free(n, usage.get(n.node)), 0),
        };
      }),
    };
  }

  // ---- offers (docs/offers.md#search) ----

  async search(f: SearchFilters, inputs?: OfferInputs): Promise<{ items: Offer[]; total: number }> {
    const rental = f.rental_type ?? 'on_demand';
    const { prices, nodes, usage, ready } = inputs ?? (await this.offerInputs());
    const priceOf = new Map(prices.map((p) => [p.gpu_type, p]));
    const offers: Offer[] = [];
    for (const n of nodes) {
      const p = priceOf.get(n.gpu_type);
      if (!p || n.status !== 'active') continue;
      if (f.gpu_type && n.gpu_type !== f.gpu_type) continue;
      if (f.location && n.location.toLowerCase() !== f.location.toLowerCase()) continue;
      if (f.template_vmid !== undefined && !ready.has(`${n.node}:${f.template_vmid}`)) continue;
      const u = usage.get(n.node);
      const freeNow = free(n, u);
      const forOnDemand = freeNow + (u?.preemptible ?? 0);
      const rentable = rental === 'interruptible' ? freeNow : forOnDemand;
      if (rentable < 1) continue;
      if (f.min_gpus !== undefined && rentable < f.min_gpus) continue;
      const unitPrice = rental === 'interruptible' ? p.interruptible_rate_micros : p.gpu_price_hourly_micros;
      // Both sides are decimal numbers of the major unit: compared by value.
      if (f.max_price !== undefined && toAmount(unitPrice) > f.max_price) continue;
      offers.push({
        node: n.node,
        gpu_type: n.gpu_type,
        gpu_count: rentable,
        gpu_ram_mb: n.gpu_ram_mb,
        total_gpu_ram_mb: n.gpu_ram_mb * rentable,
        ram_gb: n.ram_gb,
        cpu_cores: n.cpu_cores,
        cpu_model: n.cpu_model,
        pcie_gen: n.pcie_gen,
        max_storage_gb: n.max_storage_gb,
        gpu_price_hourly: toAmount(p.gpu_price_hourly_micros),
        interruptible_rate: toAmount(p.interruptible_rate_micros),
        storage_price_hourly: toAmount(p.storage_price_gb_hourly_micros),
        total_price_hourly: toAmount(
          rentable * p.gpu_price_hourly_micros + MIN_STORAGE_GB * p.storage_price_gb_hourly_micros,
        ),
        reserved_discount_1mo: bpToPercent(p.reserved_discount_1mo_bp),
        reserved_discount_3mo: bpToPercent(p.reserved_discount_3mo_bp),
        reserved_discount_6mo: bpToPercent(p.reserved_discount_6mo_bp),
        available_ondemand: forOnDemand >= 1,
        available_interruptible: freeNow >= 1,
        available_reserved: forOnDemand >= 1,
        location: n.location,
        cluster_name: n.cluster_name,
      });
    }
    offers.sort((a, b) => a.gpu_price_hourly - b.gpu_price_hourly || (a.node < b.node ? -1 : a.node > b.node ? 1 : 0));
    return { items: offers.slice(f.offset, f.offset + f.limit), total: offers.length };
  }

  // ---- nodes (docs/offers.md#nodes) ----

  /** Newest first, paginated, the total in X-Total-Count. */
  async listNodes(
    page: { limit: number; offset: number } = { limit: 50, offset: 0 },
  ): Promise<{ items: NodeRecord[]; total: number }> {
    const { rows, total } = await repo.pageNodes(this.db, page.limit, page.offset);
    const usage = rows.length
      ? await repo.gpuUsage(
          this.db,
          rows.map((n) => n.node),
        )
      : new Map<string, GpuUsage>();
    return { items: rows.map((n) => toNodeRecord(n, usage.get(n.node))), total };
  }

  async getNode(node: string): Promise<NodeRecord> {
    const n = await repo.getNode(this.db, node);
    if (!n) throw notFound(`Node ${node}`);
    return toNodeRecord(n, (await repo.gpuUsage(this.db, [node])).get(node));
  }

  /** For placement: the node row locked for the rest of the transaction (serializes GPU allocation per node). */
  async lockNode(tx: Queryable, node: string): Promise<FullNodeRow | undefined> {
    return repo.getNode(tx, node, true);
  }

  /**
   * The node a stopped VM of `from` moves to, locked, with `gpuCount` GPUs free behind the lock; none
   * when no node qualifies (docs/vms.md#start-on-another-host).
   */
  async lockMoveTarget(
    tx: Queryable,
    from: FullNodeRow,
    want: { gpuCount: number; storageGb: number },
  ): Promise<FullNodeRow | undefined> {
    const candidates = await repo.lockMoveTargets(tx, {
      from: from.node,
      gpuType: from.gpu_type,
      gpuCount: want.gpuCount,
      storageGb: want.storageGb,
      agent: from.agent_url !== null,
      cluster: from.cluster_name,
    });
    for (const node of candidates) {
      if (node.gpu_count - (await this.usage(tx, node.node)).held >= want.gpuCount) return node;
    }
    return undefined;
  }

  async usage(tx: Queryable, node: string): Promise<GpuUsage> {
    return (await repo.gpuUsage(tx, [node])).get(node) ?? { held: 0, preemptible: 0 };
  }

  async createNode(input: NodeInput): Promise<NodeRecord> {
    const { agent_url: rawUrl, agent_token: token, ...fields } = input;
    const url = rawUrl == null ? null : agentUrl(rawUrl);
    if (url && token === undefined)
      throw validation('body.agent_token', 'is required with agent_url (the agent refuses calls without it)');
    if (!url && token !== undefined) throw validation('body.agent_url', 'is required with agent_token');
    const pricing = await repo.getPricing(this.db, input.gpu_type);
    const row = await repo.insertNode(
      this.db,
      {
        ...fields,
        gpu_ram_mb: input.gpu_ram_mb ?? pricing?.gpu_ram_mb ?? 24_576,
        status: input.status ?? 'active',
        agent_url: url,
        agent_token_sealed: token === undefined ? null : seal(this.tokenKey, token),
      },
      this.clock.now(),
    );
    if (!row) throw new AppError('conflict', `Node ${input.node} already exists`);
    this.offersChanged(); // a single statement: committed already
    const endpoint = this.endpointOf(row);
    // The agent is asked right away, outside any transaction; one that does not answer is still registered.
    if (endpoint) return this.agentFirstContact(row.node, await this.probeAgent(endpoint).catch(() => null));
    return toNodeRecord(row, undefined);
  }

  // ---- host agents ----

  /** The agent of a node with one, token unsealed; null for a simulated or unknown node. */
  async agentEndpoint(node: string): Promise<AgentEndpoint | null> {
    const row = await repo.agentOf(this.db, node);
    if (!row?.agent_url || !row.agent_token_sealed) return null;
    return { url: row.agent_url, token: open(this.tokenKey, row.agent_token_sealed) };
  }

  /** Every node as the template catalogue sees it (its GPU type, status and whether an agent runs it). */
  async catalogueNodes(): Promise<CatalogueNode[]> {
    return (await repo.listNodes(this.db)).map(catalogueNodeOf);
  }

  async catalogueNode(node: string): Promise<CatalogueNode | null> {
    const row = await repo.getNode(this.db, node);
    return row ? catalogueNodeOf(row) : null;
  }

  /** Whether a node is driven by a host agent (without unsealing its token). */
  async hasAgent(node: string): Promise<boolean> {
    const row = await repo.agentOf(this.db, node);
    return !!row?.agent_url && !!row.agent_token_sealed;
  }

  endpointOf(row: FullNodeRow): AgentEndpoint | null {
    if (!row.agent_url || !row.agent_token_sealed) return null;
    return { url: row.agent_url, token: open(this.tokenKey, row.agent_token_sealed) };
  }

  /** The agents due for a heartbeat, claimed for this instance (real time: agents are real processes). */
  async claimAgentChecks(realNow: Date, intervalMs: number): Promise<FullNodeRow[]> {
    return repo.claimAgentChecks(this.db, realNow, intervalMs);
  }

  /**
   * The agent answered: it is online, with what it reports. A node that went
   * offline because its agent had stopped answering comes back to the status
   * it had, and its VMs with it.
   */
  async agentAnswered(node: string, info: AgentInfo): Promise<void> {
    await this.db.transaction(async (tx) => {
      const before = await repo.getNode(tx, node, true);
      if (!before?.agent_url) return;
      const now = this.clock.now();
      const back = before.agent_offline_from !== null && before.status === 'offline' ? before.agent_offline_from : null;
      await repo.updateNode(
        tx,
        node,
        {
          agent_status: 'online',
          agent_seen_at: now,
          agent_misses: 0,
          agent_info: info,
          agent_offline_from: null,
          ...(back ? { status: back } : {}),
        },
        now,
        back !== null,
      );
      if (back) {
        this.changesOffers(tx);
        await this.statusChanged(tx, node, 'offline', back, now, 'agent_back');
      }
    });
  }

  /** The agent did not answer: after AGENT_MAX_MISSES in a row it is offline, and so is the node. */
  async agentMissed(node: string): Promise<{ misses: number; tookOffline: boolean }> {
    return this.db.transaction(async (tx) => {
      const before = await repo.getNode(tx, node, true);
      if (!before?.agent_url) return { misses: 0, tookOffline: false };
      const now = this.clock.now();
      const misses = before.agent_misses + 1;
      const down = misses >= AGENT_MAX_MISSES;
      const takeOffline = down && before.status !== 'offline';
      await repo.updateNode(
        tx,
        node,
        {
          agent_misses: misses,
          ...(down ? { agent_status: 'offline' as const } : {}),
          ...(takeOffline
            ? { status: 'offline' as const, agent_offline_from: before.status as 'active' | 'draining' }
            : {}),
        },
        now,
        takeOffline,
      );
      if (takeOffline) {
        this.changesOffers(tx);
        await this.statusChanged(tx, node, before.status, 'offline', now, 'agent_unreachable');
      }
      return { misses, tookOffline: takeOffline };
    });
  }

  /** At registration: what the agent said, or that it did not answer (still registered, shown offline). */
  async agentFirstContact(node: string, info: AgentInfo | null): Promise<NodeRecord> {
    const now = this.clock.now();
    const patch = info
      ? { agent_status: 'online' as const, agent_seen_at: now, agent_misses: 0, agent_info: info }
      : { agent_status: 'offline' as const, agent_misses: AGENT_MAX_MISSES };
    await repo.updateNode(this.db, node, patch, now, false);
    // What the host holds is learnt at once, so that VMs can be created on it without waiting for a heartbeat.
    if (info) for (const hook of this.contactHooks) await hook(node).catch(() => undefined);
    return this.getNode(node);
  }

  /** Called when a node's agent answered its first call (at registration, or after a new URL or token). */
  onAgentContact(hook: (node: string) => Promise<void>): void {
    this.contactHooks.push(hook);
  }

  async patchNode(node: string, input: Partial<Omit<NodeInput, 'node'>>): Promise<NodeRecord> {
    const { agent_url: rawUrl, agent_token: token, ...patch } = input;
    const url = rawUrl === undefined ? undefined : rawUrl === null ? null : agentUrl(rawUrl);
    return this.db.transaction(async (tx) => {
      const before = await repo.getNode(tx, node, true);
      if (!before) throw notFound(`Node ${node}`);
      this.changesOffers(tx);
      const agentChange: Partial<FullNodeRow> = {};
      if (url !== undefined || token !== undefined) {
        const nextUrl = url === undefined ? before.agent_url : url;
        if (nextUrl === null && token !== undefined) throw validation('body.agent_token', 'needs an agent_url');
        if (nextUrl !== null && token === undefined && before.agent_token_sealed === null) {
          throw validation('body.agent_token', 'is required with agent_url (the agent refuses calls without it)');
        }
        // The driver of a node's VMs never changes under them: a node with VMs keeps having an agent or not.
        if ((nextUrl === null) !== (before.agent_url === null) && (await repo.liveVmCount(tx, node)) > 0) {
          throw invalidState(
            `Node ${node} has VMs; it cannot ${nextUrl === null ? 'leave its agent' : 'move to an agent'} until they are destroyed`,
          );
        }
        Object.assign(agentChange, {
          agent_url: nextUrl,
          agent_token_sealed:
            nextUrl === null ? null : token !== undefined ? seal(this.tokenKey, token) : before.agent_token_sealed,
          // A new address or token is checked afresh on the next heartbeat.
          agent_status: nextUrl === null ? null : before.agent_status,
          agent_misses: 0,
        });
        if (nextUrl === null)
          Object.assign(agentChange, { agent_info: null, agent_seen_at: null, agent_offline_from: null });
      }
      // An operator's status decision replaces one the heartbeats made.
      if (patch.status !== undefined) agentChange.agent_offline_from = null;
      const usage = (await repo.gpuUsage(tx, [node])).get(node);
      if (patch.gpu_count !== undefined && patch.gpu_count < (usage?.held ?? 0)) {
        throw invalidState(`Node ${node} has ${usage!.held} GPUs in use; gpu_count cannot go below that`);
      }
      if (
        patch.gpu_type !== undefined &&
        patch.gpu_type !== before.gpu_type &&
        (await repo.liveVmCount(tx, node)) > 0
      ) {
        throw invalidState(`Node ${node} has VMs; its GPU type cannot change`);
      }
      const change = { ...patch };
      if (change.gpu_type !== undefined && change.gpu_type !== before.gpu_type && change.gpu_ram_mb === undefined) {
        // Another GPU model: its VRAM follows the new type's unless given.
        const p = await repo.getPricing(tx, change.gpu_type);
        if (p) change.gpu_ram_mb = p.gpu_ram_mb;
      }
      const now = this.clock.now();
      const after = (await repo.updateNode(tx, node, { ...change, ...agentChange }, now))!;
      if (after.status !== before.status) {
        await this.statusChanged(tx, node, before.status, after.status, now, 'admin');
      }
      return toNodeRecord(after, (await repo.gpuUsage(tx, [node])).get(node));
    });
  }

  async deleteNode(node: string): Promise<void> {
    await this.db.transaction(async (tx) => {
      const n = await repo.getNode(tx, node, true);
      if (!n) throw notFound(`Node ${node}`);
      const live = await repo.liveVmCount(tx, node);
      if (live > 0) throw invalidState(`Node ${node} still has ${live} VM(s); destroy them or set the node offline`);
      await repo.deleteNode(tx, node);
      this.changesOffers(tx);
    });
  }
}
