/** /webhooks: endpoints that receive your events, signed the Standard Webhooks way (docs/webhooks.md). */
import type { FastifyInstance } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { Type } from 'typebox';
import { errorResponses, NO_CONTROL, Nullable, page, pageArgs, PaginationQuery } from '../../http/schemas.js';
import { requirePrincipal } from '../../http/principal.js';
import { notFound } from '../../errors.js';
import { UUID_RE } from '../../ids.js';
import { MAX_WEBHOOKS, SUBSCRIBABLE_TYPES, type WebhookService } from './service.js';
import { AttemptSchema, WebhookSchema, WebhookWithSecretSchema } from './schemas.js';

const Url = Type.String({
  minLength: 1,
  maxLength: 2048,
  description:
    'Where to POST: an http or https URL whose host resolves only to addresses outside every special-purpose range of the IANA IPv4 and IPv6 registries and outside multicast (so not loopback, private, link-local, a metadata address, NAT64, 6to4, Teredo or an IPv4-mapped or -translated form). Redirects are not followed.',
});
const EventTypes = Nullable(Type.Array(Type.String(), { minItems: 1, maxItems: 64 }), {
  description: `The event types to send; null or left out: every type, including types added later. The types: ${SUBSCRIBABLE_TYPES.join(', ')}`,
});
const Description = Type.String({
  maxLength: 200,
  pattern: NO_CONTROL,
  description: 'A note for you (at most 200 characters)',
});

const WebhookParams = Type.Object({ webhook_id: Type.String({ description: 'Webhook id (uuid)' }) });
const MANAGE = "Needs a login session or a read_write API key (a webhook's URL may itself be a credential).";

/** Any id that is not a uuid cannot exist: 404 like a missing webhook. */
function idOf(params: { webhook_id: string }): string {
  if (!UUID_RE.test(params.webhook_id)) throw notFound('Webhook');
  return params.webhook_id;
}

export function webhookRoutes(app: FastifyInstance, webhooks: WebhookService): void {
  const r = app.withTypeProvider<TypeBoxTypeProvider>();
  // A session or a read_write key only: a receiver's URL is often a credential itself (docs/security.md).
  const endpoint = { auth: 'user', scopes: [], cache: 'no-store' } as const;

  r.post(
    '/webhooks',
    {
      schema: {
        tags: ['webhooks'],
        operationId: 'createWebhook',
        summary: 'Add a webhook endpoint',
        description: `Events of the chosen types are POSTed to \`url\` as they happen, signed per Standard Webhooks (headers \`webhook-id\`, \`webhook-timestamp\`, \`webhook-signature\`), retried with backoff for about a day until a 2xx comes back. The signing \`secret\` appears in this response only. At most ${MAX_WEBHOOKS} per account (400 \`limit_exceeded\`); a URL that cannot receive (not http or https, or a host that resolves to a special-purpose or multicast address: loopback, private, link-local, metadata and the rest) is 422. ${MANAGE} Honours Idempotency-Key.`,
        body: Type.Object(
          { url: Url, event_types: Type.Optional(EventTypes), description: Type.Optional(Description) },
          {
            additionalProperties: false,
            examples: [
              { url: 'https://hooks.example.com/gpucloud', event_types: ['vm.status_changed', 'billing.low_balance'] },
            ],
          },
        ),
        response: { 201: WebhookWithSecretSchema, ...errorResponses(400, 401, 403, 413, 415, 422, 429) },
      },
      config: { ...endpoint, idempotent: true },
    },
    async (req, reply) => {
      reply.code(201);
      return webhooks.create(requirePrincipal(req.principal), req.body);
    },
  );

  r.get(
    '/webhooks',
    {
      schema: {
        tags: ['webhooks'],
        operationId: 'listWebhooks',
        summary: 'List webhook endpoints',
        description: `Your endpoints, newest first, without their secrets. X-Total-Count holds the total. ${MANAGE}`,
        querystring: Type.Object(PaginationQuery, { additionalProperties: false }),
        response: { 200: Type.Array(WebhookSchema), ...errorResponses(401, 403, 422, 429) },
      },
      config: endpoint,
    },
    async (req, reply) => page(reply, await webhooks.list(requirePrincipal(req.principal), ...pageArgs(req.query))),
  );

  r.get(
    '/webhooks/:webhook_id',
    {
      schema: {
        tags: ['webhooks'],
        operationId: 'getWebhook',
        summary: 'Get a webhook endpoint',
        description: `Without its secret. 404 for an unknown or another user's endpoint. ${MANAGE}`,
        params: WebhookParams,
        response: { 200: WebhookSchema, ...errorResponses(401, 403, 404, 429) },
      },
      config: endpoint,
    },
    async (req) => webhooks.get(requirePrincipal(req.principal), idOf(req.params)),
  );

  r.patch(
    '/webhooks/:webhook_id',
    {
      schema: {
        tags: ['webhooks'],
        operationId: 'updateWebhook',
        summary: 'Change a webhook endpoint',
        description: `Any of \`url\`, \`event_types\` (null: every type), \`description\`, \`enabled\`. Turning it off drops the deliveries still waiting for it, and no events are queued for it while it is off; turning it back on (also after the service turned it off for failing) starts afresh. A new URL is checked like at creation (422). ${MANAGE}`,
        params: WebhookParams,
        body: Type.Object(
          {
            url: Type.Optional(Url),
            event_types: Type.Optional(EventTypes),
            description: Type.Optional(Description),
            enabled: Type.Optional(Type.Boolean()),
          },
          { additionalProperties: false, minProperties: 1, examples: [{ enabled: true }] },
        ),
        response: { 200: WebhookSchema, ...errorResponses(400, 401, 403, 404, 413, 415, 422, 429) },
      },
      config: endpoint,
    },
    async (req) => webhooks.update(requirePrincipal(req.principal), idOf(req.params), req.body),
  );

  r.delete(
    '/webhooks/:webhook_id',
    {
      schema: {
        tags: ['webhooks'],
        operationId: 'deleteWebhook',
        summary: 'Delete a webhook endpoint',
        description: `Nothing more is sent to it, and its delivery history goes with it. 204; 404 for an unknown or another user's endpoint. ${MANAGE}`,
        params: WebhookParams,
        response: { 204: Type.Null({ description: 'Deleted' }), ...errorResponses(401, 403, 404, 429) },
      },
      config: endpoint,
    },
    async (req, reply) => {
      await webhooks.remove(requirePrincipal(req.principal), idOf(req.params));
      reply.code(204);
    },
  );

  r.post(
    '/webhooks/:webhook_id/rotate-secret',
    {
      schema: {
        tags: ['webhooks'],
        operationId: 'rotateWebhookSecret',
        summary: "Rotate a webhook's signing secret",
        description: `A new secret, shown in this response only. For 24 hours deliveries carry two signatures (the new secret's and the old one's), so a receiver can switch at leisure; after that only the new one signs. ${MANAGE}`,
        params: WebhookParams,
        response: { 200: WebhookWithSecretSchema, ...errorResponses(401, 403, 404, 429) },
      },
      config: endpoint,
    },
    async (req) => webhooks.rotateSecret(requirePrincipal(req.principal), idOf(req.params)),
  );

  r.post(
    '/webhooks/:webhook_id/test',
    {
      schema: {
        tags: ['webhooks'],
        operationId: 'testWebhook',
        summary: 'Send a test event',
        description: `Writes a \`webhook.test\` event and sends it to this endpoint only (also when it is turned off), like any other delivery: signed, retried on failure. 202 with the event's id; its attempts appear in GET /webhooks/{webhook_id}/deliveries. ${MANAGE}`,
        params: WebhookParams,
        response: {
          202: Type.Object({
            event_id: Type.String({
              format: 'uuid',
              description: 'The test event (the `webhook-id` header of its delivery)',
            }),
          }),
          ...errorResponses(401, 403, 404, 429),
        },
      },
      config: endpoint,
    },
    async (req, reply) => {
      reply.code(202);
      return webhooks.test(requirePrincipal(req.principal), idOf(req.params));
    },
  );

  r.get(
    '/webhooks/:webhook_id/deliveries',
    {
      schema: {
        tags: ['webhooks'],
        operationId: 'listWebhookDeliveries',
        summary: 'List delivery attempts',
        description: `Every attempt to send an event to this endpoint, newest first: the event, when, the HTTP status or why there was none, how long it took, and what happens next. Kept for 30 days. X-Total-Count holds the total. ${MANAGE}`,
        params: WebhookParams,
        querystring: Type.Object(PaginationQuery, { additionalProperties: false }),
        response: { 200: Type.Array(AttemptSchema), ...errorResponses(401, 403, 404, 422, 429) },
      },
      config: endpoint,
    },
    async (req, reply) =>
      page(reply, await webhooks.deliveries(requirePrincipal(req.principal), idOf(req.params), ...pageArgs(req.query))),
  );
}
