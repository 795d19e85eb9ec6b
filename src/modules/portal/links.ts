/**
 * The access portal's host names (docs/portal.md#host-names). Every web
 * service of every VM has an origin of its own: `VMID-SERVICE.DOMAIN`, where
 * SERVICE is `webui`, `jupyter` or a customer's HTTP port (`1000-8080`), on
 * the portal's scheme and port. A guest's app is customer code: on its own
 * origin it can read nothing of the console's, the API's or another VM's.
 */

export type PortalService = 'webui' | 'jupyter' | `${number}`;

export interface PortalTarget {
  vmid: number;
  service: PortalService;
}

const LABEL = /^([1-9][0-9]{0,8})-(webui|jupyter|[1-9][0-9]{3,4})$/;

/** A customer HTTP port (1024-65535) as its service name, or null. */
export function portService(port: number): PortalService | null {
  return Number.isInteger(port) && port >= 1024 && port <= 65535 ? (String(port) as PortalService) : null;
}

export class PortalLinks {
  private scheme!: 'http:' | 'https:';
  private domain!: string;
  private portPart!: string;

  constructor(base: string) {
    this.setBase(base);
  }

  /** The base, `scheme://domain[:port]`; changed once when a server listening on port 0 learns its port. */
  setBase(base: string): void {
    const u = new URL(base);
    this.scheme = u.protocol as 'http:' | 'https:';
    this.domain = u.hostname.toLowerCase();
    this.portPart = u.port ? `:${u.port}` : '';
  }

  get secure(): boolean {
    return this.scheme === 'https:';
  }

  get base(): string {
    return `${this.scheme}//${this.domain}${this.portPart}`;
  }

  /** The origin of one service of one VM, with a trailing slash. */
  url(vmid: number, service: PortalService): string {
    return `${this.scheme}//${vmid}-${service}.${this.domain}${this.portPart}/`;
  }

  /** The link access-info gives: the launch page, the token in the fragment (never sent to a server). */
  launchUrl(vmid: number, service: PortalService, token: string): string {
    return `${this.url(vmid, service)}.gpucloud/launch#launch_token=${token}`;
  }

  /** The VM and service a Host header names, or null when it is not one of the portal's names. */
  parse(host: string | undefined): PortalTarget | null {
    if (!host) return null;
    const name = host.toLowerCase().replace(/:\d{1,5}$/, '');
    if (!name.endsWith(`.${this.domain}`)) return null;
    const m = LABEL.exec(name.slice(0, -this.domain.length - 1));
    if (!m) return null;
    const service = m[2] as PortalService;
    if (/^\d+$/.test(service) && portService(Number(service)) === null) return null;
    return { vmid: Number(m[1]), service };
  }
}
