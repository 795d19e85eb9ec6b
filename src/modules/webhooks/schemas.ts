/**
 * The JSON of webhook endpoints and their delivery attempts: each TypeBox schema is the one
 * definition of its shape, the OpenAPI document's and WebhookService's type alike (docs/webhooks.md).
 */
import { Type, type Static } from 'typebox';
import { DateTime, Nullable } from '../../http/schemas.js';

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
export const WebhookSchema = Type.Object(WebhookFields, {
  description: 'A webhook endpoint (never includes its secret)',
  examples: [example],
});
export type WebhookRecord = Static<typeof WebhookSchema>;

export const WebhookWithSecretSchema = Type.Object(
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
export type WebhookWithSecretRecord = Static<typeof WebhookWithSecretSchema>;

export const AttemptSchema = Type.Object(
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
export type AttemptRecord = Static<typeof AttemptSchema>;
