-- The access portal (docs/portal.md): the HTTP ports a customer opened on a VM at its creation, and
-- the launch tokens already exchanged for a portal cookie, so that a token opens the portal once,
-- whichever instance the browser reaches.

-- Up to 5 guest ports (1024-65535), fixed for the VM's life; empty for most VMs.
ALTER TABLE vms ADD COLUMN http_ports integer[] NOT NULL DEFAULT '{}';

-- A launch token's jti, kept until the token itself would have expired (5 minutes), then removed by
-- housekeeping: after that the token's signature no longer verifies anyway.
CREATE TABLE launch_token_uses (
  jti uuid PRIMARY KEY,
  expires_at timestamptz NOT NULL
);
CREATE INDEX launch_token_uses_expiry ON launch_token_uses (expires_at);
