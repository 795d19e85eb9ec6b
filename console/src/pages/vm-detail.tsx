/**
 * One VM's page: its properties, live status, Stop / Start / Restart /
 * Destroy / Save as image, the label, auto-restart of an interruptible VM,
 * how to reach it while it runs (SSH command; WebUI, Jupyter and HTTP ports
 * opened through the access portal) and its interruption history.
 */
import { useEffect, useRef, useState } from 'preact/hooks';
import type { Vm } from '../../../src/sdk/index.js';
import { api, call, client, GpuCloudError } from '../api.js';
import { useLiveEvents, VM_EVENTS } from '../live.js';
import {
  Action,
  Confirm,
  CopyButton,
  Link,
  Loaded,
  Money,
  Page,
  Status,
  WithTimes,
  formatTime,
  notify,
  useAsync,
  vmName,
} from '../ui.js';
import { templateName, useTemplates } from '../templates.js';
import { RENTAL_LABELS } from './offers.js';
import { AccessCard } from './vm-access.js';
import { ImageSaved, SaveImageDialog, type UserImage } from './images.js';
import { AutoRestartCard, Interruptions, LabelCard } from './vm-cards.js';

const WAIT_MS = 10 * 60_000;

const TRANSITIONAL: Partial<Record<Vm['status'], string>> = {
  creating: 'The VM is being created; this page updates by itself.',
  starting: 'The VM is starting; this page updates by itself.',
  stopping: 'The VM is stopping; this page updates by itself.',
  moving:
    'The VM’s disk is moving to another node, where it then starts (billed as stopped until it runs); this page updates by itself.',
  interrupted:
    'The VM was interrupted: its GPUs went to an on-demand or reserved VM. Start it again when GPUs are free (or let auto-restart do it).',
  offline: 'The VM’s node is offline; the VM comes back when the node does.',
  failed: 'The VM failed. Destroy it to release it; its charges have stopped.',
};

export function VmDetail({ id }: { id: string }) {
  const vm = useAsync(() => call(api.GET('/vms/{vm_id}', { params: { path: { vm_id: id } } })), [id]);
  useLiveEvents(VM_EVENTS, () => void vm.reload(), { vmId: vm.data?.id ?? id });
  const [confirming, setConfirming] = useState(false);
  const [progress, setProgress] = useState<string | undefined>(undefined);
  const mounted = useRef(true);
  useEffect(
    () => () => {
      mounted.current = false;
    },
    [],
  );
  const say = (text: string | undefined) => {
    if (mounted.current) setProgress(text);
  };

  // While Stop or Start runs, the other status buttons stay away (a click meant for one never lands on another).
  const [pending, setPending] = useState<'stop' | 'start' | undefined>(undefined);
  const path = { params: { path: { vm_id: id } } };
  const stop = async () => {
    setPending('stop');
    try {
      const r = await call(api.POST('/vms/{vm_id}/stop', path));
      notify(r.message);
      await vm.reload();
    } finally {
      if (mounted.current) setPending(undefined);
    }
  };
  // Its node's GPUs went to someone else while it was stopped: offer to start it on another node.
  const [noGpus, setNoGpus] = useState<string | undefined>(undefined);
  const start = async () => {
    setPending('start');
    try {
      const r = await call(api.POST('/vms/{vm_id}/start', path));
      notify(r.message);
      await vm.reload();
    } catch (e) {
      if (e instanceof GpuCloudError && e.code === 'gpu_unavailable' && /free GPU/.test(e.detail)) {
        if (mounted.current) setNoGpus(e.detail);
        return;
      }
      throw e;
    } finally {
      if (mounted.current) setPending(undefined);
    }
  };
  const startElsewhere = async () => {
    const r = await call(api.POST('/vms/{vm_id}/start', { ...path, body: { move: 'if_needed' } }));
    notify(r.message);
    await vm.reload();
  };
  const restart = async () => {
    try {
      say('Restart: stopping the VM…');
      await call(api.POST('/vms/{vm_id}/stop', path));
      await vm.reload();
      await client.waitForVm(id, ['stopped', 'interrupted'], {
        timeoutMs: WAIT_MS,
        onStatus: (v) => say(`Restart: waiting for the VM to stop (now ${v.status})…`),
      });
      say('Restart: stopped; starting it again…');
      await call(api.POST('/vms/{vm_id}/start', path));
      await vm.reload();
      await client.waitForVm(id, 'running', {
        timeoutMs: WAIT_MS,
        onStatus: (v) => say(`Restart: waiting for the VM to run (now ${v.status})…`),
      });
      notify('VM restarted.');
    } finally {
      say(undefined);
      await vm.reload();
    }
  };
  // "Save as image": the dialog, then a note linking to the images.
  const [saving, setSaving] = useState(false);
  const [saved, setSaved] = useState<UserImage | undefined>(undefined);
  const destroy = async () => {
    const r = await call(api.DELETE('/vms/{vm_id}', path));
    notify(r.message);
    await vm.reload();
  };

  const v = vm.data;
  const restarting = progress !== undefined;
  const title = v ? vmName(v) : 'VM';

  return (
    <Page
      title={title}
      actions={
        <>
          <Link href="/vms" class="btn btn-plain">
            Back
          </Link>
          {v && v.status === 'running' && !restarting && pending !== 'start' ? (
            <Action onClick={stop} title="GPU billing pauses; the disk is kept (and billed)">
              Stop
            </Action>
          ) : null}
          {v && (v.status === 'stopped' || v.status === 'interrupted') && !restarting && pending !== 'stop' ? (
            <Action variant="primary" onClick={start}>
              Start
            </Action>
          ) : null}
          {v && (v.status === 'stopped' || v.status === 'interrupted') && !pending && !saving ? (
            <button type="button" class="btn btn-plain" onClick={() => setSaving(true)}>
              Save as image
            </button>
          ) : null}
          {v && ((v.status === 'running' && !pending) || restarting) ? (
            <Action onClick={restart} disabled={restarting} title="Stop, wait until stopped, then start again">
              Restart
            </Action>
          ) : null}
          {v && v.status !== 'destroyed' && !confirming ? (
            <button type="button" class="btn btn-danger" onClick={() => setConfirming(true)}>
              Destroy
            </button>
          ) : null}
        </>
      }
    >
      {saved ? <ImageSaved image={saved} /> : null}
      <Loaded value={vm}>{(v) => <VmBody vm={v} progress={progress} reload={vm.reload} />}</Loaded>
      {saving && v ? <SaveImageDialog vm={v} onSaved={setSaved} onClose={() => setSaving(false)} /> : null}
      {noGpus && v ? (
        <Confirm
          title="Start on another host?"
          confirmLabel="Start on another host"
          onConfirm={startElsewhere}
          onClose={() => setNoGpus(undefined)}
        >
          <p>{noGpus}.</p>
          <p>
            Its disk can move to another {v.gpu_type} node that has {v.gpu_count} GPU(s) free, where it starts. It keeps
            its id, rates and label; its SSH address and port change. While the disk travels it is <em>moving</em>,
            billed as stopped. If the move fails it stays stopped here, with nothing lost.
          </p>
        </Confirm>
      ) : null}
      {confirming && v ? (
        <Confirm
          title="Destroy this VM?"
          confirmLabel="Destroy"
          danger
          onConfirm={destroy}
          onClose={() => setConfirming(false)}
        >
          <p>
            <strong>{vmName(v)}</strong> ({v.gpu_count} × {v.gpu_type} on {v.node}) and everything on its disk are
            deleted for good. Billing ends now.
          </p>
          {v.rental_type === 'reserved' ? (
            <p class="warning">
              This VM is reserved. Destroying it does not cancel the reservation;{' '}
              <Link href="/reservations">cancel the reservation</Link> for that (75 % of what remains is refunded).
            </p>
          ) : null}
        </Confirm>
      ) : null}
    </Page>
  );
}

function VmBody({ vm, progress, reload }: { vm: Vm; progress: string | undefined; reload: () => Promise<void> }) {
  const note = TRANSITIONAL[vm.status];
  const running = vm.status === 'running';
  const templates = useTemplates();
  const template = templates.data?.find((t) => t.template_vmid === vm.template_vmid);
  return (
    <div class="vm-detail">
      <div class="vm-status">
        <Status status={vm.status} />
        <span role="status" aria-live="polite" class="muted">
          {progress ? (
            <>
              <span class="spinner" aria-hidden="true" /> {progress}
            </>
          ) : (
            (note ?? '')
          )}
        </span>
      </div>

      {vm.status === 'failed' ? (
        <div class="error vm-failure" role="alert">
          <strong>Why it failed:</strong> <WithTimes text={vm.failure_reason ?? 'no reason was recorded.'} />
        </div>
      ) : null}

      {running ? <AccessCard vm={vm} template={template} /> : null}

      <div class="grid2">
        <section class="card">
          <h2>Details</h2>
          <dl class="props">
            <dt>ID</dt>
            <dd>
              <code>{vm.id}</code> <CopyButton text={vm.id} label="Copy ID" />
            </dd>
            <dt>VM number</dt>
            <dd>{vm.vmid}</dd>
            <dt>Label</dt>
            <dd>{vm.instance_label ?? <span class="muted">none</span>}</dd>
            <dt>Node</dt>
            <dd>{vm.node}</dd>
            <dt>GPUs</dt>
            <dd>
              {vm.gpu_count} × {vm.gpu_type}
              {vm.pcie_gen ? <span class="muted"> · PCIe {vm.pcie_gen}</span> : null}
            </dd>
            <dt>CPU</dt>
            <dd>
              {vm.cpu_cores} cores{vm.cpu_model ? ` (${vm.cpu_model})` : ''}
              {running ? <span class="muted"> · {vm.cpu_percent}% used</span> : null}
            </dd>
            <dt>RAM</dt>
            <dd>
              {vm.ram_gb} GB{running ? <span class="muted"> · {vm.ram_percent}% used</span> : null}
            </dd>
            <dt>Disk</dt>
            <dd>{vm.storage_gb} GB</dd>
            <dt>IP address</dt>
            <dd>{vm.ip_address ? <code>{vm.ip_address}</code> : <span class="muted">—</span>}</dd>
            <dt>Template</dt>
            <dd>
              {templateName(templates.data, vm.template_vmid)} <span class="muted">({vm.template_vmid})</span>
            </dd>
            {vm.image_id ? (
              <>
                <dt>Image</dt>
                <dd>
                  <Link href="/images">
                    <code>{vm.image_id}</code>
                  </Link>
                </dd>
              </>
            ) : null}
            <dt>HTTP ports</dt>
            <dd>{vm.http_ports.length ? vm.http_ports.join(', ') : <span class="muted">none</span>}</dd>
            <dt>Rental type</dt>
            <dd>
              {RENTAL_LABELS[vm.rental_type]} <span class="muted">({vm.rental_type})</span>
            </dd>
            {vm.reservation_id ? (
              <>
                <dt>Reservation</dt>
                <dd>
                  <Link href="/reservations">
                    <code>{vm.reservation_id}</code>
                  </Link>
                </dd>
              </>
            ) : null}
            {vm.rental_type === 'interruptible' ? (
              <>
                <dt>Auto-restart</dt>
                <dd>{vm.auto_restart ? 'on' : 'off'}</dd>
              </>
            ) : null}
            <dt>Rate</dt>
            <dd>
              <Money value={vm.hourly_rate} precise perHour />{' '}
              <span class="muted">
                (GPUs <Money value={vm.gpu_hourly_rate} precise perHour />, disk{' '}
                <Money value={vm.storage_hourly_rate} precise perHour />; while stopped only the disk)
              </span>
            </dd>
            <dt>Created</dt>
            <dd>{formatTime(vm.created_at)}</dd>
            <dt>Started</dt>
            <dd>{formatTime(vm.started_at)}</dd>
            <dt>Stopped</dt>
            <dd>{formatTime(vm.stopped_at)}</dd>
            {vm.destroyed_at ? (
              <>
                <dt>Destroyed</dt>
                <dd>{formatTime(vm.destroyed_at)}</dd>
              </>
            ) : null}
          </dl>
        </section>

        <div class="vm-stack">
          {running ? null : (
            <section class="card">
              <h2>Access</h2>
              <p class="muted">
                {vm.status === 'destroyed'
                  ? 'The VM is destroyed.'
                  : 'The SSH command and web links appear here while the VM is running.'}
              </p>
            </section>
          )}
          {vm.status !== 'destroyed' ? <LabelCard key={vm.instance_label ?? ''} vm={vm} reload={reload} /> : null}
          {vm.rental_type === 'interruptible' && vm.status !== 'destroyed' ? (
            <AutoRestartCard vm={vm} reload={reload} />
          ) : null}
        </div>
      </div>

      {vm.rental_type === 'interruptible' ? <Interruptions vm={vm} /> : null}
    </div>
  );
}
