-- Events a customer reads (GET /events): a user's in the order they were written, and a VM's.
CREATE INDEX events_user ON events (user_id, seq);
CREATE INDEX events_vm ON events (vm_id, seq) WHERE vm_id IS NOT NULL;
