/**
 * The web services a VM's template declares for the access portal
 * (docs/portal.md): the guest port of its WebUI and of Jupyter, from the
 * template catalogue (docs/templates.md). A VM's portal reaches these ports
 * and the customer's own `http_ports`, and nothing else.
 */
import type { PortalService } from '../portal/links.js';
import type { TemplateWeb } from '../templates/service.js';

/** The guest ports a VM's portal may reach: its template's web services and its own HTTP ports, each once. */
export function webPortsOf(web: TemplateWeb, vm: { http_ports: number[] }): number[] {
  const ports = [web.webui, web.jupyter, ...vm.http_ports].filter((p): p is number => p !== undefined);
  return [...new Set(ports)].sort((a, b) => a - b);
}

/** The guest port of one portal service of a VM, or null when the VM has no such service. */
export function guestPortOf(web: TemplateWeb, vm: { http_ports: number[] }, service: PortalService): number | null {
  if (service === 'webui' || service === 'jupyter') return web[service] ?? null;
  const port = Number(service);
  return vm.http_ports.includes(port) ? port : null;
}

/** A service as people call it. */
export function serviceLabel(service: PortalService): string {
  return service === 'webui' ? 'the WebUI' : service === 'jupyter' ? 'Jupyter' : `port ${service}`;
}
