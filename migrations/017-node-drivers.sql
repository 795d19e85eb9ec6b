-- The hypervisor driver that runs a node's VMs, by its registered name (docs/architecture.md#hypervisor-drivers).
-- NULL keeps the rule every node had before drivers had names: its host agent when it has one, else the
-- simulator. node_driver() is that rule, written once for every query that needs it.
ALTER TABLE nodes ADD COLUMN driver TEXT CHECK (driver ~ '^[a-z][a-z0-9-]{0,31}$');
CREATE FUNCTION node_driver(n nodes) RETURNS TEXT LANGUAGE sql IMMUTABLE AS $$
  SELECT COALESCE(n.driver, CASE WHEN n.agent_url IS NOT NULL AND n.agent_token_sealed IS NOT NULL THEN 'agent'
                                 ELSE 'simulator' END)
$$;
