/** /webhooks: endpoints that receive your events, signed the Standard Webhooks way (docs/webhooks.md). */
import type { FastifyInstance } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { Type } from 'typebox';
import { DateTime, errorResponses, NO_CONTROL, Nullable, page, pageArgs, PaginationQuery } from '../../http/schemas.js';
import { requirePrincipal } from '../../http/principal.js';
import { notFound } from '../../errors.js';
import { UUID_RE } from '../../ids.js';
import { MAX_WEBHOOKS, SUBSCRIBABLE_TYPES, type WebhookService } from './service.js';

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

const WebhookFields = {
  id: Type.String({ format: 'uuid' }),
  url: Type.String(),
  event_types: Nullable(Type.Array(Type.String()), { description: 'The types it receives; null: every type' }),
  description: Type.String(),
  enabled: Type.Boolean({ description: 'Whether events are sent to it' }),
  disabled_reason: Nullable(Type.String(), {
    description: '`failing` when the service turned it off after 5 days of failed deliveries; null otherwise',
  }),
  failing_since: Nullable(DateTime('The first failed attempt since the last success, while it is failing')),
  created_at: DateTime(),
  updated_at: DateTime(),
};
const example = {
  id: '4a7c2e1b-9d3f-4b8a-a1c2-5e6f7a8b9c0d',
  url: 'https://hooks.example.com/gpucloud',
  event_types: ['vm.status_changed', 'vm.interrupted', 'billing.low_balance'],
  description: 'pager',
  enabled: true,
  disabled_reason: null,
  failing_since: null,
  created_at: '2026-11-25T10:00:00.000Z',
  updated_at: '2026-11-25T10:00:00.000Z',
};
const Webhook = Type.Object(WebhookFields, {
  description: 'A webhook endpoint (never includes its secret)',
  examples: [example],
});
const WithSecret = Type.Object(
  {
    ...WebhookFields,
    secret: Type.String({
      description:
        'The signing secret, `whsec_` and the base64 of 32 random bytes: shown in this response only, store it now',
    }),
  },
  {
    description: 'The endpoint and its signing secret (shown once)',
    examples: [{ ...example, secret: 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw0nKx3W5nVQ4=' }],
  },
);
const Attempt = Type.Object(
  {
    id: Type.String({ format: 'uuid' }),
    event_id: Type.String({ format: 'uuid', description: 'The event sent (the `webhook-id` header)' }),
    event_type: Type.String(),
    attempt: Type.Integer({ description: 'Which attempt at this event it was, from 1' }),
    attempted_at: DateTime('When it was made, in service time'),
    status_code: Nullable(Type.Integer({ description: 'The HTTP status the endpoint answered' })),
    error: Nullable(
      Type.String({ description: 'Why it failed: no answer, a refused address, or the status when it was not 2xx' }),
    ),
    duration_ms: Type.Integer({ description: 'How long it took' }),
    outcome: Type.Union([Type.Literal('succeeded'), Type.Literal('retrying'), Type.Literal('given_up')]),
    next_attempt_at: Nullable(DateTime('When the event is tried again (service time), while it is retrying')),
  },
  {
    description: 'One delivery attempt',
    examples: [
      {
        id: '019ab3c4-5d6e-7f80-9a1b-2c3d4e5f6a7c',
        event_id: '019ab3c4-5d6e-7f80-9a1b-2c3d4e5f6a7b',
        event_type: 'vm.status_changed',
        attempt: 1,
        attempted_at: '2026-11-25T10:00:01.000Z',
        status_code: 503,
        error: 'HTTP 503',
        duration_ms: 42,
        outcome: 'retrying',
        next_attempt_at: '2026-11-25T10:00:06.000Z',
      },
    ],
  },
);

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
        response: { 201: WithSecret, ...errorResponses(400, 401, 403, 413, 415, 422, 429) },
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
        response: { 200: Type.Array(Webhook), ...errorResponses(401, 403, 422, 429) },
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
        response: { 200: Webhook, ...errorResponses(401, 403, 404, 429) },
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
        response: { 200: Webhook, ...errorResponses(400, 401, 403, 404, 413, 415, 422, 429) },
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
        response: { 200: WithSecret, ...errorResponses(401, 403, 404, 429) },
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
        response: { 200: Type.Array(Attempt), ...errorResponses(401, 403, 404, 422, 429) },
      },
      config: endpoint,
    },
    async (req, reply) =>
      page(reply, await webhooks.deliveries(requirePrincipal(req.principal), idOf(req.params), ...pageArgs(req.query))),
  );
}
