/**
 * Builds every service once, from the configuration and the database: the composition root's first
 * part. The reactions between modules are wired in reactions.ts and the background work declared in
 * schedule.ts; app.ts serves them over HTTP.
 */
import type { FastifyBaseLogger } from 'fastify';
import { ConfigError, localUrl, type Config } from '../config.js';
import type { Db } from '../db/db.js';
import { deriveKey } from '../crypto.js';
import { clientAddress, trustFunction } from '../http/client-address.js';
import type { RateLimitStore } from '../http/rate-limit-store.js';
import { JobMetrics } from '../background/metrics.js';
import { Scheduler } from '../background/scheduler.js';
import { DriverRegistry } from '../hypervisor/registry.js';
import { driverNameOf } from '../hypervisor/registry-repository.js';
import { SimulatorDriver } from '../hypervisor/simulator.js';
import { HostAgentClient } from '../hypervisor/host-agent-client.js';
import { HostAgentDriver } from '../hypervisor/host-agent-driver.js';
import { HypervisorActions } from '../jobs/hypervisor-actions.js';
import { HostMonitor, agentInfoOf } from '../jobs/host-monitor.js';
import { CredentialWatch } from '../http/credential-watch.js';
import { EventHub } from '../modules/events/hub.js';
import { rechecker } from '../modules/auth/identify.js';
import { Portal } from '../modules/portal/service.js';
import { PortalLinks } from '../modules/portal/links.js';
import { PasswordHasher } from '../modules/auth/passwords.js';
import { TokenService } from '../modules/auth/tokens.js';
import { AuthService } from '../modules/auth/service.js';
import { ApiKeyService } from '../modules/api-keys/service.js';
import { WebhookService } from '../modules/webhooks/service.js';
import { SshKeyService } from '../modules/ssh-keys/service.js';
import { AdminUserService } from '../modules/admin/service.js';
import type { ClockService } from '../modules/clock/service.js';
import { InventoryService } from '../modules/inventory/service.js';
import { BillingService } from '../modules/billing/service.js';
import { VmService } from '../modules/vms/service.js';
import { Meter } from '../modules/billing/meter.js';
import { UsageService } from '../modules/billing/usage.js';
import { ReservationService } from '../modules/reservations/service.js';
import { TemplateService } from '../modules/templates/service.js';
import { ImageService } from '../modules/images/service.js';
import { DirectoryImageStore } from '../modules/images/store.js';
import { SnapshotService } from '../modules/snapshots/service.js';
import { ImageMeter } from '../modules/snapshots/meter.js';

export interface AppDeps {
  config: Config;
  db: Db;
  clock: ClockService;
  rateLimitStore: RateLimitStore;
  jwtSecret: string;
  /** The structured log (pino) of requests and of background work; none when absent (tests). */
  log?: FastifyBaseLogger;
  /** The web console's built files (default: dist/console, if built). */
  consoleDir?: string;
}

export interface Services {
  clock: ClockService;
  /** Set while the instance stops: every request gets 503 and Connection: close (docs/operations.md). */
  stopping: { draining: boolean };
  /** The access portal: VM web services on host names of their own (docs/portal.md). */
  portal: Portal;
  passwords: PasswordHasher;
  tokens: TokenService;
  auth: AuthService;
  apiKeys: ApiKeyService;
  sshKeys: SshKeyService;
  adminUsers: AdminUserService;
  inventory: InventoryService;
  billing: BillingService;
  vms: VmService;
  meter: Meter;
  usage: UsageService;
  reservations: ReservationService;
  /** The hypervisor drivers by name, each node driven by the one it names (docs/architecture.md#hypervisor-drivers). */
  driver: DriverRegistry;
  /** The simulated hypervisor of the nodes without an agent (faults and traffic for tests). */
  simulator: SimulatorDriver;
  /** The background work: every job, under either clock (wiring/schedule.ts declares them). */
  scheduler: Scheduler;
  /** Claims due hypervisor actions and runs them through the drivers (one job of the schedule). */
  actions: HypervisorActions;
  /** Heartbeats to host agents (docs/agent.md). */
  hostMonitor: HostMonitor;
  /** The template catalogue and what each host holds of it (docs/templates.md). */
  templates: TemplateService;
  /** Disk images: uploads, the image store, agents' downloads. */
  images: ImageService;
  /** Customer images: snapshots of VMs, and their storage billing. */
  snapshots: SnapshotService;
  imageMeter: ImageMeter;
  webhooks: WebhookService;
  /** The live event streams of this instance: one poller, and their credentials checked on each poll. */
  eventStreams: { hub: EventHub; credentials: CredentialWatch };
  /** The background work's metrics (GET /metrics serves them with the HTTP ones). */
  metrics: JobMetrics;
}

/** The services, unwired: reactions.ts and schedule.ts complete them (createServices does all three). */
export function buildServices(deps: AppDeps): Services {
  const clock = deps.clock.clock;
  const passwords = new PasswordHasher(deps.config.passwordHashConcurrency, undefined, deps.config.passwordHashCost);
  const tokens = new TokenService(deps.jwtSecret, clock);
  const sshKeys = new SshKeyService(deps.db, clock);
  const auth = new AuthService(
    deps.db,
    clock,
    passwords,
    tokens,
    deriveKey(deps.jwtSecret, 'totp-secret'),
    deps.config.sessionMaxDays * 86_400_000,
  );
  const adminUsers = new AdminUserService(deps.db, clock, auth);
  const apiKeys = new ApiKeyService(deps.db, clock);
  // The two modules need each other: offers list the templates ready on each node, and a template's
  // catalogue changes the offers. Readiness is read only once both exist.
  const inventory: InventoryService = new InventoryService(
    deps.db,
    clock,
    deps.jwtSecret,
    (endpoint) =>
      new HostAgentClient(endpoint, 3_000)
        .host()
        .then(agentInfoOf)
        .catch(() => null),
    () => templates.readyPairs(),
  );
  const billing = new BillingService(deps.db, clock);
  const simulator = new SimulatorDriver(deps.db);
  const driver = driversFor(deps, inventory, simulator);
  const meter = new Meter(deps.db, clock, {
    intervalS: deps.config.billingIntervalS,
    networkPricePerGbMicros: deps.config.networkPricePerGbMicros,
    imagePriceGbHourMicros: deps.config.imagePriceGbHourMicros,
  });
  // The two modules need each other: a reserved VM takes its deposit at creation, and a cancelled or
  // ended reservation's VM goes on as on-demand. The conversion is called only once both exist.
  const reservations: ReservationService = new ReservationService(deps.db, clock, inventory, meter, (tx, vmId, now) =>
    vms.convertToOnDemand(tx, vmId, now),
  );
  const links = new PortalLinks(deps.config.portalUrl);
  const trusted = trustFunction(deps.config.trustProxy);
  const templates = new TemplateService(deps.db, clock, imageBaseUrl(deps.config), () => inventory.offersChanged());
  const images = new ImageService(
    deps.db,
    clock,
    new DirectoryImageStore(deps.config.imageStore),
    { maxBytes: deps.config.imageMaxGb * 1024 ** 3 },
    async (node) => (await inventory.agentEndpoint(node))?.token ?? null,
    async (node) => {
      const row = await inventory.catalogueNode(node);
      // Its templates' images, and the customer images its VMs are being built from.
      return new Set([
        ...(row ? (await templates.desiredFor(row)).map((t) => t.sha256) : []),
        ...(await snapshots.imagesForNode(node)),
      ]);
    },
    { exists: (vmid) => templates.exists(vmid), setImage: (tx, vmid, sha) => templates.setImage(tx, vmid, sha) },
  );
  const vms: VmService = new VmService(deps.db, clock, inventory, sshKeys, tokens, reservations, {
    provisionDelayMs: deps.config.simProvisionMs,
    secret: deps.jwtSecret,
    links,
    templates,
    // The two modules need each other: a VM starts from an image, an image is taken of a VM.
    images: {
      forCreate: (tx, userId, imageId, storageGb) => snapshots.forCreate(tx, userId, imageId, storageGb),
      contentOf: (imageId) => snapshots.contentOf(imageId),
    },
  });
  const imageMeter = new ImageMeter(deps.db, {
    intervalS: deps.config.billingIntervalS,
    priceGbHourMicros: deps.config.imagePriceGbHourMicros,
  });
  const snapshots: SnapshotService = new SnapshotService({
    db: deps.db,
    clock,
    meter: imageMeter,
    lockSource: (tx, userId, ref) => vms.lockSnapshotSource(tx, userId, ref),
    currentSource: (vmId) => vms.snapshotSource(vmId),
    driver,
    store: images,
    limits: { maxImages: deps.config.maxImages, maxImageGb: deps.config.maxImageGb },
    log: deps.log,
  });
  const portal = new Portal({
    db: deps.db,
    clock,
    tokens,
    links,
    agentEndpoint: (node) => inventory.agentEndpoint(node),
    templateWeb: (vmid) => templates.webOf(vmid),
    cookieKey: deriveKey(deps.jwtSecret, 'portal-cookie'),
    clientAddress: (req) => clientAddress(req, trusted),
    log: deps.log,
  });
  const usage = new UsageService(deps.db, clock, deps.config.imagePriceGbHourMicros);
  const metrics = new JobMetrics();
  const scheduler = new Scheduler(clock, deps.log, metrics);
  const actions = new HypervisorActions(driver, vms, deps.log, metrics);
  const hostMonitor = new HostMonitor(inventory, vms, templates, deps.config.agentHeartbeatS, deps.log, metrics);
  const webhooks = new WebhookService(deps.db, clock, {
    secret: deps.jwtSecret,
    allowPrivate: deps.config.webhookAllowPrivate,
    timeoutMs: deps.config.webhookTimeoutS * 1000,
    log: deps.log,
    metrics,
  });
  // Open streams are checked again as the requests are, from the database; the manual clock first
  // catches up with an advance made through another instance, so an access token expires everywhere.
  const recheck = rechecker(auth, apiKeys);
  const credentials = new CredentialWatch(async (list) => {
    await deps.clock.sync();
    return recheck(list);
  });
  const hub = new EventHub(deps.db, { log: deps.log, beforeDeliver: () => credentials.check() });
  return {
    clock: deps.clock,
    portal,
    stopping: { draining: false },
    passwords,
    tokens,
    auth,
    apiKeys,
    sshKeys,
    adminUsers,
    inventory,
    billing,
    vms,
    meter,
    usage,
    reservations,
    driver,
    simulator,
    scheduler,
    actions,
    hostMonitor,
    templates,
    images,
    snapshots,
    imageMeter,
    webhooks,
    eventStreams: { hub, credentials },
    metrics,
  };
}

/**
 * The hypervisor drivers, registered by name: `agent` drives a node through its host agent,
 * `simulator` pretends. A node names its driver (nodes.driver); one that names none is driven by its
 * host agent when it has one, else by the simulator (docs/architecture.md#hypervisor-drivers).
 */
function driversFor(deps: AppDeps, inventory: InventoryService, simulator: SimulatorDriver): DriverRegistry {
  const { config } = deps;
  if (config.hypervisor !== 'simulator') {
    throw new ConfigError(
      'GPUCLOUD_HYPERVISOR',
      `${config.hypervisor} has no driver in this version: nodes registered with an agent_url run real VMs through their host agent, the others on the simulator (leave it unset)`,
    );
  }
  const registry = new DriverRegistry((node) => driverNameOf(deps.db, node));
  registry.register(simulator);
  registry.register(
    new HostAgentDriver((node) => inventory.agentEndpoint(node), {
      stopTimeoutS: config.agentStopTimeoutS,
      bootTimeoutS: config.agentBootTimeoutS,
    }),
  );
  return registry;
}

/**
 * Where host agents download images from: GPUCLOUD_PUBLIC_URL when it is an absolute URL, else this
 * instance on its own port (a server that listens on another replaces it once it listens).
 */
function imageBaseUrl(config: Config): string {
  return /^https?:\/\//.test(config.publicUrl) ? config.publicUrl : localUrl(config.host, config.port);
}
