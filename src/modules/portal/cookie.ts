/**
 * The portal's session cookie (docs/portal.md#security-model). A launch
 * token, used once, becomes this cookie for one host: one VM's one service,
 * one user, one run of the VM (the `started_at` of the run it was issued in),
 * and at most 12 hours. It is an HMAC-signed value, so every instance checks
 * it with nothing shared but the service secret; the VM's run is checked
 * against the database, so a stop, an interruption or a destroy ends it.
 *
 * Format: `v1.VMID.SERVICE.USER.RUN_MS.EXP_MS.MAC` (MAC: HMAC-SHA256 of the
 * rest, base64url). The cookie is HttpOnly, SameSite=Lax, host-only (no
 * Domain attribute), Secure under https.
 */
import { createHmac, timingSafeEqual } from 'node:crypto';
import type { PortalService } from './links.js';

export const COOKIE_NAME = 'gpucloud_portal';
export const COOKIE_MAX_S = 12 * 3600;

export interface PortalSession {
  vmid: number;
  service: PortalService;
  userId: number;
  /** The VM's started_at (ms) when the cookie was issued. */
  runMs: number;
  expMs: number;
}

const FORMAT =
  /^v1\.([1-9][0-9]{0,8})\.(webui|jupyter|[1-9][0-9]{3,4})\.([1-9][0-9]{0,15})\.([0-9]{1,15})\.([0-9]{1,15})\.([A-Za-z0-9_-]{43})$/;

export class CookieSigner {
  /** Cookies checked once, by value: verifying costs an HMAC, and a browser sends the same one on every request. */
  private readonly known = new Map<string, PortalSession>();

  constructor(private readonly key: Buffer) {}

  private mac(payload: string): string {
    return createHmac('sha256', this.key).update(payload).digest('base64url');
  }

  sign(s: PortalSession): string {
    const payload = `v1.${s.vmid}.${s.service}.${s.userId}.${s.runMs}.${s.expMs}`;
    return `${payload}.${this.mac(payload)}`;
  }

  /** The session a cookie value holds, or null for anything not signed here or expired at `nowMs`. */
  verify(value: string, nowMs: number): PortalSession | null {
    let s = this.known.get(value);
    if (!s) {
      const m = FORMAT.exec(value);
      if (!m) return null;
      const payload = value.slice(0, value.lastIndexOf('.'));
      const given = Buffer.from(m[6]!);
      const expected = Buffer.from(this.mac(payload));
      if (given.length !== expected.length || !timingSafeEqual(given, expected)) return null;
      s = {
        vmid: Number(m[1]),
        service: m[2] as PortalService,
        userId: Number(m[3]),
        runMs: Number(m[4]),
        expMs: Number(m[5]),
      };
      if (this.known.size >= 10_000) this.known.delete(this.known.keys().next().value!);
      this.known.set(value, s);
    }
    return s.expMs > nowMs ? s : null;
  }
}

/** The value of the portal's cookie in a Cookie header, if any. */
export function readCookie(header: string | undefined): string | undefined {
  if (!header) return undefined;
  for (const part of header.split(';')) {
    const i = part.indexOf('=');
    if (i > 0 && part.slice(0, i).trim() === COOKIE_NAME) return part.slice(i + 1).trim();
  }
  return undefined;
}

/** The Cookie header without the portal's own cookie (the guest never sees a gpucloud credential), or undefined. */
export function stripCookie(header: string | undefined): string | undefined {
  if (!header) return undefined;
  const rest = header
    .split(';')
    .filter((part) => {
      const i = part.indexOf('=');
      return (i < 0 ? part : part.slice(0, i)).trim() !== COOKIE_NAME;
    })
    .map((p) => p.trim())
    .filter((p) => p !== '');
  return rest.length ? rest.join('; ') : undefined;
}
