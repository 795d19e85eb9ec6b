-- Accounts, sessions, API keys, SSH keys, idempotency and the service clock (issue: foundation).

CREATE TABLE users (
  id                 BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  email              TEXT NOT NULL,
  email_normalized   TEXT NOT NULL UNIQUE,
  name               TEXT,
  password_hash      TEXT NOT NULL,
  role               TEXT NOT NULL DEFAULT 'user' CHECK (role IN ('user', 'admin')),
  suspended          BOOLEAN NOT NULL DEFAULT false,
  max_vms            INTEGER CHECK (max_vms >= 0),
  max_gpus           INTEGER CHECK (max_gpus >= 0),
  totp_secret        TEXT,
  totp_pending_secret TEXT,
  totp_enabled       BOOLEAN NOT NULL DEFAULT false,
  totp_last_step     BIGINT,
  created_at         TIMESTAMPTZ NOT NULL,
  updated_at         TIMESTAMPTZ NOT NULL
);

CREATE TABLE recovery_codes (
  id         UUID PRIMARY KEY,
  user_id    BIGINT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
  code_hash  TEXT NOT NULL,
  used_at    TIMESTAMPTZ,
  UNIQUE (user_id, code_hash)
);

-- Refresh tokens (D12): opaque, stored hashed, rotated; a family is every token descended from one login.
CREATE TABLE refresh_tokens (
  id          UUID PRIMARY KEY,
  user_id     BIGINT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
  family_id   UUID NOT NULL,
  token_hash  TEXT NOT NULL UNIQUE,
  created_at  TIMESTAMPTZ NOT NULL,
  expires_at  TIMESTAMPTZ NOT NULL,
  rotated_at  TIMESTAMPTZ,
  revoked_at  TIMESTAMPTZ
);
CREATE INDEX refresh_tokens_family ON refresh_tokens (family_id);

-- Revoked session families: access tokens carry their family (sid) and stop working with it.
CREATE TABLE revoked_families (
  family_id   UUID PRIMARY KEY,
  user_id     BIGINT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
  revoked_at  TIMESTAMPTZ NOT NULL,
  reason      TEXT NOT NULL
);

-- Two-factor login challenges (D13): single-use, 300 s, a few attempts.
CREATE TABLE auth_challenges (
  id          UUID PRIMARY KEY,
  user_id     BIGINT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
  token_hash  TEXT NOT NULL UNIQUE,
  created_at  TIMESTAMPTZ NOT NULL,
  expires_at  TIMESTAMPTZ NOT NULL,
  attempts    INTEGER NOT NULL DEFAULT 0,
  used_at     TIMESTAMPTZ
);

CREATE TABLE api_keys (
  id           UUID PRIMARY KEY,
  user_id      BIGINT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
  name         TEXT NOT NULL,
  scope        TEXT NOT NULL CHECK (scope IN ('read_write', 'read_only', 'billing_only')),
  prefix       TEXT NOT NULL,
  key_hash     TEXT NOT NULL UNIQUE,
  created_at   TIMESTAMPTZ NOT NULL,
  expires_at   TIMESTAMPTZ,
  last_used_at TIMESTAMPTZ,
  revoked_at   TIMESTAMPTZ
);
CREATE INDEX api_keys_user ON api_keys (user_id, created_at DESC);

CREATE TABLE ssh_keys (
  id           UUID PRIMARY KEY,
  user_id      BIGINT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
  label        TEXT NOT NULL,
  key_type     TEXT NOT NULL,
  fingerprint  TEXT NOT NULL,
  public_key   TEXT NOT NULL,
  created_at   TIMESTAMPTZ NOT NULL,
  UNIQUE (user_id, fingerprint)
);
CREATE INDEX ssh_keys_user ON ssh_keys (user_id, created_at DESC);

-- Idempotency-Key (D41): the first response to a key is stored and replayed for 24 h.
CREATE TABLE idempotency_keys (
  user_id         BIGINT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
  idem_key        TEXT NOT NULL,
  request_hash    TEXT NOT NULL,
  state           TEXT NOT NULL CHECK (state IN ('pending', 'done')),
  response_status INTEGER,
  response_body   TEXT,
  created_at      TIMESTAMPTZ NOT NULL,
  PRIMARY KEY (user_id, idem_key)
);

-- The manual clock (D43) is kept here across restarts.
CREATE TABLE service_clock (
  id      INTEGER PRIMARY KEY CHECK (id = 1),
  now_ms  BIGINT NOT NULL
);

-- Seeds that have run once (D44 demo data).
CREATE TABLE seeds (
  name       TEXT PRIMARY KEY,
  applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
