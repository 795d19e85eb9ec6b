-- Reads that must not slow down as history piles up (docs/architecture.md#history): a customer who
-- has created and destroyed thousands of VMs creates the next one, and lists the live ones, as fast
-- as on the first day, and the background loops cost the same in a service's fifth year as in its
-- first. Destroyed VMs stay in their table for the record; finished webhook deliveries, expired
-- refresh tokens and old idempotency keys until housekeeping removes them.

-- A user's VMs that are not destroyed, newest first: the VM and GPU limits of a create or start,
-- the default VM list, and the hourly spend.
CREATE INDEX vms_user_live ON vms (user_id, seq DESC) WHERE status <> 'destroyed';

-- A node's live VMs: every host-agent heartbeat reads the node's running VMs, a node going offline
-- or coming back moves them, and a node with live VMs cannot be deleted.
CREATE INDEX vms_node_live ON vms (node, seq) WHERE status NOT IN ('destroyed', 'failed');

-- Interrupted VMs waiting to restart by themselves, in the order they restart (every reconciler pass).
CREATE INDEX vms_auto_restart ON vms (stopped_at NULLS FIRST, seq) WHERE status = 'interrupted' AND auto_restart;

-- Whether a VM preempted others (checked on every destroy).
CREATE INDEX interruptions_preempted_by ON interruptions (preempted_by_vm_id);

-- Housekeeping of webhook deliveries: the finished ones past their keeping time, and the attempts
-- that go with each (the foreign key's lookup, also when an endpoint is deleted).
CREATE INDEX webhook_deliveries_finished ON webhook_deliveries (created_at) WHERE state <> 'pending';
CREATE INDEX webhook_attempts_delivery ON webhook_attempts (webhook_id, event_id);

-- A user's live refresh tokens: signing out everywhere, a new password or two-factor change revokes them.
CREATE INDEX refresh_tokens_user_live ON refresh_tokens (user_id) WHERE revoked_at IS NULL;

-- Housekeeping of refresh tokens and two-factor challenges long expired.
CREATE INDEX refresh_tokens_expires ON refresh_tokens (expires_at);
CREATE INDEX auth_challenges_expires ON auth_challenges (expires_at);

-- Housekeeping of idempotency keys past their 24 hours.
CREATE INDEX idempotency_keys_created ON idempotency_keys (created_at);
