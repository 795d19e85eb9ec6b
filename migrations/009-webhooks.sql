-- Webhooks (docs/webhooks.md): endpoints a customer registers, an outbox of
-- deliveries written in the same transaction as each event, and every attempt.

CREATE TABLE webhooks (
  id                     UUID PRIMARY KEY,
  user_id                BIGINT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
  url                    TEXT NOT NULL,
  -- NULL: every event type, including types added later.
  event_types            TEXT[],
  description            TEXT NOT NULL DEFAULT '',
  enabled                BOOLEAN NOT NULL DEFAULT true,
  -- Why it was turned off by the service (NULL when enabled, or turned off by its owner).
  disabled_reason        TEXT,
  -- Signing secrets, sealed with the service's key. The previous one also signs until its time runs out.
  secret                 TEXT NOT NULL,
  previous_secret        TEXT,
  previous_secret_until  TIMESTAMPTZ,
  -- The first failed attempt since the last success: an endpoint failing for long enough is turned off.
  failing_since          TIMESTAMPTZ,
  created_at             TIMESTAMPTZ NOT NULL,
  updated_at             TIMESTAMPTZ NOT NULL
);
CREATE INDEX webhooks_user ON webhooks (user_id, created_at);

-- The outbox: one row per event and endpoint. next_attempt_at is service time; the lease is real time.
CREATE TABLE webhook_deliveries (
  webhook_id       UUID NOT NULL REFERENCES webhooks (id) ON DELETE CASCADE,
  event_id         UUID NOT NULL REFERENCES events (id) ON DELETE CASCADE,
  event_seq        BIGINT NOT NULL,
  vm_id            UUID,
  state            TEXT NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'succeeded', 'given_up')),
  attempts         INTEGER NOT NULL DEFAULT 0,
  next_attempt_at  TIMESTAMPTZ NOT NULL,
  lease_token      UUID,
  lease_until      TIMESTAMPTZ,
  created_at       TIMESTAMPTZ NOT NULL,
  PRIMARY KEY (webhook_id, event_id)
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE state = 'pending';
-- A VM's events reach an endpoint in order: a delivery waits while an earlier one for the same VM is pending.
CREATE INDEX webhook_deliveries_vm ON webhook_deliveries (webhook_id, vm_id, event_seq) WHERE state = 'pending' AND vm_id IS NOT NULL;

CREATE TABLE webhook_attempts (
  id            UUID PRIMARY KEY,
  webhook_id    UUID NOT NULL,
  event_id      UUID NOT NULL,
  attempt       INTEGER NOT NULL,
  attempted_at  TIMESTAMPTZ NOT NULL,
  status_code   INTEGER,
  error         TEXT,
  duration_ms   INTEGER NOT NULL,
  outcome       TEXT NOT NULL CHECK (outcome IN ('succeeded', 'retrying', 'given_up')),
  FOREIGN KEY (webhook_id, event_id) REFERENCES webhook_deliveries (webhook_id, event_id) ON DELETE CASCADE
);
CREATE INDEX webhook_attempts_webhook ON webhook_attempts (webhook_id, attempted_at DESC, id DESC);
