-- Metering (D32), usage reports (D34), low balance (D33) and reservations (D36-D39).

-- The end of the VM's last charged period; null until the VM first runs (a VM that never ran costs nothing).
ALTER TABLE vms ADD COLUMN billed_until TIMESTAMPTZ;
-- Traffic counter value already billed (the driver's counters are cumulative).
ALTER TABLE vms ADD COLUMN network_bytes_billed BIGINT NOT NULL DEFAULT 0;
CREATE INDEX vms_billing ON vms (billed_until) WHERE billed_until IS NOT NULL AND status <> 'destroyed';

-- One row per VM and period: the unique key makes a period chargeable exactly once (D32).
CREATE TABLE usage_logs (
  id                     UUID PRIMARY KEY,
  seq                    BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,
  vm_id                  UUID NOT NULL REFERENCES vms (id) ON DELETE CASCADE,
  user_id                BIGINT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
  period_start           TIMESTAMPTZ NOT NULL,
  period_end             TIMESTAMPTZ NOT NULL,
  gpu_ms                 BIGINT NOT NULL,
  gpu_count              INTEGER NOT NULL,
  storage_ms             BIGINT NOT NULL,
  storage_gb             INTEGER NOT NULL,
  network_bytes          BIGINT NOT NULL,
  gpu_cost_micros        BIGINT NOT NULL,
  storage_cost_micros    BIGINT NOT NULL,
  network_cost_micros    BIGINT NOT NULL,
  total_cost_micros      BIGINT NOT NULL,
  -- How much of total_cost was drawn from a reservation's prepaid balance (the rest is a charge transaction).
  reservation_id         UUID,
  from_reservation_micros BIGINT NOT NULL DEFAULT 0,
  transaction_id         UUID,
  UNIQUE (vm_id, period_end)
);
CREATE INDEX usage_logs_user ON usage_logs (user_id, period_end);

CREATE TABLE reservations (
  id                       UUID PRIMARY KEY,
  seq                      BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,
  user_id                  BIGINT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
  vm_id                    UUID NOT NULL,
  gpu_type                 TEXT NOT NULL,
  gpu_count                INTEGER NOT NULL,
  storage_gb               INTEGER NOT NULL,
  reservation_months       INTEGER NOT NULL CHECK (reservation_months IN (1, 3, 6)),
  discount_bp              INTEGER NOT NULL,
  deposit_micros           BIGINT NOT NULL CHECK (deposit_micros >= 0),
  remaining_micros         BIGINT NOT NULL CHECK (remaining_micros >= 0),
  status                   TEXT NOT NULL CHECK (status IN ('active', 'completed', 'cancelled', 'converted_to_on_demand')),
  created_at               TIMESTAMPTZ NOT NULL,
  end_at                   TIMESTAMPTZ NOT NULL,
  cancelled_at             TIMESTAMPTZ,
  cancellation_fee_micros  BIGINT NOT NULL DEFAULT 0,
  refund_micros            BIGINT NOT NULL DEFAULT 0,
  ended_at                 TIMESTAMPTZ
);
CREATE INDEX reservations_user ON reservations (user_id, seq DESC);
CREATE INDEX reservations_due ON reservations (end_at) WHERE status = 'active';

-- The driver's cumulative traffic counter as last sampled (outside any transaction) by the metering job.
ALTER TABLE vms ADD COLUMN network_bytes_total BIGINT NOT NULL DEFAULT 0;

-- Set when a charge leaves the balance at or below zero (D33); the metering job stops the user's running VMs and clears it.
ALTER TABLE users ADD COLUMN low_balance_pending BOOLEAN NOT NULL DEFAULT false;
