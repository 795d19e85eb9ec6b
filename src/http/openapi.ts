/** The OpenAPI 3.1.0 document at /openapi.json and the interactive docs at /docs (CONTRACT D8, D9). */
import type { FastifyInstance } from 'fastify';
import swagger from '@fastify/swagger';
import swaggerUi from '@fastify/swagger-ui';

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

**Rate limits** (per user, per email for login, per IP before authentication), 60 s windows:
login 5, other /auth 10, VM mutations 30, everything else 300. Headers \`X-RateLimit-Limit\`,
\`X-RateLimit-Remaining\`, \`X-RateLimit-Reset\` (seconds); 429 carries \`Retry-After\`.

**Idempotency.** \`Idempotency-Key\` (up to 255 characters) on POST /vms, /ssh-keys, /api-keys and
/admin/users/{id}/credits replays the first response for 24 h.`;

export async function registerOpenApi(app: FastifyInstance): Promise<void> {
  await app.register(swagger, {
    openapi: {
      openapi: '3.1.0',
      info: { title: 'gpucloud API', version: API_VERSION, description: DESCRIPTION },
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
      tags: [
        { name: 'auth', description: 'Registration, login, tokens and two-factor authentication' },
        { name: 'account', description: 'The caller\'s account' },
        { name: 'api-keys', description: 'API keys for programs' },
        { name: 'ssh-keys', description: 'SSH public keys for VM access' },
        { name: 'admin', description: 'Operator endpoints (admin role)' },
        { name: 'system', description: 'Health, readiness, metrics' },
      ],
    },
    refResolver: {
      buildLocalReference: (json, _baseUri, _fragment, i) => (typeof json.$id === 'string' ? json.$id : `def-${i}`),
    },
  });
  await app.register(swaggerUi, {
    routePrefix: '/docs',
    // A token typed into the docs is not kept in the browser's storage for the next visitor.
    uiConfig: { docExpansion: 'list', deepLinking: true, persistAuthorization: false },
    uiHooks: {},
    staticCSP: true,
  });
  app.get(
    '/openapi.json',
    { schema: { hide: true }, config: { auth: 'public', rateLimit: false } },
    async () => app.swagger(),
  );
}
