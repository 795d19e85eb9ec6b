/**
 * A stand-in host agent speaking the agent API (v1) over real HTTP, with VMs
 * in memory, for the control plane's tests: what it is asked is recorded, and
 * a test can take it down, bring it back, or make a VM stop by itself. The
 * real agent (QEMU) is tested end to end in test/agent/.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import net, { type AddressInfo, type Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import { splice } from '../../src/net/streams.js';
import type { AgentTemplateState } from '../../src/host-agent/api.js';

export interface FakeVm {
  id: string;
  state: 'stopped' | 'booting' | 'running' | 'stopping';
  exit_reason: 'guest_powered_off' | 'crashed' | null;
  port: number;
  spec: Record<string, unknown>;
  rx: number;
  tx: number;
  /** Devices bound while it runs, as the real agent binds them at start. */
  gpus: string[];
}

export interface FakeCall {
  method: string;
  path: string;
  body: unknown;
}

export class FakeAgent {
  readonly vms = new Map<string, FakeVm>();
  readonly calls: FakeCall[] = [];
  /** Local templates, as an agent before the image store reports them (ready). */
  templates: { vmid: number; user: string }[] = [{ vmid: 100, user: 'root' }];
  /**
   * What PUT /v1/templates answers; undefined: the route does not exist (an agent before the image
   * store), and the control plane falls back on `templates`.
   */
  templateStates: AgentTemplateState[] | undefined = undefined;
  /** Where the tunnel to a guest port leads: a local stand-in server's port, by guest port. */
  readonly guestPorts = new Map<number, number>();
  /** Tunnels opened, as `vmId:port`. */
  readonly tunnels: string[] = [];
  /** The host's GPUs: 0000:01:00.0, 0000:02:00.0, ... */
  hostGpus = 1;
  /** Polls of a booting VM before it answers on SSH. */
  bootPolls = 1;
  /** Set: creating a VM (PUT /v1/vms/:id) fails with this reason (422 provision_failed), as on a full disk. */
  failProvision: string | null = null;
  private polls = new Map<string, number>();
  private server: Server | undefined;
  private sockets = new Set<Socket>();
  private nextPort = 22000;
  port = 0;

  constructor(
    public token: string,
    readonly publicHost = '203.0.113.7',
  ) {}

  get url(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  async start(port = this.port): Promise<void> {
    this.server = createServer((req, res) => void this.handle(req, res));
    this.server.on('upgrade', (req: IncomingMessage, socket: Duplex, head: Buffer) => this.tunnel(req, socket, head));
    this.server.on('connection', (s) => {
      this.sockets.add(s);
      s.on('close', () => this.sockets.delete(s));
    });
    await new Promise<void>((resolve) => this.server!.listen(port, '127.0.0.1', resolve));
    this.port = (this.server.address() as AddressInfo).port;
  }

  /** Stops answering: connections are refused until start() again. */
  async stop(): Promise<void> {
    for (const s of this.sockets) s.destroy();
    await new Promise<void>((resolve) => (this.server ? this.server.close(() => resolve()) : resolve()));
    this.server = undefined;
  }

  /** The tunnel as the real agent opens it (src/host-agent/tunnel.ts): to a declared port of a running VM. */
  private tunnel(req: IncomingMessage, socket: Duplex, head: Buffer): void {
    const refuse = (status: number, code: string) => {
      const body = JSON.stringify({ detail: code, code });
      socket.end(`HTTP/1.1 ${status} X\r\ncontent-length: ${body.length}\r\nconnection: close\r\n\r\n${body}`);
    };
    if (req.headers.authorization !== `Bearer ${this.token}`) return refuse(401, 'unauthorized');
    const m = /^\/v1\/vms\/([^/]+)\/tunnel\?port=(\d+)$/.exec(req.url ?? '');
    const vm = m ? this.vms.get(m[1]!) : undefined;
    if (!m || !vm) return refuse(404, 'not_found');
    const port = Number(m[2]);
    if (!((vm.spec.web_ports as number[] | undefined) ?? []).includes(port)) return refuse(403, 'port_not_declared');
    if (vm.state !== 'running') return refuse(409, 'not_running');
    const local = this.guestPorts.get(port);
    if (local === undefined) return refuse(502, 'guest_unreachable');
    this.tunnels.push(`${vm.id}:${port}`);
    const upstream = net.connect(local, '127.0.0.1', () => {
      socket.write('HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: gpucloud-tunnel\r\n\r\n');
      if (head.length) upstream.write(head);
      splice(socket, upstream);
    });
    upstream.on('error', () => socket.destroy());
    this.sockets.add(socket as Socket);
  }

  /** What GET /v1/host answers. */
  async hostView(): Promise<{ host_gpus: { pci_address: string; vm_id: string | null }[] }> {
    const r = await fetch(`${this.url}/v1/host`, { headers: { authorization: `Bearer ${this.token}` } });
    return (await r.json()) as { host_gpus: { pci_address: string; vm_id: string | null }[] };
  }

  private devices(): string[] {
    return Array.from({ length: this.hostGpus }, (_, i) => `0000:${String(i + 1).padStart(2, '0')}:00.0`);
  }

  /** The VM stops by itself (its guest powered off, or QEMU died): its devices are given back. */
  endVm(id: string, reason: 'guest_powered_off' | 'crashed'): void {
    const vm = this.vms.get(id);
    if (!vm) return;
    vm.state = 'stopped';
    vm.exit_reason = reason;
    vm.gpus = [];
  }

  private view(vm: FakeVm) {
    return {
      id: vm.id,
      state: vm.state,
      ssh: {
        host: this.publicHost,
        port: vm.port,
        user: this.templates.find((t) => t.vmid === vm.spec.template_vmid)?.user ?? 'root',
      },
      gpus: vm.gpus,
      exit_reason: vm.state === 'stopped' ? vm.exit_reason : null,
      traffic: { rx_bytes: vm.rx, tx_bytes: vm.tx, counted: true },
    };
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    let raw = '';
    for await (const c of req) raw += c;
    const body = raw ? JSON.parse(raw) : undefined;
    const path = (req.url ?? '').split('?')[0]!;
    this.calls.push({ method: req.method ?? '', path, body });
    const send = (status: number, value?: unknown) => {
      res.writeHead(status, value === undefined ? {} : { 'content-type': 'application/json' });
      res.end(value === undefined ? undefined : JSON.stringify(value));
    };
    if (req.headers.authorization !== `Bearer ${this.token}`)
      return send(401, { detail: 'a valid agent token is required', code: 'unauthorized' });
    if (req.method === 'GET' && path === '/v1/host') {
      return send(200, {
        agent_version: '9.9.9-fake',
        accel: 'tcg',
        host_cpu_model: 'Fake CPU @ 1 GHz',
        host_gpus: this.devices().map((pci_address, i) => ({
          pci_address,
          model: 'NVIDIA GeForce RTX 4090',
          vfio: true,
          iommu_group: 12 + i,
          vm_id: [...this.vms.values()].find((v) => v.gpus.includes(pci_address))?.id ?? null,
        })),
        public_host: this.publicHost,
        templates: this.templates,
        vms: [...this.vms.values()].map((v) => this.view(v)),
      });
    }
    if (req.method === 'PUT' && path === '/v1/templates' && this.templateStates) return send(200, this.templateStates);
    const m = /^\/v1\/vms\/([^/]+)(\/start|\/stop)?$/.exec(path);
    if (!m) return send(404, { detail: 'no such route', code: 'not_found' });
    const id = decodeURIComponent(m[1]!);
    const vm = this.vms.get(id);
    if (req.method === 'PUT' && !m[2]) {
      if (vm) return send(200, this.view(vm));
      if (this.failProvision !== null) return send(422, { detail: this.failProvision, code: 'provision_failed' });
      const ready = (this.templateStates ?? this.templates).some(
        (t) => t.vmid === body.template_vmid && (!('state' in t) || t.state === 'ready'),
      );
      if (!ready) {
        return send(422, {
          detail: `template ${body.template_vmid} is not on this host`,
          code: 'template_unavailable',
        });
      }
      const created: FakeVm = {
        id,
        state: 'stopped',
        exit_reason: null,
        port: this.nextPort++,
        spec: body,
        rx: 0,
        tx: 0,
        gpus: [],
      };
      this.vms.set(id, created);
      return send(200, this.view(created));
    }
    if (req.method === 'DELETE' && !m[2]) {
      this.vms.delete(id);
      return send(204);
    }
    if (!vm) return send(404, { detail: 'not on this host', code: 'not_found' });
    if (req.method === 'GET' && !m[2]) {
      if (vm.state === 'booting') {
        const n = (this.polls.get(id) ?? 0) + 1;
        this.polls.set(id, n);
        if (n >= this.bootPolls) vm.state = 'running';
      }
      return send(200, this.view(vm));
    }
    if (req.method === 'POST' && m[2] === '/start') {
      if (vm.state === 'stopped') {
        const held = new Set([...this.vms.values()].flatMap((v) => v.gpus));
        const free = this.devices().filter((d) => !held.has(d));
        const count = Number(vm.spec.gpu_count);
        if (free.length < count)
          return send(409, {
            detail: `${count} GPU(s) asked, ${free.length} free on this host`,
            code: 'gpus_unavailable',
          });
        vm.gpus = free.slice(0, count);
        vm.state = this.bootPolls === 0 ? 'running' : 'booting';
        vm.exit_reason = null;
        this.polls.set(id, 0);
      }
      return send(200, this.view(vm));
    }
    if (req.method === 'POST' && m[2] === '/stop') {
      vm.state = 'stopped';
      vm.exit_reason = null;
      vm.gpus = [];
      return send(200, this.view(vm));
    }
    return send(404, { detail: 'no such route', code: 'not_found' });
  }
}
