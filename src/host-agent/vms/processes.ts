/**
 * The QEMU process of each VM: start, stop, re-attach.
 *
 * Rules:
 * - QEMU runs daemonized in its own session: it outlives the agent. A new
 *   agent re-attaches to every VM whose pid is alive (checked against its
 *   command line, so a recycled pid is not taken for it) through its QMP
 *   socket, and never stops or restarts a VM because the agent restarted.
 * - The serial console goes to a socket the agent reads into a capped log
 *   (qemu/console.ts): a guest cannot fill the host's disk through it.
 * - A VM is `running` once its customer can log in and stay logged in: after
 *   cloud-init's final message (the seed's boot marker) on its console and an
 *   SSH answer, or for a guest without cloud-init once SSH answers (the banner
 *   is read: user-mode networking accepts TCP before the guest listens);
 *   qemu/boot.ts.
 * - A VM whose QEMU ends without being asked is `stopped`, with the reason:
 *   `guest_powered_off` after a SHUTDOWN event from the guest, `crashed`
 *   when the process died without one. Its GPUs are given back whenever
 *   QEMU ends (gpu-binding.ts).
 */
import { join } from 'node:path';
import { qemuArgs, qmpArg, vmFiles } from '../qemu/command.js';
import { isAlive, launchQemu, readPid } from '../qemu/process.js';
import { QmpClient } from '../qemu/qmp.js';
import { ConsoleLog } from '../qemu/console.js';
import { ConsoleScanner, isBooted, markBooted, waitForBoot } from '../qemu/boot.js';
import { bootMarker } from '../images/seed.js';
import { loopbackPort, sshBanner } from '../network/ssh-probe.js';
import { ensureTap } from '../network/bridge.js';
import { AgentError } from '../errors.js';
import type { GpuBinding } from './gpu-binding.js';
import type { Runtime, VmRecord, VmTable } from './table.js';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export class VmProcesses {
  constructor(
    private readonly table: VmTable,
    private readonly gpus: GpuBinding,
  ) {}

  /** At the agent's start: re-attaches to the VM's QEMU if it still runs, else clears what its run left. */
  async reattach(rec: VmRecord): Promise<void> {
    const rt = this.table.rt(rec.id);
    const dir = this.table.dir(rec);
    const pid = readPid(vmFiles(dir).pidFile);
    if (pid !== null && isAlive(pid, qmpArg(dir))) {
      try {
        await this.attach(rec, pid);
        this.readConsole(rec);
        rt.state = isBooted(dir) ? 'running' : 'booting';
        if (rt.state === 'booting') void this.watchBoot(rec, rt.generation);
        this.table.log('re-attached to a running VM', { vm: rec.id, pid, state: rt.state });
      } catch (err) {
        this.table.log('could not re-attach; leaving the VM process alone', { vm: rec.id, pid, err: String(err) });
        rt.state = 'running';
        rt.pid = pid;
        void this.watchPid(rec, rt.generation);
      }
    } else {
      this.table.cleanRunFiles(dir);
      this.gpus.release(rec); // its QEMU ended while no agent ran
    }
  }

  /** Binds the VM's GPUs and starts its QEMU (in the VM's queue, the VM stopped); it is `booting` then. */
  async start(rec: VmRecord): Promise<void> {
    const rt = this.table.rt(rec.id);
    this.gpus.bind(rec); // before any await
    try {
      await this.launch(rec, rt);
    } catch (err) {
      this.gpus.release(rec);
      throw err;
    }
    void this.watchBoot(rec, rt.generation);
    this.table.log('started', { vm: rec.id, pid: rt.pid, gpus: rec.gpus });
  }

  private async launch(rec: VmRecord, rt: Runtime): Promise<void> {
    const { opts } = this.table;
    const dir = this.table.dir(rec);
    this.table.cleanRunFiles(dir);
    if (!rec.net) {
      rec.web_forwards = [];
      for (const guest of rec.web_ports ?? []) rec.web_forwards.push({ guest, host: await loopbackPort() });
      this.table.save(rec);
    }
    const args = qemuArgs({
      binary: opts.qemuBinary,
      name: `gpucloud-${rec.vmid}`,
      vmDir: dir,
      accel: opts.accel,
      cpuCores: rec.cpu_cores,
      ramMb: rec.ram_mb,
      diskPath: join(dir, 'disk.qcow2'),
      seedPath: join(dir, 'seed.iso'),
      // Stand-in GPUs of a host without any are never passed to QEMU.
      gpus: opts.fakeGpus > 0 ? [] : rec.gpus,
      net: rec.net
        ? { kind: 'tap', ifname: rec.net.tap, mac: rec.net.mac }
        : {
            kind: 'user',
            hostfwdHost: opts.forwardHost,
            sshPort: rec.ssh_port,
            webForwards: rec.web_forwards ?? [],
          },
    });
    if (rec.net) await ensureTap(rec.net.tap);
    try {
      await launchQemu(args, { binary: opts.qemuBinary });
    } catch (err) {
      throw new AgentError(500, 'start_failed', `QEMU did not start: ${(err as Error).message}`);
    }
    const pid = readPid(vmFiles(dir).pidFile);
    if (pid === null) throw new AgentError(500, 'start_failed', 'QEMU started but wrote no pid file');
    rt.exitReason = null;
    rt.guestShutdown = false;
    rt.expectingExit = false;
    rt.state = 'booting';
    try {
      await this.attach(rec, pid);
    } catch (err) {
      this.table.log('QMP did not answer after start', { vm: rec.id, err: String(err) });
    }
    this.readConsole(rec);
  }

  /** Reads the VM's serial console into its capped log while QEMU runs. */
  private readConsole(rec: VmRecord): void {
    const rt = this.table.rt(rec.id);
    rt.console?.close();
    const files = vmFiles(this.table.dir(rec));
    const log = new ConsoleLog(files.consoleSocket, files.consoleLog);
    rt.console = log;
    const boot = new ConsoleScanner(bootMarker(rec.id));
    rt.boot = boot;
    log.onData((chunk) => boot.feed(chunk));
    void log.open();
  }

  /** Connects to the VM's QMP socket and follows its events and its end. */
  private async attach(rec: VmRecord, pid: number): Promise<void> {
    const rt = this.table.rt(rec.id);
    rt.pid = pid;
    rt.generation++;
    const generation = rt.generation;
    const socket = vmFiles(this.table.dir(rec)).qmpSocket;
    let qmp: QmpClient | null = null;
    for (let i = 0; i < 20 && !qmp; i++) {
      try {
        qmp = await QmpClient.connect(socket, { timeoutMs: 2000 });
      } catch (err) {
        if (i === 19) throw err;
        await sleep(100);
      }
    }
    rt.qmp = qmp;
    qmp!.onEvent((ev) => {
      if (ev.event === 'SHUTDOWN' && (ev.data as { guest?: boolean } | undefined)?.guest) rt.guestShutdown = true;
    });
    qmp!.onClose(() => {
      if (rt.generation !== generation) return;
      void this.exited(rec, generation);
    });
  }

  /** QEMU's socket closed: the process is ending. Waits for it and records why it ended. */
  private async exited(rec: VmRecord, generation: number): Promise<void> {
    const rt = this.table.rt(rec.id);
    for (let i = 0; i < 50 && rt.pid !== null && isAlive(rt.pid); i++) await sleep(100);
    if (rt.generation !== generation) return;
    if (rt.pid !== null && isAlive(rt.pid)) {
      // The socket closed but the process lives (should not happen): keep watching it.
      this.table.log('QMP closed while QEMU still runs', { vm: rec.id, pid: rt.pid });
      void this.watchPid(rec, generation);
      return;
    }
    const expected = rt.expectingExit;
    rt.exitReason = expected ? null : rt.guestShutdown ? 'guest_powered_off' : 'crashed';
    rt.state = 'stopped';
    rt.qmp = null;
    rt.pid = null;
    rt.console?.close();
    rt.console = null;
    this.table.cleanRunFiles(this.table.dir(rec));
    this.gpus.release(rec);
    if (!expected) this.table.log('VM ended by itself', { vm: rec.id, reason: rt.exitReason });
  }

  private async watchPid(rec: VmRecord, generation: number): Promise<void> {
    const rt = this.table.rt(rec.id);
    while (!this.table.closed && rt.generation === generation && rt.pid !== null && isAlive(rt.pid)) await sleep(1000);
    if (!this.table.closed && rt.generation === generation) await this.exited(rec, generation);
  }

  /** Where the guest's SSH answers from here: its own address on the bridge, else QEMU's forward. */
  private probe(rec: VmRecord): { host: string; port: number } {
    if (rec.net) return { host: rec.net.ip, port: 22 };
    const { forwardHost } = this.table.opts;
    return { host: forwardHost === '0.0.0.0' ? '127.0.0.1' : forwardHost, port: rec.ssh_port };
  }

  /** Waits until the customer can log in and stay logged in (qemu/boot.ts); then the VM is running. */
  private async watchBoot(rec: VmRecord, generation: number): Promise<void> {
    const rt = this.table.rt(rec.id);
    const current = () => !this.table.closed && rt.generation === generation && rt.state === 'booting';
    const how = await waitForBoot({
      scanner: rt.boot ?? new ConsoleScanner(bootMarker(rec.id)),
      sshAnswers: async () => (await sshBanner(this.probe(rec).host, this.probe(rec).port, 1500)) !== null,
      current,
    });
    if (how === null || !current()) return;
    rt.state = 'running';
    try {
      markBooted(this.table.dir(rec), how);
    } catch (err) {
      this.table.log('could not record the boot', { vm: rec.id, err: String(err) });
    }
    this.table.log(how === 'cloud-init' ? 'guest ready: cloud-init finished' : 'guest ready: SSH answers', {
      vm: rec.id,
      how,
    });
  }

  /**
   * Stops the VM: an ACPI power-down, then after `timeoutS` a hard quit (and a
   * kill if even that is not obeyed). 0 means a hard stop at once.
   */
  async halt(rec: VmRecord, timeoutS: number): Promise<void> {
    const rt = this.table.rt(rec.id);
    const pid = rt.pid;
    if (rt.state === 'stopped' || pid === null) {
      rt.state = 'stopped';
      this.gpus.release(rec);
      return;
    }
    rt.expectingExit = true;
    rt.state = 'stopping';
    const gone = async (ms: number) => {
      const until = Date.now() + ms;
      while (Date.now() < until) {
        if (!isAlive(pid)) return true;
        await sleep(100);
      }
      return !isAlive(pid);
    };
    if (timeoutS > 0 && rt.qmp && !rt.qmp.closed) {
      await rt.qmp.execute('system_powerdown').catch(() => undefined);
      if (await gone(timeoutS * 1000)) return this.settleStopped(rec);
      this.table.log('no power-down within the timeout: quitting', { vm: rec.id, timeoutS });
    }
    if (rt.qmp && !rt.qmp.closed) await rt.qmp.execute('quit').catch(() => undefined);
    if (!(await gone(5000))) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // already gone
      }
      await gone(5000);
    }
    this.settleStopped(rec);
  }

  private settleStopped(rec: VmRecord): void {
    const rt = this.table.rt(rec.id);
    rt.generation++; // the old process's close callback no longer applies
    rt.qmp?.close();
    rt.qmp = null;
    rt.pid = null;
    rt.console?.close();
    rt.console = null;
    rt.state = 'stopped';
    rt.exitReason = null;
    rt.expectingExit = false;
    this.table.cleanRunFiles(this.table.dir(rec));
    this.gpus.release(rec);
  }

  /** Lets go of the QMP connections and console readers; the VMs themselves run on. */
  close(): void {
    for (const rt of this.table.runtimes()) {
      rt.generation++;
      rt.qmp?.close();
      rt.console?.close();
    }
  }
}
