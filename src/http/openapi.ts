/**
 * The OpenAPI 3.1.0 document at /openapi.json and the interactive docs at
 * /docs. Operation ids are part of the API (client generators name methods
 * after them): docs/api.md lists them and a test keeps that list and the
 * document equal, so renaming one is always on purpose.
 */
import type { FastifyInstance } from 'fastify';
import swagger from '@fastify/swagger';
import swaggerUi from '@fastify/swagger-ui';
import { declareRoutes } from './route-rules.js';
import { SHARED_ERROR_RESPONSES } from './schemas.js';
import { OPTIONAL_BODY } from './no-body.js';

export const API_VERSION = '1.0.0';

const DESCRIPTION = `Rent GPU-backed virtual machines and pay hourly from a prepaid credit balance.

**Authentication.** Send \`Authorization: Bearer <token>\` where the token is a JWT access token
from \`POST /auth/login\` (valid 3600 s, renewed with \`POST /auth/refresh\`) or an API key
(\`gpc_...\`, from \`POST /api-keys\`). Scopes: \`read_write\` (everything), \`read_only\` (GETs of VMs,
SSH keys, reservations, billing, account), \`billing_only\` (GET /billing/*, GET /account,
POST /reservations/calculate).

**Errors** are \`{"detail": "...", "code": "..."}\`; 422 adds \`errors: [{field, message}]\`.

**Lists** take \`limit\` (1..100, default 50) and \`offset\`, return a bare array newest first, and
set \`X-Total-Count\`.

**Rate limits** (per user, per IP before authentication), 60 s windows: failed logins 5 per email from one
address and 20 per email from all addresses (a successful login uses up nothing), other /auth 10, VM mutations
30, everything else 300. Headers \`X-RateLimit-Limit\`,
\`X-RateLimit-Remaining\`, \`X-RateLimit-Reset\` (seconds); 429 carries \`Retry-After\`.

**Idempotency.** \`Idempotency-Key\` (up to 255 characters) on POST /vms, /ssh-keys, /api-keys, /webhooks and
/admin/users/{id}/credits replays the first response for 24 h.`;

/** The tags, in the order the docs show them. */
export const TAGS = [
  { name: 'auth', description: 'Sign up, sign in, tokens and two-factor authentication' },
  { name: 'account', description: "The caller's account" },
  { name: 'ssh-keys', description: 'SSH public keys installed on new VMs' },
  { name: 'api-keys', description: 'API keys for programs, with read_write, read_only or billing_only scope' },
  { name: 'events', description: 'What happened to your VMs, money, keys and account, oldest first' },
  { name: 'webhooks', description: 'Endpoints that receive your events as they happen, signed (Standard Webhooks)' },
  { name: 'offers', description: 'GPU offers and the public price list' },
  { name: 'vms', description: 'Rent, start, stop and destroy VMs: on-demand, reserved or interruptible' },
  { name: 'images', description: 'Private images of your VMs (snapshots), to start new VMs from' },
  { name: 'billing', description: 'Credit balance, the ledger, usage and current spend' },
  { name: 'reservations', description: 'Prepaid 1, 3 or 6-month commitments at a discount' },
  { name: 'admin', description: 'Operator endpoints: nodes, prices, users, every VM, the clock (admin role)' },
  { name: 'system', description: 'Health, readiness and metrics' },
];

export interface OpenApiOptions {
  /** `servers[0].url`: an absolute URL, or `/` for the origin the document was fetched from. */
  publicUrl: string;
  supportEmail?: string | undefined;
}

type Json = Record<string, unknown>;

/**
 * Points every error response that is one of the shared ones (same status and
 * description) at `#/components/responses/NAME`, so each is described once.
 */
export function sharedResponseRefs(doc: Json): Json {
  const byKey = new Map<string, string>();
  for (const [name, r] of Object.entries(SHARED_ERROR_RESPONSES)) byKey.set(`${r.status} ${r.description}`, name);
  const responses: Json = {};
  for (const [name, r] of Object.entries(SHARED_ERROR_RESPONSES)) {
    const headers: Json = {
      'X-Request-Id': { $ref: '#/components/headers/X-Request-Id' },
    };
    if (r.status === 429) headers['Retry-After'] = { $ref: '#/components/headers/Retry-After' };
    responses[name] = {
      description: r.description,
      headers,
      content: { 'application/json': { schema: { $ref: '#/components/schemas/ErrorResponse' } } },
    };
  }
  const paths = (doc.paths ?? {}) as Record<string, Record<string, Json>>;
  for (const item of Object.values(paths)) {
    for (const op of Object.values(item)) {
      // A body the operation takes but does not need (see http/no-body.ts): Fastify would demand one
      // if it were the route's `body` schema, so it travels as this extension and becomes optional here.
      if (op[OPTIONAL_BODY] !== undefined) {
        op.requestBody = { required: false, content: { 'application/json': { schema: op[OPTIONAL_BODY] } } };
        delete op[OPTIONAL_BODY];
      }
      const rs = op.responses as Record<string, Json> | undefined;
      if (!rs) continue;
      for (const [status, r] of Object.entries(rs)) {
        const name = byKey.get(`${status} ${String(r.description)}`);
        if (name) rs[status] = { $ref: `#/components/responses/${name}` };
      }
    }
  }
  const components = (doc.components ?? {}) as Json;
  components.responses = responses;
  components.headers = {
    'X-Request-Id': {
      description:
        "The request's id: the client's own X-Request-Id when it sent a sane one, otherwise a new one. Quote it when reporting a problem.",
      schema: { type: 'string' },
    },
    'Retry-After': {
      description: 'Seconds until the rate limit window resets',
      schema: { type: 'integer', minimum: 0 },
    },
  };
  doc.components = components;
  return doc;
}

/**
 * A Swagger UI plugin whose Logo component renders nothing. Swagger UI's options are written into the
 * page's script as text (functions by their source), so the plugin is made from its source here: a
 * function written in this file would be serialized as whatever the compiler made of it (helpers
 * that do not exist in the browser included).
 */
const NO_SVG_LOGO_PLUGIN = new Function('return { components: { Logo: function () { return null; } } };') as (
  system: unknown,
) => { components: Record<string, unknown> };

/** The document and the docs UI: the same for everyone, never rate limited, and read no time. */
const DOCS = { auth: 'public', rateLimit: false, readsTime: false, cache: 'public' } as const;

export async function registerOpenApi(app: FastifyInstance, opts: OpenApiOptions): Promise<void> {
  await app.register(swagger, {
    openapi: {
      openapi: '3.1.0',
      info: {
        title: 'gpucloud API',
        version: API_VERSION,
        description: DESCRIPTION,
        license: { name: 'MIT', identifier: 'MIT' },
        contact: {
          name: 'The operator of this service',
          ...(opts.publicUrl.startsWith('http') ? { url: opts.publicUrl } : {}),
          ...(opts.supportEmail ? { email: opts.supportEmail } : {}),
        },
      },
      servers: [
        {
          url: opts.publicUrl,
          description: opts.publicUrl === '/' ? 'The origin this document was served from' : 'The API',
        },
      ],
      components: {
        securitySchemes: {
          bearer: {
            type: 'http',
            scheme: 'bearer',
            description: 'A JWT access token or an API key (gpc_...)',
          },
        },
      },
      security: [{ bearer: [] }],
      tags: TAGS,
    },
    refResolver: {
      buildLocalReference: (json, _baseUri, _fragment, i) => (typeof json.$id === 'string' ? json.$id : `def-${i}`),
    },
    transformObject: (doc) =>
      'openapiObject' in doc
        ? (sharedResponseRefs(doc.openapiObject as Json) as typeof doc.openapiObject)
        : doc.swaggerObject,
  });
  // Swagger UI's pages and files take no route options: they are declared in the context it is registered in
  // (@fastify/swagger stays at the root, where it sees every route).
  await app.register(async (docs) => {
    declareRoutes(docs, () => true, DOCS);
    await docs.register(swaggerUi, {
      routePrefix: '/docs',
      // A token typed into the docs is not kept in the browser's storage for the next visitor.
      uiConfig: {
        docExpansion: 'list',
        deepLinking: true,
        persistAuthorization: false,
        // Swagger UI draws its top bar's logo as an inline SVG holding a <style> element, which the page's CSP
        // (no inline style) refuses, logging a violation on every visit. This plugin draws nothing there; the
        // logo @fastify/swagger-ui puts in once the bar renders (an <img>) stays. The list replaces the
        // initializer's, whose one plugin (DownloadUrl) the API preset already includes.
        plugins: [NO_SVG_LOGO_PLUGIN],
      },
      uiHooks: {},
      staticCSP: true,
    });
  });
  app.get('/openapi.json', { schema: { hide: true }, config: DOCS }, async () => app.swagger());
}
