-- Nodes driven by a host agent (`gpucloud agent`) instead of the simulator.

-- Where the node's agent listens; null for a simulated node.
ALTER TABLE nodes ADD COLUMN agent_url TEXT;
-- The agent's bearer token, sealed (AES-GCM) with a key derived from the service secret: the
-- control plane must present it, so it cannot be a one-way hash. Never returned by the API.
ALTER TABLE nodes ADD COLUMN agent_token_sealed TEXT;
ALTER TABLE nodes ADD COLUMN agent_status TEXT CHECK (agent_status IN ('online', 'offline'));
ALTER TABLE nodes ADD COLUMN agent_seen_at TIMESTAMPTZ;
-- Heartbeats: when the agent was last asked (real time, a claim shared by every instance) and how
-- many asks in a row went unanswered.
ALTER TABLE nodes ADD COLUMN agent_checked_at TIMESTAMPTZ;
ALTER TABLE nodes ADD COLUMN agent_misses INTEGER NOT NULL DEFAULT 0;
-- What the agent last reported: version, accelerator, CPU model, GPUs (JSON).
ALTER TABLE nodes ADD COLUMN agent_info JSONB;
-- Set when the node went offline because its agent stopped answering (not by an operator): the
-- status it had then, which it gets back by itself when the agent answers again.
ALTER TABLE nodes ADD COLUMN agent_offline_from TEXT CHECK (agent_offline_from IN ('active', 'draining'));

-- How to reach a VM on an agent's host, from the agent at provisioning.
ALTER TABLE vms ADD COLUMN ssh_host TEXT;
ALTER TABLE vms ADD COLUMN ssh_port INTEGER;
ALTER TABLE vms ADD COLUMN ssh_user TEXT;
-- The host devices (PCI addresses) passed through to the VM.
ALTER TABLE vms ADD COLUMN gpu_devices JSONB;
