-- Customer images (docs/images.md): a stopped VM's disk saved as a private image, to start new VMs
-- from. Its content lives in the image store under its SHA-256 (`images`), like a template's; an
-- image taken on a simulated node has no content (sha256 NULL) and serves simulated nodes only.
CREATE TABLE user_images (
  id                  UUID PRIMARY KEY,
  seq                 BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,
  user_id             BIGINT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
  name                TEXT NOT NULL,
  -- creating: the disk is being copied into the store; ready: VMs can start from it; failed: the
  -- copy did not finish (`error` says why; nothing is billed); deleted: gone, kept for the record.
  state               TEXT NOT NULL CHECK (state IN ('creating', 'ready', 'failed', 'deleted')),
  source_vm_id        UUID REFERENCES vms (id) ON DELETE SET NULL,
  source_vmid         INTEGER NOT NULL,
  -- Where the disk was when it was taken, and what it was built from (its login user and web ports).
  source_node         TEXT NOT NULL,
  template_vmid       INTEGER NOT NULL,
  -- The source VM's login user (its template's on its host): a VM from the image logs in as it.
  login_user          TEXT,
  -- A VM from the image needs a disk at least this large (the source VM's).
  disk_gb             INTEGER NOT NULL CHECK (disk_gb > 0),
  sha256              TEXT REFERENCES images (sha256),
  size_bytes          BIGINT CHECK (size_bytes >= 0),
  error               TEXT,
  created_at          TIMESTAMPTZ NOT NULL,
  ready_at            TIMESTAMPTZ,
  deleted_at          TIMESTAMPTZ,
  -- Storage is billed per GB-hour from ready_at; every period up to here is charged.
  billed_until        TIMESTAMPTZ,
  -- The instance taking the snapshot, and until when (real time): another takes over after.
  claim_token         UUID,
  claimed_until       TIMESTAMPTZ
);
CREATE INDEX user_images_user ON user_images (user_id, seq) WHERE state <> 'deleted';
CREATE INDEX user_images_billing ON user_images (billed_until) WHERE state = 'ready';
CREATE INDEX user_images_creating ON user_images (created_at) WHERE state = 'creating';

-- One row per image and billing period, as usage_logs is for VMs: the unique key makes a period
-- chargeable once.
CREATE TABLE image_usage_logs (
  id              UUID PRIMARY KEY,
  seq             BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,
  image_id        UUID NOT NULL REFERENCES user_images (id) ON DELETE CASCADE,
  user_id         BIGINT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
  period_start    TIMESTAMPTZ NOT NULL,
  period_end      TIMESTAMPTZ NOT NULL,
  size_bytes      BIGINT NOT NULL,
  price_gb_hourly_micros BIGINT NOT NULL,
  cost_micros     BIGINT NOT NULL,
  transaction_id  UUID,
  UNIQUE (image_id, period_end)
);
CREATE INDEX image_usage_logs_user ON image_usage_logs (user_id, period_end);

-- A VM started from a customer image.
ALTER TABLE vms ADD COLUMN image_id UUID REFERENCES user_images (id) ON DELETE SET NULL;

-- The simulated hypervisor can be made to fail a snapshot's export too.
ALTER TABLE sim_faults DROP CONSTRAINT sim_faults_action_check;
ALTER TABLE sim_faults ADD CONSTRAINT sim_faults_action_check
  CHECK (action IN ('provision', 'start', 'stop', 'destroy', 'move', 'snapshot'));
