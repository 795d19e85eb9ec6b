/**
 * Bridge networking (`--network bridge`, root only): every VM gets a
 * persistent tap device `gct<vmid>` on the bridge `gcbr0`, a static address
 * from the VM subnet (its seed's network-config says which), and its SSH port
 * on the public host forwarded to its port 22 by nftables (DNAT); outbound
 * traffic is masqueraded. The tap's counters are the VM's traffic, counted by
 * the kernel outside the guest (host side: tap rx = what the guest sent), and
 * a persistent tap keeps them across the VM's restarts.
 *
 * All of it is made idempotently: the bridge and taps when missing, and the
 * whole nftables table `ip gpucloud` rewritten from the VM list on each change.
 */
import { execFile, spawn } from 'node:child_process';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { promisify } from 'node:util';

const run = promisify(execFile);

export const BRIDGE = 'gcbr0';
const NFT_TABLE = 'gpucloud';

export interface Subnet {
  /** The network address as a 32-bit number. */
  network: number;
  prefix: number;
}

const IPV4 = /^(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}$/;

function toInt(ip: string): number {
  return ip.split('.').reduce((n, part) => n * 256 + Number(part), 0);
}

function toIp(n: number): string {
  return [24, 16, 8, 0].map((s) => Math.floor(n / 2 ** s) % 256).join('.');
}

/** A private IPv4 subnet like 10.88.0.0/16, /16 to /28. */
export function parseSubnet(cidr: string): Subnet {
  const [ip = '', p = ''] = cidr.split('/');
  if (!IPV4.test(ip) || !/^\d{1,2}$/.test(p) || Number(p) < 16 || Number(p) > 28)
    throw new Error(`"${cidr}" is not a subnet like 10.88.0.0/16 (/16 to /28)`);
  const prefix = Number(p);
  const size = 2 ** (32 - prefix);
  const n = toInt(ip);
  if (n % size !== 0) throw new Error(`"${cidr}": ${ip} is not the start of a /${prefix}`);
  return { network: n, prefix };
}

/** The bridge's own address: the first of the subnet. */
export function gatewayOf(s: Subnet): string {
  return toIp(s.network + 1);
}

/** Host numbers a VM may get: from 2 to the last before broadcast. */
export function vmAddress(s: Subnet, host: number): string {
  const size = 2 ** (32 - s.prefix);
  if (!Number.isInteger(host) || host < 2 || host > size - 2) throw new Error(`host ${host} is outside the subnet`);
  return toIp(s.network + host);
}

export function hostCount(s: Subnet): number {
  return 2 ** (32 - s.prefix) - 3;
}

/** A locally administered MAC from QEMU's prefix and the VM's address. */
export function macOf(ip: string): string {
  const n = toInt(ip);
  return [
    '52',
    '54',
    '00',
    ...[16, 8, 0].map((sh) => (Math.floor(n / 2 ** sh) % 256).toString(16).padStart(2, '0')),
  ].join(':');
}

export function tapName(vmid: number): string {
  if (!Number.isInteger(vmid) || vmid < 1 || vmid > 999_999_999) throw new Error(`bad vmid ${vmid}`);
  return `gct${vmid}`;
}

/** IPv4 name servers of the host (not loopback ones, which a guest cannot reach). */
export function hostNameservers(file = '/etc/resolv.conf'): string[] {
  if (!existsSync(file)) return [];
  return readFileSync(file, 'utf8')
    .split('\n')
    .map((l) => /^\s*nameserver\s+(\S+)/.exec(l)?.[1])
    .filter((a): a is string => !!a && IPV4.test(a) && !a.startsWith('127.'))
    .slice(0, 3);
}

async function ip(args: string[]): Promise<void> {
  try {
    await run('ip', args);
  } catch (err) {
    throw new Error(`ip ${args.join(' ')}: ${(err as { stderr?: string }).stderr?.trim() || (err as Error).message}`);
  }
}

function linkExists(name: string): boolean {
  return existsSync(`/sys/class/net/${name}`);
}

/** The bridge with the gateway address, up, and forwarding on. */
export async function ensureBridge(s: Subnet): Promise<void> {
  if (!linkExists(BRIDGE)) await ip(['link', 'add', BRIDGE, 'type', 'bridge']);
  const cidr = `${gatewayOf(s)}/${s.prefix}`;
  const { stdout } = await run('ip', ['-4', '-o', 'addr', 'show', 'dev', BRIDGE]);
  if (!stdout.includes(` ${cidr} `)) await ip(['addr', 'add', cidr, 'dev', BRIDGE]);
  await ip(['link', 'set', BRIDGE, 'up']);
  writeFileSync('/proc/sys/net/ipv4/ip_forward', '1\n');
}

/** The VM's persistent tap on the bridge, up. */
export async function ensureTap(name: string): Promise<void> {
  if (!linkExists(name)) await ip(['tuntap', 'add', 'dev', name, 'mode', 'tap']);
  await ip(['link', 'set', name, 'master', BRIDGE, 'up']);
}

export async function removeTap(name: string): Promise<void> {
  if (linkExists(name)) await ip(['link', 'del', name]);
}

/** Rewrites the NAT table: the SSH forward of every VM, and masquerade for the subnet. */
export async function applyForwards(s: Subnet, forwards: { port: number; ip: string }[]): Promise<void> {
  const subnet = `${toIp(s.network)}/${s.prefix}`;
  const dnat = forwards.map((f) => `    tcp dport ${f.port} dnat to ${f.ip}:22`);
  const script = [
    `table ip ${NFT_TABLE} {}`,
    `flush table ip ${NFT_TABLE}`,
    `table ip ${NFT_TABLE} {`,
    '  chain prerouting {',
    '    type nat hook prerouting priority dstnat; policy accept;',
    ...dnat,
    '  }',
    '  chain output {',
    '    type nat hook output priority -100; policy accept;',
    // Connections from the host itself to its own address reach the VMs too.
    ...forwards.map((f) => `    fib daddr type local tcp dport ${f.port} dnat to ${f.ip}:22`),
    '  }',
    '  chain postrouting {',
    '    type nat hook postrouting priority srcnat; policy accept;',
    `    ip saddr ${subnet} oifname != "${BRIDGE}" masquerade`,
    '  }',
    '}',
    '',
  ].join('\n');
  await new Promise<void>((resolve, reject) => {
    const child = spawn('nft', ['-f', '-'], { stdio: ['pipe', 'ignore', 'pipe'] });
    let err = '';
    child.stderr.on('data', (d) => (err += d));
    child.on('error', (e: NodeJS.ErrnoException) =>
      reject(new Error(e.code === 'ENOENT' ? 'nft not found (Debian package nftables)' : e.message)),
    );
    child.on('close', (code) => (code === 0 ? resolve() : reject(new Error(`nft: ${err.trim()}`))));
    child.stdin.end(script);
  });
}
