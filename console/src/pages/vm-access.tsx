/**
 * How a running VM is reached, on its page: the SSH command, and the web
 * services its template serves (as the catalogue says) and its own HTTP
 * ports, each opened through the access portal.
 */
import { useState } from 'preact/hooks';
import type { operations, Template, Vm } from '../../../src/sdk/index.js';
import { api, call } from '../api.js';
import { Action, CopyButton, Loaded, WithTimes, useAsync } from '../ui.js';

type AccessInfo = operations['getVmAccessInfo']['responses'][200]['content']['application/json'];

/** A web service of a VM the access portal opens: its template's WebUI or Jupyter, or one of its HTTP ports. */
type Service = { kind: 'webui' } | { kind: 'jupyter' } | { kind: 'port'; port: number };

/** Whether the template serves the WebUI or Jupyter (an HTTP port is the VM's own). */
function serves(t: Template, s: Service): boolean {
  return s.kind === 'webui'
    ? t.access.webui_port !== null
    : s.kind === 'jupyter'
      ? t.access.jupyter_port !== null
      : true;
}

function serviceLabel(s: Service): string {
  return s.kind === 'webui' ? 'the WebUI' : s.kind === 'jupyter' ? 'Jupyter' : `port ${s.port}`;
}

/** Why a service has no link although the VM serves it: links are interactive access to the VM. */
const NO_LINK = 'links are given to a signed-in session or a read_write API key only, and this one got none';

/** The service's link in a fresh access-info, or an error saying why there is none. */
function linkOf(vm: Vm, info: AccessInfo, template: Template | undefined, s: Service): string {
  if (s.kind === 'port') {
    const p = info.ports.find((x) => x.port === s.port);
    if (!p) throw new Error(`VM ${vm.vmid} has no HTTP port ${s.port}.`);
    if (!p.url) throw new Error(`No link for port ${s.port}: ${NO_LINK}.`);
    return p.url;
  }
  const link = s.kind === 'webui' ? info.web_ui : info.jupyter;
  if (!link) {
    throw new Error(
      !template || serves(template, s)
        ? `No link for ${serviceLabel(s)}: ${NO_LINK}.`
        : `VM ${vm.vmid} has no ${serviceLabel(s)}: its template, ${template.name}, serves none.`,
    );
  }
  return link.url;
}

/**
 * Opens a web service of the VM in a new tab, through the access portal.
 *
 * A portal link signs in once and lives 5 minutes, so it is fetched when the
 * user clicks, never kept on the page. Popup blockers let a page open a window
 * only while it handles the click, and the link arrives after a request: so
 * the tab is opened blank at once, synchronously in the click's handler, and
 * sent to the link when it comes. `noopener` cannot be asked of window.open
 * here (it would return no handle to send the tab on with); the same
 * protection is had by cutting the tab's `opener` before it leaves this
 * origin, so the VM's app (customer code, on an origin of its own) cannot
 * reach back to the console through window.opener. The link's token rides in
 * its fragment and the console sends no referrer to other origins, so it
 * reaches no server but the portal. When the browser blocks even that tab,
 * `onBlocked` gets the link to show as a plain link instead.
 */
function openService(
  vm: Vm,
  template: Template | undefined,
  s: Service,
  onBlocked: (url: string) => void,
): Promise<void> {
  const tab = window.open('', '_blank');
  if (tab) {
    tab.opener = null;
    // A word in the blank tab while the link is fetched; text only (no markup is ever written into it).
    tab.document.title = 'Opening…';
    if (tab.document.body) tab.document.body.textContent = `Opening ${serviceLabel(s)} of VM ${vm.vmid}…`;
  }
  return (async () => {
    try {
      const info = await call(api.GET('/vms/{vm_id}/access-info', { params: { path: { vm_id: vm.id } } }));
      const url = linkOf(vm, info, template, s);
      if (tab && !tab.closed) tab.location.replace(url);
      else onBlocked(url);
    } catch (e) {
      tab?.close();
      throw e;
    }
  })();
}

export function AccessCard({ vm, template }: { vm: Vm; template: Template | undefined }) {
  // The SSH command and which services have links; the links themselves are fetched again on each click.
  const info = useAsync(
    () => call(api.GET('/vms/{vm_id}/access-info', { params: { path: { vm_id: vm.id } } })),
    [vm.id, vm.started_at, vm.ip_address],
  );
  const [blocked, setBlocked] = useState<{ label: string; url: string } | undefined>(undefined);
  const open = (s: Service) => () => {
    setBlocked(undefined);
    return openService(vm, template, s, (url) => setBlocked({ label: serviceLabel(s), url }));
  };
  return (
    <section class="card vm-access">
      <h2>Access</h2>
      <Loaded value={info}>
        {(a) => {
          const services: { service: Service; name: string; primary?: boolean }[] = [
            ...(a.web_ui ? [{ service: { kind: 'webui' } as Service, name: 'Open WebUI', primary: true }] : []),
            ...(a.jupyter ? [{ service: { kind: 'jupyter' } as Service, name: 'Open Jupyter' }] : []),
            ...a.ports
              .filter((p) => p.url !== null)
              .map((p) => ({ service: { kind: 'port', port: p.port } as Service, name: `Open port ${p.port}` })),
          ];
          const unlinked = [
            ...(template && serves(template, { kind: 'webui' }) && !a.web_ui ? ['the WebUI'] : []),
            ...(template && serves(template, { kind: 'jupyter' }) && !a.jupyter ? ['Jupyter'] : []),
            ...a.ports.filter((p) => p.url === null).map((p) => `port ${p.port}`),
          ];
          return (
            <>
              <div class="secret">
                <code data-testid="ssh-command">{a.ssh.command}</code>
                <CopyButton text={a.ssh.command} label="Copy SSH command" />
              </div>
              <p class="muted">
                User <code>{a.ssh.username}</code> on <code>{a.ssh.host}</code>, port {a.ssh.port}.
              </p>
              {a.notice ? (
                <p class="warning vm-access-notice" role="note">
                  <WithTimes text={a.notice} />
                </p>
              ) : null}
              {services.length ? (
                <div class="actions vm-services">
                  {services.map((x) => (
                    <Action
                      key={x.name}
                      variant={x.primary ? 'primary' : 'plain'}
                      onClick={open(x.service)}
                      title={`Opens ${serviceLabel(x.service)} in a new tab, signed in`}
                    >
                      {x.name}
                    </Action>
                  ))}
                  <span class="muted">Opens in a new tab, signed in by a link made for that click.</span>
                </div>
              ) : null}
              {unlinked.length ? (
                <p class="muted" role="note">
                  No link for {unlinked.join(', ')}: {NO_LINK}.
                </p>
              ) : null}
              {blocked ? (
                <p class="warning" role="alert">
                  Your browser blocked the new tab.{' '}
                  <a href={blocked.url} target="_blank" rel="noopener noreferrer">
                    Open {blocked.label}
                  </a>{' '}
                  (the link works once, within 5 minutes).
                </p>
              ) : null}
            </>
          );
        }}
      </Loaded>
    </section>
  );
}
