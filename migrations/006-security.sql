-- Security hardening.

-- The key that created a key (null when a login session did): revoking a key revokes every key
-- made through it, so a leaked key cannot leave working copies behind.
ALTER TABLE api_keys ADD COLUMN created_by_key_id UUID REFERENCES api_keys (id);
CREATE INDEX api_keys_created_by ON api_keys (created_by_key_id) WHERE created_by_key_id IS NOT NULL;
