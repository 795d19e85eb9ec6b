-- Security hardening.

-- The key that created a key (null when a login session did): revoking a key revokes every key
-- made through it, so a leaked key cannot leave working copies behind.
ALTER TABLE api_keys ADD COLUMN created_by_key_id UUID REFERENCES api_keys (id);
CREATE INDEX api_keys_created_by ON api_keys (created_by_key_id) WHERE created_by_key_id IS NOT NULL;

-- Wrong second-factor codes in a row, across logins: past a threshold the account's second
-- factor is locked for a while, so guessing cannot go on one login after another.
ALTER TABLE users ADD COLUMN totp_failures INTEGER NOT NULL DEFAULT 0;
ALTER TABLE users ADD COLUMN totp_locked_until TIMESTAMPTZ;

-- Idempotency keys survive a crash of the instance that took them: a pending key has an owner
-- (one request) and a lease on real time; once the lease ran out (the owner died before its
-- change committed, so nothing was applied) a retry takes the key over. The owner's change and
-- its recorded answer commit in one transaction, so a retry never applies a change twice.
ALTER TABLE idempotency_keys ADD COLUMN owner TEXT;
ALTER TABLE idempotency_keys ADD COLUMN lease_until_ms BIGINT;
