/**
 * The template catalogue (GET /templates, public) as the console's pages use
 * it: read once and shared for a few seconds between the pages that name
 * templates (launch, a VM's page), read again after an operator changes it.
 */
import type { Template } from '../../src/sdk/index.js';
import { api, call } from './api.js';
import { useAsync, type Async } from './ui.js';

const FRESH_MS = 15_000;
let cached: { at: number; list: Promise<Template[]> } | undefined;

/** The catalogue; a read under FRESH_MS old is shared. */
export function loadTemplates(): Promise<Template[]> {
  const now = Date.now();
  if (!cached || now - cached.at > FRESH_MS) {
    const list = call(api.GET('/templates'));
    cached = { at: now, list };
    list.catch(() => (cached = undefined));
  }
  return cached.list;
}

/** The next read asks the API again (after an operator's change). */
export function forgetTemplates(): void {
  cached = undefined;
}

/** The catalogue as a page's async value; with `pollMs`, read again that often. */
export function useTemplates(pollMs?: number): Async<Template[]> {
  return useAsync(
    () => {
      // A poll is a new read: what changed on the hosts (a template becoming ready) shows.
      if (pollMs) forgetTemplates();
      return loadTemplates();
    },
    [],
    pollMs,
  );
}

/** "stable-diffusion", or "template 150" for one the catalogue does not list (any more). */
export function templateName(list: Template[] | undefined, vmid: number): string {
  return list?.find((t) => t.template_vmid === vmid)?.name ?? `template ${vmid}`;
}

/** "SSH, WebUI, Jupyter"; with `ports`, "SSH, WebUI (port 7860), Jupyter (port 8888)". */
export function accessText(t: Template, ports = false): string {
  const port = (p: number) => (ports ? ` (port ${p})` : '');
  return [
    'SSH',
    ...(t.access.webui_port !== null ? [`WebUI${port(t.access.webui_port)}`] : []),
    ...(t.access.jupyter_port !== null ? [`Jupyter${port(t.access.jupyter_port)}`] : []),
  ].join(', ');
}

/** Whether a VM of the template can be created on the node now. */
export function readyOn(t: Template, node: string): boolean {
  return t.ready_on.nodes.includes(node);
}
