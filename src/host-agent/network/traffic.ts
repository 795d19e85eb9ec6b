/**
 * Byte counters of a VM's tap device, from sysfs. Counters are named from
 * the host's side of the tap: `rxBytes` is what the guest sent, `txBytes`
 * what it received. They are cumulative since the device was created
 * (persistent taps keep them across VM restarts), so callers bill deltas.
 * A missing device or unreadable counter gives null; an interface name that
 * is not a plain name (it becomes part of a path) throws.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';

const IFNAME = /^[a-zA-Z0-9_-]{1,15}$/;

export function tapCounters(ifname: string, sysRoot = '/sys'): { rxBytes: number; txBytes: number } | null {
  if (typeof ifname !== 'string' || !IFNAME.test(ifname))
    throw new TypeError(`bad interface name: ${JSON.stringify(ifname)}`);
  const dir = join(sysRoot, 'class/net', ifname, 'statistics');
  const rxBytes = counter(join(dir, 'rx_bytes'));
  const txBytes = counter(join(dir, 'tx_bytes'));
  return rxBytes === null || txBytes === null ? null : { rxBytes, txBytes };
}

function counter(path: string): number | null {
  let text: string;
  try {
    text = readFileSync(path, 'utf8').trim();
  } catch {
    return null;
  }
  if (!/^[0-9]{1,20}$/.test(text)) return null;
  const n = Number(text);
  return Number.isSafeInteger(n) ? n : null;
}
