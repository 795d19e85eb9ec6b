-- Starting a stopped VM on another host (docs/vms.md#start-on-another-host). While its disk travels the
-- VM is `moving`: `node` is already the destination (whose GPUs it holds, so nobody takes them meanwhile)
-- and `move_from` is the host its disk comes from. A move that fails puts `node` back and clears
-- `move_from`; one that succeeds clears `move_from` and the source's copy is removed.
ALTER TABLE vms DROP CONSTRAINT vms_status_check;
ALTER TABLE vms ADD CONSTRAINT vms_status_check
  CHECK (status IN ('creating', 'starting', 'running', 'stopping', 'stopped', 'interrupted', 'destroyed', 'failed', 'offline', 'moving'));
ALTER TABLE vms DROP CONSTRAINT vms_hv_action_check;
ALTER TABLE vms ADD CONSTRAINT vms_hv_action_check CHECK (hv_action IN ('provision', 'start', 'stop', 'destroy', 'move'));
ALTER TABLE vms ADD COLUMN move_from TEXT REFERENCES nodes (node);
-- When the move began (service time), for the `vm.moved` event's duration.
ALTER TABLE vms ADD COLUMN move_started_at TIMESTAMPTZ;
-- The simulated hypervisor can be made to fail a move, as any other action.
ALTER TABLE sim_faults DROP CONSTRAINT sim_faults_action_check;
ALTER TABLE sim_faults ADD CONSTRAINT sim_faults_action_check CHECK (action IN ('provision', 'start', 'stop', 'destroy', 'move'));
