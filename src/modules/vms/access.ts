/**
 * The templates a VM is built from, and how a running VM is reached
 * (docs/vms.md#templates, docs/vms.md#labels-access-and-lists): SSH, and for
 * the web templates WebUI and Jupyter through short-lived launch tokens.
 */
import type { Db } from '../../db/db.js';
import { invalidState } from '../../errors.js';
import type { TokenService } from '../auth/tokens.js';
import { mustFind } from './records.js';

export const LAUNCH_TOKEN_TTL_S = 300;
export const WEB_TEMPLATES = new Set([102, 103, 104]);
export const TEMPLATES: Record<number, string> = {
  100: 'Ubuntu 22.04 with GPU drivers',
  101: 'Ubuntu 24.04 with GPU drivers',
  102: 'Stable Diffusion WebUI',
  103: 'ComfyUI (node-based image/video/audio generation)',
  104: 'Linux desktop in the browser',
};

export interface AccessDeps {
  db: Db;
  tokens: TokenService;
  portalUrl: string;
}

/** `launchTokens`: whether the caller may have WebUI/Jupyter launch tokens (interactive access). */
export async function accessInfo(deps: AccessDeps, userId: number, ref: string, opts: { launchTokens: boolean }) {
  const vm = await mustFind(deps.db, userId, ref);
  if (vm.status !== 'running' || !vm.ip_address) {
    throw invalidState(`Access info is available while the VM is running; it is ${vm.status}`);
  }
  // A VM on an agent's host is reached through its own port on the agent's public host.
  const username = vm.ssh_user ?? 'ubuntu';
  const host = vm.ssh_host ?? vm.ip_address;
  const port = vm.ssh_port ?? 22;
  const web = async (service: 'webui' | 'jupyter') => {
    const { token, expiresAt } = await deps.tokens.signPurpose(
      'launch',
      { vm_id: vm.id, user_id: vm.user_id, service },
      LAUNCH_TOKEN_TTL_S,
    );
    // The token rides in the fragment: browsers never send it, so no server or proxy logs it.
    return {
      url: `${deps.portalUrl}/vms/${vm.vmid}/${service}/#launch_token=${token}`,
      launch_token: token,
      expires_at: expiresAt.toISOString(),
    };
  };
  const hasWeb = WEB_TEMPLATES.has(vm.template_vmid) && opts.launchTokens;
  return {
    vm_id: vm.id,
    status: vm.status,
    ssh: {
      host,
      port,
      username,
      command: port === 22 ? `ssh ${username}@${host}` : `ssh -p ${port} ${username}@${host}`,
    },
    web_ui: hasWeb ? await web('webui') : null,
    jupyter: hasWeb ? await web('jupyter') : null,
  };
}
