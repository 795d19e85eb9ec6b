/**
 * The templates a VM is built from (docs/vms.md#templates) and the web
 * services each declares for the access portal (docs/portal.md): the guest
 * port of its WebUI and of Jupyter. A VM's portal reaches these ports and
 * the customer's own `http_ports`, and nothing else.
 */
import type { PortalService } from '../portal/links.js';

export interface TemplateInfo {
  name: string;
  /** Guest ports of the web services the template's image serves. */
  web: { webui?: number; jupyter?: number };
}

export const TEMPLATES: Record<number, TemplateInfo> = {
  100: { name: 'Ubuntu 22.04 with GPU drivers', web: {} },
  101: { name: 'Ubuntu 24.04 with GPU drivers', web: {} },
  102: { name: 'Stable Diffusion WebUI', web: { webui: 7860, jupyter: 8888 } },
  103: { name: 'ComfyUI (node-based image/video/audio generation)', web: { webui: 8188, jupyter: 8888 } },
  104: { name: 'Linux desktop in the browser', web: { webui: 6080, jupyter: 8888 } },
};

/** Templates with a WebUI and Jupyter (access-info's `web_ui` and `jupyter`). */
export const WEB_TEMPLATES = new Set(
  Object.entries(TEMPLATES)
    .filter(([, t]) => t.web.webui !== undefined)
    .map(([id]) => Number(id)),
);

/** The guest ports a VM's portal may reach: its template's web services and its own HTTP ports, each once. */
export function webPortsOf(vm: { template_vmid: number; http_ports: number[] }): number[] {
  const web = TEMPLATES[vm.template_vmid]?.web ?? {};
  const ports = [web.webui, web.jupyter, ...vm.http_ports].filter((p): p is number => p !== undefined);
  return [...new Set(ports)].sort((a, b) => a - b);
}

/** The guest port of one portal service of a VM, or null when the VM has no such service. */
export function guestPortOf(
  vm: { template_vmid: number; http_ports: number[] },
  service: PortalService,
): number | null {
  if (service === 'webui' || service === 'jupyter') return TEMPLATES[vm.template_vmid]?.web[service] ?? null;
  const port = Number(service);
  return vm.http_ports.includes(port) ? port : null;
}

/** A service as people call it. */
export function serviceLabel(service: PortalService): string {
  return service === 'webui' ? 'the WebUI' : service === 'jupyter' ? 'Jupyter' : `port ${service}`;
}
