/**
 * Nodes and their host agents (docs/offers.md#nodes), and the way in to offers and prices: this
 * class is what the rest of the code calls; offers.ts holds the offers snapshot and the search,
 * pricing.ts the prices. GPU availability always comes from repository.gpuUsage, the one place GPUs
 * are counted.
 */
import type { CatalogueNode } from '../templates/service.js';
import type { Db, Queryable } from '../../db/db.js';
import type { Clock } from '../../clock.js';
import { AppError, invalidState, notFound, validation } from '../../errors.js';
import * as repo from './repository.js';
import type { AgentInfo, FullNodeRow, GpuUsage, NodeStatus, PricingRow } from './repository.js';
import { deriveKey, open, seal } from '../../crypto.js';
import { recordEvent } from '../events/service.js';
import { OffersSnapshot, publicPricing, searchOffers } from './offers.js';
import { agentUrl, catalogueNodeOf, toNodeRecord, type NodeInput } from './nodes.js';
import type { OfferInputs, SearchFilters } from './offers.js';
import { noPrice, Prices, type PricingUpdate } from './pricing.js';
import type { NodeRecord, Offer, PricingRecord } from './schemas.js';

/** Re-exported for the VM module, which answers a create or start without a price with it. */
export { noPrice } from './pricing.js';

/** A node's agent, as the control plane calls it. */
export interface AgentEndpoint {
  url: string;
  token: string;
}

/** After this many unanswered heartbeats in a row a node's agent is offline, and so are its VMs. */
export const AGENT_MAX_MISSES = 3;

/** Called in the same transaction when a node's status changes (the VM module moves VMs offline and back). */
export type NodeStatusHook = (
  tx: Queryable,
  node: string,
  from: NodeStatus,
  to: NodeStatus,
  now: Date,
) => Promise<void>;

export class InventoryService {
  private readonly contactHooks: ((node: string) => Promise<void>)[] = [];
  private readonly statusHooks: NodeStatusHook[] = [];

  private readonly tokenKey: Buffer;
  private readonly offers: OffersSnapshot;
  private readonly prices: Prices;

  constructor(
    private readonly db: Db,
    private readonly clock: Clock,
    /** The service secret: agent tokens are sealed with a key derived from it. */
    secret: string,
    /** Asks an agent about its host (null when it does not answer); used at registration. */
    private readonly probeAgent: (endpoint: AgentEndpoint) => Promise<AgentInfo | null>,
    /** The ready (node, template) pairs offers are made of (the templates module decides readiness). */
    readyTemplates: () => Promise<Set<string>>,
  ) {
    this.tokenKey = deriveKey(secret, 'agent-token');
    this.offers = new OffersSnapshot(db, readyTemplates);
    this.prices = new Prices(db, clock, (tx) => this.changesOffers(tx));
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

  // ---- offers and prices (offers.ts, pricing.ts) ----

  /** The current offers snapshot (read again when it changed or is older than OFFERS_MAX_AGE_MS). */
  offerInputs(): Promise<OfferInputs> {
    return this.offers.inputs();
  }

  /** The current offers snapshot if loaded and still current, without waiting; else undefined. */
  offersNow(): OfferInputs | undefined {
    return this.offers.now();
  }

  /** What offers are made of has changed (call once the change has committed). */
  offersChanged(): void {
    this.offers.changed();
  }

  /** Marks the current transaction as changing offers: the snapshot is replaced after it commits. */
  private changesOffers(tx: Queryable): void {
    this.offers.changesIn(tx);
  }

  /** Ships the default prices once; never overwrites an operator's prices. */
  async ensureDefaultPricing(): Promise<void> {
    await this.prices.ensureDefaults();
    this.offersChanged();
  }

  async pricingRows(q: Queryable = this.db): Promise<PricingRow[]> {
    return repo.listPricing(q);
  }

  /** The price of a GPU type, if one is set. */
  async findPricing(q: Queryable, gpuType: string): Promise<PricingRow | undefined> {
    return this.prices.find(q, gpuType);
  }

  async pricingFor(q: Queryable, gpuType: string): Promise<PricingRow> {
    const p = await this.findPricing(q, gpuType);
    if (!p) throw noPrice(gpuType);
    return p;
  }

  async adminPricing(): Promise<PricingRecord[]> {
    return this.prices.adminList();
  }

  /** Fields not sent keep their value (docs/offers.md#prices). */
  async putPricing(gpuType: string, u: PricingUpdate): Promise<PricingRecord> {
    return this.prices.put(gpuType, u);
  }

  /** GET /pricing without the image storage price. */
  async publicPricing(inputs?: OfferInputs) {
    return publicPricing(inputs ?? (await this.offerInputs()), () => this.clock.nowMs());
  }

  /** GET /search (docs/offers.md#search). */
  async search(f: SearchFilters, inputs?: OfferInputs): Promise<{ items: Offer[]; total: number }> {
    return searchOffers(f, inputs ?? (await this.offerInputs()));
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
    return row ? this.endpointOf(row) : null;
  }

  /** Every node as the template catalogue sees it (its GPU type, status and whether an agent runs it). */
  async catalogueNodes(): Promise<CatalogueNode[]> {
    return (await repo.listNodes(this.db)).map(catalogueNodeOf);
  }

  async catalogueNode(node: string): Promise<CatalogueNode | null> {
    const row = await repo.getNode(this.db, node);
    return row ? catalogueNodeOf(row) : null;
  }

  endpointOf(row: Pick<FullNodeRow, 'agent_url' | 'agent_token_sealed'>): AgentEndpoint | null {
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
