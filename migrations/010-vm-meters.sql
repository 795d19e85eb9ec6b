-- Where each VM's billing stands (docs/metering.md), in a narrow table of its own. A close moves
-- billed_until of every accruing VM every period: rewriting a narrow row with two index entries
-- costs a fraction of rewriting a VM's wide row with all of the VM table's indexes.
-- A VM has a row from its first start until it is destroyed.
CREATE TABLE vm_meters (
  vm_id                 UUID PRIMARY KEY REFERENCES vms (id) ON DELETE CASCADE,
  -- Every period up to here is closed (usage logged and charged).
  billed_until          TIMESTAMPTZ NOT NULL,
  -- Of the VM's traffic counter (vms.network_bytes_total), the bytes already billed.
  network_bytes_billed  BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX vm_meters_due ON vm_meters (billed_until);

INSERT INTO vm_meters (vm_id, billed_until, network_bytes_billed)
  SELECT id, billed_until, network_bytes_billed FROM vms WHERE billed_until IS NOT NULL AND status <> 'destroyed';

DROP INDEX vms_billing;
ALTER TABLE vms DROP COLUMN billed_until;
ALTER TABLE vms DROP COLUMN network_bytes_billed;
