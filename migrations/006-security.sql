-- Security hardening.

-- The key that created a key (null when a login session did): revoking a key revokes every key
-- made through it, so a leaked key cannot leave working copies behind.
ALTER TABLE api_keys ADD COLUMN created_by_key_id UUID REFERENCES api_keys (id);
CREATE INDEX api_keys_created_by ON api_keys (created_by_key_id) WHERE created_by_key_id IS NOT NULL;

-- Wrong second-factor codes in a row, across logins: past a threshold the account's second
-- factor is locked for a while, so guessing cannot go on one login after another.
ALTER TABLE users ADD COLUMN totp_failures INTEGER NOT NULL DEFAULT 0;
ALTER TABLE users ADD COLUMN totp_locked_until TIMESTAMPTZ;
