/**
 * How a running VM is reached (docs/vms.md#labels-access-and-lists): SSH,
 * and through the access portal (docs/portal.md) the web services of its
 * template and the HTTP ports the customer opened, each by a link that
 * carries a short-lived launch token.
 */
import type { Static } from 'typebox';
import type { Db } from '../../db/db.js';
import { invalidState } from '../../errors.js';
import type { TokenService } from '../auth/tokens.js';
import { portService, type PortalLinks, type PortalService } from '../portal/links.js';
import { mustFind } from './records.js';
import type { AccessInfoSchema } from './schemas.js';
import type { TemplateWeb } from '../templates/service.js';

export const LAUNCH_TOKEN_TTL_S = 300;

export interface AccessDeps {
  db: Db;
  tokens: TokenService;
  links: PortalLinks;
  templateWeb: (vmid: number) => Promise<TemplateWeb>;
}

/** `launchTokens`: whether the caller may have launch tokens (interactive access to the VM). */
export async function accessInfo(
  deps: AccessDeps,
  userId: number,
  ref: string,
  opts: { launchTokens: boolean },
): Promise<Static<typeof AccessInfoSchema>> {
  const vm = await mustFind(deps.db, userId, ref);
  if (vm.status !== 'running' || !vm.ip_address) {
    throw invalidState(`Access info is available while the VM is running; it is ${vm.status}`);
  }
  // A VM on an agent's host is reached through its own port on the agent's public host.
  const username = vm.ssh_user ?? 'ubuntu';
  const host = vm.ssh_host ?? vm.ip_address;
  const port = vm.ssh_port ?? 22;
  const launch = async (service: PortalService) => {
    const { token, expiresAt } = await deps.tokens.signPurpose(
      'launch',
      { vm_id: vm.id, user_id: vm.user_id, service },
      LAUNCH_TOKEN_TTL_S,
    );
    // The token rides in the fragment: browsers never send it, so no server or proxy logs it.
    return {
      url: deps.links.launchUrl(vm.vmid, service, token),
      launch_token: token,
      expires_at: expiresAt.toISOString(),
    };
  };
  const web = await deps.templateWeb(vm.template_vmid);
  const hasWeb = opts.launchTokens;
  const ports = [];
  for (const p of vm.http_ports) {
    const link = opts.launchTokens ? await launch(portService(p)!) : null;
    ports.push({ port: p, url: link?.url ?? null, expires_at: link?.expires_at ?? null });
  }
  return {
    vm_id: vm.id,
    status: vm.status,
    ssh: {
      host,
      port,
      username,
      command: port === 22 ? `ssh ${username}@${host}` : `ssh -p ${port} ${username}@${host}`,
    },
    web_ui: hasWeb && web.webui !== undefined ? await launch('webui') : null,
    jupyter: hasWeb && web.jupyter !== undefined ? await launch('jupyter') : null,
    ports,
    // Only a host agent reports where SSH answers: a VM without that runs on the simulator.
    notice:
      vm.ssh_host === null
        ? `VM ${vm.vmid} runs on a simulated node: its address is made up and nothing answers on it (its web links lead to a page saying so). To rent real VMs, run a host agent: see "Run real VMs" in the README.`
        : null,
  };
}
