-- Inventory and prices (D18, D19), the credit ledger (D30), VMs (D22-D29) and interruptions (D25).

-- Prices per GPU type, in integer micro-units of the currency (D7); discounts in basis points (1000 = 10 %).
CREATE TABLE gpu_pricing (
  gpu_type                        TEXT PRIMARY KEY CHECK (gpu_type IN ('5090', '4090', 'pro6000')),
  gpu_ram_mb                      INTEGER NOT NULL CHECK (gpu_ram_mb > 0),
  gpu_price_hourly_micros         BIGINT NOT NULL CHECK (gpu_price_hourly_micros >= 0),
  interruptible_rate_micros       BIGINT NOT NULL CHECK (interruptible_rate_micros >= 0),
  storage_price_gb_hourly_micros  BIGINT NOT NULL CHECK (storage_price_gb_hourly_micros >= 0),
  reserved_discount_1mo_bp        INTEGER NOT NULL CHECK (reserved_discount_1mo_bp BETWEEN 0 AND 10000),
  reserved_discount_3mo_bp        INTEGER NOT NULL CHECK (reserved_discount_3mo_bp BETWEEN 0 AND 10000),
  reserved_discount_6mo_bp        INTEGER NOT NULL CHECK (reserved_discount_6mo_bp BETWEEN 0 AND 10000),
  updated_at                      TIMESTAMPTZ NOT NULL
);

CREATE TABLE nodes (
  node            TEXT PRIMARY KEY,
  gpu_type        TEXT NOT NULL REFERENCES gpu_pricing (gpu_type),
  gpu_count       INTEGER NOT NULL CHECK (gpu_count BETWEEN 1 AND 64),
  gpu_ram_mb      INTEGER NOT NULL CHECK (gpu_ram_mb > 0),
  ram_gb          INTEGER NOT NULL CHECK (ram_gb > 0),
  cpu_cores       INTEGER NOT NULL CHECK (cpu_cores > 0),
  cpu_model       TEXT NOT NULL,
  pcie_gen        TEXT NOT NULL,
  max_storage_gb  INTEGER NOT NULL CHECK (max_storage_gb >= 50),
  location        TEXT NOT NULL,
  cluster_name    TEXT NOT NULL,
  status          TEXT NOT NULL CHECK (status IN ('active', 'draining', 'offline')),
  created_at      TIMESTAMPTZ NOT NULL,
  updated_at      TIMESTAMPTZ NOT NULL,
  seq             BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE
);

-- The credit balance is a cached sum of the user's transactions: both change in one transaction (D30).
ALTER TABLE users ADD COLUMN balance_micros BIGINT NOT NULL DEFAULT 0;

CREATE TABLE transactions (
  id                    UUID PRIMARY KEY,
  seq                   BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,
  user_id               BIGINT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
  type                  TEXT NOT NULL CHECK (type IN ('credit', 'charge', 'deposit', 'refund', 'adjustment')),
  amount_micros         BIGINT NOT NULL,
  balance_after_micros  BIGINT NOT NULL,
  description           TEXT NOT NULL,
  breakdown             JSONB NOT NULL DEFAULT '{}'::jsonb,
  vm_id                 UUID,
  created_at            TIMESTAMPTZ NOT NULL
);
CREATE INDEX transactions_user ON transactions (user_id, seq DESC);

CREATE SEQUENCE vmid_seq START WITH 1000 MINVALUE 1000;

CREATE TABLE vms (
  id                          UUID PRIMARY KEY,
  vmid                        INTEGER NOT NULL UNIQUE DEFAULT nextval('vmid_seq'),
  user_id                     BIGINT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
  node                        TEXT NOT NULL,
  instance_label              TEXT,
  gpu_type                    TEXT NOT NULL,
  gpu_count                   INTEGER NOT NULL CHECK (gpu_count IN (1, 2, 4, 8)),
  storage_gb                  INTEGER NOT NULL CHECK (storage_gb >= 50),
  ram_gb                      INTEGER NOT NULL,
  cpu_cores                   INTEGER NOT NULL,
  cpu_model                   TEXT,
  pcie_gen                    TEXT,
  template_vmid               INTEGER NOT NULL CHECK (template_vmid BETWEEN 100 AND 104),
  ip_address                  TEXT,
  status                      TEXT NOT NULL CHECK (status IN ('creating', 'starting', 'running', 'stopping', 'stopped', 'interrupted', 'destroyed', 'failed', 'offline')),
  offline_from                TEXT,
  holds_gpus                  BOOLEAN NOT NULL,
  rental_type                 TEXT NOT NULL CHECK (rental_type IN ('on_demand', 'reserved', 'interruptible')),
  reservation_id              UUID,
  auto_restart                BOOLEAN,
  gpu_hourly_rate_micros      BIGINT NOT NULL,
  storage_hourly_rate_micros  BIGINT NOT NULL,
  auth_method                 TEXT NOT NULL CHECK (auth_method IN ('ssh_key', 'password')),
  ssh_key_id                  UUID,
  ssh_public_key              TEXT,
  -- The VM password, kept only until the hypervisor has it (cleared once provisioned).
  provision_secret            TEXT,
  provisioned                 BOOLEAN NOT NULL DEFAULT false,
  hv_ref                      TEXT,
  created_at                  TIMESTAMPTZ NOT NULL,
  started_at                  TIMESTAMPTZ,
  stopped_at                  TIMESTAMPTZ,
  destroyed_at                TIMESTAMPTZ,
  first_started_at            TIMESTAMPTZ,
  -- Reconciler bookkeeping: when the next hypervisor action is due, who holds the claim, retries.
  next_action_at              TIMESTAMPTZ,
  claim_token                 UUID,
  claimed_until               TIMESTAMPTZ,
  attempts                    INTEGER NOT NULL DEFAULT 0,
  -- The hypervisor action the reconcilers owe this VM: provision, start, stop or destroy.
  hv_action                   TEXT CHECK (hv_action IN ('provision', 'start', 'stop', 'destroy')),
  last_error                  TEXT,
  cpu_percent                 DOUBLE PRECISION NOT NULL DEFAULT 0,
  ram_percent                 DOUBLE PRECISION NOT NULL DEFAULT 0,
  seq                         BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE
);
CREATE INDEX vms_user ON vms (user_id, seq DESC);
CREATE INDEX vms_node_gpus ON vms (node) WHERE holds_gpus;
CREATE INDEX vms_due ON vms (next_action_at) WHERE hv_action IS NOT NULL;

CREATE TABLE interruptions (
  id                  UUID PRIMARY KEY,
  seq                 BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,
  interruptible_vm_id UUID NOT NULL REFERENCES vms (id) ON DELETE CASCADE,
  preempted_by_vm_id  UUID NOT NULL REFERENCES vms (id) ON DELETE CASCADE,
  preempted_at        TIMESTAMPTZ NOT NULL,
  restored_at         TIMESTAMPTZ,
  downtime_seconds    BIGINT,
  status              TEXT NOT NULL CHECK (status IN ('interrupted', 'restored', 'abandoned'))
);
CREATE INDEX interruptions_vm ON interruptions (interruptible_vm_id, seq DESC);

-- Simulator fault injection (D29), shared by every instance: target is a node name or 'vm:<uuid>'.
CREATE TABLE sim_faults (
  target     TEXT NOT NULL,
  action     TEXT NOT NULL CHECK (action IN ('provision', 'start', 'stop', 'destroy')),
  remaining  INTEGER NOT NULL CHECK (remaining >= 0),
  PRIMARY KEY (target, action)
);

-- Simulated network traffic per VM (the simulator's counters, read by metering).
CREATE TABLE sim_traffic (
  vm_id  UUID PRIMARY KEY,
  bytes  BIGINT NOT NULL DEFAULT 0
);


-- Events an admin (and later a webhook) can see: low balance, failures, suspensions.
CREATE TABLE events (
  id          UUID PRIMARY KEY,
  seq         BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,
  type        TEXT NOT NULL,
  user_id     BIGINT REFERENCES users (id) ON DELETE CASCADE,
  vm_id       UUID,
  data        JSONB NOT NULL DEFAULT '{}'::jsonb,
  created_at  TIMESTAMPTZ NOT NULL
);
