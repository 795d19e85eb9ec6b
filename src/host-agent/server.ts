/**
 * The agent's HTTP API (version 1), which only the control plane calls.
 * Every route needs `Authorization: Bearer TOKEN` (compared in constant
 * time; an export's disk route also takes that export's transfer token, for
 * the host a VM moves to); errors are `{detail, code}` like the public API's.
 * Every call is safe to repeat. The control plane's client is src/hypervisor/host-agent-client.ts.
 *
 *   GET    /healthz               liveness, no token
 *   GET    /v1/host               the host (version, accelerator, CPU, GPUs, templates) and every VM
 *   PUT    /v1/templates          the templates the host must hold: downloads, clean-up; answers their states
 *   PUT    /v1/vms/:id            provision (idempotent): disk overlay, seed, SSH port; with `disk`: an import
 *                                  (202, `importing` until the downloaded disk is verified and built)
 *   GET    /v1/vms/:id            one VM's state
 *   GET    /v1/vms/:id/console    the end of its serial console (text, `?bytes=` up to 65536)
 *   POST   /v1/vms/:id/start      bind its GPUs and start QEMU; `booting` until SSH answers, then `running`
 *   POST   /v1/vms/:id/stop       {timeout_s}: ACPI power-down, a hard quit after timeout_s
 *   DELETE /v1/vms/:id            stop hard and remove every file of the VM
 *   GET    /v1/vms/:id/tunnel?port=N   (Upgrade: gpucloud-tunnel) a TCP stream to a web port (tunnel.ts)
 *   POST   /v1/vms/:id/export     {token}: flatten a stopped VM's disk into export.qcow2 (202 exporting, 200 ready)
 *   GET    /v1/vms/:id/export     the export's state (404 when there is none)
 *   GET    /v1/vms/:id/export/disk   the export's bytes (Range: bytes=N-); the export's transfer token is
 *                                  accepted here as well as the node's token, and nowhere else
 *   DELETE /v1/vms/:id/export     remove the export's files
 */
import { readFileSync } from 'node:fs';
import { open } from 'node:fs/promises';
import Fastify, { type FastifyInstance, type FastifyRequest } from 'fastify';
import { Type, type Static } from 'typebox';
import { sameSecret, secretDigest } from '../crypto.js';
import { AgentError, UUID } from './errors.js';
import type { VmManager } from './vms.js';
import { ExportError, sendRange } from './images/export.js';
import { handleTunnel } from './tunnel.js';
import { USER_RE, type TemplateStore } from './templates.js';

export const AGENT_VERSION = (
  JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { version: string }
).version;

const ProvisionBody = Type.Object(
  {
    vmid: Type.Integer({ minimum: 1, maximum: 999_999_999 }),
    template_vmid: Type.Integer({ minimum: 1, maximum: 999_999_999 }),
    cpu_cores: Type.Integer({ minimum: 1, maximum: 256 }),
    ram_mb: Type.Integer({ minimum: 128, maximum: 4_194_304 }),
    storage_gb: Type.Integer({ minimum: 1, maximum: 100_000 }),
    gpu_count: Type.Integer({ minimum: 0, maximum: 16 }),
    auth_method: Type.Union([Type.Literal('ssh_key'), Type.Literal('password')]),
    ssh_public_key: Type.Union([Type.String({ minLength: 1, maxLength: 16_384 }), Type.Null()]),
    password: Type.Union([Type.String({ minLength: 1, maxLength: 1024 }), Type.Null()]),
    web_ports: Type.Optional(
      Type.Array(Type.Integer({ minimum: 1, maximum: 65535 }), { maxItems: 16, uniqueItems: true }),
    ),
    // Checked again as a user name (USER_RE) where it is used.
    user: Type.Optional(Type.String({ minLength: 1, maxLength: 32 })),
    disk: Type.Optional(
      Type.Object(
        {
          url: Type.String({ minLength: 8, maxLength: 2048, pattern: '^https?://[!-~]+$' }),
          // Sent as a header: printable ASCII without spaces.
          token: Type.String({ minLength: 1, maxLength: 4096, pattern: '^[!-~]+$' }),
          sha256: Type.String({ pattern: '^[0-9a-f]{64}$' }),
          size_bytes: Type.Integer({ minimum: 1, maximum: 2 ** 50 }),
          format: Type.Union([Type.Literal('qcow2'), Type.Literal('raw')]),
        },
        { additionalProperties: false },
      ),
    ),
  },
  { additionalProperties: false },
);

const ExportBody = Type.Object(
  { token: Type.String({ minLength: 32, maxLength: 4096, pattern: '^[!-~]+$' }) },
  { additionalProperties: false },
);

/** An http(s) URL without credentials, else 422 naming `what`. */
function checkUrl(raw: string, what: string): void {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    throw new AgentError(422, 'validation_error', `${what}: url is not a URL`);
  }
  if ((url.protocol !== 'http:' && url.protocol !== 'https:') || url.username || url.password)
    throw new AgentError(422, 'validation_error', `${what}: url must be http(s) without credentials`);
}

/** The control plane's whole desired set; up to 4 MiB of it (the other routes take 64 KiB). */
const DesiredBody = Type.Object(
  {
    templates: Type.Array(
      Type.Object(
        {
          vmid: Type.Integer({ minimum: 1, maximum: 999_999_999 }),
          user: Type.String({ pattern: USER_RE.source }),
          sha256: Type.String({ pattern: '^[0-9a-f]{64}$' }),
          size_bytes: Type.Integer({ minimum: 1, maximum: 2 ** 50 }),
          format: Type.Union([Type.Literal('qcow2'), Type.Literal('raw')]),
          url: Type.String({ minLength: 8, maxLength: 2048, pattern: '^https?://[!-~]+$' }),
        },
        { additionalProperties: false },
      ),
      { maxItems: 10_000 },
    ),
  },
  { additionalProperties: false },
);

/** What JSON Schema cannot say of a desired set: one entry per vmid, one format and size per checksum, real URLs. */
function checkDesired(body: Static<typeof DesiredBody>): void {
  const vmids = new Set<number>();
  const images = new Map<string, string>();
  for (const t of body.templates) {
    if (vmids.has(t.vmid)) throw new AgentError(422, 'validation_error', `template ${t.vmid} is listed twice`);
    vmids.add(t.vmid);
    const shape = `${t.format}/${t.size_bytes}`;
    if ((images.get(t.sha256) ?? shape) !== shape)
      throw new AgentError(422, 'validation_error', `image ${t.sha256} is listed with two formats or sizes`);
    images.set(t.sha256, shape);
    checkUrl(t.url, `template ${t.vmid}`);
  }
}

const StopBody = Type.Object(
  { timeout_s: Type.Integer({ minimum: 0, maximum: 3600 }) },
  { additionalProperties: false },
);
const IdParams = Type.Object({ id: Type.String({ pattern: UUID.source }) });
const ConsoleQuery = Type.Object(
  // A string: the agent never coerces types, and a query string is text.
  { bytes: Type.Optional(Type.String({ pattern: '^[1-9][0-9]{0,4}$' })) },
  { additionalProperties: false },
);

export interface AgentServerOptions {
  token: string;
  accel: 'kvm' | 'tcg';
  publicHost: string;
  https?: { cert: Buffer; key: Buffer } | null;
  logger?: boolean | object;
}

/** `bytes=N-` or `bytes=N-M` (one range); undefined for none or a form it does not take (the whole file). */
function parseRange(header: string | undefined, size: number): [number, number] | 'unsatisfiable' | undefined {
  const m = header === undefined ? null : /^bytes=(\d{1,16})-(\d{0,16})$/.exec(header.trim());
  if (!m) return undefined;
  const start = Number(m[1]);
  const end = m[2] ? Math.min(Number(m[2]), size - 1) : size - 1;
  if (start >= size || end < start) return 'unsatisfiable';
  return [start, end];
}

/** The route the transfer token of a VM's export opens, and no other. */
const EXPORT_DISK_ROUTE = '/v1/vms/:id/export/disk';

export function hostCpuModel(): string {
  try {
    const m = /^model name\s*:\s*(.+)$/m.exec(readFileSync('/proc/cpuinfo', 'utf8'));
    return m?.[1]?.trim() ?? 'unknown';
  } catch {
    return 'unknown';
  }
}

export async function buildAgentApp(
  vms: VmManager,
  templates: TemplateStore,
  opts: AgentServerOptions,
): Promise<FastifyInstance> {
  // Strict bodies: an unknown field or a wrong type is refused, never dropped or coerced.
  const common = {
    logger: opts.logger ?? false,
    bodyLimit: 64 * 1024,
    ajv: { customOptions: { removeAdditional: false as const, coerceTypes: false as const, useDefaults: false } },
  };
  // http or https: the routes are the same, so one instance type serves both.
  const app = (opts.https
    ? Fastify({ ...common, https: { cert: opts.https.cert, key: opts.https.key } })
    : Fastify(common)) as unknown as FastifyInstance;
  const expected = secretDigest(`Bearer ${opts.token}`);
  const cpuModel = hostCpuModel();

  app.setErrorHandler((err, _req, reply) => {
    if (err instanceof AgentError || err instanceof ExportError)
      return reply.code(err.status).send({ detail: err.message, code: err.code });
    const e = err as { validation?: unknown; statusCode?: number; message: string };
    if (e.validation) return reply.code(422).send({ detail: e.message, code: 'validation_error' });
    if (e.statusCode && e.statusCode < 500)
      return reply.code(e.statusCode).send({ detail: e.message, code: 'bad_request' });
    reply.log.error({ err }, 'agent request failed');
    return reply.code(500).send({ detail: 'internal error', code: 'internal' });
  });
  app.setNotFoundHandler((_req, reply) => reply.code(404).send({ detail: 'no such route', code: 'not_found' }));

  // Digests have one length, so the comparison takes the same time whatever was sent.
  const authorized = (header: string | undefined) => sameSecret(header ?? '', expected);
  app.server.on('upgrade', (req, socket, head) => handleTunnel(vms, authorized, req, socket, head));

  /** A VM's export disk route with that export's transfer token (the route is matched before this hook runs). */
  const transferAuthorized = (req: FastifyRequest) => {
    if (req.routeOptions.url !== EXPORT_DISK_ROUTE || req.method !== 'GET') return false;
    const id = (req.params as { id?: string }).id ?? '';
    return UUID.test(id) && vms.exportAccepts(id, req.headers.authorization);
  };

  app.addHook('onRequest', async (req, reply) => {
    if (req.url === '/healthz') return;
    if (!authorized(req.headers.authorization) && !transferAuthorized(req)) {
      reply.header('WWW-Authenticate', 'Bearer');
      return reply.code(401).send({ detail: 'a valid agent token is required', code: 'unauthorized' });
    }
  });

  app.get('/healthz', async () => ({ status: 'ok' }));

  app.get('/v1/host', async () => {
    const holders = vms.gpuHolders();
    return {
      agent_version: AGENT_VERSION,
      accel: opts.accel,
      host_cpu_model: cpuModel,
      host_gpus: vms.gpus.map((g) => ({
        pci_address: g.pci_address,
        model: g.model,
        vfio: g.vfio,
        iommu_group: g.iommu_group,
        vm_id: holders.get(g.pci_address) ?? null,
      })),
      public_host: opts.publicHost,
      templates: templates.states(),
      vms: vms.list(),
    };
  });

  app.put<{ Body: Static<typeof DesiredBody> }>(
    '/v1/templates',
    { schema: { body: DesiredBody }, bodyLimit: 4 * 1024 * 1024 },
    async (req) => {
      checkDesired(req.body);
      return templates.setDesired(req.body.templates); // the list itself, as `templates` in GET /v1/host
    },
  );

  app.put<{ Params: Static<typeof IdParams>; Body: Static<typeof ProvisionBody> }>(
    '/v1/vms/:id',
    { schema: { params: IdParams, body: ProvisionBody } },
    async (req, reply) => {
      const b = req.body;
      if (b.auth_method === 'ssh_key' && !b.ssh_public_key)
        throw new AgentError(422, 'validation_error', 'ssh_public_key is required for auth_method ssh_key');
      if (b.auth_method === 'password' && !b.password)
        throw new AgentError(422, 'validation_error', 'password is required for auth_method password');
      if (b.disk) checkUrl(b.disk.url, 'disk');
      const view = await vms.provision(req.params.id, b);
      // 202: the VM is being built from its disk in the background.
      return reply.code(view.state === 'importing' ? 202 : 200).send(view);
    },
  );

  app.get<{ Params: Static<typeof IdParams> }>('/v1/vms/:id', { schema: { params: IdParams } }, async (req) =>
    vms.view(req.params.id),
  );

  app.get<{ Params: Static<typeof IdParams>; Querystring: Static<typeof ConsoleQuery> }>(
    '/v1/vms/:id/console',
    { schema: { params: IdParams, querystring: ConsoleQuery } },
    async (req, reply) =>
      reply
        .type('text/plain; charset=utf-8')
        .header('x-content-type-options', 'nosniff')
        .send(vms.consoleTail(req.params.id, Math.min(65_536, Number(req.query.bytes ?? 16_384)))),
  );

  app.post<{ Params: Static<typeof IdParams> }>('/v1/vms/:id/start', { schema: { params: IdParams } }, async (req) =>
    vms.start(req.params.id),
  );

  app.post<{ Params: Static<typeof IdParams>; Body: Static<typeof StopBody> }>(
    '/v1/vms/:id/stop',
    { schema: { params: IdParams, body: StopBody } },
    async (req) => vms.stop(req.params.id, req.body.timeout_s),
  );

  app.delete<{ Params: Static<typeof IdParams> }>(
    '/v1/vms/:id',
    { schema: { params: IdParams } },
    async (req, reply) => {
      await vms.destroy(req.params.id);
      return reply.code(204).send();
    },
  );

  app.post<{ Params: Static<typeof IdParams>; Body: Static<typeof ExportBody> }>(
    '/v1/vms/:id/export',
    { schema: { params: IdParams, body: ExportBody } },
    async (req, reply) => {
      const state = await vms.exportDisk(req.params.id, req.body.token);
      return reply.code(state.state === 'exporting' ? 202 : 200).send(state);
    },
  );

  app.get<{ Params: Static<typeof IdParams> }>('/v1/vms/:id/export', { schema: { params: IdParams } }, async (req) => {
    const state = vms.exports.state(req.params.id, vms.folder(req.params.id));
    if (!state) throw new AgentError(404, 'not_found', `VM ${req.params.id} has no export`);
    return state;
  });

  app.get<{ Params: Static<typeof IdParams> }>(
    EXPORT_DISK_ROUTE,
    { schema: { params: IdParams }, exposeHeadRoute: false },
    async (req, reply) => {
      const { path } = vms.exports.ready(req.params.id, vms.folder(req.params.id));
      // Opened first: the size and the bytes are those of one file, even if the export is made again meanwhile.
      const file = await open(path, 'r');
      try {
        const size = (await file.stat()).size;
        const range = parseRange(req.headers.range, size);
        if (range === 'unsatisfiable')
          return await reply
            .code(416)
            .header('Content-Range', `bytes */${size}`)
            .send({ detail: `the range starts past the export's ${size} bytes`, code: 'validation_error' });
        const [start, end] = range ?? [0, size - 1];
        // Sent by hand from two buffers used again and again (export.ts): a stream's new buffer for each
        // MiB made the agent's garbage collector as busy as the rest of the sending.
        reply.hijack();
        reply.raw.writeHead(range ? 206 : 200, {
          'content-type': 'application/octet-stream',
          'content-length': String(end - start + 1),
          'accept-ranges': 'bytes',
          'cache-control': 'no-store',
          ...(range ? { 'content-range': `bytes ${start}-${end}/${size}` } : {}),
        });
        await sendRange(reply.raw, file, start, end).catch((err: unknown) => {
          req.log.warn({ err }, 'export download cut');
          reply.raw.destroy();
        });
      } finally {
        await file.close();
      }
    },
  );

  app.delete<{ Params: Static<typeof IdParams> }>(
    '/v1/vms/:id/export',
    { schema: { params: IdParams } },
    async (req, reply) => {
      await vms.removeExport(req.params.id);
      return reply.code(204).send();
    },
  );

  await app.ready();
  return app;
}
